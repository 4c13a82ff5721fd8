"""`bench serve`'s mixes on the simulator: one simulated GPU with a given cost model, serve's
default configuration (one colocated fixed instance, the default router and engine for a
GPU), and the same clients in virtual time, through the same control plane a live server
builds (serve/controlplane.py). `blitzscale bench serve --simulate RESULT.json` runs them
with the cost model a live `bench serve` run measured and sets the figures side by side:
how close the simulator comes to the live server.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable, Coroutine
from typing import Any

from blitzscale import clock
from blitzscale.bench.mixes import Burst, ClosedLoop, Mix, Single, compare, median
from blitzscale.client.protocols import synthetic_prompt_ids
from blitzscale.cluster.config import ClusterConfig
from blitzscale.control.config import PolicyConfig
from blitzscale.control.costmodel import Profile
from blitzscale.core.sampling import SamplingParams
from blitzscale.errors import BlitzScaleError, InvalidRequestError, OverloadedError
from blitzscale.serve.config import SERVE_ENGINE, ServeConfig
from blitzscale.serve.controlplane import ControlPlaneSpec, build_control_plane
from blitzscale.serve.models import ScaledModel, ServedModel
from blitzscale.serve.router import Router
from blitzscale.sim import clock as sim_clock
from blitzscale.sim.cluster import SimCluster
from blitzscale.sim.links import Topology

ONE_GPU = Topology(nodes=1, gpus_per_node=1, nvlink_bytes_per_s=0, nic_bytes_per_s=50e9,
                   pcie_bytes_per_s=50e9, ssd_bytes_per_s=2e9)  # fmt: skip


class SimServe:
    """One simulated GPU behind serve's default control plane (build with `start`)."""

    def __init__(self, profile: Profile, max_model_len: int) -> None:
        self.profile = profile
        self.max_model_len = max_model_len
        self._ids = 0

    async def start(self) -> Router:
        defaults = ServeConfig()
        engine = dataclasses.replace(SERVE_ENGINE, max_model_len=self.max_model_len).for_device("cuda")
        self.cluster = SimCluster(ONE_GPU, self.profile, ClusterConfig(num_workers=1, ranks_per_host=1))
        name = self.profile.name
        served = ServedModel(name, None, 1 << 20, self.max_model_len, cost=self.profile,
                             max_num_seqs=engine.max_num_seqs)  # fmt: skip
        spec = ControlPlaneSpec(
            router=dataclasses.replace(defaults.router, mode="colocated"),
            planner=defaults.planner,
            policy=PolicyConfig(name="fixed", fixed_prefill=1, fixed_decode=0),
            engine=engine,
            served=[served],
            scaled=[ScaledModel(name, "sim", "sim")],
            first_instances=(1, 0),
        )
        self.control = await build_control_plane(spec, self.cluster, self.cluster.data)
        return self.control.router

    async def stop(self) -> None:
        await self.control.stop()
        await self.cluster.stop()

    async def ask(self, prompt_len: int, max_tokens: int) -> tuple[float, list[tuple[float, int]], str]:
        """One request: when it was sent, (time, tokens) of each output, and its error."""
        self._ids += 1
        params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
        sent, outs = clock.now(), []
        try:
            # (every prompt its own, as the live bench's fresh random ones: no prefix hits)
            prompt = synthetic_prompt_ids(prompt_len, self._ids)
            async for o in self.control.router.generate(f"bench-{self._ids}", prompt, params):
                if o.new_token_ids:
                    outs.append((clock.now(), len(o.new_token_ids)))
        except OverloadedError as e:
            return sent, outs, f"429: {e}"
        except BlitzScaleError as e:
            return sent, outs, str(e)
        return sent, outs, ""


async def _closed_loop(s: SimServe, mix: Mix, streams: int) -> ClosedLoop:
    t0 = clock.now()
    start, end = t0 + mix.warmup_s, t0 + mix.warmup_s + mix.window_s
    tokens = done = errors = 0

    async def client(k: int) -> None:
        nonlocal tokens, done, errors
        max_tokens = mix.first_tokens(k, streams)
        while clock.now() < end:
            _, outs, err = await s.ask(mix.prompt_len, max_tokens)
            max_tokens = mix.max_tokens
            tokens += sum(n for t, n in outs if start <= t < end)
            done += not err and bool(outs) and start <= outs[-1][0] < end
            errors += bool(err) or not outs

    await asyncio.gather(*(client(k) for k in range(streams)))
    return ClosedLoop(streams, round(tokens / mix.window_s, 1), done, errors)


async def _burst(s: SimServe, mix: Mix) -> Burst:
    t0 = clock.now()
    answers = await asyncio.gather(*(s.ask(mix.burst_len, 1) for _ in range(mix.burst)))
    ok = [outs[-1][0] - t0 for _, outs, err in answers if outs and not err]
    return Burst.of(mix.burst, ok, refused=sum(1 for _, _, err in answers if err.startswith("429")))


async def _single(s: SimServe, mix: Mix) -> Single:
    ttfts = []
    for _ in range(mix.single_runs):
        sent, outs, err = await s.ask(mix.single_len, 1)
        if outs and not err:
            ttfts.append(outs[0][0] - sent)
    _, outs, _ = await s.ask(mix.prompt_len, mix.stream_tokens)
    n = sum(k for _, k in outs)
    interval = (outs[-1][0] - outs[0][0]) / (n - outs[0][1]) if outs and n > outs[0][1] else float("nan")
    return Single(mix.single_len, round(median(ttfts), 5), round(interval, 6))


def simulate_mixes(profile: Profile, mix: Mix, max_model_len: int = 8192) -> dict[str, Any]:
    """Each mix on a fresh simulated server (a fresh virtual clock each), as `bench serve`
    runs them on a live one; keyed as its results are."""

    def fresh(body: Callable[[SimServe], Coroutine[Any, Any, Any]]) -> Any:
        async def run() -> Any:
            s = SimServe(profile, max_model_len)
            await s.start()
            try:
                return await body(s)
            finally:
                await s.stop()

        return sim_clock.run(run())

    out: dict[str, Any] = {"single": fresh(lambda s: _single(s, mix))}
    out["burst"] = fresh(lambda s: _burst(s, mix))
    for n in mix.streams:
        out[f"closed_{n}"] = fresh(lambda s, n=n: _closed_loop(s, mix, n))
    return out


def against_live(live: dict[str, Any], profile: Profile | None = None) -> dict[str, Any]:
    """A live `bench serve` result's mixes on the simulator, with the cost model that run
    measured (or `profile`): per mix the simulated and the live served figures and their
    ratio (simulated / live)."""
    if profile is None:
        if not live.get("server", {}).get("profile"):
            raise InvalidRequestError(
                "the live result holds no cost model (a bench serve run before it was recorded): "
                "give one with --profile"
            )
        profile = Profile.from_json(live["server"]["profile"], "the live result's cost model")
    mix = Mix(**{k: tuple(v) if isinstance(v, list) else v for k, v in live["mix"].items()})
    sim = simulate_mixes(profile, mix)
    out: dict[str, Any] = {"model": live.get("model"), "profile": profile.name, "mix": live["mix"]}
    for name, result in sim.items():
        served = live.get(name, {}).get("served")
        entry: dict[str, Any] = {"simulated": dataclasses.asdict(result)}
        if served is not None:
            entry["live"] = served
            entry["ratio"] = compare(result, type(result)(**served))
        out[name] = entry
    return out
