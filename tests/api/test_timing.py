"""Pure pieces: per-request timing, percentiles, and how validation errors are named."""

from __future__ import annotations

import pytest

from blitzscale.api.errors import describe_validation_error
from blitzscale.api.timing import Timing, percentile
from blitzscale.core.outputs import RequestOutput


def output(new: list[int], finished: bool = False) -> RequestOutput:
    return RequestOutput("r", new, new, "", "", finished, "length" if finished else None, 3)


def test_percentile_is_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 99) == 99.0
    assert percentile(values, 100) == 100.0
    assert percentile([5.0], 99) == 5.0
    assert percentile([], 99) == 0.0
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0


def test_timing_splits_multi_token_outputs() -> None:
    t = Timing(arrival=10.0)
    assert t.record(output([]), 10.5) == []  # an output without tokens: no TTFT yet
    assert t.record(output([1, 2]), 11.0) == [0.0]  # second token came with the first
    assert t.record(output([3, 4]), 11.2) == pytest.approx([0.1, 0.1])
    assert t.record(output([5], finished=True), 11.5) == pytest.approx([0.3])
    assert (t.queue_s, t.ttft_s, t.num_tokens) == (0.5, 1.0, 5)
    assert t.tgi_timings_ms() == {
        "output_length": 5,
        "queue_time": 500,
        "first_token_time": 1000,
        "total_time": 1500,
        "inference_time": 1000,
        "max_time_between_tokens": 300,
        "avg_time_between_tokens": 125,
        "p99_time_between_tokens": 300,
    }


def test_headers_before_the_end_have_only_the_start() -> None:
    t = Timing(arrival=0.0)
    t.record(output([1]), 0.2)
    assert t.tgi_headers("gen-1") == {
        "x-queue-time": "200",
        "x-first-token-time": "200",
        "x-request-id": "gen-1",
    }


def test_backend_queue_time_wins() -> None:
    t = Timing(arrival=0.0, backend_queue_s=0.05)
    t.record(output([1], finished=True), 0.2)
    assert t.tgi_timings_ms()["queue_time"] == 50 and t.tgi_timings_ms()["inference_time"] == 150


JSON_ERROR = {"type": "json_invalid", "loc": ("body", 3), "msg": "bad", "ctx": {"error": "Expecting value"}}
MISSING = {"type": "missing", "loc": ("body", "prompt"), "msg": "Field required"}
NESTED = {"type": "x", "loc": ("body", "messages", 2, "role"), "msg": "bad"}
UNION = [
    {"type": "x", "loc": ("body", "prompt", "str"), "msg": "not str"},
    {"type": "x", "loc": ("body", "prompt", "list[int]"), "msg": "not list"},
    {"type": "x", "loc": ("body", "seed"), "msg": "not int"},
]
NOT_A_DICT = {"type": "dict_type", "loc": ("body",), "msg": "Input should be a valid dictionary"}


@pytest.mark.parametrize(
    ("errors", "message", "param"),
    [
        ([], "invalid request body", None),
        ([JSON_ERROR], "malformed JSON body: Expecting value", None),
        ([MISSING], "prompt: Field required", "prompt"),
        ([NESTED], "messages[2].role: bad", "messages[2].role"),
        (UNION, "prompt: not str or not list", "prompt"),
        ([NOT_A_DICT], "request body: Input should be a valid dictionary", None),
    ],
)
def test_validation_errors_name_the_field(errors: list[dict], message: str, param: str | None) -> None:
    assert describe_validation_error(errors) == (message, param)
