"""Workers as Ray actors, one per GPU (or CPU slot), across a Ray cluster's nodes.

Each worker is an actor, one per rank, on the node a placement group chose for that rank
(a bundle per rank, `PACK`ed over the nodes): its one method runs the same
`worker_main(WorkerConfig)` as a local process does, on the actor's node, and returns when
the worker stops. Everything else is the controller's, as with local processes: commands
are our msgspec frames over ZeroMQ, tensors go over torch.distributed (NCCL on GPU, gloo on
CPU); Ray only starts, checks, kills and stops actors. The actor's running call is its
liveness: it completes (with Ray's error) when the actor or its node is lost. A respawned
rank goes back onto its node, or, when that node is gone, onto any node with room.

The placement group only decides where the ranks go: it is given back once Ray has placed
it, and each actor is pinned to its bundle's node (node affinity) instead. Kept, a group
with bundles on a lost node is rescheduled by Ray's GCS, and while they cannot be placed
(a packed cluster that lost a node has no spare room) the GCS retries them in a busy loop:
a whole core, taken from the surviving workers, until the group is removed, which would
also kill the survivors in it (ray-project/ray#65007, unfixed in Ray 2.60).

Ray is imported here only: the local backend never needs it.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import socket
import time
from typing import Any

from blitzscale.cluster.spawn import whole_instances
from blitzscale.errors import BlitzScaleError
from blitzscale.worker.worker import WorkerConfig

log = logging.getLogger("blitzscale.cluster")
INSTALL_HINT = "the ray backend needs Ray: pip install 'blitzscale[ray]'"
LOOPBACK = ("127.0.0.1", "localhost", "::1")
# A local Ray instance whose raylet missed Ray's own node-startup limit (30 s, not
# configurable; seen on a 2-core machine running two test suites) is stopped and started
# again, up to this many starts in all.
LOCAL_STARTS = 3
STARTUP_TIMED_OUT = "timed out during startup"
AUTH_HINT = (
    " (the cluster uses Ray's token authentication: set RAY_AUTH_MODE=token and the head's"
    " token, RAY_AUTH_TOKEN=$(ray get-auth-token) on the head node, here too; docs/ray.md)"
)


def import_ray() -> Any:
    try:
        import ray
    except ImportError as e:
        raise BlitzScaleError(f"{INSTALL_HINT} ({e})") from e
    return ray


def _run_worker(cfg: WorkerConfig, node_ip: str) -> None:
    """In the actor: the worker's links go out on the interface of the node's own address
    when the controller is on another machine (on its machine, `Links` picks loopback)."""
    from blitzscale.worker.worker import worker_main
    from blitzscale.worker.world import interface_of

    if interface_of(cfg.dist_addr) is None:
        iface = interface_of(node_ip)
        if iface is not None:
            os.environ.setdefault("GLOO_SOCKET_IFNAME", iface)
            os.environ.setdefault("NCCL_SOCKET_IFNAME", iface)
    worker_main(cfg)


def _check_reachable(address: str, timeout_s: float = 10.0) -> None:
    """A `host:port` address must accept a connection: Ray's own join retries for ever."""
    host, sep, port = address.rpartition(":")
    if not sep or "://" in address or not port.isdigit():
        return  # "", "auto", "local", "ray://...": Ray resolves them (and fails fast)
    try:
        socket.create_connection((host, int(port)), timeout=timeout_s).close()
    except OSError as e:
        raise BlitzScaleError(
            f"no Ray cluster answers at {address!r} (--ray-address): {e.strerror or e}; "
            "start one with `ray start --head` there, or leave --ray-address out to start one here"
        ) from e


def bundle_nodes(table: dict[str, Any], n: int) -> dict[int, str]:
    """Rank -> node id, from a placed group's `placement_group_table` entry (bundle k is
    rank k)."""
    where = table.get("bundles_to_node_id") or {}
    missing = [k for k in range(n) if not where.get(k)]
    if missing:
        raise BlitzScaleError(f"Ray placed no node for bundles {missing} of the placement group: {table}")
    return {k: where[k] for k in range(n)}


