"""The server end of the WebSocket transport: the ``/ws`` endpoint, as a raw ASGI app.

It speaks whatever the client negotiated: a client that offers some of our
subprotocols gets the first of them in its own order of preference; a client
that offers none (OpenEnv's reference client) gets no subprotocol and plain
OpenEnv frames. On a link subprotocol (``openenv.v2.json``,
``openenv.v2.msgpack``) the connection carries many sessions, or takes a
dropped link over (``OpenEnv-Resume``): `transports.websocket._link_server`.
On any other it carries one session: it takes a session slot (or sends
``CAPACITY_REACHED`` and closes, as the reference does: the whole story is in
`transports.admission._sessions`) and runs `openenv.server.host_session` over the
connection.

This is the hot path of a server: it reads and writes ASGI messages directly,
without Starlette's ``WebSocket`` wrapper, and does as little as it can per frame.
It is still mounted in the Starlette app as a plain route (``WebSocketRoute``).
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from typing import Any
from urllib.parse import parse_qs

import anyio
import msgspec
from anyio.abc import TaskGroup
from websockets.frames import CloseCode

from openenv import ConnectionClosed, Dialect
from openenv.server import SERVER_DEFAULTS, ServerSession, SessionMetrics, encode_fatal_error, host_session
from transports.admission._guard import client_of
from transports.admission._lease import SessionLease
from transports.admission._queue import QueueTicket
from transports.admission._sessions import (
    CLIENT_GONE_REASON,
    GivingUp,
    SessionRegistry,
    session_failed_frame,
)
from transports.shared._asgi import Receive, Scope, Send
from transports.websocket._link_server import DEFAULT_RESUME_TIMEOUT, LinkConnection, ServerLink
from transports.websocket._socket_loan import SOCKET_LOAN, LendSocket, SocketLoan
from transports.websocket._subprotocols import (
    LINK_SUBPROTOCOLS,
    MAX_MESSAGE_HEADER,
    RESUME_HEADER,
    RESUME_TIMEOUT_HEADER,
    SPOKEN,
    dialect_of,
)

__all__ = ["WebSocketEndpoint", "select_subprotocol"]

logger = logging.getLogger("openenv.server")


# Seconds the server waits for the client to close the socket first: after a
# close request, or for the client's next request after a fatal error frame.
_CLOSE_GRACE = 1.0

# Messages a client may send while its session waits in the queue (a plain
# client's first request, say); past them the connection is not read until then.
_QUEUED_MESSAGES = 4


_RESUME = RESUME_HEADER.lower().encode()
_MAX_MESSAGE = MAX_MESSAGE_HEADER.lower().encode()
_RESUME_TIMEOUT = RESUME_TIMEOUT_HEADER.lower().encode()


def _header(scope: Scope, name: bytes) -> bytes | None:
    for key, value in scope.get("headers") or ():
        if key == name:
            return value  # type: ignore[no-any-return]
    return None


def _number(value: bytes | None) -> int | None:
    """A header's value as a whole number, if it is one."""
    return int(value) if value is not None and value.isdigit() and len(value) < 20 else None


def _session_to_attach(scope: Scope) -> str | None:
    """The ``session_id`` a connection's query string names, if any."""
    query = scope.get("query_string") or b""
    if b"session_id=" not in query:
        return None
    values = parse_qs(query.decode("latin-1")).get("session_id")
    return values[0] if values else None


def select_subprotocol(offered: Iterable[str]) -> str | None:
    """Pick the subprotocol to answer a client's offer with.

    Args:
        offered: The client's ``Sec-WebSocket-Protocol`` values, most preferred first.

    Returns:
        The first of them that this server speaks, or ``None`` (plain OpenEnv).
    """
    for name in offered:
        if name in SPOKEN:
            return name
    return None


class _RequestId(msgspec.Struct):
    id: int | None = None


def _wrong_frame_error(dialect: Dialect, frame: bytes | str) -> bytes:
    """The error reply to a frame of the wrong kind (binary for JSON, text for msgpack)."""
    expected, got = ("binary", "text") if dialect.encoding == "msgpack" else ("text", "binary")
    frame_out = encode_fatal_error(
        dialect, "INVALID_JSON", f"Invalid JSON: expected a {expected} frame, got a {got} frame"
    )
    if not dialect.request_ids:
        return frame_out
    try:  # A misframed request is most likely JSON: echo its id if it has one.
        request_id = msgspec.json.decode(frame, type=_RequestId).id
    except msgspec.DecodeError:
        return frame_out
    if request_id is None:
        return frame_out
    # Error frames are rare: clarity beats speed here.
    if dialect.encoding == "msgpack":
        reply = msgspec.msgpack.decode(frame_out, type=dict[str, Any])
        return msgspec.msgpack.encode({**reply, "id": request_id})
    reply = msgspec.json.decode(frame_out, type=dict[str, Any])
    return msgspec.json.encode({**reply, "id": request_id})


