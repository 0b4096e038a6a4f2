"""The switch to other libraries' public classes only: ``OPENENV_PUBLIC_IO=1``.

openenv's speed paths reach past the public APIs of uvicorn, websockets and
hypercorn (``tests/server/test_fences.py`` names every attribute). With the switch
on, a server runs on hypercorn by default on both backends (not uvicorn with
openenv's WebSocket protocol, not hypercorn+websockets; uvicorn asked for by
name runs its stock WebSocket protocol): slower, and independent of those
internals, for the time between an upgrade that breaks one and its mend. (The
client drives websockets' sans-I/O protocol through its public API on both
backends; the switch turns off its reads of whole data frames and its
registration of a link's socket with asyncio's loop between reads,
`transports.websocket._socket_reader`.) Two
fixes that reach into internals for safety stay on (uvicorn's header timeout,
the crash mended in hypercorn on trio): without them a server is not bounded.
"""

from __future__ import annotations

import os

__all__ = ["PUBLIC_IO_ENV", "public_io_only"]

PUBLIC_IO_ENV = "OPENENV_PUBLIC_IO"
"""The environment variable that turns the switch on for the whole process (``1``)."""


def public_io_only() -> bool:
    """Whether ``OPENENV_PUBLIC_IO`` asks for the public classes only (set, and not ``0``, ``false`` or ``no``)."""
    return os.environ.get(PUBLIC_IO_ENV, "").strip().lower() not in ("", "0", "false", "no")