class WorkerActorBody:
    """The actor (made a Ray actor class by `RaySpawner`): `run` is the worker's life."""

    def where(self) -> tuple[str, str, int]:
        import ray

        ctx = ray.get_runtime_context()
        return ctx.get_node_id(), ray.util.get_node_ip_address(), os.getpid()

    def run(self, cfg: WorkerConfig) -> None:
        import ray

        _run_worker(cfg, ray.util.get_node_ip_address())


class RayWorker:
    """A worker actor, with the interface of a local process (`spawn.WorkerHandle`)."""

    def __init__(self, ray: Any, actor: Any, cfg: WorkerConfig, startup_s: float) -> None:
        self._ray = ray
        self.actor = actor
        self._startup_s = startup_s
        self._where_ref = actor.where.remote()  # an actor runs its calls in order: first
        self._where: tuple[str, str, int] | None = None
        self.running = actor.run.remote(cfg)

    def where(self) -> tuple[str, str, int]:
        """(node id, node IP, pid) of the actor, once it has started."""
        if self._where is None:
            self._where = self._ray.get(self._where_ref, timeout=self._startup_s)
        return self._where

    def known_node(self) -> str:
        """Its node id, or "" while the actor has not started (never waits)."""
        if self._where is None:
            ready, _ = self._ray.wait([self._where_ref], timeout=0)
            if not ready:
                return ""
            try:
                self.where()
            except Exception:  # it never started (its node is gone)
                return ""
        assert self._where is not None
        return self._where[0]

    @property
    def pid(self) -> int:
        return self.where()[2]

    def is_alive(self) -> bool:
        ready, _ = self._ray.wait([self.running], timeout=0)
        return not ready

    def kill(self) -> None:
        self._ray.kill(self.actor, no_restart=True)

    def join(self, timeout: float | None = None) -> None:
        self._ray.wait([self.running], timeout=timeout)


