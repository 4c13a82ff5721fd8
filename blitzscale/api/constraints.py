"""What holds a request's output to a shape, as one `Grammar` (compiled by xgrammar in
blitzscale/structured.py): OpenAI's `response_format` (json_object, json_schema), vLLM's
`structured_outputs` (`json`, `regex`, `choice`, `grammar`, `json_object`: one of them),
TGI's `grammar` (`{"type": "json" | "regex", "value": ...}`) and the tools' (api/tools.py).

Each is compiled at the edge (`check_grammar`, cached), so one the library cannot compile is
a 400 naming the field it came from, with the library's message, before anything is queued.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from blitzscale.api.backend import ServingBackend
from blitzscale.api.errors import ApiError
from blitzscale.api.protocol import SamplingFields, StructuredOutputs
from blitzscale.api.tokenize import off_loop
from blitzscale.core.sampling import GRAMMAR_KINDS, Grammar
from blitzscale.errors import InvalidRequestError


@dataclass(frozen=True)
class Constraint:
    grammar: Grammar
    field: str  # the request field it came from (a 400's `param`)


def choice_grammar(choices: list[str]) -> Grammar:
    """Exactly one of `choices` (an EBNF of their literals, escaped as JSON strings)."""
    return Grammar("ebnf", "root ::= " + " | ".join(json.dumps(c, ensure_ascii=False) for c in choices))


def schema_grammar(schema: Any, field: str) -> Grammar:
    """A JSON Schema given as an object, or as its JSON text (vLLM takes both)."""
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except ValueError as e:
            raise ApiError(400, f"{field} is not a JSON Schema's text: {e}", param=field) from None
    if not isinstance(schema, dict | bool):
        raise ApiError(
            400, f"{field} must be a JSON Schema (an object), got {type(schema).__name__}", param=field
        )
    return Grammar("json_schema", json.dumps(schema, ensure_ascii=False))


def structured_constraint(so: StructuredOutputs) -> Constraint:
    where = "structured_outputs"
    given = {
        name: value
        for name, value in (
            ("json", so.json_),
            ("regex", so.regex),
            ("choice", so.choice),
            ("grammar", so.grammar),
            ("json_object", so.json_object or None),
        )
        if value is not None
    }
    if len(given) != 1:
        names = ", ".join(given) or "none"
        message = f"{where} takes exactly one of json, regex, choice, grammar, json_object (got {names})"
        raise ApiError(400, message, param=where)
    ((name, value),) = given.items()
    field = f"{where}.{name}"
    if name == "json":
        return Constraint(schema_grammar(value, field), field)
    if name == "regex":
        return Constraint(Grammar("regex", value), field)
    if name == "choice":
        return Constraint(choice_grammar(value), field)
    if name == "grammar":
        return Constraint(Grammar("ebnf", value), field)
    return Constraint(Grammar("json_object"), field)


def response_format_grammar(body: SamplingFields) -> Grammar | None:
    """The grammar `response_format` asks for (None: text); a 400 naming what is wrong for
    a type this server does not have or a json_schema without a schema."""
    rf = body.response_format
    if rf is not None and rf.json_schema is not None and rf.type != "json_schema":
        message = f"response_format.json_schema is read only with type json_schema (the type is {rf.type!r})"
        raise ApiError(400, message, param="response_format.json_schema")
    if rf is None or rf.type == "text":
        return None
    if rf.type not in GRAMMAR_KINDS:
        kinds = ", ".join(("text", *GRAMMAR_KINDS))
        raise ApiError(
            400, f"response_format type {rf.type!r} is not supported (use {kinds})", param="response_format"
        )
    if rf.type == "json_object":
        return Grammar("json_object")
    if rf.json_schema is None or rf.json_schema.schema_ is None:
        raise ApiError(
            400, "response_format json_schema needs json_schema.schema", param="response_format.json_schema"
        )
    return Grammar("json_schema", json.dumps(rf.json_schema.schema_, ensure_ascii=False))


def constraint_of(body: SamplingFields) -> Constraint | None:
    """The request's constraint (None: free text): `response_format` or `structured_outputs`,
    not both."""
    rf = response_format_grammar(body)
    if body.structured_outputs is None:
        return None if rf is None else Constraint(rf, "response_format")
    if rf is not None:
        message = "response_format and structured_outputs both shape the output: send one"
        raise ApiError(400, message, param="structured_outputs")
    return structured_constraint(body.structured_outputs)


def tgi_constraint(grammar: dict[str, Any] | None) -> Constraint | None:
    """TGI's `parameters.grammar`: `{"type": "json", "value": schema}` (an object or its
    JSON text) or `{"type": "regex", "value": pattern}`."""
    if grammar is None:
        return None
    field = "parameters.grammar"
    extra = sorted(set(grammar) - {"type", "value"})
    if extra:
        raise ApiError(400, f"{field}.{extra[0]} is not a field of a grammar", param=f"{field}.{extra[0]}")
    kind, value = grammar.get("type"), grammar.get("value")
    if kind not in ("json", "regex"):
        raise ApiError(400, f"{field}.type must be 'json' or 'regex', got {kind!r}", param=f"{field}.type")
    if kind == "json":
        return Constraint(schema_grammar(value, f"{field}.value"), field)
    if not isinstance(value, str) or not value:
        raise ApiError(400, f"{field}.value must be a regex (a non-empty string)", param=f"{field}.value")
    return Constraint(Grammar("regex", value), field)


async def check_grammar(backend: ServingBackend, constraint: Constraint | None) -> None:
    """Compile a request's grammar at the edge, once (cached), so one the library cannot
    compile is a 400 with its message, naming the field, before anything is queued. A
    backend without `check_grammar` (a test's) leaves it to its engine's `validate`."""
    check = getattr(backend, "check_grammar", None)
    if constraint is None or not callable(check):
        return
    try:
        await off_loop(check, constraint.grammar)
    except InvalidRequestError as e:
        if constraint.field == "response_format":
            raise
        message = str(e).removeprefix("response_format: ")
        raise ApiError(400, f"{constraint.field}: {message}", param=constraint.field) from None
