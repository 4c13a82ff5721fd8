"""The decode worker dies under load (pd mode). Streamed requests it was decoding fail with
a 503-class error, one whose client reads only the whole answer runs again; requests
prefilled afterwards wait, bounded, for a decode instance; when a prefill instance turns
into one, it decodes the requests it holds itself (no migration) and takes the others' KV:
every request ends, and those that complete have the right tokens."""

from __future__ import annotations

import asyncio
import time

import pytest

from blitzscale.control.policies import MutateAction
from blitzscale.control.snapshot import InstanceState
from blitzscale.core.sampling import SamplingParams
from blitzscale.errors import UnavailableError
from blitzscale.serve.background import LoopThread
from blitzscale.serve.requests import Stage
from blitzscale.serve.server import ServingCluster
from tests.serve.conftest import make_service

WAIT_S = 120
PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time, a dragon", "Water is"]

two_prefill_one_decode = pytest.fixture(scope="module")(
    make_service(
        cluster={"num_workers": 3},
        router={"mode": "pd", "max_migration_wait_s": 300.0},
        policy={"name": "fixed", "fixed_prefill": 2, "fixed_decode": 1},
    )
)


async def _text(
    service: ServingCluster, rid: str, prompt: str, max_tokens: int = 12, stream: bool = True
) -> str:
    router = service.router
    assert router is not None
    text = ""
    params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=max_tokens > 100)
    async for o in router.generate(rid, router.encode(prompt), params, stream=stream):
        text = o.text
    return text


async def _until(cond, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


def test_a_dead_decode_worker_wedges_nothing(
    two_prefill_one_decode: tuple[ServingCluster, LoopThread],
) -> None:
    service, lt = two_prefill_one_decode
    router, cluster, scaler = service.router, service.cluster, service.scaler
    assert router is not None and cluster is not None and scaler is not None
    decode = next(i for i in router.instances.values() if i.state is InstanceState.DECODE)

    async def scenario() -> tuple[list[str], list[object], list[object], str]:
        assert service.control is not None
        await service.control.pause_scaling()  # (fixed would load a decode instance again)
        reference = [await _text(service, f"ref-{i}", p) for i, p in enumerate(PROMPTS)]
        long = [asyncio.create_task(_text(service, f"long-{i}", p, 1500)) for i, p in enumerate(PROMPTS[:2])]
        quiet = asyncio.create_task(_text(service, "quiet", PROMPTS[2], 200, stream=False))

        def decoding() -> bool:
            ids = ["long-0", "long-1", "quiet"]
            return all(getattr(router.reqs.get(i), "stage", None) is Stage.DECODE for i in ids)

        await _until(decoding, "the long requests to decode")
        cluster.procs[decode.rank].kill()
        await _until(lambda: decode.state is InstanceState.INACTIVE, "the router to see the death")
        held = [asyncio.create_task(_text(service, f"held-{i}", p)) for i, p in enumerate(PROMPTS)]
        await _until(lambda: len(router.pending_migrations) >= len(PROMPTS), "held requests")
        holder = router.pending_migrations[0].prefill_rank
        assert holder is not None
        scaler._launch(MutateAction(holder))  # what the planner does when decode is short
        loop = asyncio.create_task(scaler.run())  # the mutation completes
        done = await asyncio.wait_for(asyncio.gather(*held, return_exceptions=True), WAIT_S)
        failed = await asyncio.wait_for(asyncio.gather(*long, return_exceptions=True), WAIT_S)
        again = await asyncio.wait_for(quiet, WAIT_S)
        loop.cancel()
        return reference, list(done), list(failed), again

    reference, done, failed, again = lt.run(scenario())
    assert all(isinstance(e, UnavailableError) and "died" in str(e) for e in failed), failed
    assert again.startswith(reference[2]) and len(again) > len(reference[2])  # run again, whole
    assert done == reference
    assert not router.reqs and not router.pending_migrations
    assert cluster.pool.gpu_holders(service.cfg.model.name) == sorted(
        i.rank for i in router.instances.values() if i.state is not InstanceState.INACTIVE
    )


def test_a_held_request_no_decode_instance_takes_fails_in_bounded_time() -> None:
    gen = make_service(
        cluster={"num_workers": 2},
        router={"mode": "pd", "max_migration_wait_s": 1.0},
        policy={"name": "fixed", "fixed_prefill": 1, "fixed_decode": 1},
    )()
    service, lt = next(gen)
    try:
        router, cluster = service.router, service.cluster
        assert router is not None and cluster is not None
        decode = next(i for i in router.instances.values() if i.state is InstanceState.DECODE)
        assert service.control is not None
        lt.run(service.control.pause_scaling())  # (fixed would load a decode instance again)
        cluster.procs[decode.rank].kill()

        async def scenario() -> BaseException | str:
            await _until(lambda: decode.state is InstanceState.INACTIVE, "the router to see the death")
            try:
                return await asyncio.wait_for(_text(service, "stranded", PROMPTS[0]), WAIT_S)
            except UnavailableError as e:
                return e

        err = lt.run(scenario())
        assert isinstance(err, UnavailableError) and "no decode instance" in str(err)
        prefill = next(i for i in router.instances.values() if i.state is InstanceState.PREFILL)

        async def blocks_freed() -> None:
            await _until(lambda: prefill.stats is not None and prefill.stats.used_blocks == 0, "freed KV")

        lt.run(blocks_freed())
    finally:
        next(gen, None)
