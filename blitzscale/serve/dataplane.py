"""How the router reaches its workers' engines: requests out, outputs and events in.

`ZmqDataPlane` is the server's (a ZeroMQ ROUTER socket, msgpack frames carrying the cluster
token); the simulator passes the same typed messages to simulated engines in process.
"""

from __future__ import annotations

import logging
from typing import Protocol

import zmq.asyncio

from blitzscale.messages import FrameError, Message, encode, open_frames

log = logging.getLogger("blitzscale.router")


class DataPlane(Protocol):
    async def send(self, rank: int, msg: Message) -> None: ...

    def send_nowait(self, rank: int, msg: Message) -> None:
        """Send from code that cannot wait (the message keeps its order with the others)."""
        ...

    async def recv(self) -> Message:
        """The next message from any worker."""
        ...


class ZmqDataPlane:
    def __init__(self, sock: zmq.asyncio.Socket, token: bytes) -> None:
        self.sock = sock
        self.token = token

    async def send(self, rank: int, msg: Message) -> None:
        await self.sock.send_multipart([f"w{rank}".encode(), encode(msg)])

    def send_nowait(self, rank: int, msg: Message) -> None:
        self.sock.send_multipart([f"w{rank}".encode(), encode(msg)])  # queued by zmq, sent by the loop

    async def recv(self) -> Message:
        while True:
            frames = await self.sock.recv_multipart()
            try:
                return open_frames(frames, self.token)
            except FrameError as e:  # a stray or hostile local process: drop it, go on
                log.warning("dropped a frame on the data socket from %r: %s", frames[0][:32], e)
