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
    """Instance `rank` is the worker `rank % world_size`'s serving slot `rank // world_size`
    (several models resident per worker: cluster/slotted.py); each frame names the slot."""

    def __init__(self, sock: zmq.asyncio.Socket, token: bytes, world_size: int) -> None:
        self.sock = sock
        self.token = token
        self.world_size = world_size

    def _frames(self, rank: int, msg: Message) -> list[bytes]:
        slot, worker = divmod(rank, self.world_size)
        return [f"w{worker}".encode(), slot.to_bytes(2, "little"), encode(msg)]

    async def send(self, rank: int, msg: Message) -> None:
        await self.sock.send_multipart(self._frames(rank, msg))

    def send_nowait(self, rank: int, msg: Message) -> None:
        self.sock.send_multipart(self._frames(rank, msg))  # queued by zmq, sent by the loop

    async def recv(self) -> Message:
        while True:
            frames = await self.sock.recv_multipart()
            try:
                return open_frames(frames, self.token)
            except FrameError as e:  # a stray or hostile local process: drop it, go on
                log.warning("dropped a frame on the data socket from %r: %s", frames[0][:32], e)
