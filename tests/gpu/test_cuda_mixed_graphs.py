"""Mixed steps replay graphs piece by piece around attention (engine/mixed_graphs.py): a
step of decode rows, a chunk after a cached prefix and a whole prompt gives the eager
forward's logits (bf16: close; FP8 too), padded to its bucket; the engine sends such steps
there, and steps past the largest bucket run eagerly.

Run on a GPU machine with `make test-gpu`.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from blitzscale.checkpoint import load_weights, resolve_model
from blitzscale.checkpoint.loader import random_weights
from blitzscale.checkpoint.presets import preset_config
from blitzscale.engine import EngineConfig, LLMEngine, SamplingParams
from blitzscale.model.attention import AttentionMetadata
from tests.engine.test_mixed_graphs_cpu import prefilled_step

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def _engine(model: str = "tiny-llama3", budget: int = 300) -> LLMEngine:
    if model.endswith(":fp8"):  # Llama-3-8B's layers, two of them
        cfg = replace(preset_config(model), num_layers=2, vocab_size=4096)
        w = random_weights(cfg, torch.bfloat16, "cuda", seed=3)
    else:
        w = load_weights(resolve_model(f"random:{model}"), dtype=torch.bfloat16, device="cuda")
    cfg = EngineConfig(
        block_size=16, num_kv_blocks=512, max_num_seqs=16, max_num_batched_tokens=budget, prefix_caching=True
    )
    return LLMEngine(w, None, cfg)


def _fp8_ok() -> bool:
    return torch.cuda.get_device_capability() >= (8, 9)


@torch.inference_mode()
@pytest.mark.parametrize(
    ("model", "seqs"),
    [
        # (cached tokens, new tokens) per sequence: decode rows, a chunk after a prefix, a
        # whole prompt (SDPA's path) and a chunk alone with rows (the paged prefill kernel)
        ("tiny-llama3", [(40, 1), (17, 1), (0, 30)]),
        ("tiny-llama3", [(100, 1), (64, 70), (3, 1), (0, 9)]),
        ("tiny-llama3", [(5, 1)] * 6 + [(200, 90)]),
        ("llama3-8b:fp8", [(40, 1), (17, 1), (32, 50)]),
        ("llama3-8b:fp8", [(9, 1), (0, 100)]),
    ],
)
def test_a_replayed_mixed_step_gives_the_eager_logits(model: str, seqs: list[tuple[int, int]]) -> None:
    if model.endswith(":fp8") and not _fp8_ok():
        pytest.skip("FP8 matmuls need sm_89 or later")
    e = _engine(model)
    mg = e.runner.mixed_graphs
    assert mg is not None and mg.buckets[-1] == 288
    m, kv = e.model, e.kv_cache
    g = torch.Generator().manual_seed(sum(c + n for c, n in seqs))
    free = torch.randperm(500, generator=g).add(1).tolist()  # scattered blocks
    step, meta = prefilled_step(m, kv, seqs, g, free)
    ref = m.logits(m.run_layers(m.embed(step), meta(), kv)).float()
    hidden = mg.run(step, meta())
    ours = m.logits(hidden).float()
    assert ours.shape == ref.shape == (len(step), e.model_config.vocab_size)
    scale = ref.abs().max()
    assert (ours - ref).abs().max() <= 0.03 * scale
    assert (ours.argmax(-1) == ref.argmax(-1)).float().mean() >= 0.95


@torch.inference_mode()
def test_the_engine_replays_mixed_steps_up_to_the_largest_bucket() -> None:
    e = _engine(budget=300)
    mg = e.runner.mixed_graphs
    assert mg is not None and e.runner.capture_s["mixed"] > 0
    replays: list[int] = []
    eager: list[int] = []
    run, run_layers = mg.run, e.model.run_layers

    def counted(ids: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        replays.append(int(ids.shape[0]))
        return run(ids, meta)

    def counted_eager(hidden: torch.Tensor, *rest: object, **kw: object) -> torch.Tensor:
        eager.append(int(hidden.shape[0]))
        return run_layers(hidden, *rest, **kw)  # type: ignore[arg-type]

    mg.run = counted  # type: ignore[method-assign]
    e.model.run_layers = counted_eager  # type: ignore[method-assign]
    g = torch.Generator().manual_seed(4)
    params = SamplingParams(max_tokens=20, temperature=0, ignore_eos=True)
    first = [torch.randint(0, 512, (n,), generator=g).tolist() for n in (30, 45, 12)]
    later = [torch.randint(0, 512, (n,), generator=g).tolist() for n in (120, 280, 7)]
    done = {}

    def step() -> None:
        for out in e.step():
            if out.finished:
                done[out.request_id] = out

    reqs = [e.add_request(p, params) for p in first]
    for _ in range(4):  # the three prompts in one step (87 tokens), then decode steps
        step()
    reqs += [e.add_request(p, params) for p in later]
    while e.has_unfinished():
        step()
    assert replays and replays[0] == 87, replays
    assert len(replays) >= 2 and max(replays) <= 288, replays
    assert eager and min(eager) > 288, eager  # past the largest bucket: eager
    assert e.pool.num_free_blocks == e.pool.num_blocks
    e.check_integrity()
    assert sorted(done) == sorted(reqs) and all(len(o.token_ids) == 20 for o in done.values())
