"""The parameter plane on CPU workers (gloo), with the real SmolLM2 weights.

Four worker processes join one world; weights move by chain multicast, striped from two
sources, and from the one host copy; a worker killed mid-transfer fails the operation on
every survivor within the timeout, and a retry from another source works.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from blitzscale.cluster.config import ClusterConfig
from blitzscale.cluster.local import Blocking, ClusterOpError, LocalCluster
from blitzscale.cluster.pool import PoolError
from blitzscale.messages import ReplyMsg

M = "smollm2"


@pytest.fixture(scope="module")
def smollm2_dir(smollm2_folder: str) -> Path:
    """SmolLM2 in our format, so workers load it from disk in a fraction of a second."""
    return Path(smollm2_folder)


@pytest.fixture(scope="module")
def cluster(smollm2_dir: Path) -> Iterator[Blocking]:
    with LocalCluster(ClusterConfig(num_workers=4, transfer_timeout_s=10)).blocking as c:
        yield c


def _reset(c: Blocking) -> None:
    for r in c.pool.gpu_holders(M):
        c.release(M, r)
    c.release_host_copy(M)


def test_world_is_warm_and_disk_load_marks_every_segment(cluster: Blocking, smollm2_dir: Path) -> None:
    assert sorted(cluster.hellos) == [0, 1, 2, 3]
    res = cluster.load(M, 0, str(smollm2_dir))
    assert res.path == "disk" and res.bytes > 500e6 and res.seconds > 0
    assert cluster.pool.gpu_holders(M) == [0]
    _reset(cluster)


def test_chain_multicast_to_three_targets_is_bit_identical_in_layer_order(
    cluster: Blocking, smollm2_dir: Path
) -> None:
    cluster.load(M, 0, str(smollm2_dir))
    ref = cluster.checksum(M, 0)
    report = cluster.transfer(M, str(smollm2_dir), [0], [1, 2, 3], piece_bytes=8 << 20)
    num_segments = 32  # embed + 30 layers + head
    for r in (1, 2, 3):
        assert cluster.checksum(M, r) == ref
        order = report[r].ready_order
        assert order == tuple(range(num_segments)), f"rank {r} readiness order {order}"
        assert report[r].first_layer_s < report[r].seconds
    assert cluster.pool.gpu_holders(M) == [0, 1, 2, 3]
    _reset(cluster)


def test_striped_from_two_sources_is_bit_identical(cluster: Blocking, smollm2_dir: Path) -> None:
    cluster.load(M, 0, str(smollm2_dir))
    ref = cluster.checksum(M, 0)
    cluster.transfer(M, str(smollm2_dir), [0], [1])
    report = cluster.transfer(M, str(smollm2_dir), [0, 1], [2, 3])
    for r in (2, 3):
        assert report[r].bytes == report[2].bytes > 500e6
        assert cluster.checksum(M, r) == ref
    _reset(cluster)


def test_scale_from_zero_uses_the_one_host_copy(cluster: Blocking, smollm2_dir: Path) -> None:
    cluster.load(M, 0, str(smollm2_dir))
    ref = cluster.checksum(M, 0)
    copy = cluster.cache_on_host(M, 0)
    assert copy.bytes > 500e6 and copy.pinned is False and copy.seconds > 0  # (CPU: nothing to pin)
    with pytest.raises(PoolError, match="one host copy"):
        cluster.cache_on_host(M, 0)
    cluster.transfer(M, str(smollm2_dir), [0], [1])
    with pytest.raises(PoolError, match="one host copy"):
        cluster.cache_on_host(M, 1)  # a second holder may not cache it either
    for r in (0, 1):
        cluster.release(M, r)
    assert cluster.pool.gpu_holders(M) == [] and cluster.pool.host_holder(M) == 0
    cluster.transfer(M, str(smollm2_dir), [0], [0, 2, 3], from_host=True)
    for r in (0, 2, 3):
        assert cluster.checksum(M, r) == ref
    assert cluster.checksum(M, 0, host_copy=True) == ref
    _reset(cluster)


def test_release_returns_the_memory(cluster: Blocking, smollm2_dir: Path) -> None:
    cluster.load(M, 2, str(smollm2_dir))
    res = cluster.release(M, 2)
    assert res.freed_bytes > 500e6 and res.device_bytes_in_use == 0 and res.standby is False
    assert cluster.pool.models_on(2) == []


@contextlib.contextmanager
def _chain_with_a_kill(
    smollm2_dir: Path, victim: int, timeout_s: float
) -> Iterator[tuple[Blocking, str, dict[int, ReplyMsg], float]]:
    """Four workers; 0 and 3 hold the model; the chain 0 -> 1 -> 2 runs at 100 MB/s (540 MB:
    ~5 s) and `victim` is killed 1 s in. Yields the cluster, the checksum of the model,
    the failed transfer's replies and the seconds it took to fail."""
    with LocalCluster(ClusterConfig(num_workers=4, transfer_timeout_s=timeout_s)).blocking as c:
        c.load(M, 0, str(smollm2_dir))
        c.transfer(M, str(smollm2_dir), [0], [3])
        ref = c.checksum(M, 0)
        threading.Timer(1.0, c.procs[victim].kill).start()
        t = time.monotonic()
        with pytest.raises(ClusterOpError) as err:
            c.transfer(M, str(smollm2_dir), [0], [1, 2], max_bytes_per_s=100e6, piece_bytes=4 << 20)
        yield c, ref, err.value.replies, time.monotonic() - t


