"""Trace parsing: every format, the real shipped traces, and errors that point at the bad line."""

from pathlib import Path

import pytest

from blitzscale.client.traces import (
    TraceFormatError,
    TraceRequest,
    load_trace,
    scale_hash_blocks,
    transform,
    with_lengths,
)

TRACES = Path(__file__).resolve().parents[2] / ".." / "shared" / "traces"
AZURE_CODE = TRACES / "azure_llm_2023" / "AzureLLMInferenceTrace_code.csv"
MOONCAKE = TRACES / "mooncake_fast25" / "synthetic_trace.jsonl"


def write(tmp_path: Path, name: str, text: str, newline: str = "\n") -> Path:
    path = tmp_path / name
    path.write_bytes(text.replace("\n", newline).encode())
    return path


def test_azure_2023_crlf_without_final_newline(tmp_path: Path) -> None:
    text = (
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:17:03.9799600,4808,10\n"
        "2023-11-16 18:17:04.0319600,3180,8\n"
        "2023-11-16 18:17:05.9799600,110,27"
    )
    path = write(tmp_path, "azure.csv", text, newline="\r\n")
    assert load_trace(path, "azure") == [
        TraceRequest(0.0, 4808, 10),
        TraceRequest(pytest.approx(0.052), 3180, 8),
        TraceRequest(2.0, 110, 27),
    ]


def test_azure_2024_timestamps_with_mixed_digits_and_offset(tmp_path: Path) -> None:
    text = (
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2024-05-10 00:00:00.009930+00:00,100,5\n"
        "2024-05-10 00:00:01.5+00:00,200,6\n"
        "2024-05-10 00:01:00+00:00,300,7\n"
    )
    requests = load_trace(write(tmp_path, "azure24.csv", text), "azure")
    assert [r.arrival_s for r in requests] == [0.0, pytest.approx(1.49007), pytest.approx(59.99007)]
    assert [r.input_tokens for r in requests] == [100, 200, 300]


@pytest.mark.skipif(not AZURE_CODE.exists(), reason="shared traces not present")
def test_real_azure_code_trace_first_rows_and_whole_file(tmp_path: Path) -> None:
    head = b"\r\n".join(AZURE_CODE.read_bytes().split(b"\r\n")[:4])
    requests = load_trace(write(tmp_path, "head.csv", head.decode()), "azure")
    assert requests[:2] == [TraceRequest(0.0, 4808, 10), TraceRequest(pytest.approx(0.052), 3180, 8)]
    assert len(requests) == 3
    whole = load_trace(AZURE_CODE, "azure")
    assert len(whole) == 8819
    assert whole[-1].arrival_s == pytest.approx(3435.95, abs=0.01)  # README: span 3,436 s


