"""Which JSON Schema a `response_format` may use: the keywords the grammar library
(xgrammar 0.2.9, structured.py) enforces, and a refusal naming any other that would change
which answers are valid.

xgrammar compiles some keywords into nothing: answers would then break the schema the
client sent, with `finish_reason: "stop"`. Probed one by one (each with an instance that
breaks only that keyword: tests/engine/test_schema_support.py, which fails when a new
xgrammar starts enforcing one), these are not enforced: `uniqueItems`, `not`, `if` /
`then` / `else`, `dependentRequired`, `dependentSchemas` (and draft 7's `dependencies`),
every member of an `allOf` but the first, `oneOf`'s "exactly one" (it is taken as
`anyOf`), a string's `pattern` together with `minLength` / `maxLength` (the pattern alone
is kept), and the `format`s outside ENFORCED_FORMATS. Each is refused with a 400 naming it
and where it is, except a `oneOf` whose branches no instance can match twice (told apart
by `type`, `const` / `enum`, or a required property's `const` / `enum`: pydantic's
discriminated unions), where "any" and "exactly one" agree. Annotations (`title`,
`description`, `default`, `examples`, `contentEncoding`, ...) change no answer's validity
and pass.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

ENFORCED_FORMATS = frozenset(
    {
        "date-time", "time", "date", "duration", "email", "hostname", "ipv4", "ipv6", "uuid",
        "uri", "uri-reference", "uri-template", "json-pointer", "relative-json-pointer",
    }
)  # fmt: skip
NOT_ENFORCED = {
    "not": "not",
    "if": "if / then / else",
    "then": "if / then / else",
    "else": "if / then / else",
    "dependentRequired": "dependentRequired",
    "dependentSchemas": "dependentSchemas",
    "dependencies": "dependencies",
}
# keywords whose value is a schema, a list of schemas, or a map of name -> schema
_ONE = ("items", "additionalItems", "additionalProperties", "contains", "propertyNames",
        "unevaluatedItems", "unevaluatedProperties", "not", "if", "then", "else")  # fmt: skip
_LIST = ("allOf", "anyOf", "oneOf", "prefixItems", "items")
_MAP = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_NUMBERS = {"integer", "number"}


def unsupported(schema: Any) -> str | None:
    """What in `schema` the grammar would not enforce, with where it is (`#/properties/x`);
    None if everything it says is enforced."""
    for where, node in _subschemas(schema, "#"):
        for key, what in NOT_ENFORCED.items():
            if key in node:
                return f"{what} (at {where}) is not enforced by this server's grammar library"
        if node.get("uniqueItems") is True:
            return f"uniqueItems (at {where}) is not enforced by this server's grammar library"
        if isinstance(node.get("allOf"), list) and len(node["allOf"]) > 1:
            return (
                f"allOf with {len(node['allOf'])} schemas (at {where}) is not enforced by this "
                "server's grammar library (only one schema in allOf is)"
            )
        fmt = node.get("format")
        if isinstance(fmt, str) and fmt not in ENFORCED_FORMATS:
            known = ", ".join(sorted(ENFORCED_FORMATS))
            return f"format {fmt!r} (at {where}) is not enforced by this server (enforced: {known})"
        lengths = any(isinstance(node.get(k), int) for k in ("minLength", "maxLength"))
        if isinstance(node.get("pattern"), str) and lengths:
            return f"a string's pattern together with minLength or maxLength (at {where}) is not supported"
        branches = node.get("oneOf")
        if isinstance(branches, list) and not _pairwise_disjoint(branches, schema):
            return (
                f"oneOf (at {where}) whose branches one answer could match twice is enforced as anyOf "
                "by this server's grammar library: use anyOf, or branches told apart by type, const or "
                "enum (of a required property, for objects)"
            )
    return None


def _subschemas(node: Any, where: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every schema object in `node` (itself first) with its JSON pointer; instance values
    (`enum`, `const`, `default`, `examples`) are not walked."""
    if not isinstance(node, dict):
        return
    yield where, node
    for key in _ONE:
        if isinstance(node.get(key), dict):
            yield from _subschemas(node[key], f"{where}/{key}")
    for key in _LIST:
        if isinstance(node.get(key), list):
            for i, sub in enumerate(node[key]):
                yield from _subschemas(sub, f"{where}/{key}/{i}")
    for key in _MAP:
        if isinstance(node.get(key), dict):
            for name, sub in node[key].items():
                yield from _subschemas(sub, f"{where}/{key}/{name}")


def _resolve(node: Any, root: Any) -> Any:
    """A local `$ref` (`#/$defs/Name`) followed, a few levels at most."""
    for _ in range(8):
        ref = node.get("$ref") if isinstance(node, dict) else None
        if not (isinstance(ref, str) and ref.startswith("#/")):
            return node
        target: Any = root
        for part in ref[2:].split("/"):
            target = (
                target.get(part.replace("~1", "/").replace("~0", "~")) if isinstance(target, dict) else None
            )
        node = target
    return node


def _types(node: dict[str, Any]) -> set[str] | None:
    t = node.get("type")
    if isinstance(t, str):
        t = [t]
    if not isinstance(t, list):
        return None
    types = set(t)
    return types | {"integer"} if "number" in types else types  # an integer is a number


def _values(node: dict[str, Any]) -> list[Any] | None:
    if "const" in node:
        return [node["const"]]
    return node["enum"] if isinstance(node.get("enum"), list) else None


def _disjoint(a: Any, b: Any, root: Any) -> bool:
    a, b = _resolve(a, root), _resolve(b, root)
    if not (isinstance(a, dict) and isinstance(b, dict)):
        return False
    ta, tb = _types(a), _types(b)
    if ta is not None and tb is not None and not ta & tb:
        return True
    va, vb = _values(a), _values(b)
    if va is not None and vb is not None and not any(x == y for x in va for y in vb):
        return True
    required = set(a.get("required") or ()) & set(b.get("required") or ())
    pa, pb = a.get("properties") or {}, b.get("properties") or {}
    return any(name in pa and name in pb and _disjoint(pa[name], pb[name], root) for name in required)


def _pairwise_disjoint(branches: list[Any], root: Any) -> bool:
    return all(_disjoint(a, b, root) for i, a in enumerate(branches) for b in branches[i + 1 :])
