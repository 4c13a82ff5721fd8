"""One simulated run: our router, scaler, planner and policies on the virtual clock against
a `SimCluster`, with a trace replayed open-loop by simulated clients.

The control plane is the server's own code (serve/router.py, serve/scaler.py, control/);
only the cluster (sim/cluster.py) and the clients are simulated.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from blitzscale import clock
from blitzscale.client.protocols import hashed_prompt_ids, synthetic_prompt_ids
from blitzscale.client.record import STATUS_ERROR, STATUS_OK, RequestRecord, TtftParts
from blitzscale.client.report import ReportInfo
from blitzscale.client.traces import TraceRequest
from blitzscale.cluster.config import ClusterConfig
from blitzscale.cluster.slotted import slotted
from blitzscale.control.config import PlannerConfig, PolicyConfig
from blitzscale.control.costmodel import Profile
from blitzscale.control.residency import Footprint, resolve_models_per_rank
from blitzscale.core.config import EngineConfig
from blitzscale.core.sampling import SamplingParams
from blitzscale.errors import BlitzScaleError
from blitzscale.serve.config import SERVE_ENGINE
from blitzscale.serve.controlplane import ControlPlaneSpec, build_control_plane
from blitzscale.serve.events import ScaleEvent
from blitzscale.serve.models import ScaledModel, ServedModel
from blitzscale.serve.router import Router, RouterConfig
from blitzscale.sim import clock as sim_clock
from blitzscale.sim.cluster import SimCluster
from blitzscale.sim.config import SimModel, SimPreset
from blitzscale.sim.engine import base_id

SIM_POLICIES = (
    "blitz",
    "blitz-nolive",
    "network",
    "network-multicast",
    "sllm",
    "allcache",
    "fixed-peak",
    "fixed-half",
)
SAMPLE_EVERY_S = 1.0  # the serving-instance count is sampled this often (report, GPU time)


@dataclass(frozen=True)
class SimSetup:
    preset: SimPreset
    model: SimModel
    mode: str = "pd"
    planner: PlannerConfig | None = None  # None: rates from the profile, the defaults otherwise
    planner_overrides: dict[str, Any] = field(default_factory=dict)  # over those
    engine: EngineConfig = field(default_factory=lambda: SERVE_ENGINE)  # sized for the preset's device
    router: RouterConfig | None = None
    fixed: tuple[int, int] = (1, 1)  # fixed-*: (prefill, decode) instances
    # Several models on the pool: `model` under each of these names (empty: one model, its
    # own name), each scaling to zero after `keep_alive_s` without a request, within
    # `host_memory_bytes` per host for host copies (0: no bound).
    models: tuple[str, ...] = ()
    keep_alive_s: float = math.inf
    host_memory_bytes: int = 0
    prefix_routing: bool = True  # the router weighs cached prefixes (off: load alone)
    hot_prefix_share: float = 0.1  # [policy] hot_prefix_share (0: new instances start empty)
    policy_overrides: dict[str, Any] = field(default_factory=dict)  # other [policy] knobs (a template's)
    models_per_rank: int = 0  # models resident on a GPU at once (cluster/slotted.py); 0: as many as fit

    @property
    def resident_per_rank(self) -> int:
        """`models_per_rank`, derived when 0 (control/residency.py) as serve derives it: each
        model's weights and one request of its whole context in an equal share of the
        device's usable memory."""
        p = self.preset.instance_profile(self.model)
        need = Footprint(p.weight_bytes, p.kv_bytes_per_token * self.model.max_model_len)
        gpu = not self.preset.device.lower().startswith("cpu")
        names = self.model_names
        return resolve_models_per_rank(
            self.models_per_rank, [need] * len(names), p.engine_bytes, 1.0, gpu, self.model.tp
        )

    @property
    def model_names(self) -> tuple[str, ...]:
        return self.models or (self.model.name,)


