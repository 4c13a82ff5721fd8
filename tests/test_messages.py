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


def test_every_sampling_parameter_and_logprob_crosses_the_wire() -> None:
    """Each SamplingParams field has a SamplingMsg field and comes back equal (what PD
    migration and live relays send), and output logprobs survive the codec."""
    import dataclasses

    from blitzscale.core.sampling import SamplingParams
    from blitzscale.messages import GenerateMsg, OutputMsg, OutputsMsg, TokenLogprobMsg, sampling_msg
    from blitzscale.worker.p2p import to_params

    params = SamplingParams(
        max_tokens=9, temperature=0.7, top_p=0.9, top_k=5, seed=11, stop=("x",), stop_token_ids=(3,),
        ignore_eos=True, min_tokens=2, logit_bias=((5, -1.5), (8, 2.0)), repetition_penalty=1.2,
        frequency_penalty=0.4, presence_penalty=-0.3, logprobs=4,
    )  # fmt: skip
    defaults = SamplingParams()
    assert all(getattr(params, f.name) != getattr(defaults, f.name) for f in dataclasses.fields(params))
    msg = decode(encode(GenerateMsg(request_id="r", prompt_token_ids=[1], params=sampling_msg(params))))
    assert isinstance(msg, GenerateMsg) and to_params(msg.params) == params
    out = OutputMsg(
        request_id="r", new_token_ids=[4], text_delta="", finished=False, finish_reason=None,
        num_prompt_tokens=1, num_output_tokens=1, logprobs=[TokenLogprobMsg(-0.25, [(4, -0.25), (7, -2.0)])],
    )  # fmt: skip
    assert decode(encode(OutputsMsg(rank=0, outputs=[out]))) == OutputsMsg(rank=0, outputs=[out])
