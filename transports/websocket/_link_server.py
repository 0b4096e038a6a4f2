"""The WebSocket end of a link (``openenv.v2.*``): the connections that carry a `transports.link._host.LinkHost`.

A client that selects a link subprotocol opens sessions on the connection and
sends their frames in envelopes (`transports.link._envelope`); the link's sessions
are the `LinkHost`'s business. `ServerLink` reads the envelopes, hands them to
the host, and sends the host's replies as one message per batch (and per turn
of the event loop, for replies that complete in tasks).

The link outlives a dropped connection for ``resume_timeout`` seconds: a new
connection presenting its token (``OpenEnv-Resume``) takes every session over,
and each side sends again what the other lacks (`transports.link._state`).
A connection closed on purpose ends every session still open on it.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import secrets
from collections.abc import Callable
from typing import Any, Final

import anyio
import msgspec
from websockets.frames import CloseCode

from openenv import Dialect
from openenv.server import SERVER_DEFAULTS, SessionMetrics
from transports.admission._sessions import SHUTDOWN_REASON, SessionRegistry
from transports.link._host import LinkHost
from transports.link._state import LinkProtocolError
from transports.shared._asgi import Receive, Send
from transports.shared._locks import acquire_promptly
from transports.websocket._socket_loan import LendSocket

__all__ = ["DEFAULT_RESUME_TIMEOUT", "LinkConnection", "ServerLink"]

logger = logging.getLogger("openenv.server")

DEFAULT_RESUME_TIMEOUT: Final = SERVER_DEFAULTS.resume_timeout
"""Seconds a link's sessions wait for their client to come back after its connection drops."""

# The close codes ASGI servers report for a connection that dropped without a
# closing handshake (uvicorn says 1005, hypercorn 1006): the client may come back.
_DROPPED = frozenset({1005, 1006})

# WebSocket close codes (RFC 6455).


class LinkConnection:
    """One WebSocket connection of a link: its ASGI callables, until it is let go.

    Args:
        receive: The connection's ASGI ``receive``.
        send: The connection's ASGI ``send``.
        lend: Lends the connection's socket to a session's thread, where the
            server can (`transports.websocket._socket_loan`); else ``None``.
    """

    __slots__ = ("disconnected", "lend", "receive", "released", "send")

    def __init__(self, receive: Receive, send: Send, lend: LendSocket | None = None) -> None:
        self.receive = receive
        self.send = send
        self.lend = lend
        self.released = anyio.Event()
        self.disconnected = False


