"""Shared fixtures: the real SmolLM2-135M (ours, its tokenizer, transformers' own load of the
same GGUF file), tiny random models of each architecture, and transformers twins of them.

Heavy models are session-scoped and loaded once. Tests must never write into the weights
they get from here (an engine only reads them).

Only `torch` and `pytest` are imported at module level: this file is also the root conftest
of `tests/gpu`, which runs with a bare image where transformers may be missing.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch

# On this project's small CPU machines two OpenMP threads make the small matmuls of these
# models 5-20x slower than one (the vCPUs are shared); one thread keeps the suite fast.
torch.set_num_threads(int(os.environ.get("BLITZSCALE_TEST_THREADS", "1")))
# Every engine in a worker checks its KV block books after each step (worker processes
# inherit this); a leak or a block with two owners stops the worker and fails the test.
os.environ.setdefault("BLITZSCALE_CHECK_INTEGRITY", "1")

TINY_PRESETS = ("tiny-llama3", "tiny-mistral", "tiny-qwen2")

# Parallel runs (`make test`: pytest-xdist, `--dist loadfile`). A work unit is a test file,
# so a module-scoped fixture (a cluster, a server) starts once, on one xdist worker, or a
# group of files in `SHARED`: files that share a session fixture (`pd_service`,
# tests/serve/conftest.py) or must not run beside each other (one Ray instance on this
# machine at a time). (xdist's own `loadgroup` renames test ids, which pytest 9.2 ignores.)
# Units go out slowest first, measured on the 2-core CI machine (docs/benchmarks.md), so
# the last one to finish is a short one; the rest follow in collection order.
SHARED = {
    "tests/multinode/": "ray",
    "tests/serve/test_dashboard.py": "pd_service",
    "tests/serve/test_http.py": "pd_service",
    "tests/serve/test_sampling_paths.py": "pd_service",
    "tests/serve/test_scaling.py": "pd_service",
    "tests/serve/test_structured_output.py": "pd_service",
    # transformers' load of SmolLM2 (`smollm2_hf`, about 25 s of a core) once, not per worker
    "tests/engine/test_logits_processors.py": "smollm2_hf",
    "tests/engine/test_prefix_caching.py": "smollm2_hf",
    "tests/engine/test_smollm2_reference.py": "smollm2_hf",
    "tests/serve/test_pacing_serve.py": "smollm2_hf",
}
SLOW_FIRST = (
    "ray",
    "tests/serve/test_live.py",
    "tests/serve/test_cli_serve.py",
    "tests/serve/test_tp_serving.py",
    "pd_service",
    "smollm2_hf",
    "tests/cluster/test_local_cluster.py",
    "tests/worker/test_tp_engine.py",
    "tests/serve/test_models_swap.py",
    "tests/serve/test_models.py",
    "tests/serve/test_models_resident.py",
    "tests/cluster/test_concurrency.py",
    "tests/checkpoint/test_convert_roundtrip.py",
    "tests/serve/test_shedding.py",
    "tests/serve/test_models_pd.py",
    "tests/engine/test_sampling.py",
    "tests/serve/test_reliability.py",
    "tests/serve/test_models_config.py",
    "tests/serve/test_standby.py",
    "tests/serve/test_faults.py",
    "tests/serve/test_dead_decode.py",
)


def work_unit(nodeid: str) -> str:
    """The xdist work unit of a test: its file, or the group in `SHARED` of that file."""
    path = nodeid.split("::")[0]
    return next((g for prefix, g in SHARED.items() if path.startswith(prefix)), path)


def _unit_rank(item: pytest.Item) -> int:
    unit = work_unit(item.nodeid)
    return SLOW_FIRST.index(unit) if unit in SLOW_FIRST else len(SLOW_FIRST)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if hasattr(config, "workerinput"):  # an xdist worker: the units' order (stable otherwise)
        items.sort(key=_unit_rank)


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """`--dist loadfile`, with the files of a `SHARED` group in one unit."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class FileGroupScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return work_unit(nodeid)

    return FileGroupScheduling(config, log)


@pytest.fixture(scope="session")
def smollm2_src() -> Any:
    from blitzscale.checkpoint import resolve_model

    return resolve_model("smollm2-135m")


@pytest.fixture(scope="session")
def smollm2_folder() -> str:
    """SmolLM2 in our format: the cache folder `serve` converts the GGUF into once and loads
    from (`prepare_model`). Its load takes 1 s of a core where the GGUF's takes 20 (parsing,
    dequantizing, building the tokenizer); tests/checkpoint/test_convert_roundtrip.py checks
    it bit for bit against the GGUF's load, so what is loaded from it is the GGUF's model."""
    from blitzscale.serve.model_cache import prepare_model

    return prepare_model("smollm2-135m")


@pytest.fixture(scope="session")
def smollm2_weights(smollm2_folder: str) -> Any:
    """Our fp32 load of the real SmolLM2-135M-Instruct (read-only for tests)."""
    from blitzscale.checkpoint import load_weights, resolve_model

    return load_weights(resolve_model(smollm2_folder), dtype=torch.float32, device="cpu")


@pytest.fixture(scope="session")
def smollm2_tokenizer(smollm2_folder: str) -> Any:
    from blitzscale.checkpoint import load_tokenizer, resolve_model

    return load_tokenizer(resolve_model(smollm2_folder))


@pytest.fixture(scope="session")
def smollm2_hf(smollm2_src: Any) -> Any:
    """transformers' own implementation, loading the same GGUF file through its own code."""
    from transformers import AutoModelForCausalLM

    path = smollm2_src.path
    with _gguf_parsed_once():
        model = AutoModelForCausalLM.from_pretrained(
            str(path.parent), gguf_file=path.name, dtype=torch.float32
        )
    return model.eval()


