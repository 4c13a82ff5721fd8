"""Our on-disk format: a folder with one file per TP rank, each a header then the flat buffer.

    DST/blitzscale.json     model config, dtype, tp size, file list
    DST/rank{k}.bzw         4 KiB-aligned header (magic, JSON) + the rank's contiguous buffer
    DST/tokenizer*.json ... the tokenizer, as transformers saves it

The buffer is stored byte for byte as it lies in memory, so a load is one sequential read
straight into the destination buffer; per-segment CRC32s catch corruption.
"""

from __future__ import annotations

import json
import os
import struct
import zlib
from pathlib import Path
from typing import Any

import torch

from blitzscale.checkpoint.folders import INDEX_FILE
from blitzscale.core.progress import Report
from blitzscale.errors import CheckpointError
from blitzscale.model.config import DTYPE_NAMES, ModelConfig
from blitzscale.model.layout import SEGMENT_ALIGN
from blitzscale.model.weights import ModelWeights

MAGIC = b"BLTZWGT1"
FORMAT_VERSION = 2
PREAMBLE = struct.Struct("<III")  # header length, data offset, header CRC32
_DTYPES = {name: getattr(torch, name) for name in DTYPE_NAMES}


def dtype_name(dtype: torch.dtype) -> str:
    for k, v in _DTYPES.items():
        if v == dtype:
            return k
    raise CheckpointError(f"unsupported dtype {dtype}")


def parse_dtype(name: str) -> torch.dtype:
    if name not in _DTYPES:
        raise CheckpointError(f"unsupported dtype {name!r}; use one of {', '.join(_DTYPES)}")
    return _DTYPES[name]


def rank_file(folder: Path, rank: int) -> Path:
    return folder / f"rank{rank}.bzw"


def _bytes_of(t: torch.Tensor) -> memoryview:
    return memoryview(t.view(torch.uint8).numpy())


WRITE_CHUNK = 256 << 20  # bytes written (and reported) at a time


