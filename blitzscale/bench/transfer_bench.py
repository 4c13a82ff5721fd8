"""`blitzscale bench transfer`: how fast a new instance gets its weights, by each path.

Every target's weights are checksummed next to the source's, so each figure comes with a
proof that the copy is bit-identical. With `--limits`, the raw hardware limits (NCCL
send/recv, pinned host-to-device copy, raw disk reads) are measured in the same run. With
`--dtype fp8`, every path runs twice in one run, for the model as named (dense) and for its
FP8 form (`random:NAME:fp8`), and `fp8_over_dense` gives each path's bytes and GB/s ratios:
FP8 should move about half the bytes at the same rate.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import torch

from blitzscale.checkpoint import native, resolve_model
from blitzscale.checkpoint.loader import load_weights
from blitzscale.checkpoint.pack import hf_state_dict
from blitzscale.cluster.blocking import Blocking
from blitzscale.cluster.config import ClusterConfig
from blitzscale.cluster.local import LocalCluster
from blitzscale.cluster.results import TransferResult
from blitzscale.errors import BlitzScaleError
from blitzscale.transfer.disk import drop_page_cache

MODES = ("p2p", "chain", "striped", "host", "disk", "hf")
M = "model"


@dataclass(frozen=True)
class TransferBenchConfig:
    model: str
    workers: int
    device: str
    modes: tuple[str, ...]
    workdir: Path
    piece_bytes: int = 0
    readers: int = 8
    limits: bool = False
    dtype: str = "dense"  # "dense": the model as named; "fp8": it and its FP8 form, side by side


def _checked(c: Blocking, ranks: list[int], report: dict[int, TransferResult], ref: str) -> list[dict]:
    rows = []
    for r in ranks:
        ck = c.checksum(M, r)
        fields = {**dataclasses.asdict(report[r]), "GBps": report[r].GBps}
        rows.append(
            {
                "rank": r,
                **{k: _round(v) for k, v in fields.items() if k != "ready_order"},
                "checksum": ck,
                "source_checksum": ref,
                "identical": ck == ref,
            }
        )
    return rows


def _round(v: Any) -> Any:
    return round(v, 5) if isinstance(v, float) else v


def _release_all(c: Blocking) -> None:
    for r in c.pool.gpu_holders(M):
        c.release(M, r)


def _network(c: Blocking, cfg: TransferBenchConfig, mode: str) -> dict[str, Any]:
    n = c.world_size
    if mode == "striped" and n < 3:
        raise BlitzScaleError("--mode striped needs at least 3 workers (2 sources, 1 target)")
    if n < 2:  # (checked before anything loads: p2p's target would be a rank that is not there)
        raise BlitzScaleError(f"--mode {mode} needs at least 2 workers")
    c.load(M, 0, cfg.model)
    ref = c.checksum(M, 0)
    if mode == "striped":
        c.transfer(M, cfg.model, [0], [1])
        sources, targets = [0, 1], list(range(2, n))
    else:
        sources, targets = [0], [1] if mode == "p2p" else list(range(1, n))
    report = c.transfer(M, cfg.model, sources, targets, piece_bytes=cfg.piece_bytes)
    rows = _checked(c, targets, report, ref)
    _release_all(c)
    return {"sources": sources, "targets": rows}


def _host(c: Blocking, cfg: TransferBenchConfig) -> dict[str, Any]:
    c.load(M, 0, cfg.model)
    ref = c.checksum(M, 0)
    c.cache_on_host(M, 0)
    c.release(M, 0)  # no GPU holds it now: scale from zero
    targets = list(range(c.world_size))
    report = c.transfer(M, cfg.model, [0], targets, from_host=True, piece_bytes=cfg.piece_bytes)
    rows = _checked(c, targets, report, ref)
    _release_all(c)
    c.release_host_copy(M)
    return {"host_copy_rank": 0, "targets": rows}


def _write_model(cfg: TransferBenchConfig, kind: str) -> tuple[Path, str]:
    """Our format or an HF folder of the model, written once (from the GPU if there is one)."""
    dev = "cuda:0" if cfg.device == "cuda" else "cpu"
    dtype = torch.bfloat16 if cfg.device == "cuda" else torch.float32
    out = cfg.workdir / f"bench-{kind}-{cfg.model.replace(':', '-').replace('/', '-')}"
    if (out / ("blitzscale.json" if kind == "native" else "config.json")).exists():
        return out, "reused"
    out.mkdir(parents=True, exist_ok=True)
    w = load_weights(resolve_model(cfg.model), dtype=dtype, device=dev)
    if kind == "native":
        native.save_rank(native.rank_file(out, 0), w)
        native.write_index(out, w.config, dtype, 1)
    else:
        import json

        from safetensors.torch import save_file

        sd = {k: v.contiguous().cpu() for k, v in hf_state_dict(w).items()}
        if w.config.tie_word_embeddings:
            sd.pop("lm_head.weight")
        save_file(sd, str(out / "model.safetensors"), metadata={"format": "pt"})
        (out / "config.json").write_text(json.dumps({**w.config.to_hf(), "torch_dtype": str(dtype)[6:]}))
    del w
    if cfg.device == "cuda":
        torch.cuda.empty_cache()
    return out, "written"


def _from_disk(c: Blocking, cfg: TransferBenchConfig, kind: str) -> dict[str, Any]:
    folder, _ = _write_model(cfg, kind)
    files = list(folder.glob("*.bzw" if kind == "native" else "*.safetensors"))
    out: dict[str, Any] = {"folder": str(folder)}
    runs = [("cold", False), ("warm", False)] + ([("cold_direct_io", True)] if kind == "native" else [])
    for temp, direct in runs:
        if temp.startswith("cold"):
            for f in files:
                drop_page_cache(f)
        t = time.perf_counter()
        loaded = c.load(M, 0, str(folder), readers=cfg.readers, direct_io=direct)
        res = {**msgspec.structs.asdict(loaded), "wall_s": time.perf_counter() - t}
        res["checksum"] = c.checksum(M, 0)
        out[temp] = {k: _round(v) for k, v in res.items()}
        c.release(M, 0)
    if kind == "hf" and cfg.device == "cuda":
        out["hf_from_pretrained"] = _hf_from_pretrained(folder, files)
    return out


def _hf_from_pretrained(folder: Path, files: list[Path]) -> dict[str, float]:
    from transformers import AutoModelForCausalLM

    res = {}
    for temp in ("cold", "warm"):
        if temp == "cold":
            for f in files:
                drop_page_cache(f)
        t = time.perf_counter()
        m = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.bfloat16, device_map="cuda:0")
        torch.cuda.synchronize()
        res[f"{temp}_s"] = round(time.perf_counter() - t, 3)
        del m
        torch.cuda.empty_cache()
    return res


def _limits(cfg: TransferBenchConfig) -> dict[str, Any]:
    from blitzscale.bench import limits

    out: dict[str, Any] = {}
    if cfg.device == "cuda":
        out["pinned_h2d_GBps"] = round(limits.pinned_h2d_GBps(), 2)
        if torch.cuda.device_count() >= 2:
            out["nccl_sendrecv_4GiB_GBps"] = round(limits.nccl_sendrecv_GBps(), 2)
    folder, _ = _write_model(cfg, "native")
    f = native.rank_file(folder, 0)
    for readers in sorted({1, 4, cfg.readers}):
        out[f"raw_read_cold_direct_{readers}r_GBps"] = round(limits.raw_read_GBps(f, readers, cold=True), 3)
    out["raw_read_cold_buffered_4r_GBps"] = round(limits.raw_read_GBps(f, 4, cold=True, direct=False), 3)
    for readers in (1, cfg.readers):  # the buffered pass above left the file in the page cache
        out[f"raw_read_warm_{readers}r_GBps"] = round(limits.raw_read_GBps(f, readers, cold=False), 3)
    return out


def _run_mode(c: Blocking, cfg: TransferBenchConfig, mode: str) -> dict[str, Any]:
    if mode in ("p2p", "chain", "striped"):
        return _network(c, cfg, mode)
    if mode == "host":
        return _host(c, cfg)
    return _from_disk(c, cfg, "native" if mode == "disk" else "hf")


FP8_MODES = ("p2p", "chain", "striped", "host", "disk")  # (hf: an HF folder of FP8 is not ours to write)
DTYPES = ("dense", "fp8")


def fp8_model(model: str) -> str:
    """The FP8 form of a `random:NAME` model; refuses anything else by name."""
    if not model.startswith("random:") or model.endswith(":fp8"):
        raise BlitzScaleError(
            f"--dtype fp8 compares a random:NAME model with its FP8 form, got {model!r} "
            "(for a checkpoint, run the bench on it and on its `convert --dtype fp8` folder)"
        )
    return f"{model}:fp8"


def run_transfer_bench(cfg: TransferBenchConfig) -> dict[str, Any]:
    if cfg.dtype not in DTYPES:
        raise BlitzScaleError(f"--dtype: unknown {cfg.dtype!r}; use {', '.join(DTYPES)}")
    if cfg.dtype == "dense":
        return _bench(cfg)
    fp8 = dataclasses.replace(cfg, model=fp8_model(cfg.model), dtype="dense")
    bad = [m for m in cfg.modes if m not in FP8_MODES]
    if bad:
        raise BlitzScaleError(f"--dtype fp8: mode {', '.join(bad)} is not measured for FP8; use {FP8_MODES}")
    dense = dataclasses.replace(cfg, dtype="dense")
    result: dict[str, Any] = {"dense": _bench(dense), "fp8": _bench(fp8)}
    result["fp8_over_dense"] = {
        mode: _ratios(result["dense"][mode], result["fp8"][mode]) for mode in cfg.modes
    }
    return result


def _path_figures(res: dict[str, Any]) -> tuple[float, float] | None:
    """(bytes, GB/s) of one path's result: its targets' means (network, host), or the warm
    read's (disk); None where the mode failed."""
    if "targets" in res:
        rows = res["targets"]
        return sum(r["bytes"] for r in rows) / len(rows), sum(r["GBps"] for r in rows) / len(rows)
    if "warm" in res:
        return res["warm"]["bytes"], res["warm"]["GBps"]
    return None


