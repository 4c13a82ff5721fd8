"""Issue 31: the shipped Mooncake slice replayed against `blitzscale serve` on CPU workers, prefix
caching on, then off. Run from the repository root:

    python docs/results/prefix_mooncake_smollm2_cpu.py [OUT.json]

Environment: MAX_INPUT (default 128) clamps prompts; ORDER=off,on runs caching off first;
REPLAY_EXTRA="--duration 5" appends replay options, for a quick check.

Each run starts a fresh server (SmolLM2-135M, 2 CPU workers, colocated, policy `fixed` with 2
instances, prefix-aware routing), sends 2 salted warm-up requests, replays the slice with
`blitzscale replay` (options in REPLAY below), reads /metrics before and after, then sends PROBES
requests of the slice one at a time (greedy, 16 tokens) and keeps their texts, so the two runs'
outputs can be compared: on the caching server those prompts were all sent before, so they are
served from cached blocks; on the other every token is computed.
"""

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from blitzscale.client.protocols import request_for
from blitzscale.client.traces import load_trace, scale_hash_blocks, transform

ROOT = Path(__file__).resolve().parents[2]
SLICE = ROOT / "blitzscale" / "data" / "mooncake_synthetic_slice.jsonl"
PORT = 8431
URL = f"http://127.0.0.1:{PORT}"
BLOCK, MAX_OUTPUT, TIME_SCALE = 16, 8, 0.25
MAX_INPUT = int(os.environ.get("MAX_INPUT", "128"))
ORDER = os.environ.get("ORDER", "on,off").split(",")  # which server runs first
REPLAY = [
    "--trace", str(SLICE), "--format", "mooncake", "--hash-block-tokens", str(BLOCK),
    "--max-input", str(MAX_INPUT), "--max-output", str(MAX_OUTPUT), "--time-scale", str(TIME_SCALE),
    "--timeout", "600", "--no-progress", *os.environ.get("REPLAY_EXTRA", "").split(),
]  # fmt: skip
PROBES = 12
CONFIG = """
[cluster]
num_workers = 2
[router]
mode = "colocated"
[policy]
name = "fixed"
fixed_prefill = 2
fixed_decode = 0
[engine]
prefix_caching = {caching}
"""


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "blitzscale.cli.main", *args]


def counters() -> dict[str, float]:
    """Sum over instances of the prefix-cache counters and of tokens computed by engine steps."""
    text = httpx.get(f"{URL}/metrics", timeout=30).text
    out = {"queries": 0.0, "hits": 0.0, "step_tokens": 0.0}
    names = {
        "blitzscale_prefix_cache_queries_total": "queries",
        "blitzscale_prefix_cache_hits_total": "hits",
        "blitzscale_engine_kind_tokens_total": "step_tokens",
    }
    for line in text.splitlines():
        m = re.match(r"^(\w+)\{[^}]*\} ([0-9.eE+-]+)$", line)
        if m and m.group(1) in names:
            out[names[m.group(1)]] += float(m.group(2))
    return out


def complete(prompt: str, max_tokens: int) -> str:
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}
    r = httpx.post(f"{URL}/v1/completions", json=body, timeout=300)
    r.raise_for_status()
    return r.json()["choices"][0]["text"]


def probe_prompts() -> list[tuple[int, str]]:
    """The prompts the replay sent for PROBES requests spread over the slice (same builder)."""
    trace = load_trace(SLICE, "mooncake")
    requests = transform(
        scale_hash_blocks(trace, BLOCK), time_scale=TIME_SCALE, max_input=MAX_INPUT, max_output=MAX_OUTPUT
    )
    picks = [round(k * (len(requests) - 1) / (PROBES - 1)) for k in range(PROBES)]
    out = []
    for i in picks:
        r = requests[i]
        _, body = request_for(
            "openai", None, r.input_tokens, 1, salt=i, hash_ids=r.hash_ids, block_tokens=BLOCK
        )
        out.append((i, body["prompt"]))
    return out


