"""What Linux's ``/proc`` says of a process: its TCP connections to a port, its CPU time.

Standard library only: the reference's fleet client (run with the reference
venv's python, from this folder) imports it too. Its memory is `_memory`'s.
"""

from __future__ import annotations

import os
from pathlib import Path

# /proc/net/tcp's state column: 01 is ESTABLISHED.
_ESTABLISHED = "01"


def _socket_inodes(pid: int | str) -> set[str]:
    """The inodes of the sockets process ``pid`` holds open (its fds that link to ``socket:[inode]``)."""
    inodes = set()
    folder = f"/proc/{pid}/fd"
    for fd in os.listdir(folder):
        try:
            target = os.readlink(f"{folder}/{fd}")
        except OSError:  # closed since the listing (the listing's own fd, for one)
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    return inodes


def tcp_connections_to(port: int, pid: int | str = "self") -> int | None:
    """How many established TCP connections process ``pid`` holds to remote port ``port`` (any address).

    Reads the process's socket fds and the TCP tables of its network namespace
    (``/proc/<pid>/net/tcp`` and ``tcp6``); ``None`` where ``/proc`` has none.
    """
    try:
        inodes = _socket_inodes(pid)
    except OSError:
        return None
    wanted = f"{port:04X}"
    count = 0
    for table in ("tcp", "tcp6"):
        try:
            lines = Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            # sl local_address rem_address st tx_queue:rx_queue tr:tm->when retrnsmt uid timeout inode ...
            fields = line.split()
            if fields[2].rpartition(":")[2] == wanted and fields[3] == _ESTABLISHED and fields[9] in inodes:
                count += 1
    return count


def cpu_seconds(pid: int | str = "self") -> float:
    """User and system CPU seconds process ``pid`` has used so far, every thread (raises `OSError` off Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
