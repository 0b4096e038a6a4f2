"""Bounds hypercorn lacks, added the way the runner adds its other fixes: a connection cap, no compression.

- **No compression.** Hypercorn accepts permessage-deflate whenever a client
  offers it, and inflates a message whole before its size limit applies: a
  1 MiB frame of zeros becomes 1 GiB in the server's memory. `refuse_compression`
  makes its WebSocket handshake negotiate no extension, as uvicorn and
  openenv's trio front are configured (compressing small frames costs more
  CPU than it saves on a fast link anyway). It applies to every hypercorn
  server in the process.
- **A connection cap.** Hypercorn holds every connection it accepts; past the
  open-file limit, trio's accept loop stalls and every client times out.
  `cap_connections` gives a server a most-connections-at-once, as uvicorn's
  ``limit_concurrency`` does: a connection past it is answered ``503`` and
  closed at once.
- **Writes after a reset.** On asyncio, hypercorn goes on writing (pongs to a
  flood of pings, say) to a connection the client has reset, and asyncio logs
  a warning for every such write; the capped server drops them instead.

Each reaches into hypercorn's modules (``hypercorn.protocol.ws_stream.Handshake``
and its ``extensions``, ``hypercorn.asyncio.run.TCPServer``,
``hypercorn.trio.run.TCPServer``): hypercorn is capped in ``pyproject.toml``,
and ``tests/server/test_fences.py`` names each attribute. They apply with
``OPENENV_PUBLIC_IO=1`` too: they are bounds, not speed paths.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Final

__all__ = ["BUSY_RESPONSE", "ConnectionCap", "cap_connections", "fit_to_open_files", "refuse_compression"]

logger = logging.getLogger("openenv.server")

BUSY_RESPONSE: Final = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\n"
    b"Connection: close\r\nContent-Length: 20\r\n\r\nService Unavailable\n"
)
"""What a connection past the cap is answered, as uvicorn answers one past ``limit_concurrency``."""

_CAP_ATTRIBUTE = "_openenv_connection_cap"

# File descriptors kept beside the connections: the listener, the event loop's
# own, logs, sessions' socket loans and threads' wake-ups.
_SPARE_FILES: Final = 64


def fit_to_open_files(limit: int | None) -> int | None:
    """A connection cap lowered, if need be, to leave room under the process's open-file limit.

    A server past that limit cannot accept, and every client then times out;
    one at its cap answers ``503`` at once. Says so in the log when it lowers it.

    Args:
        limit: The cap asked for; ``None`` for none.

    Returns:
        The cap to apply: ``limit``, or the soft open-file limit less a margin if lower.
    """
    try:
        import resource
    except ImportError:  # pragma: no cover - not on POSIX
        return limit
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return limit
    room = max(1, soft - _SPARE_FILES)
    if limit is None or limit > room:
        logger.warning(
            "at most %d connections at once (not %s): the open-file limit is %d; raise it (ulimit -n) for more",
            room,
            "unlimited" if limit is None else limit,
            soft,
        )
        return room
    return limit


class ConnectionCap:
    """How many connections one server holds, and the most it may.

    Args:
        limit: The most connections at once.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.open = 0

    def take(self) -> bool:
        """Count a new connection in; ``False`` (and not counted) if the cap is reached."""
        if self.open >= self.limit:
            return False
        self.open += 1
        return True

    def give_back(self) -> None:
        """Count a connection out."""
        self.open -= 1


def refuse_compression() -> None:
    """Make hypercorn's WebSocket handshakes negotiate no extension (no permessage-deflate); idempotent."""
    import hypercorn.protocol.ws_stream as ws_stream

    module: Any = ws_stream
    if getattr(module.Handshake, "_openenv_uncompressed", False):
        return

    class UncompressedHandshake(module.Handshake):  # type: ignore[misc]
        _openenv_uncompressed = True

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.extensions = None  # as if the client offered none: accept() then negotiates none

    module.Handshake = UncompressedHandshake


def cap_connections(config: Any, limit: int | None, backend: str) -> None:
    """Bound the connections of the hypercorn server that ``config`` configures.

    Installs, once per backend, hypercorn's per-connection server class with
    the cap (it reads the cap from the config it serves, so other servers in
    the process are untouched).

    Args:
        config: The server's hypercorn ``Config``.
        limit: The most connections at once; ``None`` for no cap.
        backend: ``"asyncio"`` or ``"trio"``.
    """
    setattr(config, _CAP_ATTRIBUTE, None if limit is None else ConnectionCap(limit))
    if backend == "trio":
        _install_trio()
    else:
        _install_asyncio()


def _cap_of(server: Any) -> ConnectionCap | None:
    cap: ConnectionCap | None = getattr(server.config, _CAP_ATTRIBUTE, None)
    return cap


async def _run_within_cap(
    server: Any, run: Callable[[], Awaitable[None]], refuse: Callable[[], Awaitable[None]]
) -> None:
    """Serve one of hypercorn's connections (``run``) within its server's cap; ``refuse`` it once the cap is reached.

    A connection is counted once, by the outermost capped class (the class may
    be installed again on top of others installed after it).
    """
    cap = _cap_of(server)
    if cap is None or getattr(server, "_openenv_counted", False):
        await run()
        return
    server._openenv_counted = True
    if not cap.take():
        await refuse()
        return
    try:
        await run()
    finally:
        cap.give_back()


def _install_trio() -> None:
    import hypercorn.trio.run

    run_module: Any = hypercorn.trio.run  # the module whose TCPServer its worker_serve builds
    if "_openenv_capped" in vars(run_module.TCPServer):
        return  # the outermost class is ours already

    # On top of the classes installed before (the closing fix, the WebSocket front), so
    # that it counts every connection; installed again on top of one installed after it
    # (a connection counted by an outer one is not counted again).
    class CappedTCPServer(run_module.TCPServer):  # type: ignore[misc]
        _openenv_capped = True

        async def run(self) -> None:
            await _run_within_cap(self, super().run, self._refuse)

        async def _refuse(self) -> None:
            with contextlib.suppress(Exception):
                await self.stream.send_all(BUSY_RESPONSE)
            with contextlib.suppress(Exception):
                await self.stream.aclose()

    run_module.TCPServer = CappedTCPServer


def _install_asyncio() -> None:
    import hypercorn.asyncio.run
    from hypercorn.events import Closed, RawData

    run_module: Any = hypercorn.asyncio.run
    if "_openenv_capped" in vars(run_module.TCPServer):
        return

    class CappedTCPServer(run_module.TCPServer):  # type: ignore[misc]
        _openenv_capped = True

        async def run(self) -> None:
            await _run_within_cap(self, super().run, self._refuse)

        async def _refuse(self) -> None:
            with contextlib.suppress(Exception):
                self.writer.write(BUSY_RESPONSE)
                self.writer.close()

        async def protocol_send(self, event: Any) -> None:
            if isinstance(event, RawData) and self.writer.transport.is_closing():
                # The client is gone (a reset, say): asyncio would log a warning per write.
                await self.protocol.handle(Closed())
                return
            await super().protocol_send(event)

    run_module.TCPServer = CappedTCPServer
