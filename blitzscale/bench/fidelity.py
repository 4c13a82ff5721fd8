"""`blitzscale bench fidelity`: one small configuration run live and simulated, side by side.

Live: CPU workers with SmolLM2 serve a burst of the shipped Azure code slice through HTTP
(`blitzscale replay`'s client), as `serve` would. Simulated: the same router, planner and
policy knobs on `SimCluster`, with the CPU profile for step times and a topology built from
the live cluster's own caps (its weight transfers are capped, so both sides move weights at
the same rate). The JSON gives both sides' mean and p99 TTFT and scale events, and their
ratios: how far the simulator is from what it models.

The live run also samples how many threads of other work are runnable on the machine meanwhile
(bench/machine_load.py). With `calibrate` the simulated cores carry that many (sim/cores.py):
on a loaded machine the live side slows down, and the simulated one then does too; and the
CPU profile is scaled to this machine's speed, timed in CPU time before the live run
(bench/cpu_speed.py): the shipped profile is one development machine's.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, replace
from typing import Any

from blitzscale.bench import cpu_speed
from blitzscale.bench.cpu_speed import Speed
from blitzscale.bench.machine_load import OtherWork
from blitzscale.client import replay
from blitzscale.client.summary import summarize
from blitzscale.client.traces import TraceRequest
from blitzscale.control.costmodel import Profile, load_profile
from blitzscale.demo.workload import Workload
from blitzscale.serve.background import BackgroundService
from blitzscale.serve.config import ServeConfig
from blitzscale.serve.events import ScaleEvent
from blitzscale.sim.config import SimPreset, load_model
from blitzscale.sim.links import Topology
from blitzscale.sim.runner import SimSetup, simulate

MODEL = "smollm2-135m"


@dataclass(frozen=True)
class FidelityConfig:
    workers: int = 2
    policy: str = "blitz-nolive"  # (live relays are simulated since; kept for comparable runs)
    rate_scale: float = 0.05
    time_scale: float = 1.0
    duration_s: float = 90.0
    max_input: int = 192
    max_output: int = 16
    transfer_bytes_per_s: float = 100e6  # both sides: SmolLM2's 538 MB in 5.4 s
    disk_bytes_per_s: float = 36e6
    profile: str = "smollm2-135m-cpu"
    cores: int = 2  # this machine's: the workers share them (sim/cores.py)
    calibrate: bool = False  # the simulated cores carry the other work sampled live
    # this machine's prefill speed against the profile's machine (`calibrate` measures it):
    # the slice's requests are sampled that much more densely, so the burst loads the
    # workers as much on any machine (as long as each request takes, as many come)
    speedup: float = 1.0


def serve_config(cfg: FidelityConfig) -> ServeConfig:
    return ServeConfig().with_overrides(
        model={"name": MODEL},
        cluster={
            "num_workers": cfg.workers,
            "transfer_bytes_per_s": cfg.transfer_bytes_per_s,
            "disk_bytes_per_s": cfg.disk_bytes_per_s,
            "standby": "off",
        },
        router={"mode": "colocated", "prefill_budget_tokens": 512},
        engine={"max_model_len": 1024, "num_kv_blocks": 256, "max_num_batched_tokens": 1024},
        planner={"tokens_prefilled_per_sec": 600.0, "scale_down_idle_s": 2.0, "shutting_null_keep_s": 2.0},
        policy={"name": cfg.policy},
    )


def _preset(
    cfg: FidelityConfig, memory_bytes: float, background_threads: float = 0.0, profile: Profile | None = None
) -> SimPreset:
    rate = cfg.transfer_bytes_per_s
    topo = Topology(
        nodes=1,
        gpus_per_node=cfg.workers,
        nvlink_bytes_per_s=rate,
        nic_bytes_per_s=rate,
        pcie_bytes_per_s=rate,
        ssd_bytes_per_s=cfg.disk_bytes_per_s,
        latency_s=1e-4,
        cores_per_node=cfg.cores,
        background_threads=background_threads,
    )
    return SimPreset("fidelity", topo, cfg.profile.rsplit("-", 1)[1], memory_bytes, profile)


def requests(cfg: FidelityConfig) -> list[TraceRequest]:
    return Workload(
        rate_scale=cfg.rate_scale * cfg.speedup,
        time_scale=cfg.time_scale,
        max_input=cfg.max_input,
        max_output=cfg.max_output,
        duration_s=cfg.duration_s,
    ).requests()


def _side(records: list, events: list[ScaleEvent], wall_s: float) -> dict[str, Any]:
    s = summarize(records)
    return {
        "requests": s.num_requests,
        "ok": s.num_ok,
        "ttft_mean_s": round(s.ttft_s.mean, 4),
        "ttft_p99_s": round(s.ttft_s.p99, 4),
        "tbt_p99_s": round(s.tbt_s.p99, 4),
        "scale_ups": sum(1 for e in events if e.is_up),
        "scale_downs": sum(1 for e in events if e.direction == "down"),
        "wall_s": round(wall_s, 2),
    }


def run_live(cfg: FidelityConfig, reqs: list[TraceRequest]) -> dict[str, Any]:
    scfg = serve_config(cfg)
    with BackgroundService(scfg) as svc:
        scaler, cluster = svc.service.scaler, svc.service.cluster
        assert scaler is not None and cluster is not None
        before = len(scaler.events)
        t = time.perf_counter()
        rc = replay.ReplayConfig(url=svc.url, model=MODEL, show_progress=False, timeout_s=300)
        with OtherWork(lambda: [p.pid for p in cluster.procs if p.pid is not None]) as other:
            records = replay.run(reqs, rc)
        wall = time.perf_counter() - t
        events = scaler.events[before:]
    return {**_side(records, events, wall), "other_threads": round(other.threads, 2)}


def run_sim(
    cfg: FidelityConfig, reqs: list[TraceRequest], background_threads: float = 0.0, speed: Speed | None = None
) -> dict[str, Any]:
    """`background_threads`: other work busy on the machine's cores (`machine_load`);
    `speed`: this machine's against the profile's (`cpu_speed`; None: the profile's own)."""
    scfg = serve_config(cfg)
    profile = load_profile(cfg.profile)
    if speed is not None:
        profile = speed.apply(profile)
    # (the planner holds the SLO the live side's does: none, its default band)
    model = replace(
        load_model(MODEL), max_model_len=scfg.engine.max_model_len, ttft_slo_s=scfg.model.ttft_slo_s
    )
    setup = SimSetup(
        preset=_preset(cfg, float(profile.device_memory_bytes), background_threads, profile),
        model=model,
        mode=scfg.router.mode,
        planner=scfg.planner,
        engine=scfg.engine,
        router=scfg.router,
    )
    t = time.perf_counter()
    res = simulate(setup, reqs, cfg.policy)
    after_start = [e for e in res.events if e.time > 0]  # (as live: not the first instance's load)
    return _side(res.records, after_start, time.perf_counter() - t)


def _ratio(sim: float, live: float) -> float | None:
    return round(sim / live, 3) if live else None


def calibrated(cfg: FidelityConfig) -> tuple[FidelityConfig, Speed | None]:
    """With `calibrate`: this machine's speed against the profile's, and `cfg` with the
    `speedup` it gives (without: `cfg` as it is, and None)."""
    if not cfg.calibrate:
        return cfg, None
    speed = cpu_speed.measure(load_profile(cfg.profile))
    return replace(cfg, speedup=round(speed.prefill, 3)), speed


def run_fidelity(cfg: FidelityConfig) -> dict[str, Any]:
    cfg, speed = calibrated(cfg)
    reqs = requests(cfg)
    live = run_live(cfg, reqs)
    sim = run_sim(cfg, reqs, live["other_threads"] if cfg.calibrate else 0.0, speed)
    return {
        "config": asdict(cfg),
        "speed": asdict(speed) if speed is not None else None,
        "live": live,
        "sim": sim,
        "sim_over_live": {
            k: _ratio(sim[k], live[k]) for k in ("ttft_mean_s", "ttft_p99_s", "tbt_p99_s", "scale_ups")
        },
    }
