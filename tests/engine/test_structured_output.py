"""Structured output in the engine (blitzscale/structured.py, the sampler's token mask): a
random tiny model over a byte-level tokenizer (its 512 logits wider than the tokenizer's
258 tokens) writes only JSON valid against the schema, greedy and sampled, beside rows
without a grammar that the mask leaves alone; the matcher rebuilt from a request's output
tokens equals the one that walked them; a request prefilled on one engine and decoded on
another (PD migration, in process) keeps its grammar; a schema the library cannot compile
is refused by name."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import jsonschema
import pytest
import torch

from blitzscale.core.sampling import Grammar
from blitzscale.engine import EngineConfig, LLMEngine, SamplingParams
from blitzscale.errors import InvalidRequestError
from blitzscale.structured import Grammars, allocate_bitmask
from tests.conftest import byte_tokenizer

# Bounded in every direction (enums, ranges, maxLength, maxItems), so even a random model's
# answer ends well within MAX_TOKENS.
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 6},
        "level": {"type": "integer", "minimum": 0, "maximum": 99},
        "ok": {"type": "boolean"},
        "kind": {"enum": ["cat", "dog", "owl"]},
        "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "minItems": 1, "maxItems": 3},
    },
    "required": ["name", "level", "ok", "kind", "tags"],
    "additionalProperties": False,
}
MAX_TOKENS = 160
SEED = 1  # the json_object row's


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return byte_tokenizer()


@pytest.fixture(scope="module")
def engine(tiny_weights: Callable[[str], Any], tokenizer: Any) -> LLMEngine:
    return LLMEngine(tiny_weights("tiny-llama3"), tokenizer, EngineConfig(block_size=16, num_kv_blocks=256))


def grammar(schema: dict = SCHEMA) -> Grammar:
    return Grammar("json_schema", json.dumps(schema))


def check(text: str, schema: dict = SCHEMA) -> Any:
    value = json.loads(text)
    jsonschema.validate(value, schema)
    return value


def test_greedy_and_sampled_rows_are_valid_beside_free_rows(engine: LLMEngine, tokenizer: Any) -> None:
    prompts = [tokenizer.encode(f"item {i}:") for i in range(6)]
    free = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    alone = [o.token_ids for o in engine.generate(prompts[:2], free)]
    rows = [("free", free), ("free", free)]
    rows += [("greedy", SamplingParams(max_tokens=MAX_TOKENS, temperature=0, grammar=grammar()))]
    rows += [
        ("sampled", SamplingParams(max_tokens=MAX_TOKENS, temperature=1.0, seed=s, grammar=grammar()))
        for s in range(2)
    ]
    # (seeded: a random model writes strings of any length, and this stream ends within
    # MAX_TOKENS every run; an unseeded one ran past it in about half the runs)
    obj = SamplingParams(
        max_tokens=MAX_TOKENS, temperature=0.7, top_k=20, seed=SEED, grammar=Grammar("json_object")
    )
    rows += [("object", obj)]
    ids = [engine.add_request(p, params) for p, (_, params) in zip(prompts, rows, strict=True)]
    final: dict[str, Any] = {}
    while len(final) < len(ids):
        final |= {o.request_id: o for o in engine.step() if o.finished}
    outs = [final[i] for i in ids]
    assert [o.token_ids for o in outs[:2]] == alone  # rows without a grammar are left alone
    for (kind, _), out in zip(rows[2:], outs[2:], strict=True):
        assert out.finish_reason == "stop", (kind, out.text)
        assert out.token_ids[-1] == tokenizer.eos_token_id  # the grammar's end is the model's EOS
        if kind == "object":
            assert isinstance(json.loads(out.text), dict)
        else:
            check(out.text)
    assert engine.pool.num_free_blocks == engine.pool.num_blocks


def test_logprobs_stay_those_of_the_raw_model(engine: LLMEngine, tokenizer: Any) -> None:
    """The mask picks the tokens; the logprobs reported are still the model's own (vLLM's
    default), so a masked token's logprob may be below the unmasked top one's."""
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0, logprobs=2, grammar=grammar())
    outs = list(engine.stream(tokenizer.encode("x"), params))
    lps = [lp for o in outs for lp in o.logprobs]
    assert len(lps) == len(outs[-1].token_ids)
    assert all(lp.top[0][1] >= lp.logprob - 1e-5 for lp in lps)
    assert any(lp.top[0][0] != t for lp, t in zip(lps, outs[-1].token_ids, strict=True))
    check(outs[-1].text)


def test_a_matcher_rebuilt_from_output_tokens_allows_what_the_walked_one_allows(
    engine: LLMEngine, tokenizer: Any
) -> None:
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.9, seed=7, grammar=grammar())
    [out] = engine.generate([tokenizer.encode("y")], params)
    check(out.text)
    tokens = out.token_ids[:-1]  # (before the EOS: a terminated matcher allows nothing)
    grammars = Grammars(tokenizer, 512, [tokenizer.eos_token_id])
    walked = grammars.matcher(grammar())
    for k in range(len(tokens) + 1):
        a, b = allocate_bitmask(1, 512), allocate_bitmask(1, 512)
        walked.fill(a, 0)
        grammars.matcher(grammar(), tokens[:k]).fill(b, 0)
        assert torch.equal(a, b), k
        if k < len(tokens):
            assert walked.accept(tokens[k])
    with pytest.raises(InvalidRequestError, match="does not fit the grammar"):
        grammars.matcher(grammar(), tokenizer.encode("[1]"))


def test_the_engine_rebuilds_a_lost_matcher_mid_generation(engine: LLMEngine, tokenizer: Any) -> None:
    """A request whose grammar state is gone (as on an instance it moved to) continues to the
    same tokens: the engine replays its output into a fresh matcher before sampling it."""
    prompt = tokenizer.encode("z")
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.8, seed=3, grammar=grammar())
    [whole] = engine.generate([prompt], params)
    rid = engine.add_request(prompt, params)
    for _ in range(8):
        engine.step()
    req = engine.request(rid)
    assert req is not None and req.matcher is not None and req.num_output_tokens >= 5
    req.matcher = None
    final = None
    while final is None:
        final = next((o for o in engine.step() if o.request_id == rid and o.finished), None)
    assert final.token_ids == whole.token_ids
    check(final.text)


def test_prefilled_here_decoded_there_keeps_the_grammar(
    tiny_weights: Callable[[str], Any], tokenizer: Any
) -> None:
    """PD migration in process: the first token is sampled under the grammar on the prefill
    engine; the decode engine, which never saw the request, replays it and goes on."""
    cfg = EngineConfig(block_size=16, num_kv_blocks=64)
    prefill, decode = (LLMEngine(tiny_weights("tiny-llama3"), tokenizer, cfg) for _ in range(2))
    prompt = tokenizer.encode("a person:")
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=1.0, seed=11, grammar=grammar())
    [alone] = LLMEngine(tiny_weights("tiny-llama3"), tokenizer, cfg).generate([prompt], params)
    prefill.add_request(prompt, params, "r", hold_kv=True)
    [held] = prefill.step()
    assert held.finish_reason == "migrate" and held.token_ids == alone.token_ids[:1]
    req = prefill.request("r")
    assert req is not None
    rng = req.generator.get_state()  # (the seeded generator travels too, as in RecvKVMsg)
    decode.handoffs.reserve_import("r", prompt + held.token_ids, len(prompt), params)
    decode.handoffs.kv_in("r", prefill.handoffs.kv_out("r"))
    prefill.handoffs.release_held("r")
    imported = decode.request("r")
    assert imported is not None and imported.matcher is None
    imported.generator.set_state(rng)
    decode.handoffs.commit_import("r")
    final = None
    while final is None:
        final = next((o for o in decode.step() if o.finished), None)
    assert final.token_ids == alone.token_ids
    check(final.text)


@pytest.mark.parametrize(
    ("schema", "says"),
    [
        ({"type": "nonsense"}, 'Unsupported type "nonsense"'),
        ({"type": "string", "pattern": "(unclosed"}, "parenthesis is not closed"),
        ({"$ref": "#/defs/missing"}, "Cannot find field 'defs'"),
        ({"type": "string", "minLength": 10, "maxLength": 2}, "minLength 10 is greater than maxLength 2"),
    ],
)
def test_a_schema_the_library_cannot_compile_is_refused_by_name(
    engine: LLMEngine, schema: dict, says: str
) -> None:
    with pytest.raises(InvalidRequestError, match="cannot be compiled") as err:
        engine.validate([5, 6], SamplingParams(grammar=grammar(schema)))
    assert says in str(err.value) and err.value.param == "response_format"
    assert not str(err.value).startswith("[")  # (xgrammar's log prefix is cut)


def test_what_sampling_params_refuse_about_grammars() -> None:
    with pytest.raises(InvalidRequestError, match="min_tokens cannot be combined"):
        SamplingParams(min_tokens=2, grammar=Grammar("json_object")).validate()
    with pytest.raises(InvalidRequestError, match="must be one of"):
        SamplingParams(grammar=Grammar("lark", "start: 'a'")).validate()
    for kind in ("regex", "ebnf"):
        with pytest.raises(InvalidRequestError, match=f"the {kind} is empty"):
            SamplingParams(grammar=Grammar(kind)).validate()
    with pytest.raises(InvalidRequestError, match="not JSON"):
        SamplingParams(grammar=Grammar("json_schema", "{")).validate()
    with pytest.raises(InvalidRequestError, match="must be a JSON object"):
        SamplingParams(grammar=Grammar("json_schema", "[1]")).validate()
    assert SamplingParams(grammar=Grammar("json_object")).reads_every_step  # (never overlapped)


def test_a_model_without_a_tokenizer_refuses_a_grammar(tiny_weights: Callable[[str], Any]) -> None:
    bare = LLMEngine(tiny_weights("tiny-llama3"), None, EngineConfig(block_size=16, num_kv_blocks=8))
    with pytest.raises(InvalidRequestError, match="needs the model's tokenizer"):
        bare.validate([5], SamplingParams(grammar=Grammar("json_object")))


def test_length_bounded_strings_refuse_raw_control_characters(tokenizer: Any) -> None:
    """xgrammar 0.2.9 lets raw control characters into strings with minLength / maxLength,
    and UTF-8-encoded surrogates into any string (neither is JSON; a random model over bytes
    finds them); structured.py compiles strings with JSON's characters."""
    grammars = Grammars(tokenizer, 512, [tokenizer.eos_token_id])
    for schema in (
        {"type": "string", "maxLength": 6},
        {"type": "string", "minLength": 1},
        {"type": "string"},
    ):
        m = grammars.matcher(grammar(schema))
        assert m.accept(tokenizer.encode('"')[0])
        assert not m.accept(tokenizer.encode("\x0c")[0]) and not m.accept(tokenizer.encode("\t")[0])
        assert m.accept(2 + 0xED) and not m.accept(2 + 0xA0)  # (U+D800's first bytes)
        assert all(m.accept(2 + b) for b in (0x9F, 0xBF))  # (U+D7FF: a character)
        assert all(m.accept(t) for t in tokenizer.encode('ab"'))


