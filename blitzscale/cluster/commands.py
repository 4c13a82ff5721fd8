"""What the control plane asks of the cluster beyond a load, as plain values: the cluster
makes the wire messages (with their op ids). `Activation`: start an engine
(`Cluster.activate`, a live transfer's targets), whose live start comes back as a
`LiveStart`; `CostQuery`: what a model costs on a worker's device (`Cluster.cost_report`)."""

from __future__ import annotations

from dataclasses import dataclass

from blitzscale.control.costmodel import Profile
from blitzscale.core.config import EngineConfig
from blitzscale.core.roles import Role
from blitzscale.messages import ActivateMsg, ActivateResult, ProfileMsg, ReplyMsg


@dataclass(frozen=True)
class Activation:
    """Serve `model` (its tokenizer from `source`) in `role` with `engine`; `pace`: the
    paced workers' reference device (`[engine] pace`, worker/pacing.py)."""

    model: str
    source: str
    role: Role
    engine: EngineConfig
    pace: Profile | None = None
    slot: int = 0  # the worker's serving slot (several models resident: cluster/slotted.py)

    def message(self, op_id: int, live: bool = False) -> ActivateMsg:
        """`live`: a target that serves while its weights arrive (ZigZag)."""
        return ActivateMsg(
            op_id=op_id,
            model=self.model,
            source=self.source,
            role=self.role,
            engine=self.engine,
            live=live,
            pace=self.pace,
            slot=self.slot,
        )


@dataclass(frozen=True)
class LiveStart:
    """A live target's engine started (`result`) or could not (`error`)."""

    rank: int
    result: ActivateResult | None = None
    error: str = ""

    @property
    def ok(self) -> bool:
        return self.result is not None

    @classmethod
    def of_reply(cls, reply: ReplyMsg) -> LiveStart:
        """A live target's activation reply, as the scaler sees it."""
        if not reply.ok:
            return cls(reply.rank, error=reply.error)
        if not isinstance(reply.result, ActivateResult):
            return cls(reply.rank, error=f"answered with {type(reply.result).__name__}")
        return cls(reply.rank, reply.result)


@dataclass(frozen=True)
class CostQuery:
    """The cost model of `model` (its config from `source`) served with `engine` on a
    worker's device: measured there, or read back from `cache_dir` ("": keep none);
    `measure=False` only names the device and the model's shape."""

    model: str
    source: str
    engine: EngineConfig
    cache_dir: str = ""
    measure: bool = True
    tp: int = 1  # > 1: a tensor-parallel instance's (one shard's sizes; measured on its group)

    def message(self, op_id: int) -> ProfileMsg:
        return ProfileMsg(
            op_id=op_id,
            model=self.model,
            source=self.source,
            engine=self.engine,
            cache_dir=self.cache_dir,
            measure=self.measure,
            tp=self.tp,
        )