@pytest.mark.skipif(not MOONCAKE.exists(), reason="shared traces not present")
def test_real_mooncake_trace() -> None:
    requests = load_trace(MOONCAKE, "mooncake")
    assert len(requests) == 3993
    assert requests[0] == TraceRequest(0.0, 40160, 6, tuple(range(79)))
    assert requests[-1].arrival_s == pytest.approx(1022.025)
    # README: hash_ids are 512-token blocks, the last one partial
    assert all(len(r.hash_ids) == -(-r.input_tokens // 512) for r in requests)


SLICE = Path(__file__).resolve().parents[2] / "blitzscale" / "data" / "mooncake_synthetic_slice.jsonl"


@pytest.mark.skipif(not MOONCAKE.exists(), reason="shared traces not present")
def test_shipped_slice_is_the_last_rows_of_the_trace_verbatim() -> None:
    """blitzscale/data/README.md says which rows; the bytes must be the upstream ones."""
    lines = MOONCAKE.read_bytes().splitlines(keepends=True)
    assert SLICE.read_bytes() == b"".join(lines[3793:])


def test_shipped_slice_reuses_prefixes() -> None:
    requests = load_trace(SLICE, "mooncake")
    assert len(requests) == 200
    seen: set[int] = set()
    shared = 0
    for r in requests:
        shared += next((i for i, h in enumerate(r.hash_ids) if h not in seen), len(r.hash_ids))
        seen.update(r.hash_ids)
    assert shared / sum(len(r.hash_ids) for r in requests) > 0.6  # what makes it worth replaying


BURSTGPT_1 = """Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type
5,ChatGPT,472,18,490,Conversation log
45,ChatGPT,1087,0,1087,Conversation log
118,GPT-4,417,276,693,API log
"""

BURSTGPT_3 = """Timestamp,Session ID,Elapsed time,Model,Request tokens,Response tokens,Total tokens,Log Type
10.5,s1,1.2,ChatGPT,100,0,100,Conversation log
11.0,s1,1.3,ChatGPT,200,20,220,Conversation log
"""


def test_burstgpt_both_column_layouts(tmp_path: Path) -> None:
    assert load_trace(write(tmp_path, "b1.csv", BURSTGPT_1), "burstgpt") == [
        TraceRequest(0.0, 472, 18),
        TraceRequest(40.0, 1087, 0),
        TraceRequest(113.0, 417, 276),
    ]
    assert load_trace(write(tmp_path, "b3.csv", BURSTGPT_3), "burstgpt") == [
        TraceRequest(0.0, 100, 0),
        TraceRequest(0.5, 200, 20),
    ]


def test_burstgpt_skips_failed_rows_only_when_asked(tmp_path: Path) -> None:
    path = write(tmp_path, "b1.csv", BURSTGPT_1)
    assert len(load_trace(path, "burstgpt")) == 3
    kept = load_trace(path, "burstgpt", skip_failed=True)
    assert [(r.arrival_s, r.output_tokens) for r in kept] == [(0.0, 18), (113.0, 276)]


def test_mooncake_jsonl(tmp_path: Path) -> None:
    text = (
        '{"timestamp": 1000, "input_length": 512, "output_length": 10, "hash_ids": [0]}\n'
        "\n"
        '{"timestamp": 3500, "input_length": 1024, "output_length": 20, "hash_ids": [0, 1]}\n'
    )
    assert load_trace(write(tmp_path, "m.jsonl", text), "mooncake") == [
        TraceRequest(0.0, 512, 10, (0,)),
        TraceRequest(2.5, 1024, 20, (0, 1)),
    ]


def test_mooncake_without_hash_ids_and_other_formats_have_none(tmp_path: Path) -> None:
    requests = load_trace(write(tmp_path, "m.jsonl", MOONCAKE_ROW), "mooncake")
    assert requests == [TraceRequest(0.0, 1, 1, ())]
    assert load_trace(write(tmp_path, "b1.csv", BURSTGPT_1), "burstgpt")[0].hash_ids == ()


def test_transform_and_synthetic_arrivals_keep_hash_ids() -> None:
    trace = [TraceRequest(0.0, 900, 10, (3, 4)), TraceRequest(1.0, 100, 5, (3,))]
    shaped = transform(trace, time_scale=2.0, rate_scale=2.0, max_input=600)
    assert [r.hash_ids for r in shaped] == [(3, 4), (3, 4), (3,), (3,)]
    assert [r.input_tokens for r in shaped] == [600, 600, 100, 100]
    assert [r.hash_ids for r in with_lengths([0.0, 0.5, 0.7], trace, 1, 1)] == [(3, 4), (3,), (3, 4)]


def test_scale_hash_blocks_rounds_up_and_keeps_the_block_count() -> None:
    trace = [
        TraceRequest(0.0, 40160, 6, tuple(range(79))),
        TraceRequest(1.0, 512, 1, (0,)),
        TraceRequest(2.0, 513, 1, (0, 1)),
        TraceRequest(3.0, 1, 1, (9,)),
        TraceRequest(4.0, 777, 2),  # no hash ids: left alone
    ]
    scaled = scale_hash_blocks(trace, 16)
    assert [r.input_tokens for r in scaled] == [1255, 16, 17, 1, 777]
    assert all(-(-r.input_tokens // 16) == len(r.hash_ids) for r in scaled if r.hash_ids)
    assert [r.hash_ids for r in scaled] == [r.hash_ids for r in trace]
    assert scale_hash_blocks(trace, 512) == trace
    assert [r.input_tokens for r in scale_hash_blocks(trace, 1024)][:3] == [80320, 1024, 1026]
    with pytest.raises(ValueError, match="block_tokens must be >= 1, got 0"):
        scale_hash_blocks(trace, 0)


@pytest.mark.parametrize("header", ["timestamp_ms,prefill,decode\n", ""])
def test_processed_with_or_without_header(tmp_path: Path, header: str) -> None:
    path = write(tmp_path, "p.csv", header + "100,10,1\n350.5,20,2\n100,30,3\n")
    assert load_trace(path, "processed") == [
        TraceRequest(0.0, 10, 1),
        TraceRequest(0.0, 30, 3),  # unsorted rows come out sorted by time, stable
        TraceRequest(pytest.approx(0.2505), 20, 2),
    ]


def test_empty_trace_is_empty(tmp_path: Path) -> None:
    assert load_trace(write(tmp_path, "e.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n"), "azure") == []


AZURE_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
MOONCAKE_ROW = '{"timestamp": 0, "input_length": 1, "output_length": 1}\n'
MALFORMED = [
    (
        "azure",
        AZURE_HEADER + "2023-11-16 18:17:03.9,1,2\n2023-11-16 18:17:04,x,2\n",
        3,
        "ContextTokens must be",
    ),
    ("azure", AZURE_HEADER + "yesterday,1,2\n", 2, "TIMESTAMP is not a date-time: 'yesterday'"),
    (
        "azure",
        "TIMESTAMP,ContextTokens\n2023-11-16 18:17:03.9,1\n",
        1,
        "header lacks column(s) GeneratedTokens",
    ),
    ("burstgpt", BURSTGPT_1 + "200,ChatGPT,5\n", 5, "expected 6 columns, got 3"),
    ("burstgpt", BURSTGPT_1.replace("472", "-3"), 2, "Request tokens must be >= 0, got -3"),
    ("mooncake", MOONCAKE_ROW + '{"timestamp": 1,\n', 2, "not JSON"),
    ("mooncake", '{"timestamp": 0, "input_length": 1}\n', 1, "missing key 'output_length'"),
    ("mooncake", MOONCAKE_ROW.replace('"input_length": 1', '"input_length": 1.5'), 1, "input_length must be"),
    ("mooncake", MOONCAKE_ROW + MOONCAKE_ROW.replace("}", ', "hash_ids": 7}'), 2, "hash_ids must be a list"),
    (
        "mooncake",
        MOONCAKE_ROW.replace("}", ', "hash_ids": [0, -1]}'),
        1,
        "hash_ids[1] must be an integer >= 0",
    ),
    ("mooncake", MOONCAKE_ROW.replace("}", ', "hash_ids": [1.5]}'), 1, "hash_ids[0] must be an integer >= 0"),
    ("mooncake", MOONCAKE_ROW.replace("}", ', "hash_ids": [true]}'), 1, "got True"),
    ("mooncake", MOONCAKE_ROW.replace("}", ', "hash_ids": ["3"]}'), 1, "got '3'"),
    ("processed", "0,1,1\n5,2\n", 2, "expected 3 columns"),
    ("processed", "0,1,1\nsoon,2,2\n", 2, "timestamp_ms must be a number, got 'soon'"),
]


@pytest.mark.parametrize(("fmt", "text", "line", "what"), MALFORMED)
def test_malformed_row_names_file_line_and_problem(
    tmp_path: Path, fmt: str, text: str, line: int, what: str
) -> None:
    path = write(tmp_path, f"bad.{fmt}", text)
    with pytest.raises(TraceFormatError) as info:
        load_trace(path, fmt)
    assert str(info.value).startswith(f"{path} line {line}: ")
    assert what in str(info.value)
    assert isinstance(info.value, ValueError)


def test_unknown_format_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown trace format 'csv'"):
        load_trace(write(tmp_path, "x.csv", ""), "csv")


@pytest.mark.parametrize("fmt", ["azure", "mooncake", "processed", "burstgpt"])
def test_a_trace_that_is_not_utf8_text_is_named(tmp_path: Path, fmt: str) -> None:
    path = tmp_path / f"bad.{fmt}"
    path.write_bytes(b"\x00\xff\xfe,1,2\n")
    with pytest.raises(TraceFormatError, match=r"bad\.\w+: not UTF-8 text"):
        load_trace(path, fmt)
