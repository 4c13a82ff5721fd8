"""The simulated engine and links on their own."""

from __future__ import annotations

import asyncio
from collections import Counter

from blitzscale.control.costmodel import Profile
from blitzscale.messages import AbortMsg, GenerateMsg, Message, OutputsMsg, SamplingMsg
from blitzscale.sim.clock import run
from blitzscale.sim.engine import EngineShape, Recorder, SimEngine
from blitzscale.sim.links import Links, Topology

PROFILE = Profile(
    name="t",
    device="test",
    weight_bytes=1000,
    kv_bytes_per_token=1,
    device_memory_bytes=100_000,
    prefill_tokens=(1, 1000),
    prefill_ms=(100.0, 1000.0),
    decode_batch=(1, 10),
    decode_context=(1, 1000),
    decode_ms=((10.0, 10.0), (10.0, 10.0)),
)
SHAPE = EngineShape(
    block_size=16, max_num_batched_tokens=4096, max_num_seqs=16, max_model_len=4096, kv_blocks=500
)


def _engine(sent: list[Message]) -> SimEngine:
    return SimEngine(0, "colocated", PROFILE, SHAPE, sent.append, Recorder(), lambda *a: None)


def test_an_abort_during_a_prefill_step_frees_the_request() -> None:
    async def main() -> tuple[SimEngine, list[Message]]:
        sent: list[Message] = []
        e = _engine(sent)
        e.start()
        params = SamplingMsg(max_tokens=5)
        e.handle(GenerateMsg(request_id="a", prompt_token_ids=[0] * 500, params=params, hold_kv=True))
        e.handle(GenerateMsg(request_id="b", prompt_token_ids=[0] * 100, params=params))
        await asyncio.sleep(0.2)  # both are in the prefill step (0.6 s)
        assert e.used_blocks > 0 and not e.is_idle
        e.handle(AbortMsg(request_id="a"))
        await asyncio.sleep(5)
        e.stop()
        return e, sent

    e, sent = run(main())
    outs = [o for m in sent if isinstance(m, OutputsMsg) for o in m.outputs]
    # (as the engine: an aborted request's last output, with no token, says "abort")
    assert [(o.finish_reason, o.new_token_ids) for o in outs if o.request_id == "a"] == [("abort", [])]
    assert {o.request_id for o in outs if o.new_token_ids} == {"b"}
    assert sum(len(o.new_token_ids) for o in outs) == 5
    assert e.is_idle and e.used_blocks == 0 and not e.held


def test_striped_multicast_is_never_faster_than_a_targets_inbound_link() -> None:
    topo = Topology(
        nodes=2,
        gpus_per_node=4,
        nvlink_bytes_per_s=100.0,
        nic_bytes_per_s=10.0,
        pcie_bytes_per_s=10.0,
        ssd_bytes_per_s=1.0,
        latency_s=0.0,
    )
    links = Links(topo)
    one = links.multicast_seconds([0], [1], 1000, 10)
    four = links.multicast_seconds([0, 2, 3], [1], 1000, 10)
    assert one == 10.0 and four >= 10.0 - 1e-9  # three stripes share rank 1's NVLink in
    with links.using(topo.path(0, 1)):  # a KV migration on the same link halves its share
        assert links.rate(topo.path(0, 1)) == 50.0
    assert links.rate(topo.path(0, 4)) == 10.0 and links.rate(topo.path(0, 1), Counter()) == 100.0


def test_cpu_workers_sharing_cores_take_longer_per_step() -> None:
    from blitzscale.sim.cores import HostCores

    cores = HostCores(2)
    assert cores.stretch(0) == 1.0
    with cores.computing(0), cores.computing(1):
        assert cores.stretch(1) == 1.0  # two engines, two cores
        assert cores.stretch(2) == 1.5  # a third one shares them
    assert cores.busy == set() and HostCores(0).stretch(5) == 1.0


def test_fixed_provisioning_from_blitz_peak_fits_the_cluster() -> None:
    """fixed-peak takes blitz's prefill and decode peaks, fixed-half half of each; when the
    two peaks (reached at different moments) add up past the cluster, both are cut to it in
    proportion, one instance each at least."""
    from blitzscale.sim.runner import fixed_counts

    assert fixed_counts((12, 4), "fixed-peak", 32) == (12, 4)
    assert fixed_counts((12, 5), "fixed-half", 32) == (6, 3)
    assert fixed_counts((0, 0), "fixed-peak", 32) == (1, 1)
    assert fixed_counts((30, 3), "fixed-peak", 32) == (29, 3)  # 33 instances on 32 GPUs
    assert fixed_counts((20, 20), "fixed-peak", 16) == (8, 8)
    assert fixed_counts((31, 1), "fixed-peak", 16) == (15, 1)
    assert sum(fixed_counts((40, 30), "fixed-half", 32)) == 32


def test_a_simulated_load_from_a_busy_source_joins_its_chain_instead_of_queueing() -> None:
    """As on the real parameter plane (cluster/flights.py): 0 -> 1 takes 10 s; a load
    0 -> 2 called 4 s in takes the weights from rank 1 instead of waiting for rank 0, and
    a third, called at 6 s, extends the chain from rank 2."""
    from blitzscale.cluster.config import ClusterConfig
    from blitzscale.sim.cluster import SimCluster
    from tests.serve.test_budgets import profile

    topo = Topology(
        nodes=1, gpus_per_node=4, nvlink_bytes_per_s=1000.0, nic_bytes_per_s=1000.0,
        pcie_bytes_per_s=1000.0, ssd_bytes_per_s=1e9, latency_s=0.0,
    )  # fmt: skip

    async def main() -> list[tuple[tuple[int, ...], float]]:
        from blitzscale import clock

        cluster = SimCluster(topo, profile(1000.0), ClusterConfig(num_workers=4))  # 10,000 bytes: 10 s
        await cluster.load("m", 0, "src")
        t0 = clock.now()
        ended: list[tuple[tuple[int, ...], float]] = []

        async def load(target: int, after: float) -> None:
            await asyncio.sleep(after)
            report = await cluster.transfer("m", "src", [0], [target])
            ended.append((report[target].sources, clock.now() - t0))

        await asyncio.gather(load(1, 0.0), load(2, 4.0), load(3, 6.0))
        assert cluster.joins == 2
        await cluster.stop()
        return sorted(ended, key=lambda e: e[1])

    (s1, e1), (s2, e2), (s3, e3) = run(main())
    assert (s1, s2, s3) == ((0,), (1,), (2,))
    # each on its own link, at its rate from when it was called (queued: 20 s and 30 s)
    assert (e1, e2, e3) == (10.0, 14.0, 16.0)
