"""The logits processors and logprobs (engine/logits.py) on the GPU equal the CPU's, and a
GPU engine serving penalized requests gives the tokens a CPU engine gives in fp32.
Run on a GPU machine with `make test-gpu`."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from blitzscale.checkpoint import load_weights, resolve_model
from blitzscale.engine import EngineConfig, LLMEngine, SamplingParams
from blitzscale.engine.logits import History, logprobs_of, process
from blitzscale.model.weights import ModelWeights

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


@dataclass
class _Row:
    token_ids: list[int]
    num_prompt_tokens: int


PARAMS = [
    SamplingParams(repetition_penalty=1.3),
    SamplingParams(frequency_penalty=0.7, presence_penalty=0.4),
    SamplingParams(logit_bias=((3, 5.0), (7, -100.0)), min_tokens=4, stop_token_ids=(9,)),
    SamplingParams(),  # untouched
    SamplingParams(logprobs=3, repetition_penalty=0.8, frequency_penalty=-0.5),
]


def test_processors_and_logprobs_match_the_cpu() -> None:
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(len(PARAMS), 512, generator=g)
    rows = [_Row(torch.randint(0, 512, (12,), generator=g).tolist(), 5) for _ in PARAMS]
    history = History(rows, frozenset({1}))
    cpu = process(logits, PARAMS, history)
    gpu = process(logits.cuda(), PARAMS, history).cpu()
    torch.testing.assert_close(gpu, cpu)
    assert not torch.equal(cpu, logits)  # the processors did something
    tokens = cpu.argmax(-1).tolist()
    on_gpu = logprobs_of(logits.cuda(), tokens, PARAMS)
    for a, b in zip(logprobs_of(logits, tokens, PARAMS), on_gpu, strict=True):
        assert (a is None) == (b is None)
        if a is not None and b is not None:
            assert abs(a.logprob - b.logprob) < 1e-4
            assert [t for t, _ in a.top] == [t for t, _ in b.top]


@torch.inference_mode()
def test_penalized_greedy_tokens_on_the_gpu_equal_the_cpus_fp32() -> None:
    src = resolve_model("random:tiny-qwen2")
    cpu = load_weights(src, dtype=torch.float32, device="cpu")
    cuda = ModelWeights(cpu.config, cpu.layout, cpu.buffer.to("cuda"))
    cuda.readiness.mark_all_ready()
    params = SamplingParams(
        max_tokens=16, temperature=0, ignore_eos=True, repetition_penalty=1.2, frequency_penalty=0.5,
        presence_penalty=0.3, logit_bias=((11, 2.0),), logprobs=2,
    )  # fmt: skip
    prompts = [list(range(5, 37)), list(range(40, 49))]
    outs = [
        LLMEngine(w, None, EngineConfig(block_size=16, num_kv_blocks=32)).generate(prompts, params)
        for w in (cpu, cuda)
    ]
    assert [o.token_ids for o in outs[0]] == [o.token_ids for o in outs[1]]


@torch.inference_mode()
def test_prompt_logprobs_on_the_gpu_equal_the_cpus_fp32() -> None:
    """A prompt in chunks of 16 asking for prompt logprobs, beside one that does not (which
    may replay the engine's graphs while the other's steps run eagerly): the same logprobs
    and top tokens as a CPU engine's, and the same tokens."""
    src = resolve_model("random:tiny-qwen2")
    cpu = load_weights(src, dtype=torch.float32, device="cpu")
    cuda = ModelWeights(cpu.config, cpu.layout, cpu.buffer.to("cuda"))
    cuda.readiness.mark_all_ready()
    asks = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True, prompt_logprobs=3)
    plain = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    prompt = list(range(5, 45))
    got = []
    for w in (cpu, cuda):
        e = LLMEngine(w, None, EngineConfig(block_size=16, num_kv_blocks=32, max_num_batched_tokens=16))
        e.add_request(list(range(50, 55)), plain, "plain")
        e.add_request(prompt, asks, "asks")
        outs: dict[str, list] = {"plain": [], "asks": []}
        while not all(v and v[-1].finished for v in outs.values()):
            for o in e.step():
                outs[o.request_id].append(o)
        got.append(outs)
    (cpu_first, *_), (gpu_first, *_) = got[0]["asks"], got[1]["asks"]
    assert len(gpu_first.prompt_logprobs) == len(prompt) - 1
    for a, b in zip(cpu_first.prompt_logprobs, gpu_first.prompt_logprobs, strict=True):
        assert abs(a.logprob - b.logprob) < 1e-3
        assert [t for t, _ in a.top] == [t for t, _ in b.top]
    for rid in ("plain", "asks"):
        assert got[0][rid][-1].token_ids == got[1][rid][-1].token_ids
