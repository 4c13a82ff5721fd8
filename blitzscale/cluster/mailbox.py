"""The controller's control socket, owned by one I/O thread.

ZeroMQ sockets are not thread-safe, and before this every cluster operation had to own the
socket while it waited for its replies, so operations ran one at a time. Here any thread
queues a command and gets a future for its reply; the I/O thread sends in queue order and
resolves each reply's future by (rank, op id), so operations on different ranks wait side
by side.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future

import zmq

from blitzscale.messages import FrameError, HelloMsg, Message, ReplyMsg, encode, open_frames

log = logging.getLogger("blitzscale.cluster")


class Mailbox:
    def __init__(self, sock: zmq.Socket, token: bytes, on_hello: Callable[[HelloMsg], None]) -> None:
        self._sock = sock
        self._token = token
        self._on_hello = on_hello
        self._out: queue.SimpleQueue[tuple[int, bytes]] = queue.SimpleQueue()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        self._waiting: dict[tuple[int, int], Future[ReplyMsg]] = {}
        self._lock = threading.Lock()
        self._stop = False
        self._thread = threading.Thread(target=self._run, name="cluster-io", daemon=True)
        self._thread.start()

    def expect(self, rank: int, op_id: int) -> Future[ReplyMsg]:
        """A future for the reply of `rank` to op `op_id` (register it before sending)."""
        fut: Future[ReplyMsg] = Future()
        with self._lock:
            self._waiting[rank, op_id] = fut
        return fut

    def forget(self, keys: list[tuple[int, int]]) -> None:
        """Stop waiting for these replies (answered already, or given up on)."""
        with self._lock:
            for k in keys:
                self._waiting.pop(k, None)

    def send(self, rank: int, msg: Message) -> None:
        self._out.put((rank, encode(msg)))
        os.write(self._wake_w, b"x")

    def close(self) -> None:
        self._stop = True
        os.write(self._wake_w, b"x")
        self._thread.join(timeout=10)
        os.close(self._wake_r)
        os.close(self._wake_w)

    # --- the I/O thread ---------------------------------------------------------------------

    def _run(self) -> None:
        poller = zmq.Poller()
        poller.register(self._sock, zmq.POLLIN)
        poller.register(self._wake_r, zmq.POLLIN)
        while not self._stop:
            try:
                events = dict(poller.poll(1000))
                if self._wake_r in events:
                    with contextlib.suppress(BlockingIOError):
                        os.read(self._wake_r, 4096)
                self._flush()
                if self._sock in events:
                    while self._sock.poll(0):
                        self._deliver(self._sock.recv_multipart())
            except Exception:  # the one thread every command needs: it must not die
                log.exception("the control socket's I/O thread hit an error; it goes on")
        self._flush()  # the last commands (shutdown) still go out

    def _flush(self) -> None:
        while True:
            try:
                rank, data = self._out.get_nowait()
            except queue.Empty:
                return
            self._sock.send_multipart([f"w{rank}".encode(), data])

    def _deliver(self, frames: list[bytes]) -> None:
        try:
            msg = open_frames(frames, self._token)
        except FrameError as e:  # a stray or hostile local process: drop it, go on
            log.warning("dropped a frame on the control socket from %r: %s", frames[0][:32], e)
            return
        if isinstance(msg, HelloMsg):
            self._on_hello(msg)
        elif isinstance(msg, ReplyMsg):
            with self._lock:
                fut = self._waiting.pop((msg.rank, msg.op_id), None)
            # The waiter may have given up (cancelled) at this very moment.
            if fut is not None and fut.set_running_or_notify_cancel():
                fut.set_result(msg)
        else:
            log.warning("dropped a %s on the control socket", type(msg).__name__)