def one_run(caching: bool, work: Path) -> dict:
    label = "on" if caching else "off"
    cfg = work / f"{label}.toml"
    cfg.write_text(CONFIG.format(caching=str(caching).lower()))
    log = (work / f"serve_{label}.log").open("w")
    server = subprocess.Popen(
        cli("serve", "--config", str(cfg), "--port", str(PORT), "--no-access-log"),
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 300
        while True:
            try:
                if httpx.get(f"{URL}/health", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"server did not come up; see {log.name}")
            time.sleep(1)
        for salt in (9001, 9002):  # first-request costs, on a prompt nothing else shares
            complete(f"#{salt} " + "hello " * 31, 4)
        before = counters()
        out = work / label
        t0 = time.perf_counter()
        rc = subprocess.run(cli("replay", "--url", URL, "--out", str(out), *REPLAY), check=False).returncode
        replay_s = time.perf_counter() - t0
        time.sleep(2)  # instance stats arrive with the workers' heartbeats
        after = counters()
        probes = {i: complete(prompt, 16) for i, prompt in probe_prompts()}
        time.sleep(2)
        probed = counters()
        summary = json.loads((out / "summary.json").read_text())
        records = [json.loads(line) for line in (out / "requests.jsonl").read_text().splitlines()]
        delta = {k: after[k] - before[k] for k in after}
        prompt_tokens = sum(r["input_tokens"] for r in records if r["status"] == "ok")
        return {
            "prefix_caching": caching,
            "replay_rc": rc,
            "replay_wall_s": round(replay_s, 1),
            "num_ok": summary["num_ok"],
            "num_requests": summary["num_requests"],
            "ttft_p50_ms": round(summary["ttft_s"]["p50"] * 1000, 1),
            "ttft_p99_ms": round(summary["ttft_s"]["p99"] * 1000, 1),
            "tbt_p99_ms": round(summary["tbt_s"]["p99"] * 1000, 1),
            "prompt_tokens_sent": prompt_tokens,
            "prefix_queries": delta["queries"],
            "prefix_hits": delta["hits"],
            "prompt_tokens_computed": prompt_tokens - delta["hits"],
            "hit_rate": round(delta["hits"] / delta["queries"], 4) if delta["queries"] else None,
            "engine_step_tokens": delta["step_tokens"],
            # the probes' own lookups: on the caching server, how much of them came from cache
            "probe_prefix_queries": probed["queries"] - after["queries"],
            "probe_prefix_hits": probed["hits"] - after["hits"],
            "probe_texts": probes,
            "summary": summary,
        }
    finally:
        os.killpg(server.pid, signal.SIGINT)
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
        log.close()


def main() -> None:
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    dest = (
        Path(sys.argv[1])
        if len(sys.argv) > 1
        else ROOT / "docs" / "results" / "prefix_mooncake_smollm2_cpu.json"
    )
    with tempfile.TemporaryDirectory(prefix="moon_prefix_") as tmp:
        work = Path(tmp)
        runs = {label: one_run(label == "on", work) for label in ORDER}
    on, off = runs["on"]["probe_texts"], runs["off"]["probe_texts"]
    result = {
        "what": "the shipped Mooncake slice replayed against serve, prefix caching on, then off",
        "replay_options": REPLAY,
        "order": ORDER,
        "server_config": CONFIG.strip(),
        "machine": f"{os.cpu_count()}-core CPU, shared with another job",
        "started_utc": started,
        "probes_identical": {str(i): on[i] == off[i] for i in on},
        "runs": runs,
    }
    dest.write_text(json.dumps(result, indent=2) + "\n")
    for label, r in runs.items():
        print(
            f"{label}: {r['num_ok']}/{r['num_requests']} ok, TTFT p50 {r['ttft_p50_ms']} ms p99 "
            f"{r['ttft_p99_ms']} ms, prompt tokens sent {r['prompt_tokens_sent']} computed "
            f"{r['prompt_tokens_computed']:.0f}, hit rate {r['hit_rate']}"
        )
    print(f"probe outputs identical: {sum(result['probes_identical'].values())}/{len(on)}; {dest}")


if __name__ == "__main__":
    main()
