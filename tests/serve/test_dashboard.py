"""The Grafana dashboard (deploy/grafana/blitzscale.json) queries only what a running server
exposes: every metric each panel's PromQL names is in the shared PD cluster's `/metrics`,
with every label the query selects on, groups by or puts in its legend.

No metric is checked from the collectors' declarations instead of a scrape: each one is
exposed from the start (labelled counters and the scale-up histogram per model and path
at zero, the refusal reasons at zero), once a request has run (the TTFT and TBT
histograms), or once the instances report their stats (KV, engine time, prefix cache:
the test waits for them). The PromQL reader below is a small one for the subset the
dashboard uses; anything outside it fails the test rather than going unchecked.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "blitzscale.json"
PROMETHEUS = ROOT / "deploy" / "prometheus" / "prometheus.yml"

_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
_STRING = r'"(?:[^"\\]|\\.)*"'
_SELECTOR = re.compile(rf"({_NAME})?\s*\{{((?:[^}}\"]|{_STRING})*)\}}")
_MATCHER = re.compile(rf"\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)\s*{_STRING}\s*(?:,|$)")
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)")
_RANGE = re.compile(r"\[[^\]]*\]")
_OFFSET = re.compile(r"\boffset\s+-?[0-9a-z]+")
_NUMBER = re.compile(r"(?<![a-zA-Z0-9_:])\d+(?:\.\d+)?(?:[eE][+-]?\d+)?")
_IDENT = re.compile(rf"{_NAME}")
_LEGEND = re.compile(r"\{\{\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\}\}")
_OPERATORS = frozenset({"and", "or", "unless", "offset", "bool"})
_LABEL_VALUES = re.compile(rf"^label_values\(\s*({_NAME})\s*,\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\)$")


@dataclass
class Query:
    """What one PromQL expression needs to exist: each metric with the labels it needs."""

    labels: dict[str, set[str]] = field(default_factory=dict)  # metric -> label names


def parse(expr: str, legend: str = "") -> Query:
    """The metrics `expr` reads and, for each, the labels it uses: its own selector's, plus
    the expression's grouping labels (`by`, `on`, ...) and `legend`'s `{{label}}`s, which
    every metric of it must carry for the result to have them."""
    own: list[tuple[str, set[str]]] = []

    def selector(m: re.Match[str]) -> str:
        name, body = m.group(1), m.group(2)
        if not name:
            raise ValueError(f"a selector without a metric name: {m.group(0)!r} in {expr!r}")
        names, pos = set(), 0
        for mm in _MATCHER.finditer(body):
            if mm.start() != pos:
                break
            names.add(mm.group(1))
            pos = mm.end()
        if body[pos:].strip():
            raise ValueError(f"a label matcher this reader does not know: {body!r} in {expr!r}")
        own.append((name, names))
        return f" {name} "

    rest = _SELECTOR.sub(selector, expr)
    if re.search(_STRING, rest) or "{" in rest or "}" in rest:
        raise ValueError(f"a string or brace outside a selector: {expr!r}")
    shared = set(_LEGEND.findall(legend))
    for g in _GROUPING.findall(rest):
        shared |= {x.strip() for x in g.split(",") if x.strip()}
    rest = _GROUPING.sub(" ", rest)
    rest = _NUMBER.sub(" ", _OFFSET.sub(" ", _RANGE.sub(" ", rest)))
    if "$" in rest:
        raise ValueError(f"a variable outside a selector or range: {expr!r}")
    q = Query()
    for name, names in own:
        q.labels.setdefault(name, set()).update(names)
    for m in _IDENT.finditer(rest):
        word = m.group(0)
        if word in _OPERATORS or re.match(r"\s*\(", rest[m.end() :]):
            continue  # an operator, or a function or aggregation being called
        q.labels.setdefault(word, set())
    if not q.labels:
        raise ValueError(f"no metric in {expr!r}")
    for names in q.labels.values():
        names |= shared
    return q


def dashboard_queries() -> list[tuple[str, Query]]:
    """(where, what it needs) for every panel target and every query variable."""
    board = json.loads(DASHBOARD.read_text())
    out = []
    for p in board["panels"]:
        for t in p.get("targets", []):
            out.append((f"{p['title']!r} {t['refId']}", parse(t["expr"], t.get("legendFormat", ""))))
    for v in board["templating"]["list"]:
        if v["type"] == "query":
            m = _LABEL_VALUES.match(v["definition"])
            assert m, f"variable {v['name']}: only label_values(metric, label) is checked"
            out.append((f"variable {v['name']}", Query({m.group(1): {m.group(2)}})))
    return out


def exposed(text: str) -> dict[str, set[str]]:
    """Each sample name in a `/metrics` text (counters' `_total`, histograms' `_bucket`,
    `_sum`, `_count`) with the union of its series' label names."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, set[str]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, set()).update(s.labels)
    return out


