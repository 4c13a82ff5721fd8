"""`blitzscale bench standby`: what starting an instance's engine costs, with and without
the worker's standby engine (worker/standby.py), on one worker.

Per run a fresh one-worker cluster loads the model, keeps it in the host copy, releases it
from the device, brings it back from the host copy (into the standby's buffer, when there
is one) and activates it; the activation's reply says how long building (or taking) the
engine took. Runs go in order `off`, `on`, `off`: the first pays Triton's compilation for
the model's shapes with a cold on-disk cache, the last with a warm one.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any

import torch

from blitzscale.cluster.commands import Activation
from blitzscale.cluster.config import ClusterConfig
from blitzscale.cluster.local import LocalCluster
from blitzscale.engine import EngineConfig
from blitzscale.worker.standby import StandbySpec

M = "bench-model"


@dataclass(frozen=True)
class StandbyBenchConfig:
    model: str = "random:llama3-8b"
    device: str = "cuda"
    max_num_seqs: int = 64
    max_model_len: int = 4096
    runs: tuple[str, ...] = ("off", "on", "off")


def _one(cfg: StandbyBenchConfig, standby: str) -> dict[str, Any]:
    engine = EngineConfig(max_num_seqs=cfg.max_num_seqs, max_model_len=cfg.max_model_len)
    ccfg = ClusterConfig(num_workers=1, device=cfg.device, standby=standby)
    spec = StandbySpec(M, cfg.model, engine) if ccfg.uses_standby else None
    t = time.perf_counter()
    with LocalCluster(ccfg, standby=spec).blocking as c:
        start_s = time.perf_counter() - t
        c.load(M, 0, cfg.model)
        c.cache_on_host(M, 0)
        c.release(M, 0)  # (with a standby: a random model's load dropped it, the release re-arms it)
        t = time.perf_counter()
        c.transfer(M, cfg.model, [0], [0], from_host=True)
        load_s = time.perf_counter() - t
        act = Activation(model=M, source=cfg.model, role="colocated", engine=engine)
        t = time.perf_counter()
        reply = c.activate({0: act})[0]
        activate_s = time.perf_counter() - t
        c.deactivate(0)
    return {
        "standby": standby,
        "cluster_start_s": round(start_s, 3),
        "host_load_s": round(load_s, 3),
        "activate_s": round(activate_s, 4),
        "engine_s_on_worker": round(reply.engine_s, 4),
        "used_standby": reply.standby,
        "num_kv_blocks": reply.num_kv_blocks,
    }


def run_standby_bench(cfg: StandbyBenchConfig) -> dict[str, Any]:
    return {
        "config": asdict(cfg),
        "device_name": torch.cuda.get_device_name(0) if cfg.device == "cuda" else "cpu",
        "torch": torch.__version__,
        "runs": [_one(cfg, s) for s in cfg.runs],
    }
