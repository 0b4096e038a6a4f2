"""The server end of the HTTP long-polling transport: the ``/poll/sessions`` routes, as raw ASGI.

A session outlives the HTTP requests that drive it, so each one runs
`openenv.server.host_session` in a task of the endpoint's own, which the app's
lifespan keeps (`HTTPPollingEndpoint.run`). Requests hand it frames and take its
replies:

- ``POST /poll/sessions/{id}/frames`` queues the request frame numbered
  ``OpenEnv-Seq`` for the session, unless it has it already (a retry: it is not
  queued again), then answers like a ``GET``;
- ``GET /poll/sessions/{id}/frames`` answers with the oldest reply the client has
  not acknowledged (``OpenEnv-Ack``), waiting up to ``OpenEnv-Wait`` seconds for
  one; ``204`` if none came, ``410`` once the session has ended and every reply
  was fetched.

The server forgets a reply only once the client acknowledges it, so a response
lost on the way is sent again; and it queues each request number once, so a
retried ``POST`` is never executed twice. Sessions take slots in the app's
`SessionRegistry` like WebSocket connections, and are reaped when idle: a
client that vanishes without a ``DELETE`` cannot be seen leaving.

Like ``/ws``, this is a server's hot path: it reads and writes ASGI messages
directly, without Starlette's request and response objects
(`transports.shared._raw_http`). Each session's record, with no I/O, is a
`transports.http._poll_session.PollSession`.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Callable
from typing import Any, Final

import anyio
from anyio.abc import TaskGroup
from starlette.routing import BaseRoute, Route

from openenv import Dialect
from openenv.server import SERVER_DEFAULTS, SessionMetrics, host_session
from transports.admission._guard import client_of
from transports.admission._lease import SessionLease
from transports.admission._queue import QueueTicket
from transports.admission._sessions import GivingUp, SessionRegistry, session_failed_frame
from transports.http._poll_requests import read_created_dialect, read_frame, read_poll_headers
from transports.http._poll_session import HeldBytes, PollSession
from transports.http._protocol import (
    ACK_HEADER,
    DEFAULT_MAX_WAIT,
    ERROR_HEADER,
    FRAMES_PATH,
    IDEMPOTENCY_KEY_HEADER,
    MEDIA_TYPES,
    RECEIVED_HEADER,
    SEQ_HEADER,
    SESSION_KEY_HEADER,
    SESSION_PATH,
    SESSIONS_PATH,
    WAIT_HEADER,
    Created,
    Queued,
    QueuePlace,
)
from transports.shared._asgi import Receive, Scope, Send
from transports.shared._deprecated import renamed_option
from transports.shared._raw_http import (
    CONTENT_LENGTH,
    CONTENT_TYPE,
    JSON_TYPE,
    NO_STORE,
    Handler,
    HTTPError,
    header,
    header_seconds,
    json_encode,
    respond,
)

__all__ = [
    "DEFAULT_LINGER",
    "DEFAULT_MAX_UNACKNOWLEDGED_BYTES",
    "DEFAULT_MAX_UNACKNOWLEDGED_TOTAL",
    "DEFAULT_UNUSED_TIMEOUT",
    "HTTPPollingEndpoint",
]

logger = logging.getLogger("openenv.server")

# How much of a session's id the log shows.
_LOGGED_ID_LENGTH = 8

DEFAULT_LINGER: Final = 60.0
"""Seconds an ended session's (or link's) record stays, so its client can still fetch what it has not
acknowledged and learn why it ended (``410``, then ``404``)."""

# Requests a session may hold whose replies the client has not acknowledged.
# Our client has one in flight (and a few abandoned by timeouts at most); this
# bounds what a client that never acknowledges can make the server keep.
_MAX_UNACKNOWLEDGED: Final = 64

DEFAULT_MAX_UNACKNOWLEDGED_BYTES: Final = 64 * 1024 * 1024
"""The most bytes an HTTP session holds for a client beyond one request and its reply (see `HTTPPollingEndpoint`)."""

DEFAULT_MAX_UNACKNOWLEDGED_TOTAL: Final = 256 * 1024 * 1024
"""The most bytes all the HTTP sessions of a server hold beyond one request and its reply each."""


DEFAULT_UNUSED_TIMEOUT: Final = 30.0
"""Seconds a new HTTP session may wait for its first frame before it ends.

