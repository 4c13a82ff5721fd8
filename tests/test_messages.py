"""Control messages round-trip through the msgpack codec; garbage is refused, not executed."""

from __future__ import annotations

import msgspec
import pytest

from blitzscale.control.costmodel import load_profile
from blitzscale.messages import (
    ActivateResult,
    ChecksumResult,
    HostCopyResult,
    LinkResult,
    LoadMsg,
    LoadResult,
    NoResult,
    ProfileResult,
    ReleaseResult,
    ReplyMsg,
    TransferMsg,
    TransferRankResult,
    decode,
    encode,
)


def test_round_trip_keeps_type_and_fields() -> None:
    msgs = [
        TransferMsg(op_id=3, model="m", source="random:x", chains=[[0, 1, 2], [3, 2, 1]], num_stripes=2),
        ReplyMsg(op_id=3, rank=1, ok=False, error="boom"),
        LoadMsg(op_id=4, model="m", source="/tmp/x", direct_io=True),
    ]
    for m in msgs:
        assert decode(encode(m)) == m


def test_every_reply_result_comes_back_as_its_own_type() -> None:
    """A reply carries one typed result per command (never a dict read by key)."""
    results = [
        NoResult(),
        LoadResult(
            path="disk", bytes=10, seconds=0.5, GBps=2.0, first_layer_s=0.1, direct_io=True, readers=8
        ),
        TransferRankResult(
            start=1.0, received_at=0.9, done_at=2.0, first_layer_at=None, ready_order=[2, 0, 1]
        ),
        HostCopyResult(bytes=7, pinned=True),
        ActivateResult(num_kv_blocks=64, max_model_len=512, standby=True, engine_s=0.02),
        ReleaseResult(freed_bytes=9, device_bytes_in_use=0, standby=False),
        ChecksumResult(checksum="abc", dtype="float32", bytes=3),
        ProfileResult(
            device_name="cpu",
            weight_bytes=1,
            kv_bytes_per_token=2,
            num_layers=3,
            profile=load_profile("llama3-8b-a100"),
        ),
        LinkResult(seconds=0.25),
    ]
    for res in results:
        back = decode(encode(ReplyMsg(op_id=1, rank=0, ok=True, result=res)))
        assert isinstance(back, ReplyMsg) and type(back.result) is type(res) and back.result == res


def test_a_reply_with_an_untyped_result_is_refused() -> None:
    raw = msgspec.msgpack.encode(
        {"type": "ReplyMsg", "op_id": 1, "rank": 0, "ok": True, "result": {"bytes": 3}}
    )
    with pytest.raises(msgspec.ValidationError):
        decode(raw)


@pytest.mark.parametrize("data", [b"", b"\x93\x01\x02", b"cos\nsystem\n(S'ls'\ntR.", encode(3)])  # type: ignore[arg-type]
def test_garbage_or_untagged_bytes_are_refused(data: bytes) -> None:
    with pytest.raises(msgspec.DecodeError):
        decode(data)


def test_every_sampling_parameter_and_logprob_crosses_the_wire() -> None:
    """Each SamplingParams field has a SamplingMsg field and comes back equal (what PD
    migration and live relays send), and output logprobs survive the codec."""
    import dataclasses

    from blitzscale.core.sampling import Grammar, SamplingParams
    from blitzscale.messages import GenerateMsg, OutputMsg, OutputsMsg, TokenLogprobMsg, sampling_msg
    from blitzscale.worker.p2p import to_params

    params = SamplingParams(
        max_tokens=9, temperature=0.7, top_p=0.9, top_k=5, min_p=0.05, seed=11, stop=("x",),
        stop_token_ids=(3,), ignore_eos=True, min_tokens=2, logit_bias=((5, -1.5), (8, 2.0)),
        repetition_penalty=1.2, frequency_penalty=0.4, presence_penalty=-0.3, logprobs=4, prompt_logprobs=2,
        grammar=Grammar("json_schema", '{"type":"object","properties":{"a":{"type":"integer"}}}'),
    )  # fmt: skip
    defaults = SamplingParams()
    assert all(getattr(params, f.name) != getattr(defaults, f.name) for f in dataclasses.fields(params))
    msg = decode(encode(GenerateMsg(request_id="r", prompt_token_ids=[1], params=sampling_msg(params))))
    assert isinstance(msg, GenerateMsg) and to_params(msg.params) == params
    out = OutputMsg(
        request_id="r", new_token_ids=[4], text_delta="", finished=False, finish_reason=None,
        num_prompt_tokens=1, num_output_tokens=1, logprobs=[TokenLogprobMsg(-0.25, [(4, -0.25), (7, -2.0)])],
        prompt_logprobs=[TokenLogprobMsg(-1.5, [(9, -0.5)])],
    )  # fmt: skip
    assert decode(encode(OutputsMsg(rank=0, outputs=[out]))) == OutputsMsg(rank=0, outputs=[out])
