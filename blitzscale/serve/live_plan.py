"""The planned live split (`[router] live_split = "ilp"`), composed into `LiveScaling`: after
each prompt the router sends a loading live target, the target's queued tasks are planned
again (control/live_split.py: how many layers each runs there before its partner takes
it), and the plan goes to the target as a `LiveSplitMsg`. Solved in the router's task,
within the time limit (past it, the greedy rule stays).

The plan's inputs are what the router knows: the layers' arrivals (evenly from the
target's first layers to its `LiveReadyMsg` estimate of the last), each prompt's layer time
(the model's cost model), its TTFT deadline, and the partner's own queue.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping
from typing import Protocol

from blitzscale import clock
from blitzscale.control.costmodel import Profile
from blitzscale.control.live_split import SplitProblem, SplitTask, even_arrivals, solve_split
from blitzscale.messages import LiveSplitMsg
from blitzscale.serve.dataplane import DataPlane
from blitzscale.serve.requests import RouterRequest
from blitzscale.serve.state import ControlState


class PlanRouter(Protocol):
    """What the planner uses of the router."""

    state: ControlState
    data: DataPlane

    def prefilling_on(self, rank: int) -> list[RouterRequest]: ...

    def cost(self, model: str) -> Profile | None: ...

    def ttft_slo_s(self, model: str) -> float: ...

    def wake(self) -> None: ...


class PlanPairs(Protocol):
    """What the planner uses of live scaling: the pairs, and which targets still load."""

    @property
    def pairs(self) -> Mapping[int, int | None]: ...

    def loading_target(self, rank: int) -> bool: ...


class SplitPlanner:
    def __init__(self, router: PlanRouter, live: PlanPairs, time_limit_s: float) -> None:
        self.router = router
        self.live = live
        self.time_limit_s = time_limit_s
        self._ready_at: dict[int, float] = {}  # live targets: when their first layers landed
        self._replan: set[int] = set()  # targets sent prompts since their last plan
        self._stay: dict[int, set[str]] = {}  # by target: tasks planned to stay whole there
        self._idle_replanned: set[int] = set()  # targets planned again since their partner went idle
        self.solves = 0  # plans solved (fallbacks included)
        self.solve_total_s = 0.0
        self.solve_s: deque[float] = deque(maxlen=100_000)  # the latest solve times
        self.fallbacks = 0  # plans past the time limit (greedy instead)
        _warm_up()

    def ready(self, target: int) -> None:
        """`target`'s first layers landed (its `LiveReadyMsg`)."""
        self._ready_at[target] = clock.now()

    def forget(self, target: int) -> None:
        """`target` is loaded and drained, or gone."""
        self._ready_at.pop(target, None)
        self._replan.discard(target)
        self._stay.pop(target, None)
        self._idle_replanned.discard(target)

    def dispatched(self, rank: int) -> None:
        """The router sent `rank` a prompt: a loading live target with a partner re-plans."""
        if self.live.pairs.get(rank) is not None and self.live.loading_target(rank):
            self._replan.add(rank)

    def all_stay(self, target: int) -> bool:
        """Every task on `target` is planned to finish there (no relay to ask for). A partner
        idle sooner than planned has the target planned again, once each time it goes idle."""
        stay = self._stay.get(target)
        if not stay or not all(r.wire_id in stay for r in self.router.prefilling_on(target)):
            return False
        if target not in self._idle_replanned:
            self._idle_replanned.add(target)
            self._replan.add(target)
            self.router.wake()
        return True

    async def round(self) -> None:
        """Plan the targets that got prompts (or whose partner went idle) since last time."""
        for target in sorted(self._replan):
            await self._plan(target)
        self._replan.clear()
        for target in list(self._idle_replanned):  # its partner got busy again
            src = self.router.state.get(self.live.pairs.get(target))
            if src is None or src.outstanding_tokens > 0:
                self._idle_replanned.discard(target)

    async def _plan(self, target: int) -> None:
        """Solve the split of `target`'s queued tasks and send it (control/live_split.py)."""
        rt = self.router
        tgt = rt.state.get(target)
        src = rt.state.get(self.live.pairs.get(target))
        if tgt is None or src is None or not self.live.loading_target(target) or tgt.loaded_eta is None:
            return  # (no arrival schedule to plan by: greedy)
        cost = rt.cost(tgt.model)
        tasks = rt.prefilling_on(target)
        if cost is None or not tasks:
            return
        now, layers = clock.now(), cost.num_layers
        ready_at = self._ready_at.get(target, now)
        # layers land evenly from the first's arrival to the last's (the worker's estimate)
        span = max(0.0, tgt.loaded_eta - ready_at)
        landed = min(layers - 1, int(layers * (now - ready_at) / span) + 1) if span > 0 else layers
        arrivals = even_arrivals(layers, landed, max(0.0, tgt.loaded_eta - now))
        slo = rt.ttft_slo_s(tgt.model)
        problem = SplitProblem(
            tuple(
                SplitTask(
                    deadline_s=slo - (now - r.arrival) if slo > 0 else math.inf,
                    layer_s=cost.prefill_s(len(r.prompt)) / layers,
                )
                for r in tasks
            ),
            arrivals,
            source_free_s=cost.prefill_s(src.outstanding_tokens) if src.outstanding_tokens else 0.0,
        )
        plan = solve_split(problem, self.time_limit_s)
        self.solves += 1
        self.solve_total_s += plan.solve_s
        self.solve_s.append(plan.solve_s)
        if plan.layers is None:
            self.fallbacks += 1
            self._stay.pop(target, None)
            return
        caps = {r.wire_id: k for r, k in zip(tasks, plan.layers, strict=False)}
        self._stay[target] = {rid for rid, k in caps.items() if k >= layers}
        await rt.data.send(target, LiveSplitMsg(layers=caps))


def _warm_up() -> None:
    """Load the solver once, before the first scale event needs it (the first import and
    solve take a few hundred milliseconds)."""
    solve_split(SplitProblem((SplitTask(layer_s=1e-3),), (0.0, 0.01)), time_limit_s=10.0)