Its environment is built only when that frame comes, so sessions created and
never used cost no environment, and hold their slot only this long.
"""

_SEQ = SEQ_HEADER.lower().encode()
_WAIT = WAIT_HEADER.lower().encode()
_IDEMPOTENCY_KEY = IDEMPOTENCY_KEY_HEADER.lower().encode()
_RECEIVED = RECEIVED_HEADER.lower().encode()
_SESSION_KEY = SESSION_KEY_HEADER.lower().encode()
_IDEMPOTENCY_KEY_LENGTHS: Final = range(16, 256)

# Seconds a queued creation keeps its place with no request waiting on it (the
# client's next one comes at once after a 202, or after a retry's backoff);
# also how long a slot admitted meanwhile waits for it.
_COME_BACK: Final = 5.0


class _QueuedCreation:
    """A session's creation waiting in the registry's queue, over as many ``POST`` requests as it takes.

    Its ticket keeps the place while a request waits on it, and `_COME_BACK`
    seconds after the last one ended: a client that gave up (its request
    timed out, it went) loses its place instead of being admitted and holding
    a slot nobody uses.
    """

    __slots__ = ("_changed", "claimed", "client", "key", "lease", "session", "settled", "ticket", "waiting")

    def __init__(
        self, session: PollSession, ticket: QueueTicket, key: tuple[str, str] | None, client: str | None
    ) -> None:
        self.session = session
        self.ticket = ticket
        self.key = key
        self.client = client
        self.waiting = 0  # requests waiting on it now
        self.settled = anyio.Event()  # admitted (`lease`), or refused (no lease)
        self.lease: SessionLease | None = None
        self.claimed = False  # a request took the lease and answered 201
        self._changed = anyio.Event()

    def changed(self) -> anyio.Event:
        """An event set at the next change: a request comes or goes, or the lease is claimed."""
        return self._changed

    def note_change(self) -> None:
        event, self._changed = self._changed, anyio.Event()
        event.set()


async def _either(first: anyio.Event, second: anyio.Event) -> None:
    """Return once either event is set."""
    async with anyio.create_task_group() as task_group:

        async def wait(event: anyio.Event) -> None:
            await event.wait()
            task_group.cancel_scope.cancel()

        task_group.start_soon(wait, first)
        task_group.start_soon(wait, second)


class HTTPPollingEndpoint:
    """The ``/poll/sessions`` routes: one environment session per HTTP session.

    Mount its `routes` in the app and run `run` for the app's lifetime (its
    lifespan does both, in `transports.server.app.create_app`); sessions are tasks of
    `run`'s, so they outlive the requests that drive them. Each session takes a
    slot in ``registry`` (or the client gets ``503`` with the
    ``CAPACITY_REACHED`` error frame), runs `openenv.server.host_session` until
    the client sends ``close`` or ``DELETE``s it, or the registry ends it (idle
    past its timeout, or the server stopping). Its record then stays a while, so
    the client can fetch the replies it has not acknowledged and learn that it
    ended (``410``); then its id is unknown (``404``).

    Args:
        factory: Builds one environment per session.
        registry: The app's session registry (capacity and idle reaping); idle
            HTTP sessions are reaped after its ``idle_timeout_of("http")``. Its
            clock times the endpoint's waits too: a long poll, a new session's
            wait for its first frame, an ended session's record lingering.
        max_wait: The longest the server holds a frame request waiting for a
            reply, in seconds; a client asking for longer gets this.
        max_message_size: The largest request frame accepted, in bytes (``413``
            beyond); told to each client as its session's ``max_body_size``.
        linger: Seconds an ended session's record stays before its id is forgotten.
        unused_timeout: Seconds a new session may wait for its first frame; its
            environment is built only when that frame comes.
        error_details: Whether error replies name the server's exceptions (see
            `openenv.server.ServerSession`).
        max_unacknowledged_bytes: The most bytes a session holds for its
            client (replies not acknowledged, requests not yet taken) beyond
            one request and its reply: a session holding nothing always gets
            its request in; one holding some gets ``409
            too_many_unacknowledged`` for a frame that would take it past this,
            until it acknowledges replies.
        max_unacknowledged_total: The same bound for all its sessions
            together: past it, a session that holds anything gets ``409
            too_many_unacknowledged`` too. So the replies clients leave
            unacknowledged cost at most this, plus one request and its reply
            per session.
        metrics: Where the sessions' requests are counted, or ``None``.

    Raises:
        ValueError: ``max_wait``, ``max_message_size``, ``unused_timeout``,
            ``max_unacknowledged_bytes`` or ``max_unacknowledged_total`` is not
            positive, or ``linger`` is negative.
    """

    def __init__(
        self,
        factory: Callable[[], Any],
        *,
        registry: SessionRegistry,
        max_wait: float = DEFAULT_MAX_WAIT,
        max_message_size: int = SERVER_DEFAULTS.max_message_size,
        linger: float = DEFAULT_LINGER,
        unused_timeout: float = DEFAULT_UNUSED_TIMEOUT,
        error_details: bool = True,
        max_unacknowledged_bytes: int = DEFAULT_MAX_UNACKNOWLEDGED_BYTES,
        max_unacknowledged_total: int = DEFAULT_MAX_UNACKNOWLEDGED_TOTAL,
        max_body_size: int | None = None,
        metrics: SessionMetrics | None = None,
    ) -> None:
        if max_body_size is not None:
            max_message_size = renamed_option("HTTPPollingEndpoint", "max_body_size", "max_message_size", max_body_size)
        if not max_wait > 0 or not max_message_size > 0 or not linger >= 0:
            raise ValueError("max_wait and max_message_size must be positive, linger 0 or more")
        if not unused_timeout > 0 or not max_unacknowledged_bytes > 0 or not max_unacknowledged_total > 0:
            raise ValueError("unused_timeout, max_unacknowledged_bytes and max_unacknowledged_total must be positive")
        self.unused_timeout = unused_timeout
        self.error_details = error_details
        self.metrics = metrics
        self.max_unacknowledged_bytes = max_unacknowledged_bytes
        self.max_unacknowledged_total = max_unacknowledged_total
        self._held = HeldBytes()
        self.factory = factory
        self.registry = registry
        self.max_wait = max_wait
        self.max_message_size = max_message_size
        self.linger = linger
        self._sessions: dict[str, PollSession] = {}
        # By client and idempotency key, until the first frame: only the client that
        # created a session gets its credentials again for the key.
        self._created: dict[tuple[str, str], PollSession] = {}
        self._queued: dict[tuple[str, str], _QueuedCreation] = {}  # by client and idempotency key
        self._task_group: TaskGroup | None = None
        self._new_event: Callable[[], anyio.Event] = anyio.Event

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {len(self._sessions)} sessions>"

    @property
    def session_count(self) -> int:
        """The sessions known now, live or ended but not yet forgotten."""
        return len(self._sessions)

    def routes(self) -> list[BaseRoute]:
        """The Starlette routes to mount: ``/poll/sessions``, ``/poll/sessions/{id}``, ``.../frames``.

        Returns:
            The routes, for `transports.server.app.mount_routes` (`transports.server.app.create_app` mounts them).
        """
        return [
            Route(FRAMES_PATH, Handler(self._frames), name="poll_frames"),
            Route(SESSION_PATH, Handler(self._session), name="poll_session"),
            Route(SESSIONS_PATH, Handler(self._create), name="poll_sessions"),
        ]

    async def run(self) -> None:
        """Host the sessions until cancelled (the app's lifespan runs it); then end them all."""
        # The backend's event class, called directly: anyio.Event() looks the
        # backend up on every call, and each long poll may make one.
        self._new_event = type(anyio.Event())
        try:
            async with anyio.create_task_group() as task_group:
                self._task_group = task_group
                await anyio.sleep_forever()
        finally:
            self._task_group = None
            for session in list(self._sessions.values()):
                session.end("the server stopped")
            self._sessions.clear()
            self._created.clear()

    # -- POST /poll/sessions -----------------------------------------------------

    async def _create(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["method"] != "POST":
            raise HTTPError(405, "method_not_allowed", "use POST to create a session", [(b"allow", b"POST")])
        content_type = content_length = key = None
        hold: float | None = None  # how long the client waits for this answer, if it says
        for name, value in scope["headers"]:
            if name == CONTENT_TYPE:
                content_type = value
            elif name == CONTENT_LENGTH:
                content_length = value
            elif name == _IDEMPOTENCY_KEY:
                key = value
            elif name == _WAIT:
                hold = min(header_seconds(value, WAIT_HEADER), self.max_wait)
        dialect = await read_created_dialect(receive, content_type, content_length, SESSIONS_PATH)
        idempotency_key = None
        if key is not None:
            text = key.decode("latin-1")
            if len(text) not in _IDEMPOTENCY_KEY_LENGTHS or not text.isprintable():
                raise HTTPError(
                    400, "invalid_header", f"{IDEMPOTENCY_KEY_HEADER} must be 16 to 255 printable characters"
                )
            idempotency_key = (client_of(scope), text)
            existing = self._created.get(idempotency_key)
            queued = self._queued.get(idempotency_key)
            if queued is not None and queued.claimed:
                existing = queued.session
            if existing is not None or queued is not None:
                earlier = existing or (queued.session if queued is not None else None)
                if earlier is not None and earlier.dialect != dialect:
                    raise HTTPError(
                        409,
                        "idempotency_key_reused",
                        f"this {IDEMPOTENCY_KEY_HEADER} created a session with other options",
                    )
            if existing is not None:
                await self._respond_created(send, existing)
                return
            if queued is not None:  # it waits in the queue: this request waits with it
                await self._wait_in_queue(queued, scope, receive, send, hold)
                return
        task_group = self._task_group
        if task_group is None:
            raise HTTPError(503, "not_running", "the server's lifespan is not running: it cannot host sessions")

        client = client_of(scope)
        session = PollSession(secrets.token_urlsafe(32), dialect, self._new_event, self.registry.clock, self._held)
        taken = self.registry.open_or_enqueue(transport="http", on_close=session.stop, client=client)
        if taken is None:
            await self._refuse_at_capacity(send, dialect, client)
            return
        if isinstance(taken, SessionLease):
            self._open(session, taken, idempotency_key, scope)
            await self._respond_created(send, session)
            return
        queued = _QueuedCreation(session, taken, idempotency_key, client)
        if idempotency_key is not None:
            self._queued[idempotency_key] = queued
        task_group.start_soon(self._hold_place, queued)
        await self._wait_in_queue(queued, scope, receive, send, hold)

    def _open(
        self, session: PollSession, lease: SessionLease, idempotency_key: tuple[str, str] | None, scope: Scope
    ) -> None:
        """Start a session that has its slot."""
        task_group = self._task_group
        if task_group is None:  # the server stopped meanwhile
            lease.release()
            raise HTTPError(503, "not_running", "the server's lifespan is not running: it cannot host sessions")
        session.lease = lease
        self._sessions[session.id] = session
        if idempotency_key is not None:
            session.idempotency_key = idempotency_key
            self._created[idempotency_key] = session
        task_group.start_soon(self._run_session, session)
        client = scope.get("client")
        # The id is the session's only credential: the log shows a prefix, enough to follow it.
        logger.info(
            "%s - HTTP long-polling session %s… opened",
            f"{client[0]}:{client[1]}" if client else "-",
            session.id[:_LOGGED_ID_LENGTH],
        )

    async def _hold_place(self, queued: _QueuedCreation) -> None:
        """Keep a queued creation's place while its client waits (or comes back soon); hand over its slot."""
        ticket = queued.ticket
        come_back = _COME_BACK if queued.key is not None else 0.0  # without a key it cannot come back
        try:
            with self.registry.clock.move_on_after(self.registry.queue_timeout or 0.0):
                while not ticket.admitted.is_set():
                    if queued.waiting:
                        await _either(ticket.admitted, queued.changed())
                        continue
                    with self.registry.clock.move_on_after(come_back) as grace:
                        await _either(ticket.admitted, queued.changed())
                    if grace.cancelled_caught:  # the client gave up: its place goes to the next
                        logger.info("a queued HTTP long-polling session's client went: its place is given up")
                        return
            queued.lease, ticket.lease = ticket.lease, None
            queued.settled.set()
            if queued.lease is None:
                return  # the wait ran out (or the server stops): the requests waiting answer 503
            # A request waiting takes it; or one that comes back soon.
            with self.registry.clock.move_on_after(come_back):
                while not queued.claimed:
                    await queued.changed().wait()
        finally:
            queued.settled.set()
            if queued.key is not None and self._queued.get(queued.key) is queued and not queued.claimed:
                del self._queued[queued.key]
            if not queued.claimed:
                if queued.lease is not None:
                    queued.lease.release()  # admitted, and nobody came for it
                    queued.lease = None
                self.registry.leave(ticket)

    async def _wait_in_queue(
        self, queued: _QueuedCreation, scope: Scope, receive: Receive, send: Send, hold: float | None
    ) -> None:
        """Answer a queued creation: 201 once admitted, 503 if the wait runs out, else 202 after ``hold`` seconds.

        A client that goes away meanwhile is noticed (its ``http.disconnect``):
        it no longer waits on the place, which is given up unless it comes back.
        """
        gone = False
        queued.waiting += 1
        queued.note_change()
        try:
            async with anyio.create_task_group() as task_group:

                async def notice_the_client_going() -> None:
                    nonlocal gone
                    while (await receive())["type"] != "http.disconnect":
                        pass
                    gone = True
                    task_group.cancel_scope.cancel()

                task_group.start_soon(notice_the_client_going)
                with self.registry.clock.move_on_after(hold):
                    await queued.settled.wait()
                task_group.cancel_scope.cancel()
        finally:
            queued.waiting -= 1
            queued.note_change()
        if gone:
            return
        if not queued.settled.is_set():
            position = self.registry.position(queued.ticket)
            body = json_encode(Queued(QueuePlace(position, self.registry.queue_timeout or 0.0)))
            await respond(send, 202, [JSON_TYPE, NO_STORE, (b"retry-after", b"0")], body)
            return
        if queued.claimed:  # another request for the same creation took it
            await self._respond_created(send, queued.session)
            return
        lease = queued.lease
        if lease is None:
            await self._refuse_at_capacity(send, queued.session.dialect, queued.client)
            return
        queued.lease = None
        queued.claimed = True
        queued.note_change()
        self._open(queued.session, lease, queued.key, scope)
        await self._respond_created(send, queued.session)

    async def _respond_created(self, send: Send, session: PollSession) -> None:
        body = json_encode(
            Created(session.id, session.key.decode(), session.dialect.encoding, self.max_message_size, self.max_wait)
        )
        location = SESSION_PATH.replace("{session_id}", session.id).encode()
        await respond(send, 201, [JSON_TYPE, NO_STORE, (b"location", location)], body)

    async def _refuse_at_capacity(self, send: Send, dialect: Dialect, client: str | None) -> None:
        frame = self.registry.capacity_reached_frame(dialect, client)
        headers = [
            (CONTENT_TYPE, MEDIA_TYPES[dialect.encoding].encode()),
            NO_STORE,
            (ERROR_HEADER.lower().encode(), b"CAPACITY_REACHED"),
            (b"retry-after", b"1"),
        ]
        await respond(send, 503, headers, frame)

    async def _run_session(self, session: PollSession) -> None:
        lease = session.lease
        assert lease is not None
        # Its client cannot be seen leaving: one that stops asking while a step
        # runs (for the idle timeout) has gone, and the registry gives up on it.
        lease.seen()
        giving_up = GivingUp(self.registry, lease, session.stop)
        reason = "the server stopped"  # unless it ends otherwise
        try:
            try:
                with session.scope:
                    # No environment until the client sends a frame: a session
                    # created and never used costs a slot for a short while only.
                    if not await session.first_request(self.unused_timeout):
                        reason = f"no frame came within {self.unused_timeout:g} s of its creation"
                    elif session.inbox:
                        await host_session(
                            self.factory,
                            session.receive_request,
                            session.send_reply,
                            dialect=session.dialect,
                            error_details=self.error_details,
                            on_end=session.vacate_unless_lingering,
                            on_session=giving_up.hosted,
                            metrics=self.metrics,
                        )
                        reason = (
                            "the client closed the session"
                            if session.served
                            else "the environment could not be created"
                        )
            except Exception:
                logger.exception("HTTP session failed")
                session.push(session_failed_frame(session.dialect))
                reason = "the session failed on the server"
            finally:
                # Large replies the client has yet to fetch keep the slot while
                # they linger, so ended sessions cannot pin memory past the limit.
                if session.lingers_lightly:
                    lease.release()
                # The first reason given sticks: the registry's (idle, shutdown), a DELETE's, then ours.
                session.end(lease.close_reason or session.end_reason or reason)
                logger.info(
                    "HTTP long-polling session %s… ended: %s", session.id[:_LOGGED_ID_LENGTH], session.end_reason
                )
                self._forget_key(session)
            with self.registry.clock.move_on_after(self.linger):
                await session.forgotten.wait()
        finally:
            lease.release()
            session.forget_held()
            if self._sessions.get(session.id) is session:
                del self._sessions[session.id]

    def _forget_key(self, session: PollSession) -> None:
        key, session.idempotency_key = session.idempotency_key, None
        if key is not None and self._created.get(key) is session:
            del self._created[key]

    # -- DELETE /poll/sessions/{id} ----------------------------------------------

    async def _session(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["method"] != "DELETE":
            raise HTTPError(405, "method_not_allowed", "use DELETE to end a session", [(b"allow", b"DELETE")])
        session = self._sessions.get(scope["path_params"]["session_id"])
        if session is None or not session.holds_key(header(scope, _SESSION_KEY)):
            raise _not_found()
        del self._sessions[session.id]
        self._forget_key(session)
        session.delete()
        await respond(send, 204, [NO_STORE])

    # -- POST and GET /poll/sessions/{id}/frames ---------------------------------

    async def _frames(self, scope: Scope, receive: Receive, send: Send) -> None:
        method = scope["method"]
        posting = method == "POST"
        if not posting and method != "GET":
            raise HTTPError(405, "method_not_allowed", "use POST or GET", [(b"allow", b"GET, POST")])
        session = self._sessions.get(scope["path_params"]["session_id"])
        if session is None:
            raise _not_found()
        key, seq, ack, wait, content_type, content_length = read_poll_headers(scope, self.max_wait, _SESSION_KEY)
        if not session.holds_key(key):  # its id alone (seen in a URL, a log) does not drive it
            raise _not_found()
        if session.lease is not None:
            session.lease.seen()
        if ack > session.sent:
            raise HTTPError(
                409,
                "ack_out_of_range",
                f"{ACK_HEADER} {ack} acknowledges replies never sent (the last is {session.sent})",
            )
        if posting:
            if seq == 0:
                raise HTTPError(400, "invalid_header", f"a frame needs its {SEQ_HEADER}")
            frame = await read_frame(
                receive,
                content_type,
                content_length,
                encoding=session.dialect.encoding,
                limit=self.max_message_size,
                what="session's frames",
            )
            session.acknowledge(ack)
            self._accept(session, seq, frame)
        else:
            session.acknowledge(ack)
        reply = await session.next_reply(wait)
        received = (_RECEIVED, b"%d" % session.received)
        if session.end_reason is not None and reply is None:
            raise HTTPError(410, "session_ended", f"the session has ended: {session.end_reason}", [received])
        # A 2xx to a POST says the server has every frame up to its OpenEnv-Seq,
        # and no cache keeps a POST's response: two headers fewer on the hot path.
        headers = [] if posting else [received, NO_STORE]
        if reply is not None:
            headers.append((CONTENT_TYPE, session.media_type))
            headers.append((_SEQ, b"%d" % reply[0]))
            await respond(send, 200, headers, reply[1])
        else:
            await respond(send, 204, headers)

    def _accept(self, session: PollSession, seq: int, frame: bytes) -> None:
        """Queue a request frame for the session, once; a retry of one queued already is not queued again."""
        received = session.received
        if seq <= received:
            if seq <= session.answered:
                raise HTTPError(
                    409,
                    "sequence_acknowledged",
                    f"{SEQ_HEADER} {seq} was answered and its reply acknowledged already; nothing to replay",
                )
            return  # a retry: answer it with the reply (or "pending"), never run it twice
        if seq > received + 1:
            raise HTTPError(
                409, "sequence_gap", f"{SEQ_HEADER} {seq} skips ahead: the next frame expected is {received + 1}"
            )
        if session.end_reason is not None:
            raise HTTPError(
                410,
                "session_ended",
                f"the session has ended: {session.end_reason}",
                [(_RECEIVED, b"%d" % received)],
            )
        if received - session.answered >= _MAX_UNACKNOWLEDGED:
            raise HTTPError(
                409,
                "too_many_unacknowledged",
                f"{_MAX_UNACKNOWLEDGED} requests await an acknowledged reply; acknowledge replies first",
            )
        holds = session.holds
        if holds:  # one request and its reply are always let in; more count against the bounds
            size = len(frame)
            if holds + size > self.max_unacknowledged_bytes:
                raise HTTPError(
                    409,
                    "too_many_unacknowledged",
                    f"the session holds {holds} bytes of replies and requests for its client, and this frame "
                    f"would pass {self.max_unacknowledged_bytes}; acknowledge replies first",
                )
            if self._held.bytes + size > self.max_unacknowledged_total:
                raise HTTPError(
                    409,
                    "too_many_unacknowledged",
                    f"the server holds {self._held.bytes} bytes its clients have not acknowledged, past its "
                    f"budget of {self.max_unacknowledged_total} with this frame; acknowledge replies first",
                )
        session.received = seq
        session.queue_request(seq, frame)
        if seq == 1:
            session.wake()  # the session waits for its first frame to build the environment
        assert session.lease is not None
        session.lease.mark_busy()  # a request in hand: not idle, even before the session takes it
        if seq == 1:
            self._forget_key(session)


def _not_found() -> HTTPError:
    return HTTPError(404, "session_not_found", "no such session: it never existed, or it ended and was forgotten")
