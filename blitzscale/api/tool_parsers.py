"""Reading tool calls out of a model's text, as it streams.

A parser is fed a choice's text deltas and returns what the client may be shown so far:
`Content` (plain text), `Call` (one whole tool call: its name and its arguments, a JSON
object's text) or `Arguments` (more of the one call's arguments, for a named tool choice).
`finish()` returns what was held back. Fed the whole text at once, a parser gives what a
non-streaming response shows, so both are the same reading.

- `HermesParser`: calls as `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`
  blocks among text (the format of Hermes, Qwen2.5 and SmolLM2 templates, and the one this
  server teaches a model whose chat template has no tools: api/tools.py). A block that is
  not such a call (bad JSON, an unknown name) stays in the content, as the model wrote it.
- `Llama3JsonParser`: Llama 3.1's JSON calls (`{"name": ..., "parameters": {...}}`, several
  joined by `;`, maybe after `<|python_tag|>`): a text that starts with `{` is held to the
  end and read whole; any other streams as content.
- `RequiredParser`: `tool_choice: "required"`: the grammar made the text a JSON array of
  `{"name", "parameters"}` objects; each call is given when its object closes.
- `NamedParser`: a named tool choice: the grammar made the text the arguments themselves.
"""

from __future__ import annotations

import json
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any, Protocol

CALL_OPEN = "<tool_call>"
CALL_CLOSE = "</tool_call>"
PYTHON_TAG = "<|python_tag|>"


@dataclass(frozen=True)
class Content:
    text: str


@dataclass(frozen=True)
class Call:
    name: str
    arguments: str  # a JSON object's text


@dataclass(frozen=True)
class Arguments:
    text: str  # more of the named call's arguments


Piece = Content | Call | Arguments


class ToolCallParser(Protocol):
    def feed(self, text: str) -> list[Piece]: ...

    def finish(self) -> list[Piece]: ...


def call_of(obj: Any, names: Collection[str], arguments_key: str) -> Call | None:
    """The call a decoded JSON value names, if it is one: an object with a known `name` and
    an object under `arguments_key` (absent: no arguments)."""
    if not isinstance(obj, dict) or obj.get("name") not in names:
        return None
    args = obj.get(arguments_key, {})
    if not isinstance(args, dict):
        return None
    return Call(obj["name"], json.dumps(args, ensure_ascii=False))


def held_prefix(text: str, tag: str) -> int:
    """How many characters at the end of `text` could be the start of `tag` (held back
    from the content until the next delta says whether they are)."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-n:]):
            return n
    return 0


class HermesParser:
    def __init__(self, names: Collection[str]) -> None:
        self._names = names
        self._buf = ""  # text not yet given: a block being read, or a possible tag start
        self._in_call = False

    def feed(self, text: str) -> list[Piece]:
        self._buf += text
        out: list[Piece] = []
        while True:
            if self._in_call:
                end = self._buf.find(CALL_CLOSE)
                if end < 0:
                    return out
                block = self._buf[len(CALL_OPEN) : end]
                whole = self._buf[: end + len(CALL_CLOSE)]
                self._buf = self._buf[end + len(CALL_CLOSE) :]
                self._in_call = False
                out.append(self._read_block(block, whole))
                continue
            start = self._buf.find(CALL_OPEN)
            if start < 0:
                keep = held_prefix(self._buf, CALL_OPEN)
                shown, self._buf = self._buf[: len(self._buf) - keep], self._buf[len(self._buf) - keep :]
                if shown:
                    out.append(Content(shown))
                return out
            if start:
                out.append(Content(self._buf[:start]))
            self._buf = self._buf[start:]
            self._in_call = True

    def finish(self) -> list[Piece]:
        """An unclosed block (the text ran out) stays content, as written."""
        rest, self._buf, self._in_call = self._buf, "", False
        return [Content(rest)] if rest else []

    def _read_block(self, block: str, whole: str) -> Piece:
        try:
            call = call_of(json.loads(block), self._names, "arguments")
        except ValueError:
            call = None
        return call if call is not None else Content(whole)


class Llama3JsonParser:
    def __init__(self, names: Collection[str]) -> None:
        self._names = names
        self._buf = ""
        self._mode: str | None = None  # None: undecided; "json": held to the end; "text"

    def feed(self, text: str) -> list[Piece]:
        self._buf += text
        if self._mode is None:
            head = self._buf.lstrip()
            if not head or PYTHON_TAG.startswith(head):
                return []
            self._mode = "json" if head.startswith(("{", PYTHON_TAG)) else "text"
        if self._mode == "json":
            return []
        shown, self._buf = self._buf, ""
        return [Content(shown)] if shown else []

    def finish(self) -> list[Piece]:
        text, self._buf = self._buf, ""
        if self._mode != "json":
            return [Content(text)] if text else []
        body = text.strip().removeprefix(PYTHON_TAG)
        calls = []
        for part in body.split(";"):
            try:
                obj = json.loads(part)
            except ValueError:
                return [Content(text)]
            key = "parameters" if isinstance(obj, dict) and "parameters" in obj else "arguments"
            call = call_of(obj, self._names, key)
            if call is None:
                return [Content(text)]
            calls.append(call)
        return list(calls)


class RequiredParser:
    """Scans the array for its elements' ends (depth 1 back to 0, outside strings)."""

    def __init__(self, names: Collection[str]) -> None:
        self._names = names
        self._text = ""
        self._depth = 0
        self._in_string = False
        self._escaped = False
        self._element_start = -1
        self._given = 0

    def feed(self, text: str) -> list[Piece]:
        out: list[Piece] = []
        for ch in text:
            self._text += ch
            if self._in_string:
                if self._escaped:
                    self._escaped = False
                elif ch == "\\":
                    self._escaped = True
                elif ch == '"':
                    self._in_string = False
                continue
            if ch == '"':
                self._in_string = True
            elif ch in "{[":
                self._depth += 1
                if self._depth == 2 and ch == "{":
                    self._element_start = len(self._text) - 1
            elif ch in "}]":
                self._depth -= 1
                if self._depth == 1 and ch == "}" and self._element_start >= 0:
                    call = self._call(self._text[self._element_start :])
                    self._element_start = -1
                    if call is not None:
                        out.append(call)
                        self._given += 1
        return out

    def finish(self) -> list[Piece]:
        """A text that is not the array the grammar promised (cut short by max_tokens) is
        given as content, and no call of it."""
        return [Content(self._text)] if self._text and not self._given else []

    def _call(self, element: str) -> Call | None:
        try:
            return call_of(json.loads(element), self._names, "parameters")
        except ValueError:
            return None


class NamedParser:
    def feed(self, text: str) -> list[Piece]:
        return [Arguments(text)] if text else []

    def finish(self) -> list[Piece]:
        return []
