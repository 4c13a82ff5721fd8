"""Open-loop replay against the fake server: timing, measurements, failures."""

import time
from collections.abc import Callable
from contextlib import AbstractContextManager

import pytest

from blitzscale.client.replay import ReplayConfig, run
from blitzscale.client.traces import TraceRequest

from .fake_server import FakeServer

StartServer = Callable[..., AbstractContextManager[FakeServer]]
SLACK_S = 0.05
LOADED_S = 1.0  # what a busy 2-core machine may add to a measured wait (upper bounds only)


def config(url: str, **kwargs: object) -> ReplayConfig:
    return ReplayConfig(url=url, show_progress=False, **kwargs)  # type: ignore[arg-type]


def test_slow_server_does_not_delay_later_sends(fake_server: StartServer) -> None:
    schedule = [0.0, 0.1, 0.2, 0.3, 0.4, 0.5]
    requests = [TraceRequest(t, 8, 3) for t in schedule]
    with fake_server(ttft_s=1.0, tbt_s=0.05) as server:
        began = time.perf_counter()
        records = run(requests, config(server.url))
        elapsed = time.perf_counter() - began
    assert elapsed < 2.5  # closed loop would need > 6 s
    assert [r.status for r in records] == ["ok"] * 6
    for record, planned in zip(records, schedule, strict=True):
        assert record.scheduled_s == planned
        assert record.send_s == pytest.approx(planned, abs=SLACK_S)
    arrived = sorted(r.time for r in server.received)
    assert [t - arrived[0] for t in arrived] == pytest.approx(schedule, abs=SLACK_S)


def test_ttft_tbt_and_lengths_match_the_server(fake_server: StartServer) -> None:
    with fake_server(ttft_s=0.3, tbt_s=0.05, queue_time_ms="12.5") as server:
        [record] = run([TraceRequest(0.0, 16, 4)], config(server.url, model="m"))
    assert record.status == "ok" and record.error is None
    # never less than the server waited; more only by what a loaded machine adds (generous)
    assert 0.3 <= record.ttft_s < 0.3 + LOADED_S
    assert len(record.tbts_s) == 3
    assert all(0.05 - 0.01 <= gap < 0.05 + LOADED_S for gap in record.tbts_s)
    assert record.e2e_s == pytest.approx(record.ttft_s + sum(record.tbts_s), abs=SLACK_S)
    assert (record.input_tokens, record.output_tokens, record.requested_output_tokens) == (16, 4, 4)
    assert record.queue_s == pytest.approx(0.0125)
    body = server.received[0].body
    assert body["max_tokens"] == 4 and body["model"] == "m" and body["ignore_eos"] is True


def test_tgi_protocol_and_api_key(fake_server: StartServer) -> None:
    with fake_server(ttft_s=0.1, tbt_s=0.01) as server:
        [record] = run([TraceRequest(0.0, 5, 6)], config(server.url, protocol="tgi", api_key="sekrit"))
    assert record.status == "ok" and record.output_tokens == 6
    assert 0.1 <= record.ttft_s < 0.1 + LOADED_S
    assert record.queue_s is None
    received = server.received[0]
    assert received.path == "/generate_stream"
    assert received.headers["authorization"] == "Bearer sekrit"


def test_http_error_is_recorded_not_raised(fake_server: StartServer) -> None:
    with fake_server(status=503) as server:
        [record] = run([TraceRequest(0.0, 5, 6)], config(server.url))
    assert record.status == "error"
    assert record.error is not None and record.error.startswith("HTTP 503")
    assert record.ttft_s is None and record.e2e_s is None


def test_per_request_timeout(fake_server: StartServer) -> None:
    with fake_server(ttft_s=3.0) as server:
        began = time.perf_counter()
        [record] = run([TraceRequest(0.0, 5, 6)], config(server.url, timeout_s=0.3))
        assert time.perf_counter() - began < 1.0
    assert (record.status, record.error) == ("error", "timeout after 0.3 s")


def test_unreachable_server_is_an_error_record() -> None:
    [record] = run([TraceRequest(0.0, 5, 6)], config("http://127.0.0.1:9", timeout_s=2.0))
    assert record.status == "error" and "ConnectError" in (record.error or "")


def test_config_rejects_unknown_protocol() -> None:
    with pytest.raises(ValueError, match="unknown protocol"):
        ReplayConfig(url="http://127.0.0.1:1", protocol="grpc")
