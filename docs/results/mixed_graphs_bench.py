"""Mixed steps with and without their piecewise graphs (engine/mixed_graphs.py), in one
engine, one process: random Llama-3-8B (bf16), 32 rows decoding at 2,048 keys, a prompt of
96-544 tokens joining them (one step), timed whole (`engine.step`: schedule, forward,
sample) with the GPU synchronized before and after; then a closed loop of 64 streams (a
256-token prompt each, 32-96 tokens out, a new request as each ends) for output tokens per
second, graphs on and off. Prints and writes JSON.

Run (GPU machine, repo root): `OUT=. python3 docs/results/mixed_graphs_bench.py`; writes
$OUT/mixed_graphs_bench.json.
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from blitzscale.bench import engine_bench as eb  # noqa: E402
from blitzscale.bench.engine_bench import EngineBenchConfig  # noqa: E402
from blitzscale.checkpoint import load_weights, resolve_model  # noqa: E402
from blitzscale.engine import SamplingParams  # noqa: E402

OUT = Path(os.environ.get("OUT", "/tmp"))
BATCH, CONTEXT, REPS = 32, 2048, 8
PROMPTS = (96, 224, 480, 544)  # with the 32 rows: 128, 256, 512, 576 tokens
STREAMS, STREAM_PROMPT, STREAM_OUT, COMPLETIONS = 64, 256, 64, 256


def main() -> None:
    device = torch.device("cuda")
    weights = load_weights(resolve_model("random:llama3-8b"), dtype=torch.bfloat16, device=device)
    # (decode_steps: room for the decode rows to outlive every timed step)
    cfg = EngineBenchConfig(batch_sizes=(BATCH,), context_lens=(CONTEXT,), prefill_len=512, decode_steps=256)
    engine = eb._engine(weights, cfg, STREAMS + 64)
    runner = engine.runner
    graphs = runner.mixed_graphs
    res: dict = {
        "device": torch.cuda.get_device_name(),
        "capture_s": runner.capture_s,
        "buckets": graphs.buckets if graphs else [],
        "max_num_batched_tokens": engine.config.max_num_batched_tokens,
    }
    print(json.dumps(res), flush=True)
    rng = random.Random(0)
    vocab = weights.config.vocab_size

    def prompt(n: int) -> list[int]:
        return [rng.randrange(vocab) for _ in range(n)]

    def use(on: bool) -> None:
        runner.mixed_graphs = graphs if on else None

    long = SamplingParams(max_tokens=500, temperature=0, ignore_eos=True)
    one = SamplingParams(max_tokens=1, temperature=0, ignore_eos=True)
    ids = [engine.add_request(prompt(CONTEXT), long) for _ in range(BATCH)]
    while any(engine.request(i).num_output_tokens == 0 for i in ids):  # type: ignore[union-attr]
        engine.step()
    steps: dict = {}
    for n in PROMPTS:

        def mixed(n: int = n) -> None:
            engine.add_request(prompt(n), one)
            engine.step()

        for on in (True, False) * 2:  # interleaved: the same decode rows for both
            assert all(engine.request(i) is not None for i in ids), "the decode rows ended"
            use(on)
            for _ in range(2):
                mixed()  # warm
            t = sorted(1000 * eb._timed(mixed, device) for _ in range(REPS))
            steps.setdefault(f"prompt_{n}", {}).setdefault("graphs" if on else "eager", []).append(
                [round(t[0], 3), round(t[len(t) // 2], 3)]
            )
        print(json.dumps({f"prompt_{n}": steps[f"prompt_{n}"]}), flush=True)
    res["mixed_step_ms_min_median"] = steps
    for rid in engine.request_ids():
        engine.abort(rid)
    while engine.has_unfinished():
        engine.step()

    loop: dict = {}
    for on in (True, False, True, False):
        use(on)
        lengths = random.Random(1)  # the same answer lengths for both

        def request(lengths: random.Random = lengths) -> str:
            n = lengths.randint(STREAM_OUT // 2, 3 * STREAM_OUT // 2)  # (so that streams do not end together)
            return engine.add_request(
                prompt(STREAM_PROMPT), SamplingParams(max_tokens=n, temperature=0, ignore_eos=True)
            )

        live = {request() for _ in range(STREAMS)}
        done = tokens = 0
        kinds = {"mixed_graph": 0, "mixed_eager": 0, "other": 0}
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        while done < COMPLETIONS:
            for out in engine.step():
                tokens += len(out.new_token_ids)
                if out.finished:
                    done += 1
                    live.discard(out.request_id)
                    live.add(request())
            w = engine.last_work
            mixed = w.prompt_tokens > 0 and w.decode_batch > 0
            kinds["other" if not mixed else "mixed_graph" if w.graph else "mixed_eager"] += 1
        torch.cuda.synchronize()
        wall = time.perf_counter() - t0
        loop.setdefault("graphs" if on else "eager", []).append(round(tokens / wall, 1))
        loop.setdefault("steps_" + ("graphs" if on else "eager"), []).append(kinds)
        for rid in live:
            engine.abort(rid)
        while engine.has_unfinished():
            engine.step()
        print(json.dumps({"closed_loop_tok_s": loop}), flush=True)
    res["closed_loop_output_tok_s"] = loop
    res["closed_loop"] = {"streams": STREAMS, "prompt": STREAM_PROMPT, "out": STREAM_OUT}
    res["closed_loop"]["completions"] = COMPLETIONS
    (OUT / "mixed_graphs_bench.json").write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
