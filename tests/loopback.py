"""Run a command where the only network is loopback: ``python -m tests.loopback COMMAND [ARG ...]``.

Ray's processes talk over the machine's network address even when told to use
127.0.0.1, and tests and benchmarks keep their traffic on loopback. So the Ray
tests and benchmarks run in a network namespace of their own, whose only
interface is ``lo``: there, 127.0.0.1 is the only address Ray can find or use.
An unprivileged user namespace makes this possible without root (as
``unshare --user --net`` does); the launcher maps the caller's own user and
group into it, brings ``lo`` up, and runs the command with:

- `INSIDE` set to ``1`` (the Ray tests run for real only then);
- ``RAY_TMPDIR`` a new directory of its own, removed afterwards (so no file of
  another Ray, such as ``/tmp/ray/ray_current_cluster``, is seen or overwritten);
- ``RAY_USAGE_STATS_ENABLED=0``.

It exits with the command's status, or with `UNAVAILABLE` (saying why on
stderr) when this system does not allow an unprivileged user namespace.
It imports only the standard library: the namespace must be entered while the
process has a single thread.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import shutil
import socket
import struct
import subprocess
import sys
import tempfile

__all__ = ["INSIDE", "UNAVAILABLE", "command", "inside"]

INSIDE = "OPENENV_LOOPBACK_ONLY"
"""The environment variable set to ``1`` for a command run in the namespace."""

UNAVAILABLE = 77
"""The launcher's exit status when no user and network namespace can be made here."""

_CLONE_NEWUSER = 0x10000000
_CLONE_NEWNET = 0x40000000
_SIOCGIFFLAGS = 0x8913
_SIOCSIFFLAGS = 0x8914
_IFF_UP = 0x1


def inside() -> bool:
    """Whether this process runs in the launcher's loopback-only namespace."""
    return os.environ.get(INSIDE) == "1"


def command(*argv: str) -> list[str]:
    """The command line that runs ``argv`` in a loopback-only namespace."""
    return [sys.executable, "-m", "tests.loopback", *argv]


def _unshare(flags: int) -> None:
    if hasattr(os, "unshare"):  # Python 3.12+
        os.unshare(flags)
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(flags) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))


def _write(path: str, text: str) -> None:
    with open(path, "w") as file:
        file.write(text)


def _enter_namespace() -> None:
    """Enter a new user and network namespace, as the same user and group, with ``lo`` up."""
    uid, gid = os.geteuid(), os.getegid()
    _unshare(_CLONE_NEWUSER | _CLONE_NEWNET)
    _write("/proc/self/uid_map", f"{uid} {uid} 1\n")
    _write("/proc/self/setgroups", "deny\n")  # required before an unprivileged gid_map
    _write("/proc/self/gid_map", f"{gid} {gid} 1\n")
    # struct ifreq: the interface's name (16 bytes), then its flags (a short) in a 24-byte union.
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        request = struct.pack("16sH22x", b"lo", 0)
        flags = struct.unpack("16sH22x", fcntl.ioctl(sock, _SIOCGIFFLAGS, request))[1]
        fcntl.ioctl(sock, _SIOCSIFFLAGS, struct.pack("16sH22x", b"lo", flags | _IFF_UP))


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: python -m tests.loopback COMMAND [ARG ...]", file=sys.stderr)
        return 2
    try:
        _enter_namespace()
    except OSError as exc:
        if exc.errno in (errno.EPERM, errno.EACCES, errno.EINVAL, errno.ENOSPC, errno.ENOSYS, errno.EUSERS):
            print(f"no unprivileged user and network namespace on this system: {exc}", file=sys.stderr)
            return UNAVAILABLE
        raise
    # In /tmp whatever TMPDIR says: Ray's Unix socket paths live under it, and must stay short.
    ray_tmpdir = tempfile.mkdtemp(prefix="oe-ray-", dir="/tmp")
    env = {**os.environ, INSIDE: "1", "RAY_TMPDIR": ray_tmpdir, "RAY_USAGE_STATS_ENABLED": "0"}
    try:
        child = subprocess.Popen(argv, env=env)
        while True:
            try:
                return child.wait()
            except KeyboardInterrupt:
                continue  # the child got the same Ctrl-C; its status is ours
    finally:
        shutil.rmtree(ray_tmpdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