def save_rank(path: Path, weights: ModelWeights, report: Report | None = None, stage: str = "") -> None:
    """The rank's file, written whole or not at all; `report` hears the checksums' and the
    write's progress in bytes (stages named after `stage`)."""
    buf = weights.buffer.detach().cpu().contiguous()
    total = buf.numel() * buf.element_size()
    crcs, done = [], 0
    for i in range(len(weights.layout.segments)):
        s = weights.layout.segments[i]
        seg = _bytes_of(buf[s.offset : s.offset + s.numel])
        crcs.append(zlib.crc32(seg))
        done += len(seg)
        if report is not None:
            report(f"{stage}checksums", done, total)
    header = {
        "version": FORMAT_VERSION,
        "config": weights.config.to_dict(),
        "dtype": dtype_name(buf.dtype),
        "layout": weights.layout.to_dict(),
        "segment_crc32": crcs,
    }
    blob = json.dumps(header).encode()
    data_offset = -(-(len(MAGIC) + PREAMBLE.size + len(blob)) // SEGMENT_ALIGN) * SEGMENT_ALIGN
    tmp = path.with_suffix(".tmp")
    with open(tmp, "wb") as f:
        f.write(MAGIC + PREAMBLE.pack(len(blob), data_offset, zlib.crc32(blob)) + blob)
        f.write(b"\0" * (data_offset - f.tell()))
        data = _bytes_of(buf)
        for at in range(0, len(data), WRITE_CHUNK):
            f.write(data[at : at + WRITE_CHUNK])
            if report is not None:
                report(f"{stage}writing", min(at + WRITE_CHUNK, len(data)), len(data))
    os.replace(tmp, path)


def stored_shape(folder: Path, rank: int) -> tuple[ModelConfig, torch.dtype]:
    """The model configuration and the stored dtype of a rank file (its header only)."""
    header = read_header(rank_file(folder, rank))
    try:
        return ModelConfig.from_dict(header["config"]), parse_dtype(header["dtype"])
    except (KeyError, TypeError, ValueError) as e:
        raise CheckpointError(f"{rank_file(folder, rank)}: corrupt header: missing or bad field {e}") from e


def read_header(path: Path) -> dict[str, Any]:
    try:
        with open(path, "rb") as f:
            head = f.read(len(MAGIC) + PREAMBLE.size)
            if len(head) < len(MAGIC) + PREAMBLE.size or head[: len(MAGIC)] != MAGIC:
                raise CheckpointError(f"{path}: not a blitzscale weight file (bad magic)")
            blob_len, data_offset, crc = PREAMBLE.unpack(head[len(MAGIC) :])
            blob = f.read(blob_len)
            if zlib.crc32(blob) != crc:
                raise CheckpointError(f"{path}: corrupt header (checksum mismatch)")
            header = json.loads(blob)
    except OSError as e:
        raise CheckpointError(f"{path}: cannot read: {e}") from e
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{path}: corrupt header: {e}") from e
    header["data_offset"] = data_offset
    return header


def open_rank(
    path: Path, device: torch.device | str = "cpu", into: ModelWeights | None = None
) -> tuple[dict[str, Any], ModelWeights]:
    """A rank file's checked header, and an empty buffer for its data (stored dtype) on
    `device` (or `into`, a buffer of the same shape and dtype, whose contents it replaces):
    every loader starts here, so every loader refuses the same broken files."""
    header = read_header(path)
    try:
        cfg = ModelConfig.from_dict(header["config"])
        stored = parse_dtype(header["dtype"])
        lay = header["layout"]
        if into is not None and (into.config != cfg or into.dtype != stored):
            raise CheckpointError(f"{path}: not of the shape and dtype of the buffer given to load it into")
        weights = into or ModelWeights.empty(cfg, stored, device, lay["tp_size"], lay["tp_rank"])
        crcs = list(header["segment_crc32"])
    except (KeyError, TypeError, ValueError) as e:
        raise CheckpointError(f"{path}: corrupt header: missing or bad field {e}") from e
    if len(crcs) != len(weights.layout.segments):
        raise CheckpointError(f"{path}: corrupt header: {len(crcs)} segment checksums")
    if weights.layout.to_dict() != lay:
        raise CheckpointError(f"{path}: layout does not match this version's layout of the model")
    expect = header["data_offset"] + weights.layout.nbytes
    size = path.stat().st_size
    if size != expect:
        raise CheckpointError(f"{path}: {size} bytes, expected {expect} (truncated or padded?)")
    return header, weights


def load_rank(path: Path, verify: bool = True) -> ModelWeights:
    """Read one rank file into a fresh CPU buffer, checking every segment's CRC32."""
    header, weights = open_rank(path)
    crcs = header["segment_crc32"]
    with open(path, "rb") as f:
        f.seek(header["data_offset"])
        f.readinto(_bytes_of(weights.buffer))
    if verify:
        for i, crc in enumerate(crcs):
            if zlib.crc32(_bytes_of(weights.segment(i))) != crc:
                name = weights.layout.segments[i].name
                raise CheckpointError(f"{path}: segment {name} fails its checksum (corrupt file)")
    weights.readiness.mark_all_ready()
    return weights


def write_index(folder: Path, cfg: ModelConfig, dtype: torch.dtype, tp_size: int) -> None:
    index = {
        "format": "blitzscale",
        "version": FORMAT_VERSION,
        "config": cfg.to_dict(),
        "dtype": dtype_name(dtype),
        "tp_size": tp_size,
        "files": [rank_file(folder, r).name for r in range(tp_size)],
    }
    (folder / INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n")


def read_index(folder: Path) -> dict[str, Any]:
    try:
        index = json.loads((folder / INDEX_FILE).read_text())
        ModelConfig.from_dict(index["config"])
        return index
    except (OSError, json.JSONDecodeError, KeyError, TypeError) as e:
        raise CheckpointError(f"{folder / INDEX_FILE}: unreadable: {e}") from e
