"""How one run of a batch ended, read back from its folder (the runner, the report and the
plot share it)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from blitzscale.batch import store
from blitzscale.batch.plan import RunSpec
from blitzscale.client.summary import Summary


@dataclass(frozen=True)
class RunOutcome:
    """How one run of the batch ended, read back from its folder."""

    run: RunSpec
    status: str  # store.DONE | store.FAILED | store.PLANNED
    error: str | None = None
    resumed: bool = False
    summary: Summary | None = None
    events: tuple[dict[str, Any], ...] = field(default=())

    @property
    def is_done(self) -> bool:
        return self.status == store.DONE


def read_outcome(run: RunSpec, run_dir: Path) -> RunOutcome:
    status = store.read_status(run_dir)
    state = status.get("status", store.PLANNED)
    return RunOutcome(
        run=run,
        status=state if state in (store.DONE, store.FAILED) else store.PLANNED,
        error=status.get("error"),
        resumed="resumed_from" in status,
        summary=store.read_summary(run_dir) if state == store.DONE else None,
        events=tuple(store.read_events(run_dir)) if state == store.DONE else (),
    )
