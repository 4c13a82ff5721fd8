"""What a local process that is not one of ours can do to a cluster (nothing), and
back-to-back operations on one worker (none is refused as "already in a transfer")."""

from __future__ import annotations

import os

import zmq

from blitzscale.cluster.local import Blocking
from blitzscale.messages import HelloMsg, ReplyMsg, encode
from tests.cluster.conftest import SRC, M, tiny_cluster
from tests.listeners import LOOPBACK, listening

cluster = tiny_cluster(2)


def test_every_listener_of_the_cluster_is_bound_to_the_configured_host(cluster: Blocking) -> None:
    pids = [os.getpid(), *(p.pid for p in cluster.procs)]
    addrs = listening(pids)
    assert addrs, "found no listening socket at all"
    assert all(a.split(":")[0] == LOOPBACK for a in addrs), addrs


def test_foreign_frames_on_the_control_socket_are_dropped(cluster: Blocking) -> None:
    assert cluster._sock is not None
    endpoint = cluster._sock.getsockopt(zmq.LAST_ENDPOINT).decode()
    ctx = zmq.Context()
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 1000)
    s.connect(endpoint)
    forged = ReplyMsg(op_id=10**9, rank=0, ok=False, error="forged")
    for frames in ([b"garbage"], [b"a", b"b"], [encode(forged)], [b"x" * 16, encode(forged)]):
        s.send_multipart(frames)
    s.send_multipart([b"\x00" * 16, encode(HelloMsg(rank=1, pid=1, device="evil"))])
    s.close()
    ctx.term()
    cluster.load(M, 0, SRC)
    cluster.transfer(M, SRC, [0], [1])
    assert cluster.checksum(M, 1) == cluster.checksum(M, 0)
    assert cluster.hellos[1].device == "cpu"
    cluster.release(M, 1)
    cluster.release(M, 0)


def test_back_to_back_transfers_through_one_worker_are_never_refused(cluster: Blocking) -> None:
    """The next transfer to a worker may arrive the moment the last one's reply is out."""
    cluster.load(M, 0, SRC)
    try:
        for _ in range(30):
            cluster.transfer(M, SRC, [0], [1])
            cluster.release(M, 1)
    finally:
        cluster.release(M, 0)