def test_a_pattern_with_lengths_is_refused_rather_than_half_enforced(engine: LLMEngine) -> None:
    schema = {
        "type": "object",
        "properties": {"pattern": {"type": "string", "pattern": "^a+$", "maxLength": 3}},
    }
    with pytest.raises(InvalidRequestError, match="pattern together with minLength or maxLength"):
        engine.validate([5], SamplingParams(grammar=grammar(schema)))
    engine.validate([5], SamplingParams(grammar=grammar({"type": "string", "pattern": "^a{1,3}$"})))


def test_a_batch_filled_on_several_threads_gives_each_row_its_own_mask(
    engine: LLMEngine, tokenizer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rows at different places in their answers (and one of another grammar), filled on
    two threads at once, hold what each matcher fills alone."""
    from blitzscale import structured

    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.9, seed=3, grammar=grammar())
    [out] = engine.generate([tokenizer.encode("z")], params)
    tokens = out.token_ids[:-1]
    grammars = Grammars(tokenizer, 512, [tokenizer.eos_token_id])
    other = Grammar("json_object")
    matchers = [grammars.matcher(grammar(), tokens[:k]) for k in range(0, len(tokens), 3)]
    matchers.append(grammars.matcher(other))
    rows = [2 * i + 1 for i in range(len(matchers))]  # (every other row: the rest have no grammar)
    alone = allocate_bitmask(2 * len(matchers) + 1, 512)
    for m, r in zip(matchers, rows, strict=True):
        m.fill(alone, r)
    monkeypatch.setattr(structured, "FILL_THREADS", 2)
    monkeypatch.setattr(structured, "ROWS_PER_THREAD", 1)
    batched = allocate_bitmask(2 * len(matchers) + 1, 512)
    structured.fill_bitmask(matchers, batched, rows)
    assert len(matchers) >= 3 and torch.equal(alone, batched)
    assert len({tuple(batched[r].tolist()) for r in rows}) > 2  # (the rows do differ)