@contextlib.contextmanager
def _gguf_parsed_once() -> Iterator[None]:
    """transformers' GGUF load parses the file twice (config, then tensors: each parse
    reads the 49k-entry tokenizer arrays field by field) and builds gguf's tensor name map
    anew for each of the model's 397 modules, the same map each time: 21 of its 48 s on a
    busy core. Here one parse and one map serve every call (both are only read); the
    tensors, their dequantization and transformers' own conversion are unchanged."""
    import functools

    import gguf

    saved = gguf.GGUFReader, gguf.get_tensor_name_map
    gguf.GGUFReader = functools.lru_cache(maxsize=2)(gguf.GGUFReader)  # type: ignore[misc]
    gguf.get_tensor_name_map = functools.lru_cache(maxsize=4)(gguf.get_tensor_name_map)  # type: ignore[assignment]
    try:
        yield
    finally:
        gguf.GGUFReader, gguf.get_tensor_name_map = saved


def hf_greedy(hf: Any, prompts: list[list[int]], max_new: int) -> list[list[int]]:
    """transformers' greedy continuation of each prompt alone (no padding): the reference."""
    out = []
    with torch.no_grad():
        for p in prompts:
            ids = torch.tensor([p])
            gen = hf.generate(
                ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=max_new
            )
            out.append(gen[0, len(p) :].tolist())
    return out


_tiny_cache: dict[str, Any] = {}


@pytest.fixture(scope="session")
def tiny_weights() -> Callable[[str], Any]:
    """`tiny_weights("tiny-qwen2")`: fp32 random weights of a tiny preset, loaded once."""
    from blitzscale.checkpoint import load_weights, resolve_model

    def get(preset: str) -> Any:
        if preset not in _tiny_cache:
            _tiny_cache[preset] = load_weights(resolve_model(f"random:{preset}"), dtype=torch.float32)
        return _tiny_cache[preset]

    return get


def build_hf_twin(weights: Any) -> Any:
    """A transformers model of the same architecture holding a copy of `weights`' tensors."""
    import transformers

    from blitzscale.checkpoint.pack import hf_state_dict

    cfg = transformers.AutoConfig.for_model(**weights.config.to_hf())
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    sd = hf_state_dict(weights)
    if weights.config.tie_word_embeddings:
        del sd["lm_head.weight"]  # tied: transformers points lm_head at the embedding itself
    missing, unexpected = model.load_state_dict(sd, strict=False)
    assert not unexpected, unexpected
    assert set(missing) <= {"lm_head.weight"}, missing
    assert torch.equal(model.lm_head.weight, weights.lm_head)  # tied or loaded, same values
    return model.eval()


@pytest.fixture(scope="session")
def hf_twin() -> Callable[[Any], Any]:
    """`hf_twin(weights)`: transformers' model of the architecture with the same weights."""
    return build_hf_twin


def save_tiny_hf_folder(path: Any, preset: str, tokenizer: bool = True, seed: int = 0) -> Any:
    """A Hugging Face folder as transformers writes it: config.json, model.safetensors with
    transformers' own random init of a tiny preset's architecture, and (if asked) a word-level
    tokenizer over the preset's vocabulary ("w0" .. "w511", eos "w1")."""
    from pathlib import Path

    import transformers

    from blitzscale.checkpoint.presets import PRESETS

    path = Path(path)
    cfg = transformers.AutoConfig.for_model(**PRESETS[preset].to_hf())
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    model.save_pretrained(str(path))
    assert list(path.glob("*.safetensors")), "transformers wrote no safetensors file"
    if tokenizer:
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers

        vocab = {f"w{i}": i for i in range(cfg.vocab_size)}
        tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="w0"))
        tok.pre_tokenizer = pre_tokenizers.Whitespace()
        tok.decoder = decoders.WordPiece()
        fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="w0", eos_token="w1")
        fast.save_pretrained(str(path))
    return path


def byte_tokenizer(eos_id: int = 1) -> Any:
    """A byte-level Hugging Face tokenizer with no merges: "<unk>" 0, "<eos>" `eos_id` (1, the
    tiny presets' EOS), then the 256 bytes (ids 2..257). Any text encodes, so grammar
    libraries can run over a random tiny model's 512 logits (the rest is padding); made
    offline (the GPU tests use it too, where no tokenizer can be downloaded)."""
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    assert eos_id in (0, 1)
    vocab = {"<unk>": 1 - eos_id, "<eos>": eos_id}
    vocab |= {ch: 2 + b for b, ch in sorted(bytes_to_unicode().items())}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", eos_token="<eos>")


@pytest.fixture(scope="session")
def tiny_hf_folder() -> Callable[..., Any]:
    """`tiny_hf_folder(path, "tiny-qwen2", tokenizer=True)`: see `save_tiny_hf_folder`."""
    return save_tiny_hf_folder


@pytest.fixture(scope="session")
def smollm2_engine_texts(smollm2_weights: Any, smollm2_tokenizer: Any) -> list[str]:
    """What a local engine produces for tests/serve/test_http's PROMPTS (greedy, 16 tokens)."""
    from blitzscale.engine import EngineConfig, LLMEngine, SamplingParams
    from tests.serve.test_http import PROMPTS

    engine = LLMEngine(smollm2_weights, smollm2_tokenizer, EngineConfig())
    ids = [engine.tokenizer(p).input_ids for p in PROMPTS]
    return [o.text for o in engine.generate(ids, SamplingParams(max_tokens=16, temperature=0))]
