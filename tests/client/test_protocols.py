"""Wire formats of the two streaming APIs, without a server."""

import pytest

from blitzscale.client.protocols import StreamEvent, parse_event, request_for, sse_data, synthetic_prompt


def test_prompt_has_one_word_per_requested_token() -> None:
    assert len(synthetic_prompt(300).split()) == 300
    assert synthetic_prompt(0) == "hello"


def test_openai_request_asks_for_exact_length() -> None:
    path, body = request_for("openai", "llama", 5, 7)
    assert path == "/v1/completions"
    assert body["max_tokens"] == 7 and body["ignore_eos"] is True and body["temperature"] == 0
    assert body["stream"] is True and body["model"] == "llama"
    assert len(body["prompt"].split()) == 5


def test_tgi_request() -> None:
    path, body = request_for("tgi", None, 3, 9)
    assert path == "/generate_stream"
    assert body["parameters"]["max_new_tokens"] == 9
    assert body["inputs"] == "hello hello hello"


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
    assert parse_event("openai", '{"choices": [{"text": " hi"}]}') == StreamEvent(text=" hi")
    usage = parse_event("openai", '{"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 7}}')
    assert (usage.text, usage.prompt_tokens, usage.completion_tokens) == ("", 5, 7)
    assert parse_event("openai", "[DONE]").is_done


def test_tgi_events() -> None:
    token = parse_event("tgi", '{"token": {"id": 1, "text": " a", "special": false}, "generated_text": null}')
    assert token == StreamEvent(text=" a")
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
