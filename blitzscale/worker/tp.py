"""A tensor-parallel instance across its workers: the leader drives, the other shards follow
(their side: worker/tp_follower.py).

Shard 0's worker (the leader) is the instance as the router sees it: it runs the engine
(scheduler, KV block books, sampling, outputs) exactly as a TP=1 instance does. Its model
is given a `TPLeader` (model/tp.py), so before it runs any layer range the leader sends the
other shards that step (`TPForwardMsg`: token ids and the step's attention metadata) on the
instance's control group; each shard's worker runs the same layers on its own weights and
KV cache at once, and their all-reduces meet on the compute group. The other shards keep
no books of their own: their KV cache has the leader's number of blocks and a request has
the same block ids on every shard, so KV migration moves each shard's heads from shard k to
shard k under ids the leader names (`TPKVSendMsg`, `TPKVRecvMsg`, `TPKVCommitMsg`).

Why the leader schedules for everyone (as vLLM's driver worker does) rather than every shard
running its own engine in lockstep: an instance's inputs (requests, KV arriving, aborts)
reach its shards at different moments, and any difference in what a step holds would
mismatch the shards' all-reduces. One scheduler means one order, and one sampler means one
token stream whatever the sampling (no random state to keep equal across shards).

The control group is gloo and blocks without a deadline, so a follower reads it on a thread
of its own and hands each command to its main loop through an in-process socket; commands
run there, in order, between control messages. A follower whose command fails stops its
worker (the leader's next all-reduce then fails at once instead of waiting), and the
cluster replaces the instance's ranks (cluster/local.py).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from blitzscale.checkpoint.native import dtype_name
from blitzscale.messages import (
    TPCommand,
    TPForwardMsg,
    TPReadyMsg,
    encode,
)
from blitzscale.model.attention import AttentionMetadata
from blitzscale.model.tp import TensorParallel
from blitzscale.worker.world import InstanceGroup, Links

if TYPE_CHECKING:
    from blitzscale.model.readiness import SegmentReadiness
    from blitzscale.model.weights import ModelWeights

    WeightsOf = Callable[[str], ModelWeights | None]

log = logging.getLogger("blitzscale.worker")
_META = ("positions", "slot_mapping", "block_tables", "seq_lens", "query_start_loc", "decode_seqs")
META_FIELDS = (*_META, "prefill_seqs")
MAX_PENDING_SENDS = 64  # command broadcasts not yet waited for (each is small)


def broadcast_opts() -> object:
    import torch.distributed as dist

    opts = dist.BroadcastOptions()
    opts.rootRank = 0
    opts.rootTensor = 0
    return opts


# --- leader ------------------------------------------------------------------------------


class TPLeader(TensorParallel):
    """Shard 0's group: every layer range it runs is first sent to the other shards."""

    def __init__(self, instance: InstanceGroup) -> None:
        super().__init__(instance.compute, instance.rank, instance.size)
        if instance.rank != 0:
            raise ValueError(f"shard {instance.rank} of {list(instance.members)} is no leader")
        self.instance = instance
        self._pending: list[tuple[object, torch.Tensor]] = []  # broadcasts in flight

    def send(self, cmd: TPCommand) -> None:
        """One command to every other shard (asynchronous; in order)."""
        data = encode(cmd)
        payload = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        header = torch.tensor([len(data)], dtype=torch.long)
        if len(self._pending) >= MAX_PENDING_SENDS:
            self.flush()
        for t in (header, payload):
            self._pending.append((self.instance.control.broadcast([t], broadcast_opts()), t))

    def flush(self) -> None:
        """Wait until every command sent so far has been taken by the other shards."""
        pending, self._pending = self._pending, []
        for work, _t in pending:
            work.wait()  # type: ignore[attr-defined]

    def on_layers(
        self,
        token_ids: torch.Tensor | None,
        hidden: torch.Tensor,
        meta: AttentionMetadata,
        start: int,
        end: int,
    ) -> None:
        parts = [getattr(meta, f).reshape(-1) for f in META_FIELDS]
        blob = torch.cat(parts).to("cpu", torch.long)
        ids = b"" if token_ids is None else token_ids.to("cpu", torch.long).numpy().tobytes()
        h = b"" if token_ids is not None else hidden.cpu().contiguous().view(torch.uint8).numpy().tobytes()
        self.send(
            TPForwardMsg(
                start=start,
                end=end,
                token_ids=ids,
                hidden=h,
                dtype=dtype_name(hidden.dtype),
                meta=blob.numpy().tobytes(),
                meta_sizes=[p.numel() for p in parts],
                num_seqs=meta.num_seqs,
                query_lens=list(meta.query_lens),
                context_lens=list(meta.context_lens),
                block_size=meta.block_size,
            )
        )

    def all_ok(self, ok: bool = True) -> bool:
        """Every shard's answer to the last command that asks for one (setup, KV commit)."""
        return all_agree(self.instance, ok)

    def ready_prefix(self, own: int) -> int:
        """Leading weight segments every shard has (a live target's), `own` being ours."""
        self.send(TPReadyMsg())
        return least_of(self.instance, own)


