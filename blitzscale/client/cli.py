"""`blitzscale replay`: replay a trace against a server and write results, summary and report.

The main CLI calls `add_replay_parser(subparsers)` and dispatches to `run_replay(args)`;
`python -m blitzscale.client.cli ...` runs the same command on its own. Exit codes: 0 when
the replay ran and some request succeeded, 1 when the trace file is unreadable or every
request failed, 2 for a bad command-line value (one line on stderr naming it), 130 when
interrupted.
"""

import argparse
import contextlib
import json
import sys
from collections.abc import Sequence

from blitzscale.cli.common import check_out
from blitzscale.client import replay
from blitzscale.client.options import API_KEY_ENV, ReplayOptions, UsageError, options_from_args
from blitzscale.client.protocols import PROTOCOLS
from blitzscale.client.record import write_records
from blitzscale.client.server_watch import ServerWatch
from blitzscale.client.summary import Summary, summarize
from blitzscale.client.traces import (
    FORMATS,
    TraceFormatError,
    TraceRequest,
    gamma_arrivals,
    load_trace,
    scale_hash_blocks,
    transform,
    with_lengths,
)
from blitzscale.errors import InvalidRequestError

PROG = "blitzscale replay"

DESCRIPTION = """Replay a request trace open-loop: every request is sent at its (scaled)
timestamp whether or not earlier ones have finished. Writes OUT/requests.jsonl (one line
per request), OUT/summary.json, PNG plots and OUT/report.html."""


def add_replay_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register `replay` on the main CLI's subparsers; dispatch to run_replay(args)."""
    parser = subparsers.add_parser(
        "replay", help="replay a request trace against a server", description=DESCRIPTION
    )
    add_replay_arguments(parser)
    return parser


def add_replay_arguments(parser: argparse.ArgumentParser) -> None:
    """Values stay strings here; options_from_args checks them (one-line errors)."""
    add = parser.add_argument
    add("--url", required=True, help="server root, e.g. http://127.0.0.1:8000")
    add("--out", required=True, help="output folder (created)")
    add("--trace", help="trace file")
    add("--format", help=f"trace format: {', '.join(FORMATS)}")
    add(
        "--duration", metavar="S", help="replay only requests arriving in the first S seconds (after scaling)"
    )
    add(
        "--time-scale",
        metavar="X",
        help="divide timestamps by X: 2 = twice as fast, same requests (default 1)",
    )
    add(
        "--rate-scale",
        metavar="Y",
        help="multiply the number of requests by Y, keeping the timeline: Y<1 keeps an evenly spread "
        "fraction, Y>1 repeats each request at its timestamp (default 1)",
    )
    add("--max-input", metavar="N", help="clamp input lengths to N tokens")
    add("--max-output", metavar="N", help="clamp output lengths to N tokens")
    add("--protocol", default="openai", help=f"server API: {', '.join(PROTOCOLS)} (default openai)")
    add("--slo-ttft", metavar="MS", help="TTFT SLO in ms (default: 5x the run's mean TTFT)")
    add("--slo-tbt", metavar="MS", help="mean-TBT SLO in ms (default: 5x the run's mean TBT)")
    add(
        "--gamma",
        metavar="RATE,CV",
        help="synthetic Gamma arrivals (req/s, CV); lengths from --trace if given",
    )
    add("--seed", default="0", help="seed of --gamma arrivals (default 0)")
    add("--input-len", metavar="N", help="input tokens of --gamma requests without --trace (default 512)")
    add("--output-len", metavar="N", help="output tokens of --gamma requests without --trace (default 128)")
    add("--skip-failed", action="store_true", help="burstgpt: drop failed rows (Response tokens = 0)")
    add("--model", help="model name sent in each request (openai protocol)")
    add(
        "--token-ids",
        action="store_true",
        help="send each prompt as token ids of its exact length (openai protocol; for models with "
        "no tokenizer, such as random:llama3-8b)",
    )
    add(
        "--hash-block-tokens",
        metavar="N",
        help="tokens per prefix block of traces with hash_ids (mooncake): requests sharing leading "
        "ids share those blocks of prompt; input lengths scale by N/512, the trace's block (default 512)",
    )
    add("--api-key", metavar="KEY", help=f"sent as 'Authorization: Bearer KEY' (default ${API_KEY_ENV})")
    add("--timeout", metavar="S", help="per-request limit in seconds, send to last token (default 300)")
    add("--no-progress", action="store_true", help="no progress bar")