def _ratios(dense: dict[str, Any], fp8: dict[str, Any]) -> dict[str, float] | str:
    a, b = _path_figures(dense), _path_figures(fp8)
    if a is None or b is None:
        return "not measured: the mode failed (its `error`)"
    return {"bytes": round(b[0] / a[0], 3), "GBps": round(b[1] / a[1], 3) if a[1] else 0.0}


def _bench(cfg: TransferBenchConfig) -> dict[str, Any]:
    result: dict[str, Any] = {
        "model": cfg.model,
        "device": cfg.device,
        "device_name": torch.cuda.get_device_name(0) if cfg.device == "cuda" else "cpu",
        "torch": torch.__version__,
    }
    if cfg.limits:
        result["limits"] = _limits(cfg)
    ccfg = ClusterConfig(num_workers=cfg.workers, device=cfg.device, piece_bytes=cfg.piece_bytes)
    with LocalCluster(ccfg).blocking as c:
        result["workers"] = c.world_size
        for mode in cfg.modes:
            t = time.perf_counter()
            try:
                result[mode] = _run_mode(c, cfg, mode)
            except BlitzScaleError as e:  # recorded; the other modes still run
                result[mode] = {"error": str(e)}
                _release_all(c)
            result[mode]["bench_wall_s"] = round(time.perf_counter() - t, 3)
    return result
