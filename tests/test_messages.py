"""Control messages round-trip through the msgpack codec; garbage is refused, not executed."""

from __future__ import annotations

import msgspec
import pytest

from blitzscale.messages import LoadMsg, ReplyMsg, TransferMsg, decode, encode


def test_round_trip_keeps_type_and_fields() -> None:
    msgs = [
        TransferMsg(op_id=3, model="m", source="random:x", chains=[[0, 1, 2], [3, 2, 1]], num_stripes=2),
        ReplyMsg(op_id=3, rank=1, ok=False, error="boom", result={"seconds": 0.5, "order": [1, 2]}),
        LoadMsg(op_id=4, model="m", source="/tmp/x", direct_io=True),
    ]
    for m in msgs:
        assert decode(encode(m)) == m


@pytest.mark.parametrize("data", [b"", b"\x93\x01\x02", b"cos\nsystem\n(S'ls'\ntR.", encode(3)])  # type: ignore[arg-type]
def test_garbage_or_untagged_bytes_are_refused(data: bytes) -> None:
    with pytest.raises(msgspec.DecodeError):
        decode(data)
