"""Established TCP connections each process holds on a listening port, from ``/proc``: how a
load generator's keep-alive connections fell on the web processes."""

import os
import re
from pathlib import Path

_SOCKET = re.compile(r"socket:\[(\d+)\]")
ESTABLISHED = "01"


def established_inodes(port: int, tables: tuple[str, ...] = ("tcp", "tcp6")) -> set[str]:
    """The socket inodes of connections established to local ``port``."""
    inodes = set()
    for table in tables:
        try:
            lines = Path(f"/proc/net/{table}").read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) > 9 and fields[3] == ESTABLISHED:
                if int(fields[1].rsplit(":", 1)[1], 16) == port:
                    inodes.add(fields[9])
    return inodes


def connections_per_process(pids: list[int], port: int) -> list[int]:
    """How many of the connections established to ``port`` each process holds open."""
    inodes = established_inodes(port)
    counts = []
    for pid in pids:
        held = 0
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            counts.append(0)
            continue
        for fd in fds:
            try:
                match = _SOCKET.match(os.readlink(f"/proc/{pid}/fd/{fd}"))
            except OSError:
                continue
            if match and match.group(1) in inodes:
                held += 1
        counts.append(held)
    return counts