@dataclass
class SimResult:
    policy: str
    records: list[RequestRecord]
    samples: list[tuple[float, int]]
    states: list[tuple[float, dict[str, int]]]  # instances by state, sampled with `samples`
    peak: tuple[int, int]  # most prefill-side and decode instances serving at once
    events: list[ScaleEvent]  # times from the trace's start
    gpu_seconds: float
    sim_wall_s: float
    messages: int
    relays: int = 0  # ZigZag relays: tasks a live target handed to its partner (or moved)
    moves: int = 0  # of those, head tasks moved to another instance to make their SLO
    prefix_queries: int = 0  # prompt tokens looked up in the engines' prefix caches
    prefix_hits: int = 0  # of those, found cached (not computed)
    prefix_routed: int = 0  # requests the router sent where their prefix was likely cached
    prefix_shipped: int = 0  # hot prefix blocks new instances received with their weights
    chain_joins: int = 0  # GPU-to-GPU loads that joined a chain in flight (cluster/flights.py)
    split_solve_s: tuple[float, ...] = ()  # live_split = "ilp": each plan's solve time (wall)
    split_fallbacks: int = 0  # of those, plans past the time limit (greedy instead)


def planner_for(setup: SimSetup, cluster: SimCluster) -> PlannerConfig:
    """The planner's KV migration rate from the profile and the link between two GPUs of
    a node; its prefill rate is the cost model's, as on a live server (the scaler's)."""
    if setup.planner is not None:
        return setup.planner
    p = setup.preset.instance_profile(setup.model)
    link = cluster.links.rate(cluster.topo.path(0, min(1, cluster.world_size - 1)))
    rates = {"tokens_transferred_per_sec": link / p.kv_bytes_per_token}
    return PlannerConfig.from_dict({**rates, **setup.planner_overrides})


def _policy(name: str, setup: SimSetup) -> PolicyConfig:
    if name.startswith("fixed"):
        return PolicyConfig(name="fixed", fixed_prefill=setup.fixed[0], fixed_decode=setup.fixed[1])
    knobs = {"name": name, "hot_prefix_share": setup.hot_prefix_share, **setup.policy_overrides}
    return PolicyConfig.from_dict(knobs)


def _served(name: str, setup: SimSetup, profile: Profile, engine: EngineConfig) -> ServedModel:
    """The router's view of a simulated model: no tokenizer (prompts are token counts),
    the same cost model as a live server's, and its engines' batch."""
    return ServedModel(
        name,
        None,
        1 << 20,
        setup.model.max_model_len,
        may_idle_at_zero=math.isfinite(setup.keep_alive_s),
        cost=profile,
        max_num_seqs=engine.max_num_seqs,
        prefix_block_size=engine.block_size if engine.prefix_caching else 0,
        ttft_slo_s=setup.model.ttft_slo_s,
    )


