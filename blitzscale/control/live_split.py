"""The optimal live split (design §2.3): how many layers each prompt queued on a loading
live target runs there before its partner (the source) runs the rest, solved as an integer
program by HiGHS (through scipy). The alternative to ZigZag's greedy rule (the target runs
whatever has landed, the source pulls the head whenever it is idle); a pure function of
what the router knows, so the server and the simulator plan alike.

The model, for the target's tasks i = 0..N-1 in FCFS order, each choosing k_i from a few
split points (0 = all on the source, L = whole on the target):
- the target runs layers [0, k_i) of task i as they land (`target_alone_s`; the target's
  own compute is not a bottleneck: a layer of a prompt takes far less than a layer takes
  to arrive over the network, and over NVLink the load is over before a split matters);
- the source takes the tasks in FCFS order once its own prompts are done: task i's part
  starts when the source is free and the target's part (and the relay of its hidden
  states) is there, and takes (L - k_i) layers; a task whole on the target skips it;
- the cost of a task is when its prompt is done, plus LATE_WEIGHT times how far past its
  deadline (its TTFT SLO) that is: the SLO first, the mean after.
As an integer program over a time-expanded network (node = the next task and the source's
busy-until on a grid of GRID slots; arc = a task's choice; one unit of flow from the first
task to past the last), the best plan is a shortest path. The constraint matrix (flow
conservation) is totally unimodular, so the LP optimum HiGHS's simplex returns at a vertex
is integral and optimal without branching; an answer that is not integral is solved again
with the integrality constraints. Past the time limit the plan falls back to greedy: no
caps, the runtime's own rule.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace

SPLIT_NAMES = ("greedy", "ilp")
DEFAULT_TIME_LIMIT_S = 0.04  # the paper's bound for Llama-3-8B
MAX_SPLITS = 9  # split points a task may take (more layers: evenly spaced ones)
MAX_TASKS = 16  # tasks planned, from the head (the rest follow the greedy rule)
GRID = 64  # the source's timeline in this many slots (the program's time-expanded network)
LATE_WEIGHT = 10.0  # a second past a deadline costs this many seconds of mean latency


@dataclass(frozen=True)
class SplitTask:
    """One prompt queued on the target."""

    deadline_s: float = math.inf  # seconds from now until its TTFT SLO is missed
    layer_s: float = 0.0  # one layer of this prompt on either side, seconds
    relay_s: float = 0.0  # handing its hidden states to the source, seconds


@dataclass(frozen=True)
class SplitProblem:
    tasks: tuple[SplitTask, ...]  # FCFS
    layer_ready_s: tuple[float, ...]  # per layer: seconds from now until it lands (0: there)
    source_free_s: float = 0.0  # seconds until the source has finished its own prompts

    def __post_init__(self) -> None:
        if not self.layer_ready_s:
            raise ValueError("a split needs at least one layer")
        if self.source_free_s < 0 or any(t < 0 for t in self.layer_ready_s):
            raise ValueError("times must be >= 0")

    @property
    def num_layers(self) -> int:
        return len(self.layer_ready_s)


@dataclass(frozen=True)
class SplitPlan:
    """Layers each planned task (the first MAX_TASKS) runs on the target (num_layers: all
    of it there), or None when the plan is greedy (the runtime decides)."""

    layers: tuple[int, ...] | None
    solver: str  # "ilp", or "greedy" (asked for, or the fallback)
    solve_s: float = 0.0
    status: str = ""  # why it fell back, if it did

    @property
    def fell_back(self) -> bool:
        return self.layers is None and self.status != ""


def split_points(num_layers: int) -> list[int]:
    """The layer counts a task may run on the target: every one up to MAX_SPLITS - 1 of
    them, else evenly spaced (0 and num_layers always)."""
    n = min(num_layers, MAX_SPLITS - 1)
    return sorted({round(g * num_layers / n) for g in range(n + 1)})


def target_alone_s(task: SplitTask, ready: Sequence[float], k: int) -> float:
    """The soonest the target can run layers [0, k) of `task` on its own: each layer once
    it has landed and the one before it ran."""
    end = 0.0
    for layer in range(k):
        end = max(end, ready[layer]) + task.layer_s
    return end


def solve_split(problem: SplitProblem, time_limit_s: float = DEFAULT_TIME_LIMIT_S) -> SplitPlan:
    """The optimal split of `problem`, or the greedy fallback past `time_limit_s`."""
    start = time.perf_counter()
    if not problem.tasks:
        return SplitPlan((), "ilp")
    if len(problem.tasks) > MAX_TASKS:  # the head's plan; later tasks stay greedy
        problem = replace(problem, tasks=problem.tasks[:MAX_TASKS])
    try:
        layers = _solve(problem, time_limit_s)
    except _NoPlan as why:
        return SplitPlan(None, "greedy", time.perf_counter() - start, str(why))
    return SplitPlan(layers, "ilp", time.perf_counter() - start)


class _NoPlan(Exception):
    pass


def _solve(p: SplitProblem, time_limit_s: float) -> tuple[int, ...]:
    import numpy as np  # (scipy only where the program is solved: the control plane stays light)
    from scipy.optimize import Bounds, LinearConstraint, milp
    from scipy.sparse import coo_array

    ks = split_points(p.num_layers)
    step = max(_horizon(p) / GRID, 1e-4)
    nodes, arcs, last = _network(p, ks, step)
    # flow conservation at every node but the last stage's (they absorb the unit)
    rows = [u for u, _, _, _ in arcs] + [v for _, v, _, _ in arcs]
    cols = list(range(len(arcs))) * 2
    vals = [1.0] * len(arcs) + [-1.0] * len(arcs)
    keep = [n for n in range(nodes) if n not in last]
    a = coo_array((vals, (rows, cols)), shape=(nodes, len(arcs))).tocsr()[keep]
    rhs = np.zeros(len(keep))
    rhs[0] = 1.0  # node 0 (the first task, the source's own queue) is kept: it is no last node
    cost = np.array([c for _, _, c, _ in arcs])
    deadline = time.perf_counter() + time_limit_s
    res = None
    for integral in (False, True):  # the LP's vertex is integral; the MIP only if it was not
        left = deadline - time.perf_counter()
        if left <= 0:
            raise _NoPlan("time limit reached")
        res = milp(
            cost,
            constraints=LinearConstraint(a, rhs, rhs),
            integrality=np.ones(len(arcs)) if integral else None,
            bounds=Bounds(0.0, 1.0),
            options={"time_limit": left},
        )
        if res.status != 0 or res.x is None:  # 1: time limit; 2: infeasible (a bug)
            raise _NoPlan(f"HiGHS: {res.message}")
        if np.all(np.minimum(res.x, 1.0 - res.x) < 1e-6):
            break
    else:
        raise _NoPlan("no integral plan")
    assert res is not None and res.x is not None
    out = {arcs[j][0]: arcs[j] for j in np.flatnonzero(res.x > 0.5)}
    layers, u = [], 0
    for _ in p.tasks:
        _, u, _, option = out[u]
        layers.append(ks[option])
    return tuple(layers)


def _horizon(p: SplitProblem) -> float:
    L = p.num_layers
    return max(p.layer_ready_s) + p.source_free_s + sum(t.layer_s * L + t.relay_s for t in p.tasks)


def _task_cost(t: SplitTask, end: float) -> float:
    return end + LATE_WEIGHT * max(0.0, end - t.deadline_s)


def _network(
    p: SplitProblem, ks: list[int], step: float
) -> tuple[int, list[tuple[int, int, float, int]], set[int]]:
    """The time-expanded network: node (i, b) = before task i with the source busy until
    slot b (rounded up: a plan never counts on the source sooner than it is free). Returns
    the node count, the arcs (from, to, cost, option) and the last stage's nodes."""
    L = p.num_layers

    def slot(t: float) -> int:
        return math.ceil(t / step - 1e-9)

    ids = {(0, slot(p.source_free_s)): 0}
    arcs: list[tuple[int, int, float, int]] = []
    frontier = {slot(p.source_free_s)}
    for i, t in enumerate(p.tasks):
        alone = [target_alone_s(t, p.layer_ready_s, k) for k in ks]
        nxt: set[int] = set()
        for b in sorted(frontier):
            u = ids[(i, b)]
            for o, k in enumerate(ks):
                if k == L:  # whole on the target: the source's time passes through
                    end, b2 = alone[o], b
                else:
                    end = max(b * step, alone[o] + (t.relay_s if k else 0.0)) + t.layer_s * (L - k)
                    b2 = slot(end)
                v = ids.setdefault((i + 1, b2), len(ids))
                arcs.append((u, v, _task_cost(t, end), o))
                nxt.add(b2)
        frontier = nxt
    last = {ids[(len(p.tasks), b)] for b in frontier}
    return len(ids), arcs, last


def plan_cost(p: SplitProblem, layers: Sequence[int], on_grid: bool = False) -> float:
    """The model's cost of a plan: what the program minimises (`on_grid`: as the program
    sees it, the source's busy-until rounded up to its grid; else in exact time)."""
    L, total = p.num_layers, 0.0
    step = max(_horizon(p) / GRID, 1e-4)

    def busy(t: float) -> float:
        return math.ceil(t / step - 1e-9) * step if on_grid else t

    free = busy(p.source_free_s)
    for t, k in zip(p.tasks, layers, strict=True):
        alone = target_alone_s(t, p.layer_ready_s, k)
        if k == L:
            end = alone
        else:
            end = max(free, alone + (t.relay_s if k else 0.0)) + t.layer_s * (L - k)
            free = busy(end)
        total += _task_cost(t, end)
    return total


def even_arrivals(num_layers: int, landed: int, last_in_s: float) -> tuple[float, ...]:
    """Layer arrival times when `landed` layers are there and the rest land evenly until
    `last_in_s` from now (the rate the first ones came at)."""
    rest = num_layers - landed
    return tuple(0.0 if i < landed else last_in_s * (i - landed + 1) / rest for i in range(num_layers))
