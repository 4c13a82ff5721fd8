"""A worker's standby is a shape, not a model (worker/standby.py): any model of its
configuration and dtype lands in its buffer and is served by its engine, with the cached
prefixes of the model before forgotten; another shape or dtype gets nothing from it.

Two random weight sets of one tiny shape stand for two models (say, two fine-tunes of one
base): each is served by the standby's engine after the other, and each gives the tokens a
fresh engine on its own weights gives. Without forgetting the first model's cached
prefixes, the second would reuse KV computed by the first's weights.
"""

from __future__ import annotations

from typing import Any

import torch

from blitzscale.checkpoint import load_config, resolve_model
from blitzscale.engine import EngineConfig, LLMEngine, SamplingParams
from blitzscale.model.weights import ModelWeights
from blitzscale.worker.standby import Standby, StandbySpec

ENGINE = EngineConfig(block_size=8, num_kv_blocks=64)
PARAMS = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
PROMPT = list(range(3, 43))  # five full blocks: cached after a first request


def _other_weights(weights: Any) -> ModelWeights:
    """A second model of the same shape: the same tensors, scrambled."""
    g = torch.Generator().manual_seed(7)
    scrambled = weights.buffer[torch.randperm(weights.buffer.numel(), generator=g)]
    other = ModelWeights(weights.config, weights.layout, scrambled)
    other.readiness.mark_all_ready()
    return other


def _fresh(weights: ModelWeights) -> list[int]:
    return LLMEngine(weights, None, ENGINE).generate([PROMPT], PARAMS)[0].token_ids


def _load(standby: Standby, weights: ModelWeights) -> ModelWeights:
    """What a load does with the standby's buffer: fills it in place."""
    buf = standby.take_weights(weights.config, weights.dtype, 1)
    assert buf is not None, "a model of the standby's shape got no buffer"
    buf.buffer.copy_(weights.buffer)
    buf.readiness.mark_all_ready()
    return buf


def test_models_of_one_shape_take_turns_on_the_standby_engine(tiny_weights: Any) -> None:
    a = tiny_weights("tiny-llama3")
    b = _other_weights(a)
    want_a, want_b = _fresh(a), _fresh(b)
    assert want_a != want_b, "the two stand-in models give the same tokens: no test"

    tokenizers: list[str] = []
    standby = Standby(
        StandbySpec("a", "random:tiny-llama3", ENGINE), torch.device("cpu"), torch.float32, lambda: None
    )
    standby.arm()
    assert standby.engine is not None and standby.engine_model == "a"

    def serve(model: str, weights: ModelWeights) -> list[list[int]]:
        buf = _load(standby, weights)
        engine = standby.take_engine(buf, ENGINE, model, lambda: tokenizers.append(model))
        assert engine is not None and standby.engine is None
        outs = [engine.generate([PROMPT], PARAMS)[0].token_ids for _ in range(2)]
        assert engine.pool.num_cached_blocks > 0  # (the second request hit the first's prefix)
        assert standby.recycle(model, buf, engine)  # released: the standby again
        return outs

    assert serve("a", a) == [want_a, want_a]
    assert tokenizers == []  # (the engine was built for "a": nothing to change)
    assert serve("b", b) == [want_b, want_b]  # "a"'s cached prefixes forgotten
    assert serve("b", b) == [want_b, want_b]
    assert serve("a", a) == [want_a, want_a]
    assert tokenizers == ["b", "a"]  # told each time the model changed

    qwen = load_config(resolve_model("random:tiny-qwen2"))
    assert not standby.fits(qwen, torch.float32, 1) and standby.take_weights(qwen, torch.float32, 1) is None
    assert standby.take_weights(a.config, torch.bfloat16, 1) is None  # another dtype
    assert standby.take_weights(a.config, torch.float32, 2) is None  # a shard
    assert standby.weights is not None  # (still there for the next of its shape)
