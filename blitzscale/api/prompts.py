"""The prompts of a `/v1/completions` request: a text, token ids, or a batch of either (cut
to their last tokens with `truncate_prompt_tokens`), and what `echo` puts before each
prompt's choices (a cut prompt's is its kept tokens' text)."""

from __future__ import annotations

from blitzscale.api.backend import ServingBackend
from blitzscale.api.errors import ApiError
from blitzscale.api.openai_format import Echo
from blitzscale.api.protocol import CompletionRequest
from blitzscale.api.tokenize import off_loop

MAX_PROMPTS = 2048  # prompts x n choices in one completions request (OpenAI's cap on a prompt batch)


async def completion_prompts(
    body: CompletionRequest, backend: ServingBackend
) -> tuple[list[str | None], list[list[int]]]:
    """The request's prompts (a text, token ids, or a batch of either), each as (its text
    as given, None for token ids) and its token ids."""
    prompt = body.prompt
    one_prompt = isinstance(prompt, str) or not prompt or isinstance(prompt[0], int)
    batch: list[str | list[int]] = [prompt] if one_prompt else list(prompt)  # type: ignore[list-item]
    choices = len(batch) * body.num_choices
    if choices > MAX_PROMPTS:
        message = f"{len(batch)} prompts x n={body.num_choices} is {choices} choices: at most {MAX_PROMPTS}"
        raise ApiError(400, message, param="prompt")
    texts: list[str | None] = []
    prompts: list[list[int]] = []
    for i, one in enumerate(batch):
        where = "prompt" if len(batch) == 1 else f"prompt[{i}]"
        if isinstance(one, str):
            if not one:  # tokenizers that add BOS would turn "" into a one-token prompt
                raise ApiError(400, f"{where} is empty", param=where)
            texts.append(one)
            prompts.append(await off_loop(backend.encode, one))
        else:
            texts.append(None)
            prompts.append([t for t in one if isinstance(t, int)])
    keep = body.truncate_prompt_tokens
    if keep is not None:
        kept = [truncated(ids, keep, backend.max_model_len, "truncate_prompt_tokens") for ids in prompts]
        texts = [
            text if len(k) == len(ids) else None for text, k, ids in zip(texts, kept, prompts, strict=True)
        ]
        prompts = kept
    return texts, prompts


def truncated(ids: list[int], keep: int, max_model_len: int, name: str) -> list[int]:
    """vLLM's `truncate_prompt_tokens` and TGI's `truncate`: the prompt's last `keep` tokens
    (-1: as many as the context holds); a prompt no longer than that is left whole."""
    if keep == 0 or keep < -1:
        raise ApiError(
            400, f"{name} must be at least 1 (or -1: the context's length), got {keep}", param=name
        )
    if keep > max_model_len:
        raise ApiError(
            400, f"{name} is {keep}, more than this model's context of {max_model_len} tokens", param=name
        )
    keep = max_model_len if keep == -1 else keep
    return ids[-keep:] if len(ids) > keep else ids


async def echoes_of(
    body: CompletionRequest, texts: list[str | None], prompts: list[list[int]], backend: ServingBackend
) -> list[Echo]:
    """What `echo` puts before each prompt's choices: the prompt as sent (its text, or its
    token ids decoded); none without `echo`. `max_tokens` 0 with it asks for the prompts
    alone (as vLLM, for scoring texts by their prompt logprobs); without it, 0 is refused
    as any count below 1."""
    if not body.echo:
        return []
    return [
        Echo(text if text is not None else await off_loop(backend.decode, ids), ids)
        for text, ids in zip(texts, prompts, strict=True)
    ]
