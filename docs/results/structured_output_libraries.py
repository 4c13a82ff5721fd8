"""Scratch measurement (issue 33 item 1, choosing the grammar library): the set-up and the per-step
token-mask cost of one JSON schema on SmolLM2's tokenizer (49,152 tokens), with xgrammar,
llguidance and outlines-core. Run: `pip install --no-deps --target /tmp/so_pkgs xgrammar
apache-tvm-ffi llguidance outlines-core`, `blitzscale tokenizer smollm2-135m /tmp/smollm2-tok`,
then `.venv/bin/python docs/results/structured_output_libraries.py`."""

import json
import sys
import time

sys.path.insert(0, "/tmp/so_pkgs")
from transformers import AutoTokenizer

tok = AutoTokenizer.from_pretrained("/tmp/smollm2-tok")
schema = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer"},
        "tags": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["name", "age", "tags"],
    "additionalProperties": False,
}
answer = json.dumps({"name": "Ada", "age": 36, "tags": ["math", "engines"]})
ids = tok.encode(answer, add_special_tokens=False)
V = len(tok)
print("vocab", V, "answer tokens", len(ids))
res: dict[str, object] = {}


def walk(name: str, setup_s: float, fill, accept) -> None:
    """The answer token by token: the mask filled (timed), then the token accepted."""
    ts = []
    for i in ids:
        a = time.perf_counter()
        fill()
        ts.append(time.perf_counter() - a)
        assert accept(i), (name, "refused", tok.decode([i]))
    res[name] = dict(
        setup_ms=round(1000 * setup_s, 1),
        mask_us_median=round(1e6 * sorted(ts)[len(ts) // 2], 1),
        mask_us_max=round(1e6 * max(ts), 1),
    )


try:
    import xgrammar as xgr

    t = time.perf_counter()
    info = xgr.TokenizerInfo.from_huggingface(tok, vocab_size=V)
    cg = xgr.GrammarCompiler(info).compile_json_schema(json.dumps(schema))
    setup = time.perf_counter() - t
    m = xgr.GrammarMatcher(cg)
    bm = xgr.allocate_token_bitmask(1, info.vocab_size)
    walk("xgrammar", setup, lambda: m.fill_next_token_bitmask(bm), m.accept_token)
except Exception as e:
    res["xgrammar"] = f"{type(e).__name__}: {e}"
try:
    import llguidance
    import llguidance.hf
    import llguidance.torch as lt

    t = time.perf_counter()
    lltok = llguidance.hf.from_tokenizer(tok)
    lm = llguidance.LLMatcher(lltok, llguidance.LLMatcher.grammar_from_json_schema(json.dumps(schema)))
    setup = time.perf_counter() - t
    lbm = lt.allocate_token_bitmask(1, lltok.vocab_size)
    walk("llguidance", setup, lambda: lt.fill_next_token_bitmask(lm, lbm, 0), lm.consume_token)
except Exception as e:
    res["llguidance"] = f"{type(e).__name__}: {e}"
try:
    from outlines_core.json_schema import build_regex_from_schema

    regex = build_regex_from_schema(json.dumps(schema))
    res["outlines-core"] = (
        f"its Vocabulary comes from a Hub download (from_pretrained); regex of {len(regex)} chars"
    )
except Exception as e:
    res["outlines-core"] = f"{type(e).__name__}: {e}"
print(json.dumps(res, indent=1))
