"""A worker's standby engine: the cluster's model, ready to serve but for its weights.

Building an engine costs more than a weight transfer over NVLink: on an H200 the KV cache
and the decode graphs of Llama-3-8B take 0.2-0.4 s (Triton compiles for the model's shapes,
every batch bucket is captured), against 44 ms for 16 GB of weights. So a GPU worker builds
one at start, before any instance is needed, on an empty weight buffer whose every segment
is marked missing (graphs hold the buffer's and the cache's addresses, not their contents).
A transfer to this worker lands in that buffer and its activation takes the engine as it
is: the first decode after the last segment lands replays a graph captured long before.

When the instance is released, its weights buffer and its drained engine become the standby
again (the GPU is the model's; nothing is captured twice). The standby is a shape, not a
model: any model of the same configuration (several fine-tunes of one base, the same
architecture under several names) lands in its buffer, by network, from a host copy or from
disk, and its activation takes the engine as it is, with the new model's tokenizer and its
cached prefixes forgotten (`LLMEngine.serve_other_model`). A load of another shape drops
the standby first (its memory would not leave room); the release after it builds it again.
Only TP=1 has a standby.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from blitzscale.checkpoint import load_config, resolve_model
from blitzscale.core.heap import free_frozen
from blitzscale.engine import EngineConfig, LLMEngine
from blitzscale.engine.oom import free_cached_memory
from blitzscale.model.config import ModelConfig
from blitzscale.model.weights import ModelWeights, layout_of
from blitzscale.worker.memory import DeviceRoom, Holding, NoRoomError

log = logging.getLogger("blitzscale.worker")


def free_device_memory(device: torch.device) -> None:
    """Give what dropped engines and weights held back to the device, cycles included
    (frozen ones too: core/heap.py)."""
    free_frozen()
    free_cached_memory(device)


@dataclass(frozen=True)
class StandbySpec:
    model: str  # the name the controller loads the model under
    source: str  # where its config (and tokenizer) come from
    engine: EngineConfig  # the engine an activation asks for (the server's `[engine]`)


class Standby:
    """Owned by the worker's main thread; empty when there is no spec."""

    def __init__(
        self,
        spec: StandbySpec | None,
        device: torch.device,
        dtype: torch.dtype,
        tokenizer: Callable[[], Any],
        room: DeviceRoom | None = None,
    ) -> None:
        """`room`: the worker's accounting of its device (worker/memory.py): the room for
        the engine's KV cache beside its buffer; a standby that does not fit is not built."""
        self.spec = spec
        self.device = device
        self.dtype = dtype
        self.tokenizer = tokenizer
        self.room = room
        self.weights: ModelWeights | None = None
        self.engine: LLMEngine | None = None
        self.handed_out: ModelWeights | None = None  # the buffer a load is filling
        self.engine_model = ""  # the model the engine last served (its prefixes, its tokenizer)
        self.build_s = 0.0

    def arm(self) -> None:
        """Build it (no-op without a spec, or when it exists)."""
        if self.spec is None or self.engine is not None or self.handed_out is not None:
            return
        t = time.perf_counter()
        cfg = load_config(resolve_model(self.spec.source))
        size = layout_of(cfg, self.dtype).nbytes
        kv_room = None
        if self.room is not None:
            try:
                kv_room = self.room.for_engine(
                    cfg, self.dtype, size, self.spec.engine, "the standby engine", size
                )
            except NoRoomError as e:
                log.warning("no standby engine for %s: %s", self.spec.model, e)
                return
        weights = ModelWeights.empty(cfg, self.dtype, self.device)
        weights.readiness.reset()
        self.engine = LLMEngine(weights, self.tokenizer(), self.spec.engine, kv_room=kv_room)
        self.weights = weights
        self.engine_model = self.spec.model
        self.build_s = time.perf_counter() - t
        log.info("standby engine for %s built in %.2f s", self.spec.model, self.build_s)

    def holdings(self) -> list[Holding]:
        """What it holds on the device (a buffer handed out to a load is the load's)."""
        held = (
            [Holding("the standby's buffer", self.weights.layout.nbytes)] if self.weights is not None else []
        )
        if self.engine is not None:
            held.append(Holding("the standby engine's KV cache", self.engine.kv_cache_bytes))
        return held

    @property
    def spare_bytes(self) -> int:
        """What dropping it would free (a buffer handed out is in use)."""
        return sum(h.nbytes for h in self.holdings())

    def respec(self, engine: EngineConfig) -> None:
        """Build it again as `engine` (no-op when it is built so, or without a spec)."""
        if self.spec is None or self.spec.engine == engine:
            return
        if self.handed_out is not None:
            raise ValueError("the standby's buffer is being filled by a load; it cannot be rebuilt now")
        self.spec = dataclasses.replace(self.spec, engine=engine)
        self.drop()
        self.arm()

    def fits(self, config: ModelConfig, dtype: torch.dtype, tp_size: int) -> bool:
        """Whether a model of `config` in `dtype` (unsharded) lands in the standby's buffer."""
        w = self.weights
        return w is not None and tp_size == 1 and w.config == config and w.dtype == dtype

    def take_weights(self, config: ModelConfig, dtype: torch.dtype, tp_size: int) -> ModelWeights | None:
        """The empty buffer for a load of a model of `config` in `dtype` (None: allocate
        anew)."""
        if not self.fits(config, dtype, tp_size):
            return None
        weights, self.weights = self.weights, None
        assert weights is not None
        weights.readiness.reset()
        self.handed_out = weights
        return weights

    def take_engine(
        self, weights: ModelWeights, engine: EngineConfig, model: str, tokenizer: Callable[[], Any]
    ) -> LLMEngine | None:
        """The standby engine, if `weights` is its buffer and the activation asks for the
        engine it was built as; it is `model`'s instance's from now on (told its
        `tokenizer` if it last served another model)."""
        if self.handed_out is not weights or self.engine is None:
            return None
        if engine.for_device(self.device.type) != self.engine.config:
            return None
        built, self.engine, self.handed_out = self.engine, None, None
        if model != self.engine_model:
            built.serve_other_model(tokenizer())
        self.engine_model = ""
        return built

    def lost(self, weights: ModelWeights) -> None:
        """A transfer into the standby buffer failed: build the standby again."""
        if self.handed_out is weights:
            self.handed_out = None
            self.engine = None
            self.arm()

    def drop(self) -> None:
        """Free it (a load of another shape needs the room)."""
        if self.engine is None and self.weights is None:
            return
        self.engine = self.weights = None
        self.engine_model = ""
        free_device_memory(self.device)

    def recycle(self, model: str, weights: ModelWeights, engine: LLMEngine | None) -> bool:
        """A released instance's buffer and drained engine become the standby (True), if
        the standby slot is free and the engine was built as the standby's (any model:
        the next load of its shape lands here)."""
        spec = self.spec
        if spec is None:
            return False
        if self.handed_out is weights and self.engine is not None:  # loaded, never activated
            self.handed_out = None
            weights.readiness.reset()
            self.weights = weights
            return True
        if self.engine is not None or self.handed_out is not None:
            return False
        if engine is None or engine.model.weights is not weights or not engine.is_idle:
            return False
        if engine.config != spec.engine.for_device(self.device.type) or weights.layout.tp_size != 1:
            return False
        weights.readiness.reset()
        self.weights, self.engine, self.engine_model = weights, engine, model
        return True
