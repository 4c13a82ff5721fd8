"""The control plane asks the cluster in plain values; the cluster makes the wire messages."""

from __future__ import annotations

from blitzscale.cluster.commands import Activation, CostQuery, LiveStart
from blitzscale.core.config import EngineConfig
from blitzscale.messages import ActivateResult, NoResult, ReplyMsg, decode, encode

ENGINE = EngineConfig(block_size=16, num_kv_blocks=16, max_model_len=256)


def test_an_activation_becomes_its_message_with_the_clusters_op_id() -> None:
    act = Activation(model="m", source="random:tiny-llama3", role="prefill", engine=ENGINE)
    msg = act.message(7, live=True)
    assert (msg.op_id, msg.model, msg.source, msg.role, msg.engine, msg.live) == (
        7, "m", "random:tiny-llama3", "prefill", ENGINE, True,
    )  # fmt: skip
    assert decode(encode(msg)) == msg and act.message(8).live is False


def test_a_cost_query_becomes_a_profile_message() -> None:
    msg = CostQuery(model="m", source="s", engine=ENGINE, cache_dir="/c", measure=False).message(3)
    assert (msg.op_id, msg.model, msg.source, msg.cache_dir, msg.measure) == (3, "m", "s", "/c", False)


def test_a_live_targets_reply_is_a_typed_start_or_an_error() -> None:
    started = ActivateResult(num_kv_blocks=4, max_model_len=64)
    ok = LiveStart.of_reply(ReplyMsg(op_id=1, rank=2, ok=True, result=started))
    assert ok.ok and ok.rank == 2 and ok.result is not None and ok.result.num_kv_blocks == 4
    failed = LiveStart.of_reply(ReplyMsg(op_id=1, rank=3, ok=False, error="boom"))
    assert not failed.ok and failed.error == "boom"
    wrong = LiveStart.of_reply(ReplyMsg(op_id=1, rank=3, ok=True, result=NoResult()))
    assert not wrong.ok and "NoResult" in wrong.error