class WebSocketEndpoint:
    """The ``/ws`` endpoint: a link of many sessions, or one session, per WebSocket connection.

    An ASGI application for ``websocket`` scopes (mount it with Starlette's
    ``WebSocketRoute``). Per connection it selects the subprotocol and accepts.
    A link (``openenv.v2.*``) is served by `transports.websocket._link_server.ServerLink`,
    each of its sessions taking a slot as a connection's would. On any other
    subprotocol it takes
    a slot in ``registry`` (or sends one ``CAPACITY_REACHED`` error frame and
    closes), builds the environment with ``factory`` and serves it until the
    client sends ``close`` (the session ends; the client is expected to close
    the socket, else the server closes it with 1000 after a second) or
    disconnects, or the registry asks the session to end: idle past its
    timeout, or the server stopping (then it closes with 1001, the reason
    saying which). The slot is released and the environment closed however the
    connection ends.

    Frames of the wrong kind (binary in a JSON dialect, text in msgpack) get an
    ``INVALID_JSON`` error reply and the session goes on, like any other bad frame.

    Args:
        factory: Builds one environment per session.
        registry: The app's session registry (capacity and idle reaping).
        error_details: Whether error replies name the server's exceptions (see
            `openenv.server.ServerSession`).
        resume_timeout: Seconds a link's sessions wait for their client to
            come back after its connection drops (less if the client's
            ``OpenEnv-Resume-Timeout`` says so); see
            `transports.websocket._link_server`.
        metrics: Where the sessions' requests are counted, or ``None``.
        max_message_size: The largest message the server takes (a link's client is told it).
        attach: Serves a connection that names a session made elsewhere
            (``/ws?session_id=…``, OpenEnv 0.10's MCP sessions): called with the
            id and the accepted connection's ``receive`` and ``send``, in plain
            OpenEnv frames. ``None`` serves such a connection as any other.
    """

    def __init__(
        self,
        factory: Callable[[], Any],
        *,
        registry: SessionRegistry,
        error_details: bool = True,
        resume_timeout: float = DEFAULT_RESUME_TIMEOUT,
        metrics: SessionMetrics | None = None,
        max_message_size: int | None = SERVER_DEFAULTS.max_message_size,
        attach: Callable[[str, Receive, Send], Awaitable[None]] | None = None,
    ) -> None:
        self.factory = factory
        self.registry = registry
        self.metrics = metrics
        self.error_details = error_details
        self.resume_timeout = resume_timeout
        self.max_message_size = max_message_size
        self._links: dict[str, ServerLink] = {}
        self.attach = attach

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Serve one WebSocket connection (the ASGI entry point).

        Args:
            scope: The connection's ASGI scope.
            receive: The ASGI ``receive`` callable.
            send: The ASGI ``send`` callable.

        Raises:
            RuntimeError: The scope is not a ``websocket`` one.
        """
        if scope["type"] != "websocket":  # pragma: no cover - the router only sends websockets
            raise RuntimeError(f"{type(self).__name__} serves websocket scopes, not {scope['type']!r}")
        message = await receive()
        if message["type"] != "websocket.connect":
            return
        attach_to = _session_to_attach(scope) if self.attach is not None else None
        if attach_to is not None and self.attach is not None:
            with contextlib.suppress(OSError):
                await send({"type": "websocket.accept", "subprotocol": None})  # plain OpenEnv frames
                await self.attach(attach_to, receive, send)
            return
        subprotocol = select_subprotocol(scope.get("subprotocols") or ())
        dialect = dialect_of(subprotocol)
        try:
            await send({"type": "websocket.accept", "subprotocol": subprotocol})
        except OSError:
            return
        client = client_of(scope)
        lend: LendSocket | None = (scope.get("extensions") or {}).get(SOCKET_LOAN)
        if subprotocol in LINK_SUBPROTOCOLS:
            token = _header(scope, _RESUME)
            await self._serve_link(
                LinkConnection(receive, send, lend),
                dialect,
                None if token is None else token.decode(),
                _number(_header(scope, _MAX_MESSAGE)),
                _number(_header(scope, _RESUME_TIMEOUT)),
                client,
            )
            return
        await self._serve_connection(receive, send, dialect, lend, client)

    async def _serve_link(
        self,
        connection: LinkConnection,
        dialect: Dialect,
        token: str | None,
        client_limit: int | None,
        client_resume_timeout: int | None,
        client: str,
    ) -> None:
        """Host a new link on the connection, or (given a token) carry an existing one on it.

        ``client`` (`transports.admission._guard.client_of`) is whom the link's sessions
        count against, for the per-client quota.
        """
        if token is None:
            resume_timeout = self.resume_timeout
            if client_resume_timeout is not None:  # the client will not try longer (0: it never comes back)
                resume_timeout = min(resume_timeout, client_resume_timeout)
            link = ServerLink(
                self.factory,
                registry=self.registry,
                dialect=dialect,
                error_details=self.error_details,
                resume_timeout=resume_timeout,
                max_message_size=self.max_message_size,
                client_max_message_size=client_limit,
                metrics=self.metrics,
                client=client,
                on_end=lambda ended: self._links.pop(ended.token, None),
            )
            self._links[link.token] = link
            await link.run(connection)
            return
        existing = self._links.get(token)
        if existing is None or existing.dialect != dialect:
            await _close(
                connection.send, CloseCode.POLICY_VIOLATION, "no link to resume: its token is unknown or expired"
            )
            return
        await existing.take_over(connection)

    async def _serve_connection(
        self, asgi_receive: Receive, asgi_send: Send, dialect: Dialect, lend: LendSocket | None, client: str
    ) -> None:
        scope = anyio.CancelScope()
        admitted = await _admit(self.registry, asgi_receive, client=client, on_close=scope.cancel)
        if admitted is None:
            return  # the client went while it waited for a slot
        lease, asgi_receive = admitted
        if lease is None:
            await _turn_away(asgi_receive, asgi_send, dialect, self.registry.capacity_reached_frame(dialect, client))
            return
        lease.connected = True  # never reaped as idle while its connection lasts
        session = _WebSocketSession(asgi_receive, asgi_send, dialect, lease)
        giving_up = GivingUp(self.registry, lease, scope.cancel)
        lease.on_long_step = session.watch_client
        serve_on_thread = None if lend is None else functools.partial(_serve_on_thread, lend, lease, dialect)
        close_code, reason = CloseCode.NORMAL_CLOSURE, ""
        try:
            with scope:
                await _in_own_task(
                    functools.partial(
                        host_session,
                        self.factory,
                        session.receive_frame,
                        session.send_frame,
                        dialect=dialect,
                        error_details=self.error_details,
                        on_end=lease.vacate,
                        metrics=self.metrics,
                        serve_on_thread=serve_on_thread,
                        on_session=giving_up.hosted,
                    ),
                    on_task_group=session.watch_from,
                )
            if lease.close_reason is not None:  # idle too long, or the server is stopping
                close_code, reason = CloseCode.GOING_AWAY, lease.close_reason
        except Exception:
            logger.exception("WebSocket session failed")
            close_code, reason = CloseCode.INTERNAL_ERROR, "session error"
            if not session.disconnected:
                with contextlib.suppress(ConnectionClosed):
                    await session.send_frame(session_failed_frame(dialect))
        finally:
            lease.release()
        if session.disconnected:
            return
        if close_code == CloseCode.NORMAL_CLOSURE and lease.close_reason is None:
            if session.served:
                # After a close request the client closes the socket next (OpenEnv's
                # and ours do at once). Let it, rather than cross close frames with
                # it: hypercorn on trio can fail when both ends close at once.
                if await _client_closes(asgi_receive, _CLOSE_GRACE, on_request=False):
                    return
            elif await _client_closes(asgi_receive, _CLOSE_GRACE, on_request=True):
                return  # FACTORY_ERROR sent: see _turn_away
        await _close(asgi_send, close_code, reason)


async def _admit(
    registry: SessionRegistry,
    asgi_receive: Receive,
    *,
    client: str,
    on_close: Callable[[], object],
    on_queued: Callable[[QueueTicket], Awaitable[None]] | None = None,
) -> tuple[SessionLease | None, Receive] | None:
    """Take a slot for a connection's session, waiting in the registry's queue while the client stays.

    While it waits, the connection is read: a client that goes gives its place
    up at once (else it would be admitted, and hold the slot, with nobody
    there); what it sends meanwhile (at most `_QUEUED_MESSAGES`) is kept.

    Returns:
        ``(lease, receive)``: the lease, or ``None`` if no slot came in time (or
        the client is at its quota); ``receive`` gives the messages kept first.
        ``None`` if the client went.
    """
    ticket = registry.open_or_enqueue(transport="websocket", on_close=on_close, client=client)
    if not isinstance(ticket, QueueTicket):
        return ticket, asgi_receive
    kept: list[dict[str, Any]] = []
    gone = False
    try:
        if on_queued is not None:
            await on_queued(ticket)
        async with anyio.create_task_group() as task_group:

            async def notice_the_client_going() -> None:
                nonlocal gone
                while len(kept) < _QUEUED_MESSAGES:
                    message = await asgi_receive()
                    if message["type"] == "websocket.disconnect":
                        gone = True
                        task_group.cancel_scope.cancel()
                        return
                    kept.append(message)

            task_group.start_soon(notice_the_client_going)
            lease = await registry.wait_admitted(ticket)
            task_group.cancel_scope.cancel()
    except BaseException:
        registry.leave(ticket)
        raise
    if gone:
        registry.leave(ticket)
        if lease is not None:
            lease.release()
        return None
    if not kept:
        return lease, asgi_receive

    async def receive_kept_first() -> dict[str, Any]:
        return kept.pop(0) if kept else await asgi_receive()

    return lease, receive_kept_first


async def _in_own_task(
    session: Callable[[], Coroutine[Any, Any, None]], on_task_group: Callable[[TaskGroup], object] | None = None
) -> None:
    """Run a session in a task of its own, and wait for it.

    Each time a task resumes (a session's, once per request), Python passes
    through every frame of its await chain. In the connection's task, the
    server's, the app's middleware's and the router's dozen frames sit above
    the endpoint; a task of its own starts at the session. ``on_task_group``
    gets the task group, for tasks beside the session (they end with it).
    """
    async with anyio.create_task_group() as own_task:

        async def then_the_rest() -> None:
            try:
                await session()
            finally:
                own_task.cancel_scope.cancel()  # what runs beside it ends with it

        if on_task_group is None:
            own_task.start_soon(session)
            return
        on_task_group(own_task)
        own_task.start_soon(then_the_rest)


async def _serve_on_thread(
    lend: LendSocket, lease: SessionLease, dialect: Dialect, session: ServerSession
) -> bytes | None:
    """`serve_frames`'s ``serve_on_thread`` for a plain connection: answer requests on the session's thread."""
    loan = lend()
    if loan is None:
        return None
    return await _serve_on_loan(loan, lease, dialect, session)


async def _serve_on_loan(
    loan: SocketLoan, lease: SessionLease, dialect: Dialect, session: ServerSession
) -> bytes | None:
    """Answer requests on the session's thread with the lent socket until the loan must end; then end it.

    Returns a reply the loan was stopped before sending (see `SocketLoan.serve`).
    """
    binary = dialect.encoding == "msgpack"
    begin = loan.begin

    def on_frame(is_text: bool, payload: bytes) -> bytes | None:
        if is_text is binary:
            return None  # a frame of the wrong kind: the event loop answers it
        lease.mark_busy()
        return session.handle_on_thread(payload, lambda request_id: begin())

    def on_idle() -> bool:
        lease.touch()  # before looking at close_reason: see SessionLease.ask_to_end
        return lease.close_reason is None

    try:
        unsent: bytes | None = await session.run_on_thread(
            functools.partial(loan.serve, on_frame, on_idle, None), loan.stop
        )
    finally:
        loan.end()
    return unsent


async def _send(asgi_send: Send, binary: bool, frame: bytes) -> None:
    """Send one frame as the dialect frames it: binary for msgpack, text for JSON."""
    if binary:
        await asgi_send({"type": "websocket.send", "bytes": frame})
    else:
        await asgi_send({"type": "websocket.send", "text": frame.decode()})


async def _turn_away(asgi_receive: Receive, asgi_send: Send, dialect: Dialect, frame: bytes) -> None:
    """End a connection that gets no session with one fatal error frame (``CAPACITY_REACHED``, ...), then close.

    It closes once the client has sent its first request (or after a grace): a
    client that reads replies only after a request (OpenEnv's) then gets this
    frame as the reply to it, instead of finding the socket closed.
    """
    try:
        await _send(asgi_send, dialect.encoding == "msgpack", frame)
    except OSError:
        return
    if not await _client_closes(asgi_receive, _CLOSE_GRACE, on_request=True):
        await _close(asgi_send, CloseCode.NORMAL_CLOSURE, "")


class _WebSocketSession:
    """One session on one plain WebSocket connection: `host_session`'s receive and send over ASGI.

    Attributes:
        lease: The session's slot; idle while it waits for the client, busy otherwise.
        disconnected: Whether the client has gone (nothing more can be sent).
        served: Whether a request reached the session (else its factory failed).
    """

    __slots__ = (
        "_binary",
        "_dialect",
        "_kept",
        "_receive",
        "_send",
        "_task_group",
        "_watch",
        "disconnected",
        "lease",
        "served",
    )

    def __init__(self, asgi_receive: Receive, asgi_send: Send, dialect: Dialect, lease: SessionLease) -> None:
        self._receive = asgi_receive
        self._send = asgi_send
        self._dialect = dialect
        self._binary = dialect.encoding == "msgpack"
        self.lease = lease
        self.disconnected = False
        self.served = False
        self._task_group: TaskGroup | None = None
        self._watch: anyio.Event | None = None  # set once the read that watches the client while busy is done
        self._kept: dict[str, Any] | None = None  # what that read got

    def watch_from(self, task_group: TaskGroup) -> None:
        """Where to start the read that watches the client while a request runs long (`watch_client`)."""
        self._task_group = task_group

    def watch_client(self) -> None:
        """While a request runs long, read the connection: a client that has gone ends the session now.

        The lease's `SessionLease.on_long_step`. A message that comes instead
        is kept for the next `receive_frame`: the client is there.
        """
        if self._watch is not None or self._task_group is None or self.disconnected:
            return
        self._watch = anyio.Event()
        self._task_group.start_soon(self._read_while_busy, self._watch)

    async def _read_while_busy(self, done: anyio.Event) -> None:
        try:
            message = await self._receive()
        except OSError:  # the connection broke
            message = {"type": "websocket.disconnect", "code": 1006}
        finally:
            done.set()
        self._kept = message
        if message["type"] == "websocket.disconnect":
            self.disconnected = True
            self.lease.give_up(CLIENT_GONE_REASON)

    async def send_frame(self, frame: bytes) -> None:
        """Send one reply frame; `ConnectionClosed` once the client has gone."""
        try:
            await _send(self._send, self._binary, frame)
        except OSError as exc:  # uvicorn's ClientDisconnected, a broken pipe
            self.disconnected = True
            raise ConnectionClosed("the client went away") from exc

    async def receive_frame(self) -> bytes:
        """The next request frame; a frame of the wrong kind gets an error reply and is skipped.

        Raises:
            ConnectionClosed: The client disconnected, or the registry asked the
                session to end (it was idle too long, the server is stopping).
        """
        self.served = True
        lease = self.lease
        while True:
            if lease.close_reason is not None:  # asked to end while it was busy
                raise ConnectionClosed(lease.close_reason)
            lease.touch()  # waiting for the client: the idle clock runs
            if self._watch is None:
                message = await self._receive()
            else:  # the watch's read is under way, or done: its message is the next
                await self._watch.wait()
                message, self._kept, self._watch = self._kept, None, None
                if message is None:  # cut off before it read anything
                    continue
            lease.mark_busy()
            kind = message["type"]
            if kind == "websocket.receive":
                if self._binary:
                    data = message.get("bytes")
                    if data is not None:
                        return data  # type: ignore[no-any-return]
                    wrong: bytes | str = message.get("text") or ""
                else:
                    text = message.get("text")
                    if text is not None:
                        return text.encode()  # type: ignore[no-any-return]
                    wrong = message.get("bytes") or b""
                await self.send_frame(_wrong_frame_error(self._dialect, wrong))
            elif kind == "websocket.disconnect":
                self.disconnected = True
                raise ConnectionClosed(f"the client disconnected ({message.get('code', 1005)})")


async def _client_closes(asgi_receive: Receive, timeout: float, *, on_request: bool) -> bool:
    """Wait up to ``timeout`` seconds for the client to close; returns whether it did.

    With ``on_request``, a frame from the client also ends the wait (and is
    dropped); without, frames are ignored until the client closes.
    """
    with anyio.move_on_after(timeout):
        while True:
            kind = (await asgi_receive())["type"]
            if kind == "websocket.disconnect":
                return True
            if on_request and kind == "websocket.receive":
                return False
    return False


async def _close(asgi_send: Send, code: int, reason: str) -> None:
    """Send the close frame; the client may be gone already, which is fine."""
    with contextlib.suppress(OSError, RuntimeError):  # gone, or the socket is closed already
        await asgi_send({"type": "websocket.close", "code": code, "reason": reason})