async def _run(
    setup: SimSetup,
    trace: Sequence[TraceRequest],
    policy: str,
    progress: Callable[[float], None] | None,
    trace_models: Sequence[str] | None = None,
) -> SimResult:
    wall0 = time.perf_counter()
    preset, model = setup.preset, setup.model
    profile = preset.instance_profile(model)
    topo = preset.topology
    per_rank = setup.resident_per_rank
    cfg = ClusterConfig(
        num_workers=topo.world_size,
        ranks_per_host=topo.gpus_per_node,
        host_memory_bytes=setup.host_memory_bytes,
    )
    cluster = SimCluster(
        topo, profile, cfg, local_host_cache=policy in ("sllm", "allcache"), tp=model.tp, slots=per_rank
    )
    slots = slotted(cluster, per_rank)  # (the control plane's ranks: the slots)
    pcfg = _policy(policy, setup)
    rcfg = setup.router or RouterConfig(mode=setup.mode, max_queue_tokens=0, max_queue_wait_s=0)
    rcfg = replace(rcfg, prefix_aware=rcfg.prefix_aware and setup.prefix_routing)
    device = "cpu" if preset.device.startswith("cpu") else "cuda"
    engine = replace(setup.engine, max_model_len=model.max_model_len, models_per_device=per_rank).for_device(
        device
    )
    planner = planner_for(setup, cluster)
    if pcfg.name == "fixed":
        n_pre, n_dec = setup.fixed
    else:
        n_pre, n_dec = planner.min_prefill, planner.min_decode
    names = setup.model_names
    spec = ControlPlaneSpec(
        router=rcfg,
        planner=planner,
        policy=pcfg,
        engine=engine,
        served=[_served(name, setup, profile, engine) for name in names],
        scaled=[
            ScaledModel(name, "sim", "sim", keep_alive_s=setup.keep_alive_s, ttft_slo_s=model.ttft_slo_s)
            for name in names
        ],
        first_instances=(n_pre, n_dec if setup.mode == "pd" else 0),
        tp=model.tp,
    )
    control = await build_control_plane(spec, slots, cluster.data)
    router, scaler = control.router, control.scaler
    t0 = clock.now()
    control.start_scaling()
    records: list[RequestRecord | None] = [None] * len(trace)
    samples: list[tuple[float, int]] = []
    states: list[tuple[float, dict[str, int]]] = []
    peak = [0, 0]

    def sample() -> None:
        roles = [i.accepts for i in router.instances.values() if i.accepts is not None]
        samples.append((clock.now() - t0, len(roles)))
        states.append((clock.now() - t0, dict(Counter(i.state.value for i in router.instances.values()))))
        peak[0] = max(peak[0], sum(1 for r in roles if r != "decode"))
        peak[1] = max(peak[1], sum(1 for r in roles if r == "decode"))

    async def sampler() -> None:
        while True:
            sample()
            if progress is not None:
                progress(clock.now() - t0)
            await asyncio.sleep(SAMPLE_EVERY_S)

    async def client(i: int, tr: TraceRequest, name: str | None) -> None:
        await asyncio.sleep(max(0.0, t0 + tr.arrival_s - clock.now()))
        records[i] = await _one(router, cluster, i, tr, t0, name)

    sampling = asyncio.create_task(sampler())
    which = list(trace_models) if trace_models is not None else [None] * len(trace)
    await asyncio.gather(*(client(i, tr, which[i]) for i, tr in enumerate(trace)))
    sample()
    sampling.cancel()
    await control.stop()
    await cluster.stop()
    planner = router.live.planner  # (live_split = "ilp")
    events = [e.shifted(t0) for e in scaler.events]
    return SimResult(
        policy=policy,
        records=[r for r in records if r is not None],
        samples=samples,
        states=states,
        peak=(peak[0], peak[1]),
        events=events,
        gpu_seconds=cluster.gpu_seconds(),
        sim_wall_s=time.perf_counter() - wall0,
        messages=cluster.messages,
        relays=router.live.relays_total,
        moves=router.live.moves_total,
        prefix_queries=cluster.recorder.prefix_queries,
        prefix_hits=cluster.recorder.prefix_hits,
        prefix_routed=router.num_prefix_routed,
        prefix_shipped=cluster.prefix_blocks_shipped,
        chain_joins=cluster.joins,
        split_solve_s=tuple(planner.solve_s) if planner else (),
        split_fallbacks=planner.fallbacks if planner else 0,
    )


def _prompt(i: int, tr: TraceRequest) -> list[int]:
    """Request i's prompt: placeholder token ids, but as the replay client builds them, so
    that prefix caching sees what it would live: blocks shared exactly where the trace's
    `hash_ids` are (Mooncake), no two prompts sharing a block otherwise (the request's index
    opens it)."""
    n = max(1, tr.input_tokens)
    return hashed_prompt_ids(n, tr.hash_ids, salt=i) if tr.hash_ids else synthetic_prompt_ids(n, i)


