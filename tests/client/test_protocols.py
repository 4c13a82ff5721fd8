"""Wire formats of the two streaming APIs, without a server."""

import pytest

from blitzscale.client.protocols import (
    PROMPT_TOKEN_ID,
    SALT_DIGITS,
    SALT_FIRST_ID,
    StreamEvent,
    parse_event,
    request_for,
    sse_data,
    synthetic_prompt,
    synthetic_prompt_ids,
)


def test_prompt_has_one_word_per_requested_token_after_its_salt() -> None:
    words = synthetic_prompt(300, salt=7).split()
    assert words[0] == "#7" and words[1:] == ["hello"] * 299
    assert synthetic_prompt(0) == "#0"


def test_prompts_of_different_requests_share_no_first_token() -> None:
    firsts = {tuple(synthetic_prompt_ids(64, salt=i)[:SALT_DIGITS]) for i in range(3000)}
    assert len(firsts) == 3000
    assert all(t < 512 for i in (0, 10**6, 2**32 - 1) for t in synthetic_prompt_ids(8, salt=i))
    assert synthetic_prompt_ids(2, salt=5) == [SALT_FIRST_ID, SALT_FIRST_ID]


def test_openai_request_asks_for_exact_length() -> None:
    path, body = request_for("openai", "llama", 5, 7)
    assert path == "/v1/completions"
    assert body["max_tokens"] == 7 and body["ignore_eos"] is True and body["temperature"] == 0
    assert body["stream"] is True and body["model"] == "llama"
    assert len(body["prompt"].split()) == 5


def test_token_id_prompt_has_exactly_the_requested_length() -> None:
    _, body = request_for("openai", None, 6, 7, token_ids=True, salt=1)
    assert body["prompt"] == [SALT_FIRST_ID] * 3 + [SALT_FIRST_ID + 1] + [PROMPT_TOKEN_ID] * 2
    assert request_for("openai", None, 0, 1, token_ids=True)[1]["prompt"] == [SALT_FIRST_ID]
    # a trace row of 0 tokens out (a request that failed upstream) asks for one, as simulate does
    assert request_for("openai", None, 3, 0)[1]["max_tokens"] == 1
    assert request_for("tgi", None, 3, 0)[1]["parameters"]["max_new_tokens"] == 1
    with pytest.raises(ValueError, match="token-id prompts need the openai protocol"):
        request_for("tgi", None, 5, 7, token_ids=True)


def test_tgi_request() -> None:
    path, body = request_for("tgi", None, 3, 9)
    assert path == "/generate_stream"
    assert body["parameters"]["max_new_tokens"] == 9
    assert body["inputs"] == "#0 hello hello"


def test_unknown_protocol() -> None:
    with pytest.raises(ValueError, match="unknown protocol 'grpc'"):
        request_for("grpc", None, 1, 1)


def test_sse_data_lines_only() -> None:
    assert sse_data('data: {"a": 1}') == '{"a": 1}'
    assert sse_data("data:[DONE]") == "[DONE]"
    assert sse_data(": keep-alive") is None
    assert sse_data("event: message") is None
    assert sse_data("") is None


def test_openai_events() -> None:
    assert parse_event("openai", '{"choices": [{"text": " hi"}]}') == StreamEvent(text=" hi", is_token=True)
    usage = parse_event("openai", '{"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 7}}')
    assert (usage.text, usage.prompt_tokens, usage.completion_tokens, usage.is_token) == ("", 5, 7, False)
    # a token with no text (held back, an EOS, no tokenizer) is still a token
    held = parse_event("openai", '{"choices": [{"text": "", "finish_reason": null}]}')
    closing = parse_event("openai", '{"choices": [{"text": "", "finish_reason": "length"}]}')
    assert (held.is_token, closing.is_token) == (True, True)
    assert parse_event("openai", "[DONE]").is_done


def test_tgi_events() -> None:
    token = parse_event("tgi", '{"token": {"id": 1, "text": " a", "special": false}, "generated_text": null}')
    assert token == StreamEvent(text=" a", is_token=True)
    special = parse_event("tgi", '{"token": {"id": 2, "text": "</s>", "special": true}}')
    assert special.text == ""
    last = parse_event(
        "tgi", '{"token": {"text": "b"}, "generated_text": "ab", "details": {"generated_tokens": 2}}'
    )
    assert (last.text, last.completion_tokens, last.is_done) == ("b", 2, True)


@pytest.mark.parametrize(
    ("data", "error"),
    [
        ('{"error": "overloaded", "error_type": "generation"}', "overloaded"),
        ('{"error": {"message": "bad prompt", "code": 400}}', "bad prompt"),
        ("not json", "bad event: 'not json'"),
        ("[1, 2]", "bad event: '[1, 2]'"),
    ],
)
def test_error_events(data: str, error: str) -> None:
    assert parse_event("openai", data).error == error
