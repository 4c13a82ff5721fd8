"""Scratch measurement (issue 28, the simulator's closed loop at 256 streams): does a step
take longer under sustained load than in the cost probe's short windows? Runs on the device
machine: the worker's standby engine on random stand-in weights, then for each shape a few
short windows (as the probe times them) and a sustained run of about 20 s, with the GPU's
SM clock, power and temperature sampled by nvidia-smi beside it. Prints one JSON object."""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time

import torch

from blitzscale.checkpoint.loader import load_config
from blitzscale.checkpoint.resolve import resolve_model
from blitzscale.engine import LLMEngine, SamplingParams
from blitzscale.engine.engine import default_dtype
from blitzscale.model.weights import ModelWeights
from blitzscale.serve.config import SERVE_ENGINE
from blitzscale.worker.costprobe import _decoding, _drain, _prompts, fill_random

MODEL = os.environ.get("MODEL", "random:llama3-8b")
SUSTAIN_S = float(os.environ.get("SUSTAIN_S", "20"))
dev = torch.device("cuda")
weights = ModelWeights.empty(load_config(resolve_model(MODEL)), default_dtype(dev), dev)
fill_random(weights, seed=0)
weights.readiness.mark_all_ready()
engine = LLMEngine(weights, None, SERVE_ENGINE.for_device("cuda"))
vocab = weights.config.vocab_size
gen = torch.Generator().manual_seed(0)
samples: list[dict] = []
stop = threading.Event()


def smi() -> None:
    q = "clocks.sm,power.draw,temperature.gpu,clocks_event_reasons.active"
    while not stop.is_set():
        try:
            run = subprocess.run(
                ["nvidia-smi", f"--query-gpu={q}", "--format=csv,noheader,nounits"],
                capture_output=True, text=True, timeout=5,
            )  # fmt: skip
            if run.returncode and "reasons" in q:  # an older driver: without the reasons
                q = "clocks.sm,power.draw,temperature.gpu"
                continue
            out = run.stdout.strip()
            samples.append({"t": round(time.perf_counter() - T0, 2), "smi": out})
        except (OSError, subprocess.SubprocessError) as e:
            samples.append({"t": round(time.perf_counter() - T0, 2), "error": str(e)})
        stop.wait(1.0)


def windows(step, seconds: float, per: int = 8) -> list[float]:
    """ms per step of consecutive windows of `per` steps over `seconds`."""
    out, end = [], time.perf_counter() + seconds
    while time.perf_counter() < end:
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(per):
            step()
        torch.cuda.synchronize()
        out.append(round(1000 * (time.perf_counter() - t) / per, 3))
    return out


def summary(ms: list[float]) -> dict:
    s = sorted(ms)
    return {"n": len(ms), "first": ms[:3], "min": s[0], "p50": s[len(s) // 2], "last": ms[-3:]}


T0 = time.perf_counter()
threading.Thread(target=smi, daemon=True).start()
result: dict = {"engine": str(engine.config)}
for batch, ctx in ((256, 128), (256, 512), (64, 512)):
    long = int(SUSTAIN_S * 1000 / 5) + 64  # enough tokens to keep decoding through the run
    params = SamplingParams(max_tokens=long, temperature=0, ignore_eos=True)
    ids = [engine.add_request(p, params) for p in _prompts(batch, ctx, vocab, gen)]
    while any((r := engine.request(i)) is not None and r.num_output_tokens == 0 for i in ids):
        engine.step()
    engine.step()
    short = windows(engine.step, 0.2, per=4)
    sustained = windows(engine.step, SUSTAIN_S)
    _drain(engine, ids)
    result[f"decode b{batch} c{ctx}"] = {"short": summary(short), "sustained": summary(sustained)}
    time.sleep(3)  # let the GPU cool as between probe points

# mixed: one 512-token prompt joining 255 decode rows at every step
ids = _decoding(engine, 255, 512, 4000, vocab, gen)
one = SamplingParams(max_tokens=1, temperature=0, ignore_eos=True)


def mixed_step() -> None:
    ids.append(engine.add_request(_prompts(1, 512, vocab, gen)[0], one))
    engine.step()


short = windows(mixed_step, 0.3, per=4)
sustained = windows(mixed_step, SUSTAIN_S)
_drain(engine, ids)
result["mixed 512+255 c512"] = {"short": summary(short), "sustained": summary(sustained)}
stop.set()
result["smi (sm MHz, W, C, reasons)"] = samples
print(json.dumps(result, indent=1))
