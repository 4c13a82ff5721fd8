"""Issue 29's two-model check on one GPU: `blitzscale serve` as a user runs it, one worker,
N models (`[[models]]`, each random Llama-3-8B-shaped weights, 16.06 GB in bf16), policy
blitz, every model scaling to zero after `keep_alive_s`. A replay touches them in turn (each
request finds its model on its host copy only: straight after another model's request, whose
instance is drained and released first, and after the GPU went empty) and then all at once
(requests for every model arriving together). Per swap: the request's first-token time,
the swap-in and swap-out seconds and the load path (from /metrics before and after), beside
the pinned host-to-device copy of the same bytes measured first in this run, and the
prefill of the same prompt on a resident model. Every HTTP status is counted (the issue:
zero 5xx) and the disk loads per model (one each: afterwards only the host copy).

With `--resident` every model stays on the GPU (`[cluster] models_per_rank` = the number of
models, each engine with its share of the device, keep-alive beyond the run, host copies
bounded by `--host-memory-gb`): after each model's first load the replay touches them in
turn and at once, and no swap may happen at all. With `--models-per-rank 0` serve derives
how many fit (control/residency.py) and the replay runs as with `--resident`.

Run (GPU machine, repo root, the wheels of `make test-gpu` on the path):
`python3 docs/results/models_swap_h200.py [--models 2] [--rounds 3] [--resident] [--out FILE]`.
Prints JSON (and writes it to --out, with the whole serve log beside it: FILE.serve.log).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[2]
PROMPT = [(i * 7919) % 40_000 + 100 for i in range(128)]  # 128 token ids (in SmolLM2's 49k too)
MAX_TOKENS = 8


def weight_bytes(model: str, device: str) -> int:
    from blitzscale.checkpoint import load_config, resolve_model
    from blitzscale.model.layout import build_layout

    size = 2 if device == "cuda" else 4  # bf16 on a GPU, fp32 on CPU (serve's defaults)
    return build_layout(load_config(resolve_model(model)), size).nbytes


def copy_limit_s(nbytes: int, device: str) -> float:
    """The host-to-device copy of `nbytes` at its best: from registered host memory on a
    GPU (bench/limits.py, in this process before the server starts); on CPU a plain copy
    (a dry run of this script)."""
    if device == "cuda":
        import torch

        from blitzscale.bench.limits import pinned_h2d_GBps

        rate = pinned_h2d_GBps(nbytes)
        torch.cuda.empty_cache()  # (the server's worker needs the device's memory, all of it)
        return nbytes / (rate * 1e9)
    import torch

    src, dst = torch.empty(nbytes, dtype=torch.uint8), torch.empty(nbytes, dtype=torch.uint8)
    t = time.perf_counter()
    dst.copy_(src)
    return time.perf_counter() - t


def config_toml(
    model: str,
    device: str,
    models: int,
    keep_alive_s: float,
    per_rank: int = 1,
    host_bytes: int = 0,
    max_model_len: int = 0,
) -> str:
    lines = [
        "[model]",
        f"keep_alive_s = {keep_alive_s}",
        "[cluster]",
        f'device = "{device}"',
        "num_workers = 1",
        f"models_per_rank = {per_rank}",
        f"host_memory_bytes = {host_bytes}",
        "[router]",
        'mode = "colocated"',
        "[policy]",
        'name = "blitz"',
        "[engine]",
        f"max_model_len = {max_model_len}",
    ]
    for k in range(models):
        lines += ["[[models]]", f'name = "m{k}"', f'source = "{model}"']
    return "\n".join(lines) + "\n"


Sample = tuple[str, frozenset[tuple[str, str]]]  # (name, labels)


def metrics(text: str) -> dict[Sample, float]:
    from prometheus_client.parser import text_string_to_metric_families

    return {
        (s.name, frozenset(s.labels.items())): s.value
        for fam in text_string_to_metric_families(text)
        if fam.name.startswith("blitzscale_")
        for s in fam.samples
    }


def total(m: dict[Sample, float], name: str, **labels: str) -> float:
    want = set(labels.items())
    return sum(v for (n, ls), v in m.items() if n == name and want <= ls)


def delta(before: dict[Sample, float], after: dict[Sample, float], model: str) -> dict[str, Any]:
    def d(name: str, **labels: str) -> float:
        return total(after, name, **labels) - total(before, name, **labels)

    ups = "blitzscale_scale_events_total"
    paths = {p: int(d(ups, direction="up", model=model, path=p)) for p in ("disk", "host", "network")}
    secs = "blitzscale_model_swap_seconds_sum"
    others = {dict(ls)["model"] for (n, ls) in after if n == secs}
    out = {o: d(secs, direction="out", model=o) for o in sorted(others)}
    return {
        "loads": {p: n for p, n in paths.items() if n},
        "swap_in_s": round(d(secs, direction="in", model=model), 4),
        "swapped_out_s": {o: round(v, 4) for o, v in out.items() if v > 0},
    }


async def one(c: httpx.AsyncClient, url: str, model: str) -> dict[str, Any]:
    body = {"model": model, "prompt": PROMPT, "max_tokens": MAX_TOKENS, "temperature": 0, "stream": True}
    t = time.perf_counter()
    first = None
    async with c.stream("POST", f"{url}/v1/completions", json=body) as r:
        async for line in r.aiter_lines():
            if first is None and line.startswith("data: {"):
                first = time.perf_counter() - t
        status = r.status_code
    return {"model": model, "status": status, "ttft_s": round(first, 4) if first else None}


async def replay(url: str, models: list[str], rounds: int, at_once: int, resident: bool) -> dict[str, Any]:
    async with httpx.AsyncClient(timeout=600) as c:

        async def scrape() -> dict[str, float]:
            return metrics((await c.get(f"{url}/metrics")).text)

        async def gpu_empty(timeout_s: float = 120) -> None:
            end = time.perf_counter() + timeout_s
            while total(await scrape(), "blitzscale_model_weight_bytes", where="gpu") > 0:
                assert time.perf_counter() < end, "no model went to zero"
                await asyncio.sleep(0.2)

        requests: list[dict[str, Any]] = []
        swaps: list[dict[str, Any]] = []
        resident: list[dict[str, Any]] = []

        async def swap(rnd: int, kind: str, m: str) -> None:
            before = await scrape()
            r = await one(c, url, m)
            after = await scrape()
            requests.append(r)
            swaps.append({"round": rnd, "kind": kind, **r, **delta(before, after, m)})
            again = await one(c, url, m)  # resident now: its prefill and first step
            requests.append(again)
            resident.append({"round": rnd, **again})

        for m in models:  # each model's first load (from disk)
            await swap(0, "first", m)
        for rnd in range(1, rounds + 1):
            for m in models:  # the model before it still on the GPU, idle
                await swap(rnd, "straight", m)
            for m in models if not resident else ():  # the GPU empty: only the host copy has it
                await gpu_empty()
                await swap(rnd, "from_zero", m)
        t = time.perf_counter()
        together = await asyncio.gather(*(one(c, url, m) for m in models for _ in range(at_once)))
        burst_s = time.perf_counter() - t
        requests += together
        final = await scrape()
    return {
        "swaps": swaps,
        "resident": resident,
        "at_once": {"requests": together, "seconds": round(burst_s, 2)},
        "statuses": {
            str(s): sum(r["status"] == s for r in requests) for s in {r["status"] for r in requests}
        },
        "final_metrics": {
            n + str(sorted(ls)): v
            for (n, ls), v in final.items()
            if n.startswith(("blitzscale_model_", "blitzscale_scale_events_total"))
        },
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", type=int, default=2)
    ap.add_argument("--model", default="random:llama3-8b", help="every served model's source")
    ap.add_argument("--device", default="cuda", help="cpu: a dry run of this script")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--at-once", type=int, default=4, help="requests per model sent together at the end")
    ap.add_argument("--keep-alive", type=float, default=4.0)
    ap.add_argument("--resident", action="store_true", help="every model resident at once (no swaps)")
    ap.add_argument("--host-memory-gb", type=float, default=0.0, help="host memory for copies (0: no bound)")
    ap.add_argument(
        "--max-model-len", type=int, default=0, help="[engine] max_model_len (0: the model's context)"
    )
    ap.add_argument(
        "--models-per-rank",
        type=int,
        default=None,
        help="[cluster] models_per_rank (0: derived by serve; then as --resident if it gives more than one)",
    )
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    if args.models_per_rank is not None and args.models_per_rank != 1:
        args.resident = True
    if args.resident:
        args.keep_alive = 3600.0
    sys.path.insert(0, str(ROOT))
    nbytes = weight_bytes(args.model, args.device)
    limit = copy_limit_s(nbytes, args.device)
    work = Path(tempfile.mkdtemp(prefix="swap-"))
    conf = work / "cluster.toml"
    per_rank = (
        args.models_per_rank if args.models_per_rank is not None else (args.models if args.resident else 1)
    )
    host_bytes = int(args.host_memory_gb * 1e9)
    conf.write_text(
        config_toml(
            args.model, args.device, args.models, args.keep_alive, per_rank, host_bytes, args.max_model_len
        )
    )
    port = 18_000 + os.getpid() % 1000
    url = f"http://127.0.0.1:{port}"
    log = (work / "serve.log").open("w")
    cmd = [sys.executable, "-m", "blitzscale.cli.main", "serve", "--config", str(conf), "--port", str(port)]
    proc = subprocess.Popen([*cmd, "--no-access-log"], stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
    t0 = time.perf_counter()
    try:
        while True:
            assert proc.poll() is None, (work / "serve.log").read_text()[-3000:]
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.perf_counter() - t0 < 1500, "serve did not start"
            time.sleep(1)
        started_s = time.perf_counter() - t0
        models = [f"m{k}" for k in range(args.models)]
        out = asyncio.run(replay(url, models, args.rounds, args.at_once, args.resident))
    finally:
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
    prefill = min(r["ttft_s"] for r in out["resident"] if r["ttft_s"])
    for s in out["swaps"]:
        if s["ttft_s"] and s["kind"] != "first":
            s["ttft_over_copy_plus_prefill"] = round(s["ttft_s"] / (limit + prefill), 3)
    result = {
        "models": args.models,
        "models_per_rank": per_rank,
        "max_model_len": args.max_model_len,
        "host_memory_bytes": host_bytes,
        "model": args.model,
        "device": args.device,
        "weight_bytes": nbytes,
        "pinned_h2d_s": round(limit, 4),
        "pinned_h2d_GBps": round(nbytes / limit / 1e9, 1),
        "resident_ttft_min_s": prefill,
        "serve_started_s": round(started_s, 1),
        **out,
        "derived": [
            x for x in (work / "serve.log").read_text().splitlines() if "models resident per rank" in x
        ],
        "serve_log_tail": (work / "serve.log").read_text()[-4000:],
    }
    text = json.dumps(result, indent=1)
    if args.out:
        Path(args.out).write_text(text)
        # the whole serve log beside it, to break a swap's time down afterwards
        Path(args.out).with_suffix(".serve.log").write_text((work / "serve.log").read_text())
    print(text)


if __name__ == "__main__":
    main()
