"""Pacing: a CPU worker whose engine steps take what a fixed reference device would take.

On a machine whose cores the workers share (the demo: three workers on two cores), a new
instance adds no compute, and its weight transfer takes CPU from the instance serving, so
which load path a policy picks decides little. Paced, every engine step lasts the time a
step-time profile (control/costmodel.py) gives for what the step computed (engine/work.py),
never less than its real compute: the worker sleeps the rest, releasing the CPU. With a
reference slow enough that all the workers' paced steps fit the machine's cores with room
to spare, each instance is a device of its own, as a GPU is, and the load paths (network,
host, disk) decide. Tokens are the real model's; only time is stretched.

`[engine] pace` (resolved by the controller before any worker starts, and sent to each
worker in its ActivateMsg as the profile itself):
- "off" (serve's default): steps take what they take;
- "reference": the shipped CPU profile of SmolLM2-135M measured on the development machine
  (one thread a worker, as every CPU worker runs) made `reference_factor` times slower, so
  the workers' paced steps use at most CORE_SHARE of the machine's cores;
- "reference:F": the same, F (>= 1) times slower;
- a shipped profile's name (blitzscale/data/profiles/) or a profile's .json path.
"""

from __future__ import annotations

import os

from blitzscale.control.costmodel import Profile, ProfileError, load_profile
from blitzscale.engine.work import StepWork
from blitzscale.errors import InvalidRequestError

REFERENCE_OF = "smollm2-135m-cpu"  # measured with one torch thread, as each CPU worker runs
# The workers' paced steps may use this share of the machine's cores when all of them are
# busy; the rest is for the router, the client, weight transfers and whoever else shares it.
CORE_SHARE = 0.5


def reference_factor(num_workers: int, cpus: int | None = None) -> float:
    """How much slower than the measured CPU the reference device is: all `num_workers`
    busy at once then need at most CORE_SHARE of `cpus` cores (never faster: >= 1)."""
    cores = cpus or os.cpu_count() or 1
    return max(1.0, round(num_workers / (cores * CORE_SHARE), 2))


def reference_profile(factor: float) -> Profile:
    """The measured CPU profile, every step `factor` times longer."""
    base = load_profile(REFERENCE_OF)
    return base.derive(
        name=f"{base.name} x{factor:g}",
        device=f"a reference device {factor:g}x slower than {base.device}",
        bandwidth_factor=1 / factor,
        flops_factor=1 / factor,
        memory_bytes=base.device_memory_bytes,
    )


def slowdown(p: Profile | None) -> float:
    """How many times longer than the measured CPU's (REFERENCE_OF) `p`'s prompt steps
    are; 1 unpaced, or for a device faster than the CPU (its steps are the real compute's)."""
    if p is None:
        return 1.0
    return max(1.0, p.prefill_s(512) / load_profile(REFERENCE_OF).prefill_s(512))


def resolve_pace(setting: str, num_workers: int, cpus: int | None = None) -> Profile | None:
    """The profile `[engine] pace = setting` paces by (None: off); a bad value is an
    InvalidRequestError naming it."""
    where = f"[engine] pace = {setting!r}"
    if setting == "off":
        return None
    if setting == "reference":
        return reference_profile(reference_factor(num_workers, cpus))
    if setting.startswith("reference:"):
        try:
            factor = float(setting.partition(":")[2])
        except ValueError:
            factor = float("nan")
        if not factor >= 1 or factor == float("inf"):
            raise InvalidRequestError(f"{where}: the factor after 'reference:' must be a number >= 1")
        return reference_profile(factor)
    try:
        return load_profile(setting)
    except ProfileError as e:
        raise InvalidRequestError(f"{where}: {e}; or 'off', 'reference', 'reference:F'") from e


def step_s(p: Profile, work: StepWork) -> float:
    """Seconds one step of `work` takes on `p`'s device. A mixed step reads the weights
    once: its decode rows cost what as many more prompt tokens would, plus what attending
    to their contexts adds over the shortest profiled one (the simulator's rule,
    sim/engine.py), and what the profile measured a mixed step to take beyond that
    (`mixed_extra_ms`); prompt tokens through some of the layers cost that share of a
    prefill of as many tokens."""
    b = work.decode_batch
    if work.prompt_tokens:
        t = p.prefill_s(work.prompt_tokens + b)
        if b:
            ctx = work.mean_context
            t += max(0.0, p.decode_s(b, ctx) - p.decode_s(b, min(ctx, p.decode_context[0])))
            t += p.mixed_extra_ms / 1000
    else:
        t = p.decode_s(b, work.mean_context) if b else 0.0
    return t + sum(p.prefill_s(n) * share for n, share in work.partial)


class Pacer:
    """A worker's pacing: how long to sleep after each step, and how its paced steps went
    (over the worker's life; reported in its StatsMsg)."""

    def __init__(self) -> None:
        self.steps = 0
        self.over = 0  # steps whose real compute took longer than their reference time
        self.real_s = 0.0
        self.paced_s = 0.0  # the paced steps' length: the reference time, or the compute if longer

    def remainder_s(self, profile: Profile, work: StepWork, real_s: float) -> float:
        """The rest of the step's reference time on `profile` after `real_s` of compute
        (0 if none). A step that computed nothing the profile times (a live target's
        embedding or head stage, a step with nothing scheduled) is neither paced nor counted."""
        if work.is_empty:
            return 0.0
        ref = step_s(profile, work)
        self.steps += 1
        self.real_s += real_s
        self.paced_s += max(ref, real_s)
        if real_s > ref:
            self.over += 1
        return max(0.0, ref - real_s)


def summary(steps: int, over: int, real_s: float, paced_s: float) -> str:
    """One line on how paced steps went (the demo, a worker's log)."""
    if not steps:
        return "no paced step"
    busy = real_s / paced_s if paced_s else 0.0
    return (
        f"{steps} paced steps, real compute {busy:.0%} of their time, "
        f"{over} ({over / steps:.0%}) took longer than their reference"
    )
