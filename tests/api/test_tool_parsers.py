"""Reading tool calls out of text (api/tool_parsers.py): fed whole, and fed in every split
a stream could make, a parser gives the same content and calls."""

from __future__ import annotations

import json

import pytest

from blitzscale.api.tool_parsers import (
    Arguments,
    Call,
    Content,
    HermesParser,
    Llama3JsonParser,
    NamedParser,
    Piece,
    RequiredParser,
    ToolCallParser,
)

NAMES = ["get_weather", "add"]


def read(parser: ToolCallParser, deltas: list[str]) -> list[Piece]:
    """Every piece, with neighbouring contents joined (a stream may cut a text anywhere)."""
    pieces: list[Piece] = []
    for d in deltas:
        pieces += parser.feed(d)
    pieces += parser.finish()
    merged: list[Piece] = []
    for p in pieces:
        if isinstance(p, Content) and merged and isinstance(merged[-1], Content):
            merged[-1] = Content(merged[-1].text + p.text)
        elif not (isinstance(p, Content) and not p.text):
            merged.append(p)
    return merged


def splits(text: str) -> list[list[str]]:
    """The text whole, character by character, and cut in two at every place."""
    return [[text], list(text)] + [[text[:i], text[i:]] for i in range(1, len(text))]


def weather(city: str) -> str:
    return json.dumps({"city": city})


HERMES_CASES = [
    ("plain text, no call", [Content("plain text, no call")]),
    (
        'Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
        [Content("Let me look.\n"), Call("get_weather", weather("Paris"))],
    ),
    (
        '<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>\n'
        '<tool_call>{"name": "get_weather", "arguments": {"city": "<Oslo>"}}</tool_call>',
        [Call("add", '{"a": 1, "b": 2}'), Content("\n"), Call("get_weather", weather("<Oslo>"))],
    ),
    # not a call: unknown name, bad JSON, arguments not an object, an unclosed block
    (
        '<tool_call>{"name": "rm", "arguments": {}}</tool_call>',
        [Content('<tool_call>{"name": "rm", "arguments": {}}</tool_call>')],
    ),
    ("<tool_call>{oops}</tool_call> after", [Content("<tool_call>{oops}</tool_call> after")]),
    (
        '<tool_call>{"name": "add", "arguments": [1]}</tool_call>',
        [Content('<tool_call>{"name": "add", "arguments": [1]}</tool_call>')],
    ),
    ('a <tool_call>{"name": "add"', [Content('a <tool_call>{"name": "add"')]),
    ("ends in <tool_c", [Content("ends in <tool_c")]),  # a tag's start, then the end
    ('<tool_call>{"name": "add"}</tool_call>', [Call("add", "{}")]),  # no arguments: none
]


@pytest.mark.parametrize(("text", "expected"), HERMES_CASES)
def test_hermes_blocks_in_every_split(text: str, expected: list[Piece]) -> None:
    for deltas in splits(text):
        assert read(HermesParser(NAMES), deltas) == expected, deltas


def test_hermes_holds_back_only_what_may_be_a_tag() -> None:
    p = HermesParser(NAMES)
    assert p.feed("It is <") == [Content("It is ")]  # "<" may start a block
    assert p.feed("b>") == [Content("<b>")]  # it did not
    assert p.feed("<tool_call>{") == []
    assert p.feed('"name": "add", "arguments": {}}</tool_call>ok') == [Call("add", "{}"), Content("ok")]


LLAMA_CASES = [
    ("The weather is fine.", [Content("The weather is fine.")]),
    ('{"name": "get_weather", "parameters": {"city": "Rome"}}', [Call("get_weather", weather("Rome"))]),
    (
        '<|python_tag|>{"name": "add", "parameters": {"a": 1}}; {"name": "add", "arguments": {"a": 2}}',
        [Call("add", '{"a": 1}'), Call("add", '{"a": 2}')],
    ),
    ('{"name": "nope", "parameters": {}}', [Content('{"name": "nope", "parameters": {}}')]),
    ('{"name": "add", "parameters"', [Content('{"name": "add", "parameters"')]),
    ("  ", [Content("  ")]),
]


@pytest.mark.parametrize(("text", "expected"), LLAMA_CASES)
def test_llama3_json_in_every_split(text: str, expected: list[Piece]) -> None:
    for deltas in splits(text):
        assert read(Llama3JsonParser(NAMES), deltas) == expected, deltas


def test_llama3_text_streams_as_it_comes() -> None:
    p = Llama3JsonParser(NAMES)
    assert p.feed("  ") == []  # undecided
    assert p.feed("Hi") == [Content("  Hi")]
    assert p.feed(" there") == [Content(" there")]


def test_required_gives_each_call_when_its_object_closes() -> None:
    text = (
        '[{"name": "add", "parameters": {"a": "}]{\\"x"}}, '
        '{"name": "get_weather", "parameters": {"city": "Nice"}}]'
    )
    first_end = text.index("}}, ") + 2
    for deltas in splits(text):
        assert read(RequiredParser(NAMES), deltas) == [
            Call("add", json.dumps({"a": '}]{"x'})),
            Call("get_weather", weather("Nice")),
        ]
    p = RequiredParser(NAMES)
    assert p.feed(text[: first_end - 1]) == []
    assert p.feed(text[first_end - 1 : first_end]) == [Call("add", json.dumps({"a": '}]{"x'}))]


def test_required_cut_short_is_content() -> None:
    """max_tokens cut the array before any call closed: the text is the content."""
    text = '[{"name": "add", "parameters": {"a'
    assert read(RequiredParser(NAMES), [text]) == [Content(text)]
    whole = '[{"name": "add", "parameters": {}}, {"name": "add", "par'
    assert read(RequiredParser(NAMES), [whole]) == [Call("add", "{}")]  # the closed one


def test_named_passes_the_arguments_through() -> None:
    assert read(NamedParser(), ['{"ci', 'ty": "Nice"}']) == [Arguments('{"ci'), Arguments('ty": "Nice"}')]
