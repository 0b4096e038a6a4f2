"""The in-process transport: an environment served in the caller's own event loop.

For unit tests and local runs. Nothing crosses a process, but every message is
still encoded and decoded as it would be on a network, so a test that passes
in-process also proves the messages serialise. The server side runs as a task of
its own, exactly as a network server's session would, so timeouts, late replies
and cancellation behave as they do over a socket.

URL form: ``inproc://package.module:Factory`` (the ``module:attribute`` form
uvicorn uses); or pass ``factory=`` directly.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anyio

from openenv import ConnectError, ConnectionClosed, Dialect, Transport
from openenv._background import BackgroundTask, start_background
from openenv._limits import DEFAULT_CLIENT_CLOSE_TIMEOUT
from openenv.channel import FrameQueue, QueueClosed
from openenv.server import host_session, load_factory

from ._deprecated import renamed_option

__all__ = ["InProcessTransport"]

SCHEME = "inproc://"
"""The prefix of the URLs this transport takes."""


class InProcessTransport(Transport):
    """Serves a fresh environment in this event loop, as a session of its own.

    Registered for ``inproc://``. Each transport builds one environment from the
    factory on connect, and closes it when the transport closes. A factory
    that raises gives the client a `openenv.FactoryError` at its first request,
    as a network server does.

    Examples:
        ```python
        from openenv.examples.echo import CallToolAction, EchoEnv, EchoEnvironment
        from transports.inprocess import InProcessTransport

        # By URL: the module:attribute form uvicorn uses.
        async with EchoEnv("inproc://openenv.examples.echo:EchoEnvironment") as env:
            await env.reset()

        # Or with the factory itself (a class, or any callable without arguments).
        async with EchoEnv(transport=InProcessTransport(factory=EchoEnvironment)) as env:
            await env.reset()
            result = await env.step(CallToolAction(tool_name="echo_message", arguments={"message": "hi"}))
            print(result.observation.echoed_message)  # hi
        ```

    Args:
        url: ``inproc://package.module:Factory``; unused when ``factory`` is given.
        factory: Builds the environment (usually its class); overrides the URL.
        dialect: The dialect to speak. The default, JSON with request ids, is what
            our WebSocket server negotiates; ``Dialect()`` speaks plain OpenEnv.
        close_timeout: Seconds to let the session finish its current request and
            close its environment before it is cancelled (5 by default).
        close_grace: Deprecated: ``close_timeout``, the name every transport uses.

    Attributes:
        url: The URL given, or ``None``.
        dialect: The dialect the session speaks.
        close_timeout: Seconds the session gets to finish when the transport closes.

    Raises:
        ValueError: Neither ``url`` nor ``factory`` was given.
    """

    def __init__(
        self,
        url: str | None = None,
        *,
        factory: Callable[[], Any] | None = None,
        dialect: Dialect = Dialect(request_ids=True),
        close_timeout: float = DEFAULT_CLIENT_CLOSE_TIMEOUT,
        close_grace: float | None = None,
    ) -> None:
        if url is None and factory is None:
            raise ValueError("InProcessTransport needs an inproc:// URL or a factory")
        if close_grace is not None:
            close_timeout = renamed_option("InProcessTransport", "close_grace", "close_timeout", close_grace)
        self.url = url
        self.dialect = dialect
        self.close_timeout = close_timeout
        self._factory = factory
        self._session: BackgroundTask | None = None
        # Unbounded queues are safe here: the client sends one request at a time
        # (plus a close, and any it abandoned), and the session one reply for each.
        self._to_server: FrameQueue[bytes] | None = None
        self._from_server: FrameQueue[bytes] | None = None

    def _load_factory(self) -> Callable[[], Any]:
        if self._factory is not None:
            return self._factory
        assert self.url is not None
        if not self.url.lower().startswith(SCHEME):
            raise ConnectError(f"{self.url!r} is not an {SCHEME} URL")
        try:
            return load_factory(self.url[len(SCHEME) :])
        except (ImportError, ValueError, TypeError) as exc:
            raise ConnectError(f"cannot load the environment factory of {self.url!r}: {exc}") from exc

    async def __aenter__(self) -> InProcessTransport:
        """Start the session task, which builds the environment.

        Returns:
            The transport itself.

        Raises:
            ConnectError: The URL is not an ``inproc://`` URL, or its factory
                cannot be imported or is not callable.
        """
        factory = self._load_factory()
        to_server, from_server = self._to_server, self._from_server = FrameQueue[bytes](), FrameQueue[bytes]()
        # A task of the loop's, not of the caller's: the transport may be closed from any task.
        self._session = await start_background(lambda: self._run_session(factory, to_server, from_server))
        return self

    async def _run_session(
        self, factory: Callable[[], Any], inbox: FrameQueue[bytes], outbox: FrameQueue[bytes]
    ) -> None:
        async def receive() -> bytes:
            try:
                return await inbox.get()
            except QueueClosed:
                raise ConnectionClosed("the client closed the session") from None

        async def send(frame: bytes) -> None:
            try:
                outbox.put(frame)
            except QueueClosed:
                raise ConnectionClosed("the client went away") from None

        try:
            await host_session(factory, receive, send, dialect=self.dialect)
        finally:
            inbox.close()
            outbox.close()

    async def send(self, frame: bytes) -> None:
        """Queue one frame for the session; never blocks.

        Args:
            frame: The encoded request.

        Raises:
            ConnectionClosed: The transport is not connected, or the session has ended.
        """
        if self._to_server is None:
            raise ConnectionClosed("the transport is not connected")
        try:
            self._to_server.put(frame)
        except QueueClosed:
            raise ConnectionClosed("the in-process session has ended") from None

    async def receive(self) -> bytes:
        """Return the session's next frame, waiting for it.

        Returns:
            The reply frame.

        Raises:
            ConnectionClosed: The transport is not connected, or the session has
                ended and every frame it sent was returned.
        """
        if self._from_server is None:
            raise ConnectionClosed("the transport is not connected")
        try:
            return await self._from_server.get()
        except QueueClosed:
            raise ConnectionClosed("the in-process session has ended") from None

    async def aclose(self) -> None:
        """End the channel: the session sees end-of-stream after its current request. Idempotent."""
        for queue in (self._to_server, self._from_server):
            if queue is not None:
                queue.close()

    async def __aexit__(self, *exc_info: object) -> None:
        """Close, give the session `close_timeout` seconds to finish, then cancel it.

        Args:
            *exc_info: The exception that ended the block, if any (unused).
        """
        await self.aclose()
        session, self._session = self._session, None
        if session is None:
            return
        with anyio.CancelScope(shield=True), anyio.move_on_after(self.close_timeout):
            await session.done.wait()
        await session.stop()
