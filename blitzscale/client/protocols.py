"""The two HTTP streaming APIs the replay speaks: request bodies and server-sent events.

Pure functions, so each wire format is tested without a server. `openai` is the
`/v1/completions` API (vLLM, SGLang, our server); `tgi` is Hugging Face TGI's
`/generate_stream`. Both stream one `data:` line per event.
"""

import json
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

from blitzscale.client.traces import MOONCAKE_BLOCK_TOKENS

PROTOCOLS = ("openai", "tgi")

# One word that common tokenizers encode as one token, also after a space, so a prompt of
# N words is close to N tokens whatever the model.
PROMPT_WORD = "hello"
# The token of a token-id prompt (`--token-ids`): inside every vocabulary we ship, tiny ones too,
# and no common tokenizer's BOS/EOS.
PROMPT_TOKEN_ID = 100
# A request's own first tokens (its index in base SALT_BASE, SALT_DIGITS of them, ids from
# SALT_FIRST_ID: inside every vocabulary we ship), so that no two requests of a replay
# share a prefix a server could cache: a trace's prompts are lengths, not shared text.
SALT_FIRST_ID = 101
SALT_BASE = 256
SALT_DIGITS = 4
# Prompts built from a trace's prefix-block hashes (Mooncake's `hash_ids`): every block is a
# function of its hash id alone, so requests whose lists share a leading run of ids share
# exactly those blocks of tokens, a prefix a server can cache, and no salt. A block opens with
# its id spelled in HASH_DIGITS digits, least significant first (token-id prompts: ids from
# SALT_FIRST_ID in base SALT_BASE; text: words of HASH_WORDS), so blocks of different ids
# differ once they hold that many tokens (blocks of k < HASH_DIGITS tokens: ids below base^k);
# pseudo-random symbols of the id fill the rest.
HASH_DIGITS = 6
# Words that SmolLM2's tokenizer (and GPT-2-style ones generally) encodes as one token with
# or without a space before it: a text prompt of N of them, space-separated, is N tokens, and
# a shared run of blocks is a shared run of tokens.
# fmt: off
HASH_WORDS: tuple[str, ...] = (
    "the", "of", "and", "to", "in", "is", "for", "on", "with", "as", "at", "by", "from", "that",
    "this", "it", "be", "are", "was", "or", "an", "not", "but", "all", "can", "has", "have", "will",
    "one", "two", "new", "more", "time", "year", "day", "way", "work", "life", "home", "world",
    "city", "water", "light", "house", "place", "road", "book", "music", "game", "team", "school",
    "story", "money", "power", "table", "river", "tree", "fire", "stone", "green", "blue", "red",
    "small", "large",
)
# fmt: on
_MASK64 = (1 << 64) - 1


@dataclass(frozen=True)
class StreamEvent:
    """What one SSE event carried: generated text, token counts the server reported, an error."""

    text: str = ""
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    error: str | None = None
    is_done: bool = False
    # The event stands for generated tokens: an openai chunk with a choice, also one with no
    # text (held back, an EOS, a model with no tokenizer), as vLLM's and our server's streams
    # send one per step; the usage chunk has none. TGI: a token with text.
    is_token: bool = False


def synthetic_prompt(num_tokens: int, salt: int = 0) -> str:
    """A prompt of `num_tokens` words, about as many tokens (at least one word: empty
    prompts are rejected), the first of them `salt` (a request's index: prompts of
    different requests share no prefix)."""
    return " ".join([f"#{salt}", *[PROMPT_WORD] * (max(num_tokens, 1) - 1)])


