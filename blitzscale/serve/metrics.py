"""Prometheus metrics of the serving cluster. Gauges are read from the router at scrape
time (no second copy of its state); counters and the scale-up durations are bumped by the
scaler. deploy/grafana/blitzscale.json charts them (tests/serve/test_dashboard.py checks
that every metric and label it queries is here)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Gauge, Histogram
from prometheus_client import Counter as PromCounter
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from blitzscale.control.snapshot import InstanceState
from blitzscale.messages import ActivateResult

if TYPE_CHECKING:
    from blitzscale.serve.router import Router


class _RouterCollector(Collector):
    def __init__(self, router: Router) -> None:
        self.router = router

    def _worker_time(self) -> Iterator[CounterMetricFamily]:
        """Where each serving instance's worker spends its time (its first rank's loop)."""
        steps = CounterMetricFamily(
            "blitzscale_engine_steps", "Engine steps run by each serving instance", labels=["instance"]
        )
        step_s = CounterMetricFamily(
            "blitzscale_engine_step_seconds",
            "Seconds inside engine steps (launch, sampling, waiting for the device)",
            labels=["instance"],
        )
        busy_s = CounterMetricFamily(
            "blitzscale_worker_busy_seconds",
            "Seconds of the worker loop while it had work (steps plus messages and outputs)",
            labels=["instance"],
        )
        labels = ["instance", "kind"]
        by_kind = {
            "steps": CounterMetricFamily(
                "blitzscale_engine_kind_steps",
                "Engine steps by kind (decode, mixed, prefill: _graph or _eager; live)",
                labels=labels,
            ),
            "seconds": CounterMetricFamily(
                "blitzscale_engine_kind_step_seconds", "Seconds inside engine steps, by kind", labels=labels
            ),
            "overlapped": CounterMetricFamily(
                "blitzscale_engine_kind_overlapped_steps",
                "Engine steps launched before the step before them was read, by kind",
                labels=labels,
            ),
            "tokens": CounterMetricFamily(
                "blitzscale_engine_kind_tokens",
                "Tokens computed by engine steps (prompt tokens plus decode rows), by kind",
                labels=labels,
            ),
        }
        queries = CounterMetricFamily(
            "blitzscale_prefix_cache_queries",
            "Prompt tokens looked up in each serving instance's prefix cache",
            labels=["instance"],
        )
        hits = CounterMetricFamily(
            "blitzscale_prefix_cache_hits",
            "Prompt tokens found in each serving instance's prefix cache (not computed again)",
            labels=["instance"],
        )
        oom = CounterMetricFamily(
            "blitzscale_engine_oom_retries",
            "Engine steps that ran out of device memory and were retried smaller (engine/oom.py)",
            labels=["instance"],
        )
        for i in self.router.instances.values():
            s = i.stats
            if s is None or i.state is InstanceState.INACTIVE:
                continue
            oom.add_metric([str(i.id)], s.oom_retries)
            queries.add_metric([str(i.id)], s.prefix_queries)
            hits.add_metric([str(i.id)], s.prefix_hits)
            steps.add_metric([str(i.id)], s.num_steps)
            step_s.add_metric([str(i.id)], s.step_s)
            busy_s.add_metric([str(i.id)], s.busy_s)
            for k in s.step_kinds:
                for field, family in by_kind.items():
                    family.add_metric([str(i.id), k.kind], getattr(k, field))
        yield steps
        yield step_s
        yield busy_s
        yield from by_kind.values()
        yield queries
        yield hits
        yield oom
        routed = CounterMetricFamily(
            "blitzscale_router_prefix_routed_requests",
            "Requests the router sent where, by its index, a prefix of their prompt was cached",
        )
        routed.add_metric([], self.router.num_prefix_routed)
        yield routed
        routed_tokens = CounterMetricFamily(
            "blitzscale_router_prefix_routed_tokens",
            "Prompt tokens the router's index expected those requests to find cached",
        )
        routed_tokens.add_metric([], self.router.prefix_routed_tokens)
        yield routed_tokens

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        router = self.router
        models = router.model_names()
        inst = GaugeMetricFamily(
            "blitzscale_instances",
            'Instances by model, role and state (model "none": ranks holding nothing)',
            labels=["model", "role", "state"],
        )
        counts = Counter(
            (i.model or "none", i.accepts or "none", i.state.value) for i in router.instances.values()
        )
        for model in [*models, "none"]:
            for state in InstanceState:  # every state of every model appears, zeros included
                if model == "none" and state is not InstanceState.INACTIVE:
                    continue
                roles = {r for (m, r, s) in counts if m == model and s == state.value} or {"none"}
                for role in sorted(roles):
                    inst.add_metric([model, role, state.value], counts.get((model, role, state.value), 0))
        yield inst
        queue = GaugeMetricFamily(
            "blitzscale_queue_requests", "Requests in the global queue, by model", labels=["model"]
        )
        queued = Counter(r.model for r in router.queue)
        for model in models:
            queue.add_metric([model], queued.get(model, 0))
        yield queue
        queued_tokens = GaugeMetricFamily(
            "blitzscale_queue_prompt_tokens", "Prompt tokens in the global queue, by model", labels=["model"]
        )
        for model in models:
            queued_tokens.add_metric([model], router.queue.tokens_of(model))
        yield queued_tokens
        copies = GaugeMetricFamily(
            "blitzscale_host_copies", "Host copies of each model in the whole cluster", labels=["model"]
        )
        for model in models:
            copies.add_metric([model], int(router.cluster.pool.host_holder(model) is not None))
        yield copies
        live = GaugeMetricFamily("blitzscale_requests_in_flight", "Requests accepted and not finished")
        live.add_metric([], len(self.router.reqs))
        yield live
        kv = GaugeMetricFamily(
            "blitzscale_kv_blocks", "KV cache blocks per serving instance", labels=["instance", "kind"]
        )
        usage = GaugeMetricFamily(
            "blitzscale_kv_usage_ratio",
            "Used share of each serving instance's KV blocks",
            labels=["instance"],
        )
        for i in self.router.instances.values():
            s = i.stats
            if s is None or not s.total_blocks or i.state is InstanceState.INACTIVE:
                continue
            kv.add_metric([str(i.id), "used"], s.used_blocks)
            kv.add_metric([str(i.id), "free"], s.total_blocks - s.used_blocks)
            usage.add_metric([str(i.id)], s.used_blocks / s.total_blocks)
        yield kv
        yield usage
        kv_bytes = GaugeMetricFamily(
            "blitzscale_model_kv_cache_bytes",
            "Device bytes the KV caches of each model's serving instances hold (every shard's)",
            labels=["model"],
        )
        held: Counter[str] = Counter({m: 0 for m in models})
        for i in self.router.instances.values():
            if i.stats is not None and i.state is not InstanceState.INACTIVE:
                held[i.model] += i.stats.kv_cache_bytes * len(i.ranks)
        for model, nbytes in held.items():
            kv_bytes.add_metric([model], nbytes)
        yield kv_bytes
        yield from self._worker_time()
        refused = CounterMetricFamily(
            "blitzscale_requests_refused", "Requests refused by load shedding", labels=["reason"]
        )
        for reason in ("queue_full", "queue_timeout"):
            refused.add_metric([reason], self.router.num_refused.get(reason, 0))
        yield refused
        respawner = self.router.respawner
        yield CounterMetricFamily(
            "blitzscale_worker_deaths", "Worker processes found dead", value=respawner.deaths
        )
        yield CounterMetricFamily(
            "blitzscale_worker_restarts",
            "Dead workers respawned, links rebuilt, handed back to the planner",
            value=respawner.restarts,
        )
        live = self.router.live
        plan = live.planner  # (live_split = "ilp")
        for name, doc, value in (
            (
                "blitzscale_live_requests",
                "Requests whose prefill ran partly on an instance still loading its weights",
                live.requests_total,
            ),
            (
                "blitzscale_live_layers",
                "Layers run on instances still loading their weights",
                live.layers_total,
            ),
            (
                "blitzscale_live_relays",
                "Partly prefilled tasks a live target handed to its source to finish",
                live.relays_total,
            ),
            (
                "blitzscale_live_moves",
                "Head tasks of loading live targets moved to another instance to make their TTFT SLO",
                live.moves_total,
            ),
            (
                "blitzscale_live_split_solves",
                "Planned live splits solved ([router] live_split = ilp), fallbacks included",
                plan.solves if plan else 0,
            ),
            (
                "blitzscale_live_split_fallbacks",
                "Planned live splits past their time limit (the greedy rule instead)",
                plan.fallbacks if plan else 0,
            ),
            (
                "blitzscale_live_split_solve_seconds",
                "Wall time the router spent solving live splits",
                plan.solve_total_s if plan else 0.0,
            ),
            (
                "blitzscale_live_abandoned",
                "Live targets given up when their weight source died, their waiting prompts run again",
                live.abandoned_total,
            ),
        ):
            yield CounterMetricFamily(name, doc, value=value)


# Seconds. A scale-up spans a GPU-to-GPU copy of a small model (ms) to a cold disk read of a
# large one (a minute or more).
SCALE_UP_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)


class ClusterMetrics:
    def scaled_up(self, model: str, path: str, nbytes: int, seconds: float) -> None:
        """One load's event, its weight bytes and its whole duration as the scaler saw it."""
        self.scale_events.labels(direction="up", path=path, model=model).inc()
        self.transfer_bytes.labels(path=path, model=model).inc(nbytes)
        self.scale_up_seconds.labels(path=path, model=model).observe(seconds)

    def swapped(self, model: str, direction: str, seconds: float) -> None:
        """A model's first GPU copy came in ("in": from its host copy or disk) or its last
        went ("out": drained, host copy kept, released), and how long that took."""
        self.swaps.labels(model=model, direction=direction).inc()
        self.swap_seconds.labels(model=model, direction=direction).observe(seconds)

    def held(self, model: str, gpu_bytes: int, host_bytes: int) -> None:
        """The weight bytes of `model` now on GPUs (every rank's share) and on hosts."""
        self.weight_bytes.labels(model=model, where="gpu").set(gpu_bytes)
        self.weight_bytes.labels(model=model, where="host").set(host_bytes)

    def prefixes_shipped(self, model: str, blocks: int, nbytes: int) -> None:
        """Hot prefix blocks a new instance received with its weights."""
        self.hot_prefix_blocks.labels(model=model).inc(blocks)
        self.hot_prefix_bytes.labels(model=model).inc(nbytes)

    def activated(self, result: ActivateResult) -> None:
        """Count one activation from its reply (worker/standby.py)."""
        self.activations.labels(engine="standby" if result.standby else "built").inc()

    def __init__(self, registry: CollectorRegistry, router: Router) -> None:
        registry.register(_RouterCollector(router))
        self.scale_events = PromCounter(
            "blitzscale_scale_events", "Scale operations", ["model", "direction", "path"], registry=registry
        )
        self.transfer_bytes = PromCounter(
            "blitzscale_transfer_bytes",
            "Weight bytes moved to new instances",
            ["model", "path"],
            registry=registry,
        )
        self.scale_up_seconds = Histogram(
            "blitzscale_scale_up_seconds",
            "Whole duration of each scale-up (load, activation), by model and load path",
            ["model", "path"],
            buckets=SCALE_UP_BUCKETS,
            registry=registry,
        )
        self.hot_prefix_blocks = PromCounter(
            "blitzscale_hot_prefix_blocks",
            "Cached prefix KV blocks shipped from a source to new instances with the weights",
            ["model"],
            registry=registry,
        )
        self.hot_prefix_bytes = PromCounter(
            "blitzscale_hot_prefix_bytes",
            "Bytes of the hot prefix blocks shipped to new instances",
            ["model"],
            registry=registry,
        )
        self.load_failures = PromCounter(
            "blitzscale_load_failures",
            "Loads onto a rank that failed (the rank backs off)",
            registry=registry,
        )
        self.activations = PromCounter(
            "blitzscale_activations",
            "Engines started on new instances: a worker's standby engine, or built then",
            ["engine"],
            registry=registry,
        )
        for engine in ("standby", "built"):
            self.activations.labels(engine=engine)
        self.swaps = PromCounter(
            "blitzscale_model_swaps",
            "A model's first GPU copy loaded (in: from its host copy or disk) or its last released (out)",
            ["model", "direction"],
            registry=registry,
        )
        self.swap_seconds = Histogram(
            "blitzscale_model_swap_seconds",
            "Each swap, whole: load from zero and activation (in); drain, host copy, release (out)",
            ["model", "direction"],
            buckets=SCALE_UP_BUCKETS,
            registry=registry,
        )
        self.weight_bytes = Gauge(
            "blitzscale_model_weight_bytes",
            "Weight bytes of each model held on GPUs (every rank's share) and on hosts",
            ["model", "where"],
            registry=registry,
        )
        for model in router.model_names():
            self.add_model(model)

    def add_model(self, model: str) -> None:
        """The model's counters, visible at zero before its first event."""
        for path in ("network", "host", "disk"):
            self.transfer_bytes.labels(model=model, path=path)
            self.scale_events.labels(model=model, direction="up", path=path)
            self.scale_up_seconds.labels(model=model, path=path)
        self.scale_events.labels(model=model, direction="down", path="release")
        for direction in ("in", "out"):
            self.swaps.labels(model=model, direction=direction)
            self.swap_seconds.labels(model=model, direction=direction)
        self.held(model, 0, 0)
