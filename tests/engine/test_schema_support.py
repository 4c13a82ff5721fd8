"""Which JSON Schema keywords a `response_format` may use (blitzscale/schema_support.py):
each one refused is one the grammar library really leaves unenforced (its grammar accepts
an answer that breaks it), and each kept is enforced (its grammar refuses such an answer).
When a new xgrammar starts enforcing a refused keyword, the first test fails: lift the
refusal then."""

from __future__ import annotations

import json
from typing import Any

import pytest

from blitzscale.schema_support import unsupported
from blitzscale.structured import _xgr


def accepts(schema: dict[str, Any], answer: Any) -> bool:
    """Whether the grammar compiled from `schema` (as structured.py compiles it: compact,
    strict) takes `answer` as the model would write it."""
    xgr = _xgr()
    from xgrammar.testing import _is_grammar_accept_string

    g = xgr.Grammar.from_json_schema(json.dumps(schema), any_whitespace=False, strict_mode=True)
    return bool(_is_grammar_accept_string(g, json.dumps(answer)))


INTS = {"type": "integer"}
REFUSED = [
    # (schema, an answer that breaks it, what the refusal names)
    ({"type": "array", "items": {"enum": [1, 2]}, "uniqueItems": True}, [1, 1], "uniqueItems (at #)"),
    ({"type": "object", "properties": {"n": {"not": INTS}}, "required": ["n"]}, {"n": 3},
     "not (at #/properties/n)"),
    ({"if": INTS, "then": {"minimum": 5}}, 3, "if / then / else"),
    ({"type": "object", "properties": {"a": INTS, "b": INTS}, "dependentRequired": {"a": ["b"]}}, {"a": 1},
     "dependentRequired"),
    ({"type": "object", "properties": {"a": INTS, "b": INTS}, "dependentSchemas": {"a": {"required": ["b"]}}},
     {"a": 1}, "dependentSchemas"),
    ({"allOf": [INTS, {"minimum": 5}]}, 3, "allOf with 2 schemas"),
    ({"oneOf": [INTS, {"type": "number"}]}, 3, "oneOf (at #)"),
    ({"type": "string", "format": "no-such-format"}, "@@ @@", "format 'no-such-format'"),
    ({"type": "string", "format": "idn-email"}, "@@ @@", "format 'idn-email'"),
]  # fmt: skip
KEPT = [
    # (schema, an answer that breaks it): enforced, so not refused
    ({"type": "array", "items": INTS, "minItems": 2, "maxItems": 3}, [1]),
    ({"type": "string", "format": "date"}, "not a date"),
    ({"type": "integer", "multipleOf": 5}, 3),
    ({"allOf": [{"type": "integer", "minimum": 5}]}, 3),
    ({"oneOf": [INTS, {"type": "string"}]}, True),  # told apart by type
    ({"oneOf": [{"const": "a"}, {"enum": ["b", "c"]}]}, "d"),
    (  # pydantic's discriminated union: $refs told apart by a required property's const
        {
            "$defs": {
                "Cat": {"type": "object", "properties": {"kind": {"const": "cat"}, "lives": INTS},
                        "required": ["kind", "lives"], "additionalProperties": False},
                "Dog": {"type": "object",
                        "properties": {"kind": {"const": "dog"}, "good": {"type": "boolean"}},
                        "required": ["kind", "good"], "additionalProperties": False},
            },
            "oneOf": [{"$ref": "#/$defs/Cat"}, {"$ref": "#/$defs/Dog"}],
        },
        {"kind": "dog", "lives": 9},
    ),
    (  # keywords' names as property names and inside instance values are not keywords
        {"type": "object", "properties": {"not": INTS, "if": {"enum": [{"not": 1}]}}, "required": ["not"],
         "additionalProperties": False},
        {"not": "x"},
    ),
]  # fmt: skip


@pytest.mark.parametrize(("schema", "answer", "names"), REFUSED)
def test_every_keyword_refused_is_one_the_library_leaves_unenforced(
    schema: dict[str, Any], answer: Any, names: str
) -> None:
    problem = unsupported(schema)
    assert problem is not None and names in problem, problem
    assert accepts(schema, answer), f"xgrammar now enforces what {names} asks: lift the refusal"


@pytest.mark.parametrize(("schema", "answer"), KEPT)
def test_what_the_library_enforces_is_kept(schema: dict[str, Any], answer: Any) -> None:
    assert unsupported(schema) is None
    assert not accepts(schema, answer)


def test_a_oneof_whose_branches_overlap_only_through_a_ref_is_refused() -> None:
    schema = {"$defs": {"N": {"type": "number"}}, "oneOf": [INTS, {"$ref": "#/$defs/N"}]}
    assert "oneOf (at #)" in (unsupported(schema) or "")
