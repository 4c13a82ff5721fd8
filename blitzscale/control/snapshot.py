"""A read-only picture of the cluster at one instant: the input of every policy."""

from __future__ import annotations

import enum
from dataclasses import dataclass


class InstanceState(enum.Enum):
    """The design's instance states (§4)."""

    INACTIVE = "inactive"  # no weights
    LOADING = "loading"  # weights arriving, not serving
    PREFILL = "prefill"
    DECODE = "decode"
    COLOCATED = "colocated"  # prefill and decode on one instance (colocated mode)
    NEW_PREFILL = "new_prefill"  # live target: serving while weights arrive (ZigZag)
    OLD_PREFILL = "old_prefill"  # the source of a live target
    REFRACTORY_PREFILL = "refractory_prefill"  # fully loaded, draining its live queue
    MUTATING_TO_DECODE = "mutating_to_decode"  # a prefill instance turning into a decode one
    SHUTTING_PREFILL = "shutting_prefill"  # draining before release
    SHUTTING_DECODE = "shutting_decode"
    SHUTTING_NULL = "shutting_null"  # idle, weights still on the GPU: a warm pool


@dataclass(frozen=True)
class InstanceView:
    id: int
    ranks: tuple[int, ...]
    state: InstanceState
    num_running: int = 0  # requests it is computing
    num_waiting: int = 0  # requests queued at it
    used_blocks: int = 0
    total_blocks: int = 0
    idle_since: float | None = None  # when it last became idle (None: busy)
    loaded_at: float | None = None  # when its weights last finished loading
    load_s: float = 0.0  # how long that load took (what loading it again would cost)
    model: str = ""  # the model it holds or loads


@dataclass(frozen=True)
class ClusterSnapshot:
    now: float  # seconds, monotonic
    instances: tuple[InstanceView, ...]
    queued_prompt_tokens: int  # in the router's global queue
    live_target_tokens: int  # prompt tokens held by live targets (NEW_PREFILL)
    migrating_tokens: int  # prefilled tokens waiting to migrate to decode instances
    free_ranks: tuple[int, ...]  # ranks with no instance (INACTIVE)
    gpu_holders: tuple[int, ...]  # ranks holding the model's weights (from the pool)
    host_holder: int | None  # rank whose host memory holds the one host copy
    tp: int = 1  # ranks per instance
    pd_mode: bool = True  # False: colocated
    host_of_rank: tuple[int, ...] = ()  # rank -> host id; ranks past the end are on host 0
    model: str = ""  # the model this picture is of (instances, queue and copies are its own;
    # free ranks are the whole pool's)
    model_bytes: int = 0  # one instance's weights of it (0: not known yet)
    # Several models resident per GPU (cluster/slotted.py): the ranks are slots of this many
    # GPUs, rank % slot_workers being a rank's GPU, which holds a model at most once
    # (0: each rank is a GPU of its own).
    slot_workers: int = 0

    def gpus_with_model(self) -> set[int]:
        """The GPUs (with slots) that hold this model or an instance of it: none of their
        free slots can take it. Empty without slots."""
        w = self.slot_workers
        if not w:
            return set()
        ranks = [r for i in self.instances for r in i.ranks] + list(self.gpu_holders)
        return {r % w for r in ranks}

    def in_states(self, *states: InstanceState) -> list[InstanceView]:
        return [i for i in self.instances if i.state in states]