def build_requests(options: ReplayOptions) -> list[TraceRequest]:
    """The requests to send: the shaped trace, or Gamma arrivals with the trace's lengths."""
    trace = (
        load_trace(options.trace, options.fmt or "", skip_failed=options.skip_failed) if options.trace else []
    )
    trace = scale_hash_blocks(trace, options.hash_block_tokens)  # before --max-input clamps
    if options.gamma is not None:
        rate, cv = options.gamma
        arrivals = gamma_arrivals(rate, cv, options.duration_s or 0.0, options.seed)
        requests = with_lengths(arrivals, trace, options.input_len, options.output_len)
        return transform(requests, max_input=options.max_input, max_output=options.max_output)
    return transform(
        trace,
        duration=options.duration_s,
        time_scale=options.time_scale,
        rate_scale=options.rate_scale,
        max_input=options.max_input,
        max_output=options.max_output,
    )


def run_replay(args: argparse.Namespace) -> int:
    try:
        options = options_from_args(args)
    except UsageError as e:
        return _fail(str(e), 2)
    try:
        requests = build_requests(options)
    except TraceFormatError as e:
        return _fail(str(e), 1)
    if not requests:
        return _fail("no requests to replay (empty trace, or --duration shorter than the first gap)", 1)
    try:  # (before the run: a bad path would otherwise lose it)
        check_out(options.out, is_file=False)
    except InvalidRequestError as e:
        return _fail(str(e), 2)
    config = replay.ReplayConfig(
        url=options.url,
        protocol=options.protocol,
        model=options.model,
        api_key=options.api_key,
        timeout_s=options.timeout_s,
        show_progress=options.show_progress,
        token_ids=options.token_ids,
        hash_block_tokens=options.hash_block_tokens,
    )
    _raise_open_file_limit()
    watch = ServerWatch(options.url, options.api_key).start()  # instance counts, if the server says
    try:
        records = replay.run(requests, config)
    except KeyboardInterrupt:
        return _fail("interrupted; no results written", 130)
    finally:
        watch.stop()
    samples = watch.samples or None
    summary = summarize(records, options.slo_ttft_s, options.slo_tbt_s, instance_samples=samples)
    options.out.mkdir(parents=True, exist_ok=True)
    write_records(options.out / "requests.jsonl", records)
    summary_json = {**summary.to_json(), "options": options.to_json()}
    (options.out / "summary.json").write_text(json.dumps(summary_json, indent=2) + "\n", encoding="utf-8")
    from blitzscale.client.report import write_report  # (matplotlib: ~1 s to import)

    page = write_report(options.out, records, summary, samples, watch.events)
    print(_one_line(summary))
    print(f"results in {options.out}; report {page}")
    if not summary.num_ok:
        return _fail(f"all {summary.num_requests} requests failed; see requests.jsonl", 1)
    return 0


def _one_line(summary: Summary) -> str:
    def ms(value: float | None) -> str:
        return "-" if value is None else f"{value * 1000:.1f} ms"

    attainment = "-" if summary.slo_attainment is None else f"{summary.slo_attainment:.1%}"
    return (
        f"{summary.num_ok}/{summary.num_requests} ok, "
        f"TTFT p50 {ms(summary.ttft_s.p50)} p99 {ms(summary.ttft_s.p99)}, "
        f"TBT p99 {ms(summary.tbt_s.p99)}, SLO attainment {attainment}, "
        f"{summary.output_tokens_per_s:.1f} output tok/s"
    )


def _fail(message: str, code: int) -> int:
    print(f"{PROG}: error: {message}", file=sys.stderr)
    return code


def _raise_open_file_limit() -> None:
    """Open loop keeps one socket per outstanding request; lift the soft limit to the hard one."""
    try:
        import resource
    except ImportError:  # not on Unix
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        # If refused, keep the soft limit: a very large replay may then see connection errors.
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=PROG, description=DESCRIPTION)
    add_replay_arguments(parser)
    return run_replay(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