class InstanceReadiness:
    """A live tensor-parallel target as its leader's engine sees it: a segment is ready
    once every shard has it. Each shard's weights arrive on a chain of their own, so the
    leader asks the shards (`refresh`, once before each step) how far they are."""

    def __init__(self, own: SegmentReadiness, leader: TPLeader) -> None:
        self.own = own
        self.leader = leader
        self._prefix = 0
        self.failed = False  # a shard's transfer failed: the rest will never arrive

    def refresh(self) -> None:
        if self._prefix < self.own.num_segments and not self.failed:
            least = self.leader.ready_prefix(self.own.num_ready_prefix)
            self.failed = least < 0
            self._prefix = max(self._prefix, least)

    def is_ready(self, segment: int) -> bool:
        return segment < self._prefix

    @property
    def all_ready(self) -> bool:
        return self._prefix >= self.own.num_segments

    @property
    def num_ready_prefix(self) -> int:
        return self._prefix

    def remaining_s(self) -> float:
        """The leader's own shard's estimate (every shard's chain carries as many bytes)."""
        return 0.0 if self.all_ready else self.own.remaining_s()


def all_agree(instance: InstanceGroup, ok: bool) -> bool:
    """An all-reduce of one flag on the compute group: True if every shard said yes."""
    return least_of(instance, 1 if ok else 0) > 0


def least_of(instance: InstanceGroup, value: int) -> int:
    """An all-reduce MIN of one count on the compute group (exact in float32 up to 2**24)."""
    import torch.distributed as dist

    t = torch.tensor([float(value)], device=_device_of(instance))
    dist.all_reduce(t, op=dist.ReduceOp.MIN, group=instance.compute)
    return int(t.item())


def _device_of(instance: InstanceGroup) -> torch.device:
    """The compute group's device (NCCL groups reduce CUDA tensors only)."""
    name = getattr(instance.compute, "name", lambda: "gloo")()
    return torch.device("cuda", torch.cuda.current_device()) if name == "nccl" else torch.device("cpu")


def make_leader(links: Links, weights: ModelWeights) -> TPLeader | None:
    """The leader's group for a shard-0 engine (None for a TP=1 model)."""
    tp = weights.layout.tp_size
    if tp == 1:
        return None
    inst = links.instance
    if inst is None or inst.size != tp:
        size = inst.size if inst is not None else 1
        raise RuntimeError(f"rank {links.rank} holds a tp={tp} shard but its instance group has {size} ranks")
    if weights.layout.tp_rank != 0 or inst.rank != 0:
        raise RuntimeError(f"rank {links.rank} holds shard {weights.layout.tp_rank}: only shard 0 leads")
    return TPLeader(inst)