class RaySpawner:
    """`address`: a running Ray cluster ("auto", "ray://..." or host:port); "" starts a local
    Ray instance, as `ray.init()` does (and stops it at `close`)."""

    def __init__(self, address: str = "", startup_timeout_s: float = 180.0) -> None:
        self.ray = import_ray()
        self.address = address
        self.startup_timeout_s = startup_timeout_s
        self.host = ""
        self.workers: dict[int, RayWorker] = {}
        self._pg: Any = None  # only while placing the ranks (`slots`)
        self._homes: dict[int, str] = {}  # rank -> the node id it is placed on
        self._started_ray = False
        self._actor_cls: Any = None
        self._device = "cpu"

    def connect(self, host: str) -> str:
        ray = self.ray
        if not ray.is_initialized():
            _check_reachable(self.address)  # (Ray waits for ever on an address with no GCS)
            try:
                self._init()
            except (ConnectionError, RuntimeError, ValueError) as e:
                raise BlitzScaleError(
                    f"cannot join the Ray cluster at {self.address!r} (--ray-address): {e}"
                    f"{AUTH_HINT if 'auth' in str(e).lower() else ''}"
                ) from e
            self._started_ray = not self.address
        if not self.host:
            self.host = self._advertise(host)
        return self.host

    def _init(self) -> None:
        """`ray.init`; a local instance that timed out starting is started again
        (LOCAL_STARTS); joining a cluster is tried once."""
        ray = self.ray
        for start in range(1, LOCAL_STARTS + 1):
            try:
                ray.init(address=self.address or "local", include_dashboard=False, log_to_driver=True)
                return
            except Exception as e:  # Ray raises a bare Exception for this one
                if self.address or STARTUP_TIMED_OUT not in str(e):
                    raise
                ray.shutdown()
                if start == LOCAL_STARTS:
                    raise BlitzScaleError(
                        f"the local Ray instance did not start in {LOCAL_STARTS} tries (each time: {e}); "
                        "is the machine overloaded? or start Ray yourself and pass --ray-address"
                    ) from e
                log.warning("the local Ray instance did not start (%s); starting it again", e)

    def _advertise(self, host: str) -> str:
        """Loopback only works if every node is this machine; otherwise this node's IP."""
        if host not in LOOPBACK:
            return host
        mine = self.ray.util.get_node_ip_address()
        ips = {n["NodeManagerAddress"] for n in self.ray.nodes() if n["Alive"]}
        return host if ips <= {mine} else mine

    def slots(self, num_workers: int, device: str, tp: int) -> int:
        from ray.util.placement_group import placement_group, placement_group_table

        self._device = device
        kind = "GPU" if device == "cuda" else "CPU"
        have = int(self.ray.available_resources().get(kind, 0))  # (others may hold some)
        n = min(num_workers, have)
        if device == "cuda":
            n = whole_instances(n, tp, f"the Ray cluster has {have}")
        if n < 1:
            raise BlitzScaleError(f"the Ray cluster has no {kind} free for a worker")
        if n < num_workers:
            log.warning(
                "the Ray cluster has %d %s free: starting %d workers, not %d", have, kind, n, num_workers
            )
        # PACK keeps ranks of one node together (consecutive ranks share NVLink / host
        # memory) and still spans the nodes when one does not hold them all.
        self._pg = placement_group([{kind: 1}] * n, strategy="PACK")
        ready = self._pg.ready()
        done, _ = self.ray.wait([ready], timeout=self.startup_timeout_s)
        if not done:
            self.close()
            raise BlitzScaleError(
                f"Ray could not place {n} workers of 1 {kind} each within {self.startup_timeout_s} s "
                f"(cluster resources: {self.ray.cluster_resources()})"
            )
        self._homes = bundle_nodes(placement_group_table(self._pg), n)
        self._release_pg()  # (the actors claim the same resources on the same nodes next)
        return n

    def _release_pg(self) -> None:
        if self._pg is not None:
            from ray.util.placement_group import remove_placement_group

            remove_placement_group(self._pg)
            self._pg = None

    def spawn(self, cfg: WorkerConfig, name: str) -> RayWorker:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        if self._actor_cls is None:
            self._actor_cls = self.ray.remote(max_restarts=0, max_task_retries=0)(WorkerActorBody)
        gpu = self._device == "cuda"
        if gpu:  # the actor sees its one GPU as device 0
            cfg = dataclasses.replace(cfg, device="cuda:0")
        # The first actor of a rank goes where the placement group put its bundle, and
        # only there; a replacement prefers its rank's node and, that node gone, goes
        # wherever there is room (soft), or waits for room.
        before = self.workers.get(cfg.rank)
        respawn = before is not None
        if before is not None and before.known_node():  # (where Ray put the last one)
            self._homes[cfg.rank] = before.known_node()
        actor = self._actor_cls.options(
            name=None,
            num_cpus=0 if gpu else 1,
            num_gpus=1 if gpu else 0,
            scheduling_strategy=NodeAffinitySchedulingStrategy(self._homes[cfg.rank], soft=respawn),
        ).remote()
        worker = RayWorker(self.ray, actor, cfg, self.startup_timeout_s)
        self.workers[cfg.rank] = worker
        return worker

    def node_of(self, rank: int) -> str:
        w = self.workers.get(rank)
        node = w.known_node() if w is not None else ""
        return node[:8] if node else "?"

    def _until_dead(self, actors: list[Any], timeout_s: float) -> None:
        """Until each killed actor is dead. `ray.kill` only asks the GCS: a worker that
        returned from `run` (it was told to shut down) answers calls until the kill lands.
        (Removing the placement group it ran in used to wait for that.)"""
        errors = self.ray.exceptions
        deadline = time.monotonic() + timeout_s
        for actor in actors:
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    log.warning("a worker actor was still alive %.0f s after it was killed", timeout_s)
                    return
                try:
                    self.ray.get(actor.where.remote(), timeout=left)
                except errors.ActorUnavailableError:
                    pass  # (reachable again soon, or dead)
                except errors.RayActorError:
                    break  # dead
                except errors.GetTimeoutError:
                    continue  # (the deadline is checked above)
                time.sleep(0.05)  # it answered: the kill has not landed yet

    def close(self) -> None:
        ray = self.ray
        for w in self.workers.values():
            try:
                ray.kill(w.actor, no_restart=True)
            except Exception as e:  # already gone
                log.debug("kill: %s", e)
        # Until Ray has seen every actor end (its process is then on its way out).
        if self.workers:
            ray.wait([w.running for w in self.workers.values()], num_returns=len(self.workers), timeout=30)
            self._until_dead([w.actor for w in self.workers.values()], 30.0)
        self.workers.clear()
        self._release_pg()
        if self._started_ray and ray.is_initialized():
            ray.shutdown()
            self._started_ray = False
