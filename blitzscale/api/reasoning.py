"""A reasoning model's thinking, apart from its answer: `<think>...</think>` (DeepSeek-R1,
Qwen3, SmolLM3 and the like) becomes `reasoning_content`, what follows `</think>` the
`content` (and the text tool calls are read from), as vLLM's reasoning parsers and
DeepSeek's API give them.

It is on for a model whose chat template writes `<think>` (the model was taught the tags).
A reply starts in its thinking when the prompt ends inside an open `<think>` (templates that
open it for the model) or when the reply itself opens with `<think>`; any other reply is all
content (a template that closes an empty think block when thinking is off gives one).
Streamed, a partial tag is held back until the next text tells what it is.
"""

from __future__ import annotations

from blitzscale.api.tool_parsers import held_prefix

OPEN = "<think>"
CLOSE = "</think>"
THINK_TAIL_TOKENS = 16  # a prompt's last tokens that tell whether it left a think block open


def thinks(template: str | None) -> bool:
    """Whether a chat template teaches the thinking tags."""
    return bool(template) and OPEN in template  # type: ignore[operator]


def opened_by(prompt_tail: str) -> bool:
    """Whether a prompt (its last characters) ends inside an open `<think>`."""
    return prompt_tail.rfind(OPEN) > prompt_tail.rfind(CLOSE)


class ReasoningSplit:
    """One choice's text, fed as it comes: (reasoning, content) of each piece."""

    def __init__(self, thinking: bool) -> None:
        self._state = "reasoning" if thinking else "start"
        self._buf = ""

    def feed(self, text: str, finished: bool = False) -> tuple[str, str]:
        self._buf += text
        reasoning = content = ""
        while True:
            if self._state == "start":  # (does the reply open a think block?)
                head = self._buf.lstrip()
                if OPEN.startswith(head) and head != OPEN and not finished:
                    return reasoning, content  # (nothing yet, or a tag's start)
                if head.startswith(OPEN):
                    self._buf, self._state = head[len(OPEN) :], "reasoning"
                else:
                    self._state = "content"
                continue
            if self._state == "reasoning":
                end = self._buf.find(CLOSE)
                if end >= 0:
                    reasoning += self._buf[:end]
                    self._buf, self._state = self._buf[end + len(CLOSE) :].lstrip("\n"), "after"
                    continue
                keep = 0 if finished else held_prefix(self._buf, CLOSE)
                reasoning += self._buf[: len(self._buf) - keep]
                self._buf = self._buf[len(self._buf) - keep :]
                return reasoning, content
            if self._state == "after":  # (the blank lines after </think> are the tags')
                self._buf = self._buf.lstrip("\n")
                if not self._buf and not finished:
                    return reasoning, content
                self._state = "content"
            content += self._buf
            self._buf = ""
            return reasoning, content