def test_killed_target_fails_cleanly_and_a_retry_from_another_source_works(smollm2_dir: Path) -> None:
    with _chain_with_a_kill(smollm2_dir, victim=1, timeout_s=5) as (c, ref, replies, elapsed):
        assert replies[1].error == "worker died"
        assert not replies[2].ok and not replies[0].ok  # every survivor saw the failure
        assert elapsed < 20, f"took {elapsed:.1f} s"
        assert c.pool.gpu_holders(M) == [0, 3] and c.pool.models_on(1) == c.pool.models_on(2) == []
        c.transfer(M, str(smollm2_dir), [3], [2])  # retry from the other holder
        assert c.checksum(M, 2) == ref


def test_killed_chain_source_fails_every_survivor_at_once_and_leaves_their_link_usable(
    smollm2_dir: Path,
) -> None:
    """The source of a chain 0 -> 1 -> 2 dies: 1 sees it at once, and 2, waiting on 1 (alive),
    must not wait out the transfer timeout. Their own link then carries the retry."""
    timeout_s = 120.0  # a survivor that waited it out would take this long
    with _chain_with_a_kill(smollm2_dir, victim=0, timeout_s=timeout_s) as (c, ref, replies, elapsed):
        assert replies[0].error == "worker died"
        assert not replies[1].ok and not replies[2].ok
        assert elapsed < timeout_s / 2, f"the survivors waited {elapsed:.1f} s"
        assert c.pool.gpu_holders(M) == [3]
        report = c.transfer(M, str(smollm2_dir), [3], [1, 2])  # the chain 3 -> 1 -> 2: 1 sends to 2 again
        assert sorted(report) == [1, 2]
        assert c.checksum(M, 1) == c.checksum(M, 2) == ref


def test_tensor_parallel_instances_move_shard_k_to_shard_k(cluster: Blocking) -> None:
    model, spec = "tiny-tp2", "random:tiny-llama3"
    cluster.load_instance(model, [0, 1], spec)
    refs = [cluster.checksum(model, r) for r in (0, 1)]
    assert refs[0] != refs[1]  # two different shards
    report = cluster.transfer_instances(model, spec, [[0, 1]], [[2, 3]])
    assert sorted(report) == [2, 3]
    assert [cluster.checksum(model, r) for r in (2, 3)] == refs
    for r in range(4):
        cluster.release(model, r)


def test_fp8_weights_move_as_they_are_by_network_and_host_copy(cluster: Blocking) -> None:
    """An FP8 model's buffer (e4m3 linears, fp32 scales) travels byte for byte: chain
    multicast, then from the one host copy; its sizes are the FP8 layout's, not fp32's."""
    model, spec = "tiny-fp8", "random:tiny-llama3:fp8"
    loaded = cluster.load(model, 0, spec)
    ref = cluster.checksum(model, 0)
    report = cluster.transfer(model, spec, [0], [1, 2])
    assert [cluster.checksum(model, r) for r in (1, 2)] == [ref, ref]
    dense = cluster.load("tiny-dense", 3, "random:tiny-llama3")
    assert report[1].bytes == loaded.bytes < 0.6 * dense.bytes
    copy = cluster.cache_on_host(model, 0)
    assert copy.bytes == loaded.bytes
    for r in (0, 1, 2):
        cluster.release(model, r)
    cluster.release("tiny-dense", 3)
    cluster.transfer(model, spec, [0], [0, 3], from_host=True)
    assert [cluster.checksum(model, r) for r in (0, 3)] == [ref, ref]
    for r in (0, 3):
        cluster.release(model, r)
    cluster.release_host_copy(model)


def test_configured_bandwidth_cap_slows_a_transfer_to_its_rate(smollm2_dir: Path) -> None:
    rate = 200e6  # bytes/s: 540 MB take about 2.7 s
    with LocalCluster(ClusterConfig(num_workers=2, transfer_bytes_per_s=rate)).blocking as c:
        c.load(M, 0, str(smollm2_dir))
        report = c.transfer(M, str(smollm2_dir), [0], [1], piece_bytes=8 << 20)
        nbytes = report[1].bytes
        assert report[1].seconds >= 0.9 * nbytes / rate and report[1].GBps <= 1.1 * rate / 1e9
        assert c.checksum(M, 1) == c.checksum(M, 0)


def test_a_worker_names_its_device_its_memory_and_the_models_shape(
    cluster: Blocking, smollm2_dir: Path
) -> None:
    """What the start-up fit check reads (serve/costs.py check_fits_device): a CPU worker's
    memory is its host's; the model's bytes, KV per token and context are its config's."""
    from blitzscale.cluster.commands import CostQuery
    from blitzscale.core.config import EngineConfig

    r = cluster.cost_report(1, CostQuery(M, str(smollm2_dir), EngineConfig(), measure=False))
    with open("/proc/meminfo") as f:
        total_kb = int(f.readline().split()[1])  # MemTotal
    assert abs(r.device_memory_bytes - total_kb * 1024) < 0.01 * total_kb * 1024
    assert r.device_name.startswith("cpu") and r.profile is None
    assert (r.weight_bytes, r.context_len, r.num_layers) == (538169344, 8192, 30)
    assert r.kv_bytes_per_token == 2 * 30 * 3 * 64 * 4  # k and v, 30 layers, 3 kv heads of 64, fp32
