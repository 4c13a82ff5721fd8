"""Which TCP addresses a set of processes listens on (Linux /proc), for tests that check
nothing of ours listens beyond the configured host."""

from __future__ import annotations

import os
from pathlib import Path

LOOPBACK = "0100007F"  # 127.0.0.1 as /proc/net/tcp writes it (little-endian hex)


def listening(pids: list[int]) -> list[str]:
    """Local addresses ("hex-ip:port" as /proc/net writes them) of the TCP sockets these
    processes listen on."""
    inodes = set()
    for pid in pids:
        fd_dir = Path(f"/proc/{pid}/fd")
        for fd in fd_dir.iterdir():
            try:
                link = os.readlink(fd)
            except OSError:
                continue
            if link.startswith("socket:["):
                inodes.add(link[8:-1])
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            cols = line.split()
            if cols[3] == "0A" and cols[9] in inodes:  # 0A: LISTEN
                found.append(cols[1])
    return found
