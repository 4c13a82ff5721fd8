"""What structured output's token mask costs an engine step, at batch 1 and 64: the host fill
of the bitmask (one xgrammar matcher per row, one after the other, and as the engine fills
it: structured.fill_bitmask, on several threads at 64 rows) and its
application to the logits on their device (upload + xgrammar's kernel, as
structured.apply_bitmask does), on [batch, vocab] float32 logits. Prints JSON.

Run (GPU machine, repo root): `source .whl/setup.sh && python3 docs/results/structured_output_mask_cost.py`
(CPU: `PYTHONPATH=. .venv/bin/python docs/results/structured_output_mask_cost.py --device cpu`).
The tokenizer is SmolLM2's where it can be loaded (`--tokenizer DIR` for any Hugging Face
folder, e.g. one written by `blitzscale tokenizer`), else a byte-level one; `--vocab` sets
the logits' width (default 128256, Llama 3's; padding beyond the tokenizer is masked).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from blitzscale.core.sampling import Grammar
from blitzscale.structured import FILL_THREADS, Grammars, allocate_bitmask, apply_bitmask, fill_bitmask

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 32},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 4},
        "kind": {"enum": ["person", "robot"]},
    },
    "required": ["name", "age", "tags", "kind"],
    "additionalProperties": False,
}
ANSWER = json.dumps({"name": "Ada Lovelace", "age": 36, "tags": ["math", "engines"], "kind": "person"})


def tokenizer(path: str | None) -> tuple[object, str]:
    if path:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(path), path
    try:
        from blitzscale.checkpoint import load_tokenizer, resolve_model

        return load_tokenizer(resolve_model("smollm2-135m")), "smollm2-135m"
    except Exception:
        from tests.conftest import byte_tokenizer

        return byte_tokenizer(), "byte-level (258 tokens)"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--tokenizer", default=None)
    ap.add_argument("--vocab", type=int, default=128256)
    ap.add_argument("--batches", default="1,64")
    args = ap.parse_args()
    tok, tok_name = tokenizer(args.tokenizer)
    vocab = max(args.vocab, len(tok))  # type: ignore[arg-type]
    eos = tok.eos_token_id  # type: ignore[attr-defined]
    t = time.perf_counter()
    grammars = Grammars(tok, vocab, [eos])
    grammar = Grammar("json_schema", json.dumps(SCHEMA))
    grammars.compile(grammar)
    setup_s = time.perf_counter() - t
    ids = tok.encode(ANSWER, add_special_tokens=False)  # type: ignore[attr-defined]
    dev = torch.device(args.device)
    out: dict[str, object] = {
        "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
        "tokenizer": tok_name,
        "vocab": vocab,
        "answer_tokens": len(ids),
        "setup_ms": round(1000 * setup_s, 1),
    }
    for batch in (int(b) for b in args.batches.split(",")):
        # row r sits r tokens into the answer (rows at every depth of the grammar)
        matchers = [grammars.matcher(grammar, ids[: r % len(ids)]) for r in range(batch)]
        logits = torch.randn(batch, vocab, device=dev)
        rows = list(range(batch))
        fills, engine_fills, applies = [], [], []
        for _ in range(50):
            e = time.perf_counter()
            fill_bitmask(matchers, allocate_bitmask(batch, vocab), rows)
            engine_fills.append(time.perf_counter() - e)
            a = time.perf_counter()
            bitmask = allocate_bitmask(batch, vocab)
            for r, m in enumerate(matchers):
                m.fill(bitmask, r)
            b = time.perf_counter()
            x = logits.clone()
            if dev.type == "cuda":
                torch.cuda.synchronize()
            c = time.perf_counter()
            apply_bitmask(x, bitmask, rows)
            if dev.type == "cuda":
                torch.cuda.synchronize()
            d = time.perf_counter()
            fills.append(b - a)
            applies.append(d - c)
        # (the first calls compile the kernel)
        fills, engine_fills, applies = fills[5:], engine_fills[5:], applies[5:]
        out[f"batch_{batch}"] = {
            "fill_us_median": round(1e6 * statistics.median(fills), 1),
            "fill_us_per_row": round(1e6 * statistics.median(fills) / batch, 2),
            "engine_fill_us_median": round(1e6 * statistics.median(engine_fills), 1),
            "engine_fill_threads": max(1, min(FILL_THREADS, batch // 8)),
            "apply_us_median": round(1e6 * statistics.median(applies), 1),
            "total_us_median": round(1e6 * (statistics.median(fills) + statistics.median(applies)), 1),
            "apply_us_max": round(1e6 * max(applies), 1),
        }
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
