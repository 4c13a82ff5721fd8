"""Structured output on a CUDA engine: a random tiny Llama 3 in bf16 (decode by CUDA graphs,
overlapped decoding on) over a byte-level tokenizer writes only JSON valid against the
schema at batch 1 and 64, greedy and sampled, beside rows without a grammar. The mask is
filled on the host and applied on the GPU after the graph's logits, before sampling.

Run on a GPU machine: `source .whl/setup.sh && python3 -m pytest tests/gpu/test_cuda_structured.py
-m gpu -q -p no:cacheprovider --confcutdir=tests/gpu` (xgrammar's wheels are in .whl)."""

from __future__ import annotations

import json

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 8},
        "level": {"type": "integer", "minimum": 0, "maximum": 999},
        "ok": {"type": "boolean"},
        "kind": {"enum": ["cat", "dog", "owl"]},
        "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "minItems": 1, "maxItems": 4},
        "where": {
            "type": "object",
            "properties": {
                "x": {"type": "integer", "minimum": -99, "maximum": 99},
                "code": {"type": "string", "pattern": "^[A-Z]{2}[0-9]$"},
            },
            "required": ["x", "code"],
            "additionalProperties": False,
        },
    },
    "required": ["name", "level", "ok", "kind", "tags", "where"],
    "additionalProperties": False,
}


def _valid(text: str) -> bool:
    try:
        value = json.loads(text)
    except ValueError:
        return False
    try:
        import jsonschema
    except ImportError:  # (the GPU image may lack it: check the shape by hand)
        w = value["where"]
        return (
            set(value) == set(SCHEMA["required"])
            and len(value["name"]) <= 8
            and 0 <= value["level"] <= 999
            and value["kind"] in ("cat", "dog", "owl")
            and 1 <= len(value["tags"]) <= 4
            and -99 <= w["x"] <= 99
            and len(w["code"]) == 3
        )
    try:
        jsonschema.validate(value, SCHEMA)
    except jsonschema.ValidationError:
        return False
    return True


@pytest.mark.parametrize("batch", [1, 64])
@torch.inference_mode()
def test_json_schema_output_is_valid_on_cuda(batch: int, device: str = "cuda") -> None:
    from blitzscale.checkpoint import load_weights, resolve_model
    from blitzscale.core.sampling import Grammar
    from blitzscale.engine import EngineConfig, LLMEngine, SamplingParams
    from tests.conftest import byte_tokenizer

    tok = byte_tokenizer()
    weights = load_weights(
        resolve_model("random:tiny-llama3"),
        dtype=torch.bfloat16 if device == "cuda" else torch.float32,
        device=device,
    )
    engine = LLMEngine(weights, tok, EngineConfig(block_size=16, num_kv_blocks=2048, overlap="on"))
    grammar = Grammar("json_schema", json.dumps(SCHEMA))
    g = torch.Generator().manual_seed(batch)
    lengths = torch.randint(3, 40, (batch,), generator=g).tolist()
    prompts = [torch.randint(2, 258, (n,), generator=g).tolist() for n in lengths]
    params = [
        SamplingParams(
            max_tokens=256,
            temperature=0 if i % 2 == 0 else 1.0,
            seed=i if i % 4 == 1 else None,
            grammar=grammar,
        )
        for i in range(batch)
    ]
    free = [torch.randint(2, 258, (8,), generator=g).tolist() for _ in range(min(batch, 8))]
    ids = [engine.add_request(p, sp) for p, sp in zip(prompts, params, strict=True)]
    free_ids = [engine.add_request(p, SamplingParams(max_tokens=64, ignore_eos=True)) for p in free]
    final, graph_steps = {}, 0
    while len(final) < len(ids) + len(free_ids):
        final |= {o.request_id: o for o in engine.step() if o.finished}
        graph_steps += engine.runner.last_was_graph
    bad = [(i, final[i].finish_reason, final[i].text) for i in ids if not _valid(final[i].text)]
    assert not bad, bad[:3]
    assert all(final[i].finish_reason == "stop" for i in ids)
    assert all(len(final[i].token_ids) == 64 for i in free_ids)  # rows without a grammar run free
    assert engine.pool.num_free_blocks == engine.pool.num_blocks
    assert graph_steps > 0  # (decode steps replayed CUDA graphs; the mask came after them)
