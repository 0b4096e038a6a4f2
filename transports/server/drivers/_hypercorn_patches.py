"""What openenv changes in hypercorn on trio, for the process: a fix, and WebSocket connections served beside it.

Both replace ``hypercorn.trio.run.TCPServer``, the class hypercorn's trio worker
builds for each connection, with a subclass (idempotently): one mends a crash
when a client closes its WebSocket, the other lets `transports.server.drivers._websocket_front`
serve WebSocket upgrades for a server that asks for it (hypercorn+websockets).
"""

from __future__ import annotations

import contextlib
from typing import Any, cast

import anyio

from transports.server.drivers._websocket_front import ReplayedStream, is_websocket_upgrade, read_head, serve_websocket

__all__ = ["add_trio_websocket_front", "mend_trio_closing"]


def mend_trio_closing() -> None:
    """Keep a client closing its WebSocket from killing hypercorn's whole trio server.

    Hypercorn's trio connection half-closes its socket (``send_eof``) outside the
    lock its other writes take. A write that lands meanwhile (the closing
    handshake's answer, or the app's last frame when both ends close at once)
    raises `trio.BusyResourceError`, which nothing catches: it ends the server's
    task group, listener and every session with it, while the process lives on.
    The write is moot (the socket is being closed), so this treats it as the
    peer having gone, as hypercorn treats a broken socket. Idempotent.
    """
    import hypercorn.trio.run
    import hypercorn.trio.tcp_server
    from hypercorn.events import Closed
    from hypercorn.trio.tcp_server import TCPServer

    # Trio's own exception, taken from the hypercorn module that meets it (the
    # rest of openenv reaches trio only through anyio).
    tcp_server_module: Any = hypercorn.trio.tcp_server
    busy_error: type[Exception] = tcp_server_module.trio.BusyResourceError

    run_module: Any = hypercorn.trio.run  # the module whose TCPServer its worker_serve builds
    if getattr(run_module.TCPServer, "_openenv_mended", False):
        return

    class MendedTCPServer(TCPServer):
        _openenv_mended = True

        async def protocol_send(self, event: Any) -> None:
            try:
                await super().protocol_send(event)
            except busy_error:  # send_eof is closing the socket: the write is moot
                await self.protocol.handle(Closed())

    run_module.TCPServer = MendedTCPServer


def add_trio_websocket_front() -> None:
    """Serve the WebSocket connections of hypercorn+websockets beside hypercorn on trio.

    Hypercorn's trio worker builds a ``TCPServer`` per connection; this one,
    for a server whose config has ``_openenv_websocket_front`` set, reads the
    request head first, serves a WebSocket upgrade itself (see
    `transports.server.drivers._websocket_front`), and hands anything else to hypercorn with
    the bytes already read. Other servers' connections go to hypercorn
    untouched. Idempotent.
    """
    import hypercorn.trio.run

    run_module: Any = hypercorn.trio.run  # the module whose TCPServer its worker_serve builds
    if getattr(run_module.TCPServer, "_openenv_fronted", False):
        return

    class FrontedTCPServer(run_module.TCPServer):  # type: ignore[misc]  # the mended class, if installed
        _openenv_fronted = True
        stream: Any  # trio's SocketStream, or the one that replays the head

        async def run(self) -> None:
            if not getattr(self.config, "_openenv_websocket_front", False):
                await super().run()
                return
            head = await self._read_head()
            if head is None:
                with contextlib.suppress(Exception):
                    await self.stream.aclose()
                return
            if not is_websocket_upgrade(head):
                self.stream = ReplayedStream(self.stream, head)
                await super().run()
                return
            sock = self.stream.socket
            try:
                client, server = sock.getpeername()[:2], sock.getsockname()[:2]
            except OSError:  # gone already
                with contextlib.suppress(Exception):
                    await self.stream.aclose()
                return
            watched = cast(Any, self.app).app  # hypercorn's wrapper around the ASGI app
            await serve_websocket(
                watched,
                self.stream,
                head,
                client=client,
                server=server,
                max_message_size=self.config.websocket_max_message_size,
                state=dict(self.state),
            )

        async def _read_head(self) -> bytes | None:
            """The request head, within the keep-alive timeout; ``None`` if it does not come, or the server stops."""
            head: bytes | None = None
            with anyio.move_on_after(self.config.keep_alive_timeout):
                async with anyio.create_task_group() as task_group:

                    async def cancel_when_terminated() -> None:
                        await self.context.terminated.wait()
                        task_group.cancel_scope.cancel()

                    task_group.start_soon(cancel_when_terminated)
                    head = await read_head(self.stream)
                    task_group.cancel_scope.cancel()
            return head

    run_module.TCPServer = FrontedTCPServer
