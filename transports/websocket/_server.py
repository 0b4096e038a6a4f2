"""The server end of the WebSocket transport: the ``/ws`` endpoint, as a raw ASGI app.

It speaks whatever the client negotiated: a client that offers one of our
subprotocols (``openenv.v1.json``, ``openenv.v1.msgpack``) gets the first of them
in its own order of preference; a client that offers none (OpenEnv's reference
client) gets no subprotocol and plain OpenEnv frames. Then it takes a session
slot (or sends ``CAPACITY_REACHED`` and closes, as the reference does: the whole
story is in `transports._sessions`) and runs
`openenv.server.host_session` over the connection.

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

from openenv import ConnectionClosed, Dialect
from openenv.server import ServerSession, SessionMetrics, encode_fatal_error, host_session

from .._asgi import Receive, Scope, Send
from .._guard import client_of
from .._sessions import (
    CLIENT_GONE_REASON,
    GivingUp,
    QueueTicket,
    SessionLease,
    SessionRegistry,
    session_failed_frame,
)
from ._resume import DEFAULT_RESUME_TIMEOUT, RESUME_HEADER, Connection, ResumableLink
from ._socket_loan import SOCKET_LOAN, LendSocket, SocketLoan
from ._subprotocols import PLAIN, RESUMABLE_SUBPROTOCOLS, SUBPROTOCOLS, QueuedData, QueuedFrame

__all__ = ["WebSocketEndpoint", "select_subprotocol"]

logger = logging.getLogger("openenv.server")

# Close codes (RFC 6455).
NORMAL_CLOSURE = 1000
GOING_AWAY = 1001
INTERNAL_ERROR = 1011

# Seconds the server waits for the client to close the socket first: after a
# close request, or for the client's next request after a fatal error frame.
_CLOSE_GRACE = 1.0

# Messages a client may send while its session waits in the queue (a plain
# client's first request, say); past them the connection is not read until then.
_QUEUED_MESSAGES = 4


_RESUME = RESUME_HEADER.lower().encode()


def _header(scope: Scope, name: bytes) -> bytes | None:
    for key, value in scope.get("headers") or ():
        if key == name:
            return value  # type: ignore[no-any-return]
    return None


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
        if name in SUBPROTOCOLS or name in RESUMABLE_SUBPROTOCOLS:
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
    """The ``/ws`` endpoint: one environment session per WebSocket connection.

    An ASGI application for ``websocket`` scopes (mount it with Starlette's
    ``WebSocketRoute``). Per connection it selects the subprotocol, accepts, takes
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
        resume_timeout: Seconds a resumable session (one whose client offered
            a resumable subprotocol) waits for its client to come back after
            its connection drops; see `transports.websocket._resume`.
        metrics: Where the sessions' requests are counted, or ``None``.
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
        attach: Callable[[str, Receive, Send], Awaitable[None]] | None = None,
    ) -> None:
        self.factory = factory
        self.registry = registry
        self.metrics = metrics
        self.error_details = error_details
        self.resume_timeout = resume_timeout
        self.attach = attach
        self._resumable: dict[str, ResumableLink] = {}

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
        resumable = subprotocol is not None and subprotocol in RESUMABLE_SUBPROTOCOLS
        if subprotocol is None:
            dialect = PLAIN
        else:
            dialect = RESUMABLE_SUBPROTOCOLS[subprotocol] if resumable else SUBPROTOCOLS[subprotocol]
        try:
            await send({"type": "websocket.accept", "subprotocol": subprotocol})
        except OSError:
            return
        lend: LendSocket | None = (scope.get("extensions") or {}).get(SOCKET_LOAN)
        client = client_of(scope)
        if not resumable:
            await self._serve_connection(receive, send, dialect, lend, client)
            return
        connection = Connection(receive, send, lend)
        token = _header(scope, _RESUME)
        if token is None:
            await self._serve_resumable(connection, dialect, client)
        else:
            await self._resume(connection, token.decode("latin-1"), dialect)

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
        close_code, reason = NORMAL_CLOSURE, ""
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
                close_code, reason = GOING_AWAY, lease.close_reason
        except Exception:
            logger.exception("WebSocket session failed")
            close_code, reason = INTERNAL_ERROR, "session error"
            if not session.disconnected:
                with contextlib.suppress(ConnectionClosed):
                    await session.send_frame(session_failed_frame(dialect))
        finally:
            lease.release()
        if session.disconnected:
            return
        if close_code == NORMAL_CLOSURE and lease.close_reason is None:
            if session.served:
                # After a close request the client closes the socket next (OpenEnv's
                # and ours do at once). Let it, rather than cross close frames with
                # it: hypercorn on trio can fail when both ends close at once.
                if await _client_closes(asgi_receive, _CLOSE_GRACE, on_request=False):
                    return
            elif await _client_closes(asgi_receive, _CLOSE_GRACE, on_request=True):
                return  # FACTORY_ERROR sent: see _turn_away
        await _close(asgi_send, close_code, reason)

    async def _serve_resumable(self, first: Connection, dialect: Dialect, client: str) -> None:
        """Host a resumable session: it lives on until its client closes it or fails to come back in time."""
        registry = self.registry
        scope = anyio.CancelScope()
        binary = dialect.encoding == "msgpack"

        async def tell_queued(ticket: QueueTicket) -> None:
            # The client waits for the session frame: told it is queued, it waits as long as the queue may.
            place = QueuedData(registry.position(ticket), registry.queue_timeout or 0.0)
            frame = (msgspec.msgpack if binary else msgspec.json).encode(QueuedFrame("queued", place))
            with contextlib.suppress(OSError):
                await _send(first.send, binary, frame)

        admitted = await _admit(registry, first.receive, client=client, on_close=scope.cancel, on_queued=tell_queued)
        if admitted is None:
            return  # the client went while it waited for a slot
        lease, first.receive = admitted
        if lease is None:
            await _turn_away(first.receive, first.send, dialect, registry.capacity_reached_frame(dialect, client))
            return
        lease.connected = True  # its client away, resume_timeout bounds the wait instead
        link = ResumableLink(first, dialect, self.resume_timeout)
        self._resumable[link.token] = link
        giving_up = GivingUp(registry, lease, scope.cancel)
        beside: list[TaskGroup] = []  # where the watch runs (the session's own task group)
        watching: anyio.Event | None = None  # set once the watch's read is done
        kept: dict[str, Any] | ConnectionClosed | None = None  # what it got

        async def read_while_busy(done: anyio.Event) -> None:
            # The client's connection may drop and come back meanwhile (link.receive waits for it);
            # if it closes on purpose, or does not come back in time, the client has gone.
            nonlocal kept
            try:
                while True:
                    message = await link.receive()
                    if message is not None and message["type"] == "websocket.receive":
                        kept = message
                        return
            except ConnectionClosed as exc:
                kept = exc
                lease.give_up(CLIENT_GONE_REASON)
            finally:
                done.set()

        def watch_client() -> None:  # the lease's on_long_step
            nonlocal watching
            if watching is None and beside:
                watching = anyio.Event()
                beside[0].start_soon(read_while_busy, watching)

        lease.on_long_step = watch_client

        async def next_message() -> dict[str, Any] | None:
            nonlocal watching, kept
            if watching is None:
                return await link.receive()
            await watching.wait()  # the watch's read is under way, or done: its outcome is the next
            outcome, kept, watching = kept, None, None
            if isinstance(outcome, ConnectionClosed):
                raise outcome
            return outcome

        async def receive_frame() -> bytes:
            while True:
                if lease.close_reason is not None:
                    raise ConnectionClosed(lease.close_reason)
                lease.touch()  # waiting for the client: the idle clock runs
                message = await next_message()
                lease.mark_busy()
                if message is None or message["type"] != "websocket.receive":
                    continue  # replaced, or gone: wait for the next connection
                frame = message.get("bytes") if binary else message.get("text")
                if frame is None:
                    assert link.current is not None
                    wrong = message.get("text") or "" if binary else message.get("bytes") or b""
                    await link.send_raw(link.current, _wrong_frame_error(dialect, wrong))
                    continue
                data = frame if binary else frame.encode()
                if await link.take(data):
                    return data  # type: ignore[no-any-return]

        async def serve_on_thread(session: ServerSession) -> bytes | None:
            connection = link.current
            if connection is None or connection.lend is None:
                return None
            link.lent = loan = connection.lend()
            if loan is None:
                return None
            try:
                return await _serve_on_loan(loan, lease, dialect, session, link)
            finally:
                link.lent = None

        close_code, reason = NORMAL_CLOSURE, ""
        try:
            await link.send_raw(first, link.session_frame())
            with scope:
                await _in_own_task(
                    functools.partial(
                        host_session,
                        self.factory,
                        receive_frame,
                        link.send,
                        dialect=dialect,
                        error_details=self.error_details,
                        on_end=lease.vacate,
                        metrics=self.metrics,
                        serve_on_thread=serve_on_thread if first.lend is not None else None,
                        on_session=giving_up.hosted,
                    ),
                    on_task_group=beside.append,
                )
            if lease.close_reason is not None:
                close_code, reason = GOING_AWAY, lease.close_reason
        except Exception:
            logger.exception("WebSocket session failed")
            close_code, reason = INTERNAL_ERROR, "session error"
            if link.current is not None:
                await link.send(session_failed_frame(dialect))
        finally:
            lease.release()
            del self._resumable[link.token]
            last = link.current
            link.current = None
            try:
                # After a close request the client closes first (see _serve_connection).
                if last is not None and (
                    close_code != NORMAL_CLOSURE
                    or not await _client_closes(last.receive, _CLOSE_GRACE, on_request=False)
                ):
                    await _close(last.send, close_code, reason)
            finally:  # whatever happens, the connection that resumed the session is let go
                if last is not None:
                    last.released.set()
                first.released.set()

    async def _resume(self, connection: Connection, token: str, dialect: Dialect) -> None:
        """Take a resumable session over on a new connection, until the session ends or moves again."""
        link = self._resumable.get(token)
        if link is None or link.dialect != dialect:
            frame = encode_fatal_error(
                dialect, "SESSION_ERROR", "no session to resume: its token is unknown or expired"
            )
            await _turn_away(connection.receive, connection.send, dialect, frame)
            return
        previous = await link.attach(connection)
        if previous is not None and not previous.disconnected:
            await _close(previous.send, GOING_AWAY, "the session moved to another connection")
        await connection.released.wait()
        if connection.disconnected is False and link.current is not connection:
            # Replaced by yet another connection: this one is done.
            await _close(connection.send, GOING_AWAY, "the session moved to another connection")


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
    loan: SocketLoan,
    lease: SessionLease,
    dialect: Dialect,
    session: ServerSession,
    link: ResumableLink | None = None,
) -> bytes | None:
    """Answer requests on the session's thread with the lent socket until the loan must end; then end it.

    On a resumable session, ``link`` notes each request and keeps each reply,
    as `ResumableLink.take` and `ResumableLink.send` do on the event loop.
    Returns a reply the loan was stopped before sending (see `SocketLoan.serve`).
    """
    binary = dialect.encoding == "msgpack"
    begin = loan.begin

    def admit(request_id: int | None) -> bool:
        if link is None:
            return begin()
        if not link.is_new(request_id) or not begin():
            return False  # a request sent again goes to ResumableLink.take
        link.note(request_id)
        return True

    def on_frame(is_text: bool, payload: bytes) -> bytes | None:
        if is_text is binary:
            return None  # a frame of the wrong kind: the event loop answers it
        lease.mark_busy()
        return session.handle_on_thread(payload, admit)

    def on_idle() -> bool:
        lease.touch()  # before looking at close_reason: see SessionLease.ask_to_end
        return lease.close_reason is None

    try:
        on_sent = None if link is None else link.replied
        unsent: bytes | None = await session.run_on_thread(
            functools.partial(loan.serve, on_frame, on_idle, on_sent), loan.stop
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
        await _close(asgi_send, NORMAL_CLOSURE, "")


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
