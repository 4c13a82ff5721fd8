"""The cost model of every served model on the workers' device, found once at start.

The default model's is measured by its first worker (worker/costprobe.py; kept in the cache
folder's `profiles/`, so a restart reads it back) or read from `[model] profile`, which must
be of this model and of this kind of device. A model of the same shape shares it; another
shape gets it scaled by weight bytes (an estimate until it is measured itself). A
tensor-parallel instance's is one shard's (its sizes are a rank's share, its steps include
the all-reduces), measured on a scratch instance across the first instance group's ranks
(worker/cost_report.py); a profile file given for one is one shard's, or the whole model's
on one device (what `blitzscale profile` measures; used as given, as before TP instances
were measured).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from blitzscale.cluster.base import Cluster
from blitzscale.cluster.commands import CostQuery
from blitzscale.control.costmodel import CostReport, Profile, ProfileError, load_profile
from blitzscale.control.residency import Footprint, resolve_models_per_rank
from blitzscale.core.config import EngineConfig
from blitzscale.errors import InvalidRequestError
from blitzscale.serve.config import ModelEntry, ServeConfig

log = logging.getLogger("blitzscale.serve")


def profiles_dir(cfg: ServeConfig) -> Path:
    root = cfg.model.cache_dir or os.environ.get("BLITZSCALE_CACHE", "~/.cache/blitzscale")
    return Path(root).expanduser() / "profiles"


def profile_file(cfg: ServeConfig) -> Profile | None:
    """`[model] profile`, read and checked against the device type (before any worker
    starts; the GPU's name and the model's shape are checked once a worker says them)."""
    path = cfg.model.profile
    if not path:
        return None
    try:
        profile = load_profile(path)
    except ProfileError as e:
        raise ProfileError(f"[model] profile: {e}") from e
    if cfg.cluster.device == "cpu":
        profile.check_device("cpu", f"[model] profile {path}")
    elif profile.device.lower().startswith("cpu"):
        raise ProfileError(
            f"[model] profile {path}: measured on {profile.device!r}, "
            f"but the workers run on {cfg.cluster.device}"
        )
    return profile


async def _report(
    cluster: Cluster,
    model: ModelEntry,
    folder: str,
    engine: EngineConfig,
    cache: Path,
    measure: bool,
    tp: int = 1,
) -> CostReport:
    """Rank 0's answer (with `tp` > 1: one shard's sizes, and rank 0 leads the instance
    group a measurement runs on)."""
    query = CostQuery(
        model=model.name, source=folder, engine=engine, cache_dir=str(cache), measure=measure, tp=tp
    )
    return await cluster.cost_report(0, query)


async def shape_reports(
    cluster: Cluster,
    cfg: ServeConfig,
    models: Sequence[ModelEntry],
    folders: Mapping[str, str],
    engine: EngineConfig,
) -> dict[str, CostReport]:
    """Each model's shape and the workers' device, as rank 0 says them (nothing measured)."""
    cache = profiles_dir(cfg)
    return {m.name: await _report(cluster, m, folders[m.name], engine, cache, measure=False) for m in models}


def footprint(report: CostReport, tp: int) -> Footprint:
    """A model's least bytes on one rank: its shard of the weights, and of the KV cache of
    one request of its whole context."""
    return Footprint(report.weight_bytes // tp, report.kv_bytes_per_token * report.context_len // tp)


def models_per_rank(cfg: ServeConfig, shapes: Mapping[str, CostReport], engine: EngineConfig) -> int:
    """`[cluster] models_per_rank`, derived from the device and the models when 0
    (control/residency.py), and every model checked to fit its share of a rank."""
    tp = cfg.model.tp
    first = next(iter(shapes.values()))
    per_rank = resolve_models_per_rank(
        cfg.cluster.models_per_rank,
        [footprint(r, tp) for r in shapes.values()],
        first.device_memory_bytes,
        engine.gpu_memory_utilization,
        gpu=cfg.cluster.device == "cuda",
        tp=tp,
    )
    for name, shape in shapes.items():  # (before anything is measured or loaded)
        capped = bool(cfg.cluster.worker_memory_bytes)
        check_fits_device(name, shape, tp, per_rank, engine.gpu_memory_utilization, capped)
    return per_rank


async def cost_models(
    cluster: Cluster,
    cfg: ServeConfig,
    models: Sequence[ModelEntry],
    folders: Mapping[str, str],
    engine: EngineConfig,
    shapes: Mapping[str, CostReport],
    given: Profile | None = None,
) -> dict[str, Profile | None]:
    """Each model's cost model (one shard's for tensor-parallel instances). `shapes`: each
    model's shape (`shape_reports`); `given`: the `[model] profile` file, read before the
    workers started (`profile_file`)."""
    cache = profiles_dir(cfg)
    default, tp = models[0], cfg.model.tp
    first = await _report(cluster, default, folders[default.name], engine, cache, given is None, tp)
    per_shard = tp > 1  # the base's sizes are one shard's (the others' are compared as such)
    if given is not None:
        where = f"[model] profile {cfg.model.profile}"
        whole = shapes[default.name]  # (a TP=1 profile, as `blitzscale profile` measures: as given)
        if tp > 1 and _sizes(given) == _sizes(whole):
            given.check_device(first.device_name, where)
            per_shard = False
        else:
            first.check(given, where)
    base = given or first.profile
    assert base is not None  # (measured when not given)
    how = f"from {cfg.model.profile}" if given else ("read back" if first.cached else "measured")
    log.info(
        "cost model of %s on %s (%s, %.2f s): %s",
        default.name,
        first.device_name,
        how,
        first.probe_s,
        describe(base),
    )
    out: dict[str, Profile | None] = {default.name: base}
    for m in models[1:]:  # (each model's sizes as the base's are: one shard's, or whole)
        r = shapes[m.name]
        if per_shard:
            r = await _report(cluster, m, folders[m.name], engine, cache, False, tp)
        shape = (r.weight_bytes, r.kv_bytes_per_token, r.num_layers)
        if shape == (base.weight_bytes, base.kv_bytes_per_token, base.num_layers):
            out[m.name] = base
        else:
            out[m.name] = base.scaled(m.name, *shape)
            log.info("cost model of %s: %s", m.name, out[m.name].note)  # type: ignore[union-attr]
    return out


def _sizes(p: Profile | CostReport) -> tuple[int, int, int]:
    return p.weight_bytes, p.kv_bytes_per_token, p.num_layers


def check_fits_device(
    model: str, report: CostReport, tp: int, per_rank: int = 1, utilization: float = 1.0, capped: bool = False
) -> None:
    """Refuse a model whose share of the weights and the KV cache of one request of its
    whole context do not fit one rank's device memory, naming the sizes (unknown: pass).
    `capped`: the memory reported is `[cluster] worker_memory_bytes`, not the device's.
    A rank's share is the whole model's bytes / tp: tensors every shard holds in full (the
    embeddings) are counted once, so a tp > 1 model near the limit may still not fit.
    With `per_rank` models resident per rank each must fit its equal share of the device
    (`utilization` of it: what the engines size their KV caches from)."""
    if not report.device_memory_bytes:
        return
    need = footprint(report, tp)
    weights, kv = need.weight_bytes, need.min_kv_bytes
    gb = 1e9
    if per_rank > 1:
        share = int(report.device_memory_bytes * utilization) // per_rank
        if weights + kv <= share:
            return
        fit = int(report.device_memory_bytes * utilization) // (weights + kv)
        raise InvalidRequestError(
            f"[cluster] models_per_rank={per_rank}: each model gets {share / gb:.2f} GB of the "
            f"{report.device_memory_bytes / gb:.2f} GB device ({report.device_name}, x{utilization} "
            f"gpu_memory_utilization, / {per_rank}), but model {model!r} needs {weights / gb:.2f} GB of "
            f"weights and {kv / gb:.2f} GB of KV cache for one request of its {report.context_len}-token "
            f"context; at most {fit} such models fit a rank"
        )
    if weights + kv <= report.device_memory_bytes:
        return
    held = f"{report.device_memory_bytes / gb:.2f} GB"
    where = (
        f"{held} a worker may hold ([cluster] worker_memory_bytes); raise it, or serve it"
        if capped
        else f"{held} of the workers' device ({report.device_name}); serve it"
    )
    raise InvalidRequestError(
        f"model {model!r} does not fit a rank: its weights take {weights / gb:.2f} GB per rank "
        f"(tp={tp}) and one request of its {report.context_len}-token context "
        f"{kv / gb:.2f} GB of KV cache, {(weights + kv) / gb:.2f} GB in all, more than the {where} "
        "with a larger tp, or converted to FP8 (`blitzscale convert --dtype fp8`)"
    )


def describe(p: Profile) -> str:
    """One line: the prefill rate and decode step times at the smallest and largest batch."""
    lo, hi = p.decode_batch[0], p.decode_batch[-1]
    ctx = p.decode_context[0]
    return (
        f"prefill {p.prefill_rate():,.0f} tokens/s ({p.prefill_tokens[-1]} a step), decode "
        f"{1000 * p.decode_s(lo, ctx):.2f} ms at batch {lo}, "
        f"{1000 * p.decode_s(hi, ctx):.2f} ms at batch {hi}"
    )
