"""huggingface_hub's `InferenceClient` (TGI's own client) against a real uvicorn server on
127.0.0.1: it posts to the server's root with `stream` in the body."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from huggingface_hub import InferenceClient
from huggingface_hub.errors import ValidationError

from blitzscale.api.app import create_app

from .fake_backend import FakeBackend
from .live_server import live_server


@pytest.fixture(scope="module")
def client() -> Iterator[InferenceClient]:
    with live_server(create_app(FakeBackend())) as url:
        yield InferenceClient(base_url=url, timeout=30)


def test_text_generation_whole_and_streamed(client: InferenceClient) -> None:
    assert client.text_generation("hello world", max_new_tokens=5) == "hello"
    out = client.text_generation("hello world", max_new_tokens=5, details=True)
    assert out.generated_text == "hello" and out.details is not None
    assert out.details.finish_reason == "length" and out.details.generated_tokens == 5
    assert "".join(client.text_generation("hello world", max_new_tokens=5, stream=True)) == "hello"


def test_a_bad_value_is_the_clients_validation_error(client: InferenceClient) -> None:
    with pytest.raises(ValidationError, match="max_new_tokens"):
        client.text_generation("hello", max_new_tokens=100_000)
