# ruff: noqa: E501  (a table: one schema a line reads better than ruff's wrapping)
"""Twenty held-out JSON schemas for structured output's end-to-end test (none of them was
used while building it): nested objects, arrays, enums, required and optional fields,
numbers, integers and booleans with ranges, string patterns, minItems / maxItems, const,
anyOf, $defs references, nullable fields. Each string and array is bounded, so a greedy
small model that repeats itself still ends within MAX_TOKENS. Each comes with the user
message that asks for it."""

from __future__ import annotations

from typing import Any

MAX_TOKENS = 200


def _s(n: int = 24) -> dict[str, Any]:
    return {"type": "string", "maxLength": n}


def _obj(props: dict[str, Any], required: list[str] | None = None) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": props,
        "required": list(props) if required is None else required,
        "additionalProperties": False,
    }


SCHEMAS: list[tuple[str, str, dict[str, Any]]] = [
    ("person", "Describe a person.", _obj({"name": _s(), "age": {"type": "integer", "minimum": 0, "maximum": 120}})),
    ("city", "Give facts about Paris.", _obj({"city": _s(), "country": _s(), "population": {"type": "integer", "minimum": 0, "maximum": 40000000}})),
    ("weather", "Report the weather.", _obj({"temperature_c": {"type": "number", "minimum": -50, "maximum": 60}, "sunny": {"type": "boolean"}})),
    ("colour", "Pick a colour.", _obj({"colour": {"enum": ["red", "green", "blue"]}})),
    ("todo", "Write a short todo list.", _obj({"items": {"type": "array", "items": _s(16), "minItems": 1, "maxItems": 3}})),
    ("book", "Describe a book.", _obj({"title": _s(), "author": _obj({"first": _s(12), "last": _s(12)}), "year": {"type": "integer", "minimum": 1400, "maximum": 2030}})),
    ("point", "Give a 2D point.", _obj({"x": {"type": "number"}, "y": {"type": "number"}})),
    ("flags", "Which features are on?", _obj({"dark_mode": {"type": "boolean"}, "beta": {"type": "boolean"}, "notifications": {"type": "boolean"}})),
    ("order", "Make a pizza order.", _obj({"size": {"enum": ["small", "medium", "large"]}, "toppings": {"type": "array", "items": {"enum": ["cheese", "ham", "olives", "mushrooms"]}, "minItems": 1, "maxItems": 3}, "quantity": {"type": "integer", "minimum": 1, "maximum": 9}})),
    ("zip", "Give a US zip code.", _obj({"zip": {"type": "string", "pattern": "^[0-9]{5}$"}})),
    ("date", "When is the meeting?", _obj({"date": {"type": "string", "pattern": "^20[0-9]{2}-[01][0-9]-[0-3][0-9]$"}, "room": {"type": "integer", "minimum": 1, "maximum": 500}})),
    ("optional", "Describe a pet.", _obj({"name": _s(), "species": {"enum": ["cat", "dog", "fish"]}, "nickname": _s(12)}, required=["name", "species"])),
    ("matrix", "Write a 2x2 matrix.", _obj({"rows": {"type": "array", "items": {"type": "array", "items": {"type": "integer", "minimum": -9, "maximum": 9}, "minItems": 2, "maxItems": 2}, "minItems": 2, "maxItems": 2}})),
    ("const", "Say the API version.", _obj({"version": {"const": "v1"}, "ok": {"type": "boolean"}})),
    ("anyof", "Give an id.", _obj({"id": {"anyOf": [{"type": "integer", "minimum": 0, "maximum": 99999}, _s(8)]}})),
    ("nullable", "Who is the manager?", _obj({"manager": {"anyOf": [_s(), {"type": "null"}]}})),
    ("defs", "List two friends.", {"$defs": {"friend": _obj({"name": _s(12), "close": {"type": "boolean"}})}, **_obj({"friends": {"type": "array", "items": {"$ref": "#/$defs/friend"}, "minItems": 2, "maxItems": 2}})}),
    ("scores", "Score three players.", _obj({"scores": {"type": "array", "items": _obj({"player": _s(10), "score": {"type": "integer", "minimum": 0, "maximum": 100}}), "minItems": 1, "maxItems": 3}})),
    ("product", "Describe a product.", _obj({"sku": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{3}$"}, "price": {"type": "number", "minimum": 0, "maximum": 1000}, "in_stock": {"type": "boolean"}, "category": {"enum": ["tools", "toys", "food"]}})),
    ("event", "Describe an event.", _obj({"name": _s(), "attendees": {"type": "integer", "minimum": 0, "maximum": 1000}, "location": _obj({"city": _s(16), "indoor": {"type": "boolean"}}), "tags": {"type": "array", "items": _s(10), "maxItems": 2}})),
]  # fmt: skip
