"""This machine's speed against a CPU profile's, for `blitzscale bench fidelity`.

The shipped CPU profile was measured on one development machine; another machine's cores
may be twice as fast (one was: SmolLM2's 128-token prefill in 202 ms against the profile's
416), and a simulation stepped by the profile would then be twice as slow as the live run
it is compared with. So the fidelity bench times a few of SmolLM2's steps here, as a CPU
worker runs them (one torch thread), and the profile is scaled by the ratios: prefill steps
by the prefill's, decode steps by the decode's (`Profile.derive`).

The steps are timed in the thread's CPU time, not the wall clock's: a step that waits for
a core while other work runs is not slower in CPU time, so the speed measured is the
machine's own, and the other work is left to `bench/machine_load.py` (counted once).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from blitzscale.control.costmodel import Profile

PROMPT = 128  # tokens of the prefill timed (a point of the shipped profile)
DECODE_STEPS = 8  # decode steps timed together, at batch 1
REPEATS = 3  # the fastest of these counts


@dataclass(frozen=True)
class Speed:
    """Steps here against the profile's: > 1 is faster. `*_ms`: what was measured."""

    prefill: float
    decode: float
    prefill_ms: float
    decode_ms: float

    def apply(self, profile: Profile) -> Profile:
        """`profile` as this machine's."""
        memory = profile.device_memory_bytes
        return profile.derive(f"{profile.name}-here", profile.device, self.decode, self.prefill, memory)


@contextmanager
def _one_thread() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # as each CPU worker runs (worker/worker.py)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def measure(profile: Profile, model: str = "smollm2-135m") -> Speed:
    """Time `model`'s prefill of PROMPT tokens and decode steps at batch 1 here, against
    `profile`'s (which must be of `model` on a CPU)."""
    from blitzscale.checkpoint import load_weights, resolve_model
    from blitzscale.engine import EngineConfig, LLMEngine, SamplingParams

    weights = load_weights(resolve_model(model), dtype=torch.float32)
    config = EngineConfig(block_size=16, num_kv_blocks=64, max_num_batched_tokens=512)
    engine = LLMEngine(weights, None, config)
    gen = torch.Generator().manual_seed(0)
    vocab = weights.config.vocab_size
    prefill, decode = float("inf"), float("inf")
    with _one_thread(), torch.inference_mode():
        for _ in range(REPEATS):
            prompt = torch.randint(0, vocab, (PROMPT,), generator=gen).tolist()
            params = SamplingParams(max_tokens=DECODE_STEPS + 3, temperature=0, ignore_eos=True)
            rid = engine.add_request(prompt, params)
            t = time.thread_time()
            engine.step()  # the whole prompt: one step
            prefill = min(prefill, time.thread_time() - t)
            engine.step()  # (joining the batch)
            t = time.thread_time()
            for _ in range(DECODE_STEPS):
                engine.step()
            decode = min(decode, (time.thread_time() - t) / DECODE_STEPS)
            engine.abort(rid)
            while engine.has_unfinished():
                engine.step()
    return Speed(
        prefill=profile.prefill_s(PROMPT) / prefill,
        decode=profile.decode_s(1, PROMPT) / decode,
        prefill_ms=round(1000 * prefill, 2),
        decode_ms=round(1000 * decode, 2),
    )
