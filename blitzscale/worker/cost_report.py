"""A worker's answer to "what does this model cost on your device" (`ProfileMsg`): the
device's name and memory, the model's shape and context and, if asked, its cost model here
(measured by worker/costprobe.py on the standby engine or a scratch one, or read back from
the cache folder when it was measured before): a CostReport's fields.

A tensor-parallel instance's (`tp` > 1) is asked of the rank leading the first instance
group: the sizes are one shard's (as the simulator's TP profiles have them, sim/tp.py), and
the probe runs a scratch instance across the group: shard 0's engine here, whose every step
the other shards run on stand-in shards of their own (`TPSetupMsg.stand_in_source`), so the
steps timed include the all-reduces between them.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import torch

from blitzscale.checkpoint import load_config, resolve_model
from blitzscale.control.costmodel import Profile
from blitzscale.core.config import EngineConfig
from blitzscale.errors import BlitzScaleError
from blitzscale.kvcache.cache import KVCache
from blitzscale.messages import ProfileMsg, ProfileResult, TPSetupMsg, TPStopMsg
from blitzscale.model.weights import layout_of
from blitzscale.worker import costprobe
from blitzscale.worker.standby import Standby, free_device_memory
from blitzscale.worker.tp import TPLeader
from blitzscale.worker.world import InstanceGroup

log = logging.getLogger("blitzscale.worker")


def device_memory_bytes(device: torch.device) -> int:
    """The device's whole memory (a CPU worker's: its host's physical memory)."""
    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).total_memory)
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def cost_report(
    msg: ProfileMsg,
    device: torch.device,
    dtype: torch.dtype,
    standby: Standby,
    rank: int,
    cap: int = 0,
    instance: InstanceGroup | None = None,
) -> ProfileResult:
    """`cap`: what the worker may hold on its device, when lower than the device's memory
    (`[cluster] worker_memory_bytes`): the memory it reports, so the start-up checks and the
    models-per-rank rule plan for the same bound the worker keeps (worker/memory.py).
    `instance`: this rank's tensor-parallel group (a TP measurement runs on it)."""
    config = load_config(resolve_model(msg.source))
    layout = layout_of(config, dtype, msg.tp)
    out = ProfileResult(
        device_name=costprobe.device_name(device),
        weight_bytes=layout.nbytes,
        kv_bytes_per_token=KVCache.bytes_per_block(config, 1, dtype, msg.tp),
        num_layers=config.num_layers,
        device_memory_bytes=min(cap, device_memory_bytes(device)) if cap else device_memory_bytes(device),
        # (the engine's: capped by `[engine] max_model_len` as LLMEngine caps it)
        context_len=min(
            msg.engine.max_model_len or config.max_position_embeddings, config.max_position_embeddings
        ),
    )
    if not msg.measure:
        return out
    engine_cfg = msg.engine.for_device(device.type)
    key = costprobe.cache_key(config, dtype, device, engine_cfg, tp=msg.tp)
    folder = Path(msg.cache_dir) if msg.cache_dir else None
    t = time.perf_counter()
    profile = costprobe.cached_profile(folder, key) if folder is not None else None
    cached = profile is not None
    if profile is None:
        probe = _Probe(msg, config, dtype, device, engine_cfg, costprobe.probe_points(device, engine_cfg))
        profile = probe.on_instance(_leader_of(instance, msg.tp, rank)) if msg.tp > 1 else probe.here(standby)
    if not cached and folder is not None:
        costprobe.save_profile(folder, key, profile)
    took = time.perf_counter() - t
    how = "read back" if cached else "measured"
    log.info("rank %d: cost model of %s %s in %.2f s", rank, msg.model, how, took)
    return msgspec.structs.replace(out, profile=profile, cached=cached, probe_s=took)


def _leader_of(instance: InstanceGroup | None, tp: int, rank: int) -> TPLeader:
    if instance is None or instance.size != tp or instance.rank != 0:
        size = instance.size if instance is not None else 1
        raise BlitzScaleError(
            f"rank {rank} cannot measure a tp={tp} instance: it leads no instance group of {tp} "
            f"ranks (its group: {size} ranks)"
        )
    return TPLeader(instance)


@dataclass(frozen=True)
class _Probe:
    """One measurement of `msg.model`'s cost model on this device: its config, the engine
    configuration and the points to time."""

    msg: ProfileMsg
    config: Any
    dtype: torch.dtype
    device: torch.device
    engine_cfg: EngineConfig
    points: costprobe.ProbePoints

    def here(self, sb: Standby) -> Profile:
        """On the standby engine when it is this model's and of this engine configuration
        (its buffer filled with stand-in weights: none have arrived in it), else a scratch
        engine."""
        ours = sb.spec is not None and sb.spec.model == self.msg.model and sb.weights is not None
        if ours and sb.engine is not None and sb.engine.config == self.engine_cfg:
            assert sb.weights is not None
            with costprobe.stand_in(sb.weights):
                return costprobe.measure(sb.engine, self.points, self.msg.model)
        return self._on_scratch(lambda engine: costprobe.measure(engine, self.points, self.msg.model))

    def on_instance(self, leader: TPLeader) -> Profile:
        """A scratch instance across `leader`'s group: shard 0's engine here, the other
        shards on stand-in weights of their own with KV caches of its size, dropped after."""
        return self._on_scratch(lambda engine: self._lead(engine, leader), leader)

    def _lead(self, engine: Any, leader: TPLeader) -> Profile:
        msg = self.msg
        setup = TPSetupMsg(
            model=msg.model,
            num_blocks=engine.counts()["total_blocks"],
            block_size=self.engine_cfg.block_size,
            max_model_len=engine.max_model_len,
            stand_in_source=msg.source,
        )
        leader.send(setup)
        try:
            if not leader.all_ok():
                members = list(leader.instance.members)
                raise BlitzScaleError(f"ranks {members}: a shard could not build its stand-in of {msg.model}")
            return costprobe.measure(engine, self.points, msg.model)
        finally:
            try:
                leader.send(TPStopMsg())
                leader.flush()
            except Exception as e:  # (a broken group: keep what broke the probe, not this)
                log.error("the cost probe's instance group could not be stopped: %s", e)

    def _on_scratch(self, run: Callable[[Any], Profile], leader: TPLeader | None = None) -> Profile:
        """`run` on a scratch engine for the probe (shard 0's, leading `leader`), freed after
        (this frame holds its only reference, so the device memory goes back here)."""
        engine = costprobe.scratch_engine(
            self.config, self.dtype, self.device, self.engine_cfg, self.points, leader
        )
        try:
            return run(engine)
        finally:
            del engine
            free_device_memory(self.device)
