"""Every control message between processes, as msgspec structs with one msgpack codec.

Tensors never travel here (they go over torch.distributed); pickle never does either.
A message is a tagged struct; `encode` / `decode` are the only way onto a socket.
"""

from __future__ import annotations

from typing import Any

import msgspec


class Msg(msgspec.Struct, tag=True, kw_only=True, frozen=True):
    """Base of all messages; the tag is the class name."""


# --- worker -> controller ------------------------------------------------------------


class HelloMsg(Msg):
    rank: int
    pid: int
    device: str


class ReplyMsg(Msg):
    """Answer to one command; `ok=False` carries a one-line error."""

    op_id: int
    rank: int
    ok: bool
    error: str = ""
    result: dict[str, Any] = {}


# --- controller -> worker ------------------------------------------------------------


class LoadMsg(Msg):
    """Load a model locally: from disk (our format or an HF folder) or random weights."""

    op_id: int
    model: str  # the name the pool knows it by
    source: str  # a model spec: path, name, random:...
    tp_size: int = 1
    tp_rank: int = 0
    parallel_readers: int = 8
    direct_io: bool = False  # O_DIRECT reads (bypass the page cache) where possible


class TransferMsg(Msg):
    """One rank's part of a weight transfer; every participant gets the same plan."""

    op_id: int
    model: str
    source: str  # spec of the model, so a target can size its buffer
    chains: list[list[int]]  # chains[j] = [source rank, target ranks...] carrying stripe j
    num_stripes: int
    dtype: str = "float32"
    piece_bytes: int = 0  # 0: one piece per segment stripe
    host_source: bool = False  # chain heads send from their pinned host copy
    head_is_target: bool = False  # with host_source: the head also loads the model itself
    max_bytes_per_s: float = 0.0  # 0: no cap (a cap reproduces slow links)
    timeout_s: float = 60.0
    tp_size: int = 1
    tp_rank: int = 0


class HostCacheMsg(Msg):
    """Keep (or drop) this rank's pinned host copy of a model it holds on its device."""

    op_id: int
    model: str
    keep: bool = True


class ReleaseMsg(Msg):
    op_id: int
    model: str
    host_copy: bool = False  # also drop the host copy


class ChecksumMsg(Msg):
    op_id: int
    model: str
    host_copy: bool = False


class ShutdownMsg(Msg):
    op_id: int = 0


Message = HelloMsg | ReplyMsg | LoadMsg | TransferMsg | HostCacheMsg | ReleaseMsg | ChecksumMsg | ShutdownMsg

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(Message)


def encode(msg: Message) -> bytes:
    return _encoder.encode(msg)


def decode(data: bytes) -> Message:
    return _decoder.decode(data)
