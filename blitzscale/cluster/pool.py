"""The parameter pool: where every copy of every model is. Pure bookkeeping.

Invariants: a rank holds a model at most once; a model has at most one host copy in the
whole cluster (O(1) host caching); a copy is recorded only once its load has completed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from blitzscale.errors import BlitzScaleError


class PoolError(BlitzScaleError):
    """An operation would break a pool invariant."""


@dataclass
class ModelCopies:
    gpu: set[int] = field(default_factory=set)  # ranks holding it on their device
    loading: set[int] = field(default_factory=set)  # ranks receiving it now
    host: int | None = None  # rank whose host memory holds the one host copy


@dataclass(frozen=True)
class CopiesView:
    """Where one model's copies are, at one moment (`ParameterPool.snapshot`)."""

    gpu: tuple[int, ...]
    loading: tuple[int, ...]
    host: int | None


class ParameterPool:
    def __init__(self) -> None:
        self._models: dict[str, ModelCopies] = {}

    def _entry(self, model: str) -> ModelCopies:
        return self._models.setdefault(model, ModelCopies())

    def gpu_holders(self, model: str) -> list[int]:
        return sorted(self._models[model].gpu) if model in self._models else []

    def host_holder(self, model: str) -> int | None:
        return self._models[model].host if model in self._models else None

    def host_ranks(self) -> set[int]:
        """Ranks that hold some model's host copy."""
        return {c.host for c in self._models.values() if c.host is not None}

    def ranks_of(self, model: str) -> set[int]:
        """Ranks holding `model` or loading it."""
        c = self._models.get(model)
        return c.gpu | c.loading if c is not None else set()

    def models_on(self, rank: int) -> list[str]:
        return sorted(m for m, c in self._models.items() if rank in c.gpu or rank in c.loading)

    def begin_load(self, model: str, ranks: list[int]) -> None:
        e = self._entry(model)
        clash = [r for r in ranks if r in e.gpu or r in e.loading]
        if clash:
            raise PoolError(f"ranks {clash} already hold or are loading {model}")
        e.loading.update(ranks)

    def commit_load(self, model: str, ranks: list[int]) -> None:
        e = self._entry(model)
        missing = [r for r in ranks if r not in e.loading]
        if missing:
            raise PoolError(f"ranks {missing} were not loading {model}")
        e.loading.difference_update(ranks)
        e.gpu.update(ranks)

    def abort_load(self, model: str, ranks: list[int]) -> None:
        self._entry(model).loading.difference_update(ranks)

    def release(self, model: str, rank: int) -> None:
        e = self._entry(model)
        if rank not in e.gpu:
            raise PoolError(f"rank {rank} does not hold {model}")
        e.gpu.discard(rank)

    def forget_rank(self, rank: int) -> None:
        """A worker died: nothing it held exists any more."""
        for e in self._models.values():
            e.gpu.discard(rank)
            e.loading.discard(rank)
            if e.host == rank:
                e.host = None

    def add_host_copy(self, model: str, rank: int) -> None:
        e = self._entry(model)
        if e.host is not None:
            raise PoolError(f"{model} already has its one host copy (on rank {e.host})")
        e.host = rank

    def drop_host_copy(self, model: str) -> int | None:
        e = self._entry(model)
        rank, e.host = e.host, None
        return rank

    def snapshot(self) -> dict[str, CopiesView]:
        return {
            m: CopiesView(tuple(sorted(c.gpu)), tuple(sorted(c.loading)), c.host)
            for m, c in sorted(self._models.items())
        }