async def _one(
    router: Router, cluster: SimCluster, i: int, tr: TraceRequest, t0: float, model: str | None = None
) -> RequestRecord:
    rid = f"sim-{i}"
    sent = clock.now()
    ttft: float | None = None
    queue_s: float | None = None
    parts: TtftParts | None = None
    n_out = 0
    # A trace row of 0 tokens in or out is sent as 1 (an API refuses an empty prompt and
    # max_tokens 0), as the replay client sends it; the record says what was sent.
    params = SamplingParams(max_tokens=max(1, tr.output_tokens), temperature=0.0, ignore_eos=True)
    prompt = _prompt(i, tr)
    common = dict(
        index=i,
        scheduled_s=tr.arrival_s,
        send_s=sent - t0,
        input_tokens=len(prompt),
        requested_output_tokens=params.max_tokens,
    )
    try:
        async for out in router.generate(rid, prompt, params, model=model):
            if ttft is None and out.new_token_ids:
                ttft = clock.now() - sent
                queue_s = router.queue_time_s(rid)
                parts = cluster.recorder.ttft_parts(rid, sent, ttft)
            n_out = len(out.token_ids)
    except BlitzScaleError as e:
        cluster.recorder.forget(rid)
        return RequestRecord(**common, output_tokens=n_out, status=STATUS_ERROR, error=str(e), ttft_s=ttft)
    e2e = clock.now() - sent
    tbts = cluster.recorder.tbts(base_id(rid))
    cluster.recorder.forget(rid)
    return RequestRecord(
        **common,
        output_tokens=n_out,
        status=STATUS_OK,
        ttft_s=ttft,
        tbts_s=tbts,
        e2e_s=e2e,
        queue_s=queue_s,
        inference_s=None if queue_s is None else e2e - queue_s,
        ttft_parts=parts,
    )


def simulate(
    setup: SimSetup,
    trace: Sequence[TraceRequest],
    policy: str,
    progress: Callable[[float], None] | None = None,
    trace_models: Sequence[str] | None = None,
) -> SimResult:
    """Run one policy over `trace` on a fresh virtual clock; `trace_models`: each request's
    model (one of `setup.model_names`; None: the first)."""
    if policy not in SIM_POLICIES:
        raise BlitzScaleError(f"unknown policy {policy!r}; known: {', '.join(SIM_POLICIES)}")
    if trace_models is not None and len(trace_models) != len(trace):
        raise BlitzScaleError(f"{len(trace_models)} models for {len(trace)} requests")
    return sim_clock.run(_run(setup, trace, policy, progress, trace_models))


def fixed_counts(peak: tuple[int, int], policy: str, capacity: int) -> tuple[int, int]:
    """fixed-peak provisions the most instances blitz served at once; fixed-half half that.
    Blitz's prefill and decode peaks need not fall at the same moment, and at a heavy rate
    their sum can pass the cluster's `capacity` (instances): then both are cut to it, in
    proportion (one each at least)."""
    if policy == "fixed-half":
        pre, dec = max(1, math.ceil(peak[0] / 2)), max(1, math.ceil(peak[1] / 2))
    else:
        pre, dec = max(1, peak[0]), max(1, peak[1])
    if pre + dec <= capacity or capacity < 2:
        return pre, dec
    pre = min(capacity - 1, max(1, round(capacity * pre / (pre + dec))))
    return pre, capacity - pre


def sized_fixed(setup: SimSetup, peak: tuple[int, int], policy: str) -> SimSetup:
    """`setup` with fixed-peak's or fixed-half's instances (`fixed_counts`) on its cluster."""
    t = setup.preset.topology
    return replace(setup, fixed=fixed_counts(peak, policy, t.nodes * t.gpus_per_node // setup.model.tp))


def sim_report_info(policy: str, states: list[tuple[float, dict[str, int]]]) -> ReportInfo:
    return ReportInfo(
        title="BlitzScale simulation",
        policy=policy,
        instance_time="GPU-seconds (simulated)",
        state_samples=states,
    )