def problems(queries: list[tuple[str, Query]], metrics: dict[str, set[str]]) -> list[str]:
    out = []
    for where, q in queries:
        for name, labels in q.labels.items():
            if name not in metrics:
                out.append(f"{where}: no metric {name}")
            elif missing := labels - metrics[name]:
                out.append(f"{where}: {name} has no label {sorted(missing)}")
    return out


# --- the reader itself (no server) --------------------------------------------------------


def test_parse_reads_names_selectors_groupings_and_legends() -> None:
    q = parse(
        'histogram_quantile(0.99, sum by (le, path) (rate(a_seconds_bucket{model=~"$model", x!="}"}'
        "[$__rate_interval])))",
        "p99 {{path}}",
    )
    assert q.labels == {"a_seconds_bucket": {"le", "path", "model", "x"}}
    q = parse("sum by (i) (rate(hits_total[5m])) / sum by (i) (rate(queries_total[5m])) > 0.5")
    assert q.labels == {"hits_total": {"i"}, "queries_total": {"i"}}
    q = parse('sum(up{job="a"}) by (job) + on (job) group_left (zone) b offset 5m')
    assert q.labels == {"up": {"job", "zone"}, "b": {"job", "zone"}}
    assert parse("requests_in_flight").labels == {"requests_in_flight": set()}
    assert parse("max(x) > bool 1e3 and y").labels == {"x": set(), "y": set()}


@pytest.mark.parametrize(
    "expr",
    [
        '{__name__="x"}',
        'x{a="1" b="2"}',
        'label_replace(x, "a", "$1", "b", "(.*)")',
        "x[$r] * $scale",
        "1 + 2",
    ],
)
def test_parse_refuses_what_it_cannot_check(expr: str) -> None:
    with pytest.raises(ValueError):
        parse(expr)


def test_dashboard_shape_and_scrape_example() -> None:
    board = json.loads(DASHBOARD.read_text())
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids)), "panel ids are unique"
    names = {v["name"]: v for v in board["templating"]["list"]}
    assert names["datasource"]["type"] == "datasource" and names["datasource"]["query"] == "prometheus"
    for p in board["panels"]:
        g = p["gridPos"]
        assert g["x"] + g["w"] <= 24, p["title"]
        if p["type"] == "row":
            continue
        assert p["targets"] and p.get("description"), p["title"]
        for d in [p["datasource"], *(t["datasource"] for t in p["targets"])]:
            assert d == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
        assert len({t["refId"] for t in p["targets"]}) == len(p["targets"]), p["title"]
    text = PROMETHEUS.read_text()
    for line in ("honor_labels: true", "metrics_path: /metrics", 'targets: ["localhost:8000"]'):
        assert line in text, line  # (honor_labels: the metrics' own `instance` label)


# --- against a running server ---------------------------------------------------------------


@pytest.fixture(scope="module")
def scraped(pd_url: str) -> dict[str, set[str]]:
    """The PD cluster's `/metrics` once a request has run and every instance has reported."""
    r = httpx.post(
        f"{pd_url}/v1/completions",
        json={"model": "smollm2-135m", "prompt": "The capital of France is", "max_tokens": 4},
        timeout=120,
    )
    assert r.status_code == 200, r.text
    queries = dashboard_queries()
    deadline = time.monotonic() + 30
    while True:  # instances' stats (KV, engine time) arrive with their next report
        metrics = exposed(httpx.get(f"{pd_url}/metrics", timeout=30).text)
        if not problems(queries, metrics) or time.monotonic() > deadline:
            return metrics
        time.sleep(0.5)


def test_every_panel_queries_exposed_metrics_and_labels(scraped: dict[str, set[str]]) -> None:
    queries = dashboard_queries()
    assert len(queries) > 30
    assert problems(queries, scraped) == []


def test_a_missing_metric_or_label_is_caught(scraped: dict[str, set[str]]) -> None:
    bad = [
        ("typo", parse("rate(blitzscale_scale_event_total[5m])")),
        ("label", parse('sum by (model) (blitzscale_kv_usage_ratio{instance="0"})')),
        ("legend", parse("blitzscale_queue_requests", "{{reason}}")),
    ]
    assert problems(bad, scraped) == [
        "typo: no metric blitzscale_scale_event_total",
        "label: blitzscale_kv_usage_ratio has no label ['model']",
        "legend: blitzscale_queue_requests has no label ['reason']",
    ]


def test_scale_up_durations_count_the_first_instances_loads(pd_url: str) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(f"{pd_url}/metrics", timeout=30).text
    fam = next(f for f in text_string_to_metric_families(text) if f.name == "blitzscale_scale_up_seconds")
    count = {s.labels["path"]: s.value for s in fam.samples if s.name.endswith("_count")}
    total = {s.labels["path"]: s.value for s in fam.samples if s.name.endswith("_sum")}
    events = {
        s.labels["path"]: s.value
        for f in text_string_to_metric_families(text)
        if f.name == "blitzscale_scale_events"
        for s in f.samples
        if s.name.endswith("_total") and s.labels["direction"] == "up"
    }
    assert count["disk"] >= 1 and total["disk"] > 0  # the first instance, from disk
    assert count == events  # one duration per scale-up event, by path
