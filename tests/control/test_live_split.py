"""The planned live split (control/live_split.py): the integer program's answer is the best
plan of its model (checked against every plan of small problems), it gives the answers the
model calls for in the plain cases, and it falls back to greedy past its time limit."""

from __future__ import annotations

import itertools
import math
import random

import pytest

from blitzscale.control.live_split import (
    GRID,
    MAX_TASKS,
    SplitProblem,
    SplitTask,
    even_arrivals,
    plan_cost,
    solve_split,
    split_points,
)


def _problem(rng: random.Random, n: int, layers: int) -> SplitProblem:
    tasks = tuple(
        SplitTask(
            deadline_s=rng.choice([math.inf, rng.uniform(0.1, 1.5)]),
            layer_s=rng.uniform(0.5e-3, 8e-3),
            relay_s=rng.uniform(0.0, 5e-3),
        )
        for _ in range(n)
    )
    arrivals = even_arrivals(layers, rng.randint(1, layers - 1), rng.uniform(0.05, 1.5))
    return SplitProblem(tasks, arrivals, source_free_s=rng.uniform(0.0, 0.6))


@pytest.mark.parametrize("seed", range(12))
def test_the_program_finds_the_best_plan_of_its_model(seed: int) -> None:
    rng = random.Random(seed)
    p = _problem(rng, n=rng.randint(1, 4), layers=8)
    plan = solve_split(p, time_limit_s=30.0)
    assert plan.solver == "ilp" and plan.layers is not None, plan.status
    assert len(plan.layers) == len(p.tasks)
    every = itertools.product(split_points(p.num_layers), repeat=len(p.tasks))
    best = min(plan_cost(p, c, on_grid=True) for c in every)
    assert plan_cost(p, plan.layers, on_grid=True) == pytest.approx(best, rel=1e-9, abs=1e-9)
    # and the grid costs little in exact time: each task's end is late by at most a slot per
    # task before it
    exact = min(plan_cost(p, c) for c in itertools.product(split_points(p.num_layers), repeat=len(p.tasks)))
    n = len(p.tasks)
    slot = (max(p.layer_ready_s) + p.source_free_s + sum(t.layer_s * 8 + t.relay_s for t in p.tasks)) / GRID
    assert plan_cost(p, plan.layers) <= exact + n * (n + 1) / 2 * slot * 11 + 1e-9


def test_a_task_whose_layers_have_all_landed_stays_whole_when_the_source_is_busy() -> None:
    p = SplitProblem((SplitTask(layer_s=1e-3),), even_arrivals(16, 16, 0.0), source_free_s=5.0)
    assert solve_split(p, 30.0).layers == (16,)


def test_an_idle_source_takes_the_whole_prompt_when_no_layer_is_there_yet() -> None:
    p = SplitProblem((SplitTask(layer_s=1e-3),), tuple(1.0 + 0.1 * i for i in range(16)), source_free_s=0.0)
    assert solve_split(p, 30.0).layers == (0,)


def test_the_target_runs_what_lands_before_the_source_is_free() -> None:
    # layers land every 10 ms; the source is busy for 45 ms: the head task runs the layers
    # that are there by then (a split point at or below 4) and the source the rest
    p = SplitProblem(
        (SplitTask(layer_s=1e-4),), tuple(0.01 * (i + 1) for i in range(32)), source_free_s=0.045
    )
    (k,) = solve_split(p, 30.0).layers or (None,)
    assert k is not None and 0 < k <= 4


def test_a_deadline_comes_before_the_mean() -> None:
    # two tasks; only one fits its deadline on the source; the program gives the source the
    # one with the tight deadline although the other is first in line
    arrivals = tuple(1.0 + 0.01 * i for i in range(8))
    first, second = SplitTask(layer_s=0.02), SplitTask(layer_s=0.02, deadline_s=0.2)
    plan = solve_split(SplitProblem((first, second), arrivals, source_free_s=0.0), 30.0)
    assert plan.layers is not None
    assert plan.layers[0] == 8  # the first waits for its layers on the target
    assert plan.layers[1] == 0  # the second runs on the source at once, within 0.2 s


def test_past_the_time_limit_the_plan_is_greedy() -> None:
    p = _problem(random.Random(1), n=12, layers=32)
    plan = solve_split(p, time_limit_s=1e-9)
    assert plan.layers is None and plan.solver == "greedy" and plan.fell_back
    assert "time limit" in plan.status.lower()


def test_only_the_head_of_a_long_queue_is_planned() -> None:
    p = _problem(random.Random(2), n=MAX_TASKS + 5, layers=32)
    plan = solve_split(p, time_limit_s=30.0)
    assert plan.layers is not None and len(plan.layers) == MAX_TASKS


def test_a_problem_needs_layers_and_times_that_are_not_negative() -> None:
    with pytest.raises(ValueError, match="at least one layer"):
        SplitProblem((), ())
    with pytest.raises(ValueError, match=">= 0"):
        SplitProblem((), (0.0,), source_free_s=-1.0)