class ServerLink:
    """The server's side of one link on WebSocket: its host, and whichever connection carries it now.

    Args:
        factory: Builds one environment per session.
        registry: The app's session registry. Its clock times the wait for the
            client to come back (``resume_timeout``).
        dialect: The dialect of the sessions' frames (the link subprotocol's).
        error_details: Whether error replies name the server's exceptions.
        resume_timeout: Seconds the sessions wait for their client after the connection drops.
        max_message_size: The largest message the server takes (its `Hello` tells the client).
        client_max_message_size: The largest message the client takes (its handshake said):
            no envelope is larger, and a session whose reply alone would be ends.
        metrics: Where the sessions' requests are counted, or ``None``.
        client: Who opened the link (`transports.admission._guard.client_of`), for the per-client quota.
        on_end: Called once when the link is over (the endpoint forgets its token there).

    Attributes:
        token: The secret a new connection presents to take the link over.
    """

    def __init__(
        self,
        factory: Callable[[], Any],
        *,
        registry: SessionRegistry,
        dialect: Dialect,
        error_details: bool,
        resume_timeout: float,
        max_message_size: int | None = None,
        client_max_message_size: int | None = None,
        metrics: SessionMetrics | None = None,
        client: str | None = None,
        on_end: Callable[[ServerLink], object],
    ) -> None:
        self.token = secrets.token_urlsafe(32)
        self._max_message_size = max_message_size
        self.dialect = dialect
        self._resume_timeout = resume_timeout
        self._registry = registry
        self._clock = registry.clock
        self._on_end = on_end
        self._binary = dialect.encoding == "msgpack"
        self._host = LinkHost(
            factory,
            registry=registry,
            dialect=dialect,
            error_details=error_details,
            transport="websocket",
            flush=self._flush,
            metrics=metrics,
            client=client,
        )
        self._host.client_max_message_size = client_max_message_size
        self._current: LinkConnection | None = None
        self._incoming: LinkConnection | None = None  # a connection taking the link over
        self._arrived = anyio.Event()  # set when `_incoming` is set
        self._send_lock = anyio.Lock(fast_acquire=True)
        self._close_code = CloseCode.NORMAL_CLOSURE
        self._close_reason = ""
        # Cancels the wait for the next message of a connection that is being taken over: its
        # server may report the connection's end only once its client answers, which a dead one never does.
        self._receiving = anyio.CancelScope()
        self._in_receive = False
        # Cancels a plain wait for the next message once the link's lone session may be lent the socket
        # (its reply came from a task, its neighbour ended): the loop then lends it (`LinkHost.on_lendable`).
        self._plain_read: anyio.CancelScope | None = None
        self._host.on_lendable = self._lend_now
        self._host.on_shutting_down = self._stop
        # The server stops and the link holds no session: the carrier stops reading, and the
        # connection closes with 1001 (some servers, hypercorn, would wait their whole grace for it).
        self._stopping = False
        # A connection that takes the link over gets nothing before the client's Resume says what it holds.
        self._awaiting_resume = False

    async def run(self, first: LinkConnection) -> None:
        """Host the link on ``first`` and on every connection that takes it over, until it is over.

        Run by the task of the connection that opened the link; the sessions'
        tasks are its children. Returns once no connection will come back (its
        last one closed on purpose, or none came back in time) and every
        session's environment is closed; the connection in use then is closed.
        """
        self._host.hello(self.token, self._resume_timeout, self._max_message_size)
        forget = self._registry.notify_closing(self._on_server_closing)

        async def carry() -> str:
            connection: LinkConnection | None = first
            while connection is not None:
                self._current = connection
                if await self._serve(connection):
                    return "the client closed the connection"
                connection = await self._next_connection(connection)
                self._awaiting_resume = True
            return "the client is gone"

        try:
            await self._host.host(carry)
        except Exception:
            logger.exception("a WebSocket link failed")
            self._close_code, self._close_reason = CloseCode.INTERNAL_ERROR, "link error"
            self._host.release_all()
        finally:
            forget()
            self._on_end(self)
            if self._stopping and self._close_code == CloseCode.NORMAL_CLOSURE:
                self._close_code, self._close_reason = CloseCode.GOING_AWAY, SHUTDOWN_REASON
            last = self._current
            if last is not None and not last.disconnected:
                with anyio.CancelScope(shield=True), anyio.move_on_after(1.0):
                    await _close(last.send, self._close_code, self._close_reason)
            if last is not None:
                last.released.set()
            first.released.set()

    async def take_over(self, connection: LinkConnection) -> None:
        """Carry the link on a new connection (one presenting its token); return once it is let go.

        The connection in use, if any, is closed (1001); the new one's first
        message must be `transports.link._envelope.Resume`.
        """
        incoming, self._incoming = self._incoming, connection
        if incoming is not None:
            incoming.released.set()  # a connection that was waiting to take over: this one wins
        self._arrived.set()
        if self._in_receive:
            self._receiving.cancel()
        current = self._current
        if current is not None and not current.disconnected:
            await _close(current.send, CloseCode.GOING_AWAY, "the link moved to another connection")
        await connection.released.wait()

    async def _next_connection(self, dropped: LinkConnection) -> LinkConnection | None:
        """Let a dropped connection go and wait for one that takes the link over (``None``: none came).

        The wait ends early when the server stops (`_stop`): the server would
        otherwise wait for this task until its shutdown grace runs out.
        """
        dropped.released.set()
        self._current = None
        with self._clock.move_on_after(self._resume_timeout):
            while self._incoming is None and not self._stopping:
                self._arrived = anyio.Event()
                await self._arrived.wait()
        incoming, self._incoming = self._incoming, None
        return incoming

    async def _serve(self, connection: LinkConnection) -> bool:
        """Read envelopes from ``connection`` and answer them until it ends; whether it ended on purpose."""
        await self._flush()  # the Hello, or what a connection that takes over lacks
        with anyio.CancelScope() as self._receiving:
            return await self._host.serve(functools.partial(self._read, connection))
        # Cancelled: taken over, or the server stops. A connection taking over is served (and closed at once, stopping).
        return self._stopping and self._incoming is None

    async def _read(self, connection: LinkConnection) -> bool:
        """The carrier's loop on ``connection`` (run by `LinkHost.serve`); whether it ended on purpose."""
        host = self._host
        while not self._stopping:
            await host.room()
            if self._incoming is not None:
                return False  # another connection takes the link over
            if connection.lend is not None and not self._awaiting_resume:
                await host.lend_to_lone_session(connection.lend)
                if self._incoming is not None:
                    return False
            self._in_receive = True
            message = None
            try:
                if connection.lend is None or self._awaiting_resume or not host.may_lend_later():
                    message = await connection.receive()
                else:
                    with anyio.CancelScope() as self._plain_read:
                        message = await connection.receive()  # a cancelled read loses nothing
            finally:
                self._in_receive = False
                self._plain_read = None
            if message is None:
                continue  # the lone session may be lent the socket now
            if self._incoming is not None:
                # Taken over meanwhile: this message is not taken (the client sends what it holds
                # again, once the server's Resumed says what it lacks).
                return False
            ended = await self._answer(connection, message)
            if ended is not None:
                return ended and self._incoming is None
        return self._incoming is None  # the server stops

    def _on_server_closing(self) -> None:
        if not self._host.sessions:
            self._stop()  # with sessions, the last one's end for the shutdown stops it (`LinkHost.on_shutting_down`)

    def _stop(self) -> None:
        self._stopping = True
        self._arrived.set()  # a wait for the client to come back is over too
        if self._in_receive:
            self._receiving.cancel()

    def _lend_now(self) -> None:
        if self._plain_read is not None:
            self._plain_read.cancel()

    async def _answer(self, connection: LinkConnection, message: dict[str, Any]) -> bool | None:
        """Act on one ASGI message of the connection: ``None`` to read on, else whether it ended on purpose."""
        kind = message["type"]
        if kind == "websocket.disconnect":
            connection.disconnected = True
            return self._host.left_by_client or message.get("code", 1005) not in _DROPPED
        if kind != "websocket.receive":
            return None
        binary = self._binary
        data = message.get("bytes") if binary else message.get("text")
        if data is None:
            expected = "binary" if binary else "text"
            self._close_code, self._close_reason = CloseCode.UNSUPPORTED_DATA, f"a link's messages are {expected}"
            return True
        # Its first message, the Resume, is taken before anything of the message can wait (and a give-up
        # of a call that waits may cut the rest short: `LinkHost.serve`).
        self._awaiting_resume = False
        try:
            await self._host.take(data if binary else data.encode())
        except (msgspec.DecodeError, LinkProtocolError) as exc:
            self._close_code, self._close_reason = CloseCode.PROTOCOL_ERROR, f"not a link message: {exc}"[:120]
            return True
        await self._flush()
        return None

    async def _flush(self) -> None:
        """Send every posted entry on the connection in use, as one message (nothing without one)."""
        state = self._host.state
        if not state.has_outgoing or self._awaiting_resume:
            return
        lock = self._send_lock
        await acquire_promptly(lock)
        try:
            connection = self._current
            if connection is None or connection.disconnected:
                return  # kept unacknowledged: sent again to the connection that takes the link over
            entries = state.outgoing()
            if not entries:
                return
            try:
                for message in self._host.codec.encode_within(entries, self._host.client_max_message_size):
                    if self._binary:
                        await connection.send({"type": "websocket.send", "bytes": message})
                    else:
                        await connection.send({"type": "websocket.send", "text": message.decode()})
            except OSError:
                connection.disconnected = True  # its receive reports the disconnect next
        finally:
            lock.release()


async def _close(send: Send, code: int, reason: str) -> None:
    """Send the close frame; the client may be gone already, which is fine."""
    with contextlib.suppress(OSError, RuntimeError):
        await send({"type": "websocket.close", "code": code, "reason": reason})