def synthetic_prompt_ids(num_tokens: int, salt: int = 0) -> list[int]:
    """A prompt of exactly `num_tokens` token ids (at least one) whose first ones spell
    `salt` (a request's index: prompts of different requests share no prefix)."""
    digits = [SALT_FIRST_ID + (salt // SALT_BASE**i) % SALT_BASE for i in reversed(range(SALT_DIGITS))]
    n = max(num_tokens, 1)
    return (digits + [PROMPT_TOKEN_ID] * n)[:n]


def _mix(x: int) -> int:
    """A 64-bit integer hash (the splitmix64 finaliser): deterministic on every platform."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


@lru_cache(maxsize=4096)
def _block_symbols(hash_id: int, length: int, base: int) -> tuple[int, ...]:
    """`length` symbols in [0, base) that depend on `hash_id` only: its HASH_DIGITS digits in
    `base` (least significant first), then pseudo-random ones seeded by it."""
    spelled = [(hash_id // base**i) % base for i in range(HASH_DIGITS)]
    filler = [_mix(hash_id * 1_000_003 + i) % base for i in range(max(length - HASH_DIGITS, 0))]
    return tuple((spelled + filler)[:length])


def _hashed_symbols(num_tokens: int, hash_ids: Sequence[int], block_tokens: int, base: int) -> list[int]:
    """One block of `block_tokens` symbols per hash id, cut to `num_tokens` (fewer if the ids
    run out)."""
    if block_tokens < 1:
        raise ValueError(f"block_tokens must be >= 1, got {block_tokens}")
    out: list[int] = []
    for hash_id in hash_ids:
        if len(out) >= num_tokens:
            break
        out.extend(_block_symbols(hash_id, block_tokens, base))
    return out[:num_tokens]


def hashed_prompt_ids(
    num_tokens: int, hash_ids: Sequence[int], block_tokens: int = MOONCAKE_BLOCK_TOKENS, salt: int = 0
) -> list[int]:
    """A prompt of exactly `num_tokens` token ids (at least one): one block of `block_tokens`
    ids per hash id, each block a function of its id alone. Tokens past the last block (a
    trace whose ids cover less than its length) are a salted prompt: shared by no one."""
    n = max(num_tokens, 1)
    ids = [SALT_FIRST_ID + s for s in _hashed_symbols(n, hash_ids, block_tokens, SALT_BASE)]
    return ids + (synthetic_prompt_ids(n - len(ids), salt) if len(ids) < n else [])


def hashed_prompt(
    num_tokens: int, hash_ids: Sequence[int], block_tokens: int = MOONCAKE_BLOCK_TOKENS, salt: int = 0
) -> str:
    """The text form of `hashed_prompt_ids`: `num_tokens` space-separated words of HASH_WORDS
    (one token each for SmolLM2's tokenizer), blocks as there; a salted tail if the ids run out."""
    n = max(num_tokens, 1)
    words = [HASH_WORDS[s] for s in _hashed_symbols(n, hash_ids, block_tokens, len(HASH_WORDS))]
    if len(words) < n:
        words.append(synthetic_prompt(n - len(words), salt))
    return " ".join(words)


def request_for(
    protocol: str,
    model: str | None,
    input_tokens: int,
    output_tokens: int,
    *,
    token_ids: bool = False,
    salt: int = 0,
    hash_ids: Sequence[int] = (),
    block_tokens: int = MOONCAKE_BLOCK_TOKENS,
) -> tuple[str, dict]:
    """The (path, JSON body) asking for exactly `output_tokens` tokens after the prompt (at
    least one: a trace row of 0, a request that failed upstream, is sent as 1, as an API
    refuses max_tokens 0 and the simulator sends it; so is a prompt of 0 tokens).
    `token_ids`: the prompt goes as a list of token ids (openai only), which models without
    a tokenizer (random weights) accept and which has exactly `input_tokens` tokens.
    `salt`: the request's index, which starts its prompt (no two share a cached prefix),
    unless the request has `hash_ids`: then its prompt is one block of `block_tokens` tokens
    per id (`hashed_prompt`), shared with every request whose ids start the same way."""
    if token_ids and protocol != "openai":
        raise ValueError(f"token-id prompts need the openai protocol, not {protocol!r}")
    output_tokens = max(1, output_tokens)
    prompt: str | list[int]
    if hash_ids:
        prompt = (
            hashed_prompt_ids(input_tokens, hash_ids, block_tokens, salt)
            if token_ids
            else hashed_prompt(input_tokens, hash_ids, block_tokens, salt)
        )
    else:
        prompt = (
            synthetic_prompt_ids(input_tokens, salt) if token_ids else synthetic_prompt(input_tokens, salt)
        )
    if protocol == "openai":
        body: dict = {
            "prompt": prompt,
            "max_tokens": output_tokens,
            "ignore_eos": True,  # vLLM/SGLang extension: generate the trace's length, not until EOS
            "temperature": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if model:
            body["model"] = model
        return "/v1/completions", body
    if protocol == "tgi":
        params = {"max_new_tokens": output_tokens, "details": True}
        return "/generate_stream", {"inputs": prompt, "parameters": params}
    raise ValueError(f"unknown protocol {protocol!r}; expected one of {', '.join(PROTOCOLS)}")


def sse_data(line: str) -> str | None:
    """The payload of a `data:` line; None for comments, `event:`/`id:` fields and blank lines."""
    if not line.startswith("data:"):
        return None
    return line[5:].strip()


def parse_event(protocol: str, data: str) -> StreamEvent:
    """Decode one `data:` payload of `protocol`. A payload that is not JSON is an error event,
    not an exception: the replay records it against the request and moves on."""
    if data == "[DONE]":
        return StreamEvent(is_done=True)
    try:
        obj = json.loads(data)
    except json.JSONDecodeError:
        return StreamEvent(error=f"bad event: {data[:200]!r}")
    if not isinstance(obj, dict):
        return StreamEvent(error=f"bad event: {data[:200]!r}")
    if "error" in obj:
        return StreamEvent(error=_error_text(obj["error"]))
    return _openai_event(obj) if protocol == "openai" else _tgi_event(obj)


def _error_text(error: object) -> str:
    if isinstance(error, dict):
        return str(error.get("message", error))
    return str(error)


def _openai_event(obj: dict) -> StreamEvent:
    choices = obj.get("choices") or [{}]
    first = choices[0] if isinstance(choices[0], dict) else {}
    text = first.get("text") or ""
    usage = obj.get("usage") or {}
    return StreamEvent(
        text=text,
        prompt_tokens=usage.get("prompt_tokens"),
        completion_tokens=usage.get("completion_tokens"),
        is_token=bool(obj.get("choices")),
    )


def _tgi_event(obj: dict) -> StreamEvent:
    token = obj.get("token") or {}
    text = "" if token.get("special") else token.get("text") or ""
    details = obj.get("details") or {}
    return StreamEvent(
        text=text,
        completion_tokens=details.get("generated_tokens"),
        is_done=obj.get("generated_text") is not None,
        is_token=bool(text),
    )
