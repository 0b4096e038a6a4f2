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
directly, without Starlette's request and response objects.
"""

from __future__ import annotations

import hmac
import logging
import math
import secrets
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any, Final

import anyio
import anyio.lowlevel
import msgspec
from anyio.abc import TaskGroup
from starlette.routing import BaseRoute, Route

from openenv import Clock, ConnectionClosed, Dialect
from openenv.channel import FrameQueue, QueueClosed
from openenv.server import SERVER_DEFAULTS, SessionMetrics, host_session
from transports.admission._guard import client_of
from transports.admission._sessions import GivingUp, QueueTicket, SessionLease, SessionRegistry, session_failed_frame
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
    dialect_for,
)
from transports.shared._asgi import Receive, Scope, Send
from transports.shared._deprecated import renamed_option
from transports.shared._error_body import encode_error

__all__ = [
    "DEFAULT_MAX_UNACKNOWLEDGED_BYTES",
    "DEFAULT_MAX_UNACKNOWLEDGED_TOTAL",
    "DEFAULT_UNUSED_TIMEOUT",
    "HTTPPollingEndpoint",
]

logger = logging.getLogger("openenv.server")

# How much of a session's id the log shows.
_LOGGED_ID_LENGTH = 8

# Seconds an ended session's record stays, so its client can still fetch the
# replies it has not acknowledged and learn why it ended (410, then 404).
_LINGER: Final = 60.0

# The most unacknowledged reply bytes an ended session keeps without holding
# its slot while its record lingers (the last reply, unacknowledged, is usual).
_LINGER_FREE_BYTES: Final = 64 * 1024

# Requests a session may hold whose replies the client has not acknowledged.
# Our client has one in flight (and a few abandoned by timeouts at most); this
# bounds what a client that never acknowledges can make the server keep.
_MAX_UNACKNOWLEDGED: Final = 64

DEFAULT_MAX_UNACKNOWLEDGED_BYTES: Final = 64 * 1024 * 1024
"""The most bytes an HTTP session holds for a client beyond one request and its reply (see `HTTPPollingEndpoint`)."""

DEFAULT_MAX_UNACKNOWLEDGED_TOTAL: Final = 256 * 1024 * 1024
"""The most bytes all the HTTP sessions of a server hold beyond one request and its reply each."""


class _Held:
    """The bytes every session of an endpoint holds for its client: replies not acknowledged, requests not taken."""

    __slots__ = ("bytes",)

    def __init__(self) -> None:
        self.bytes = 0


DEFAULT_UNUSED_TIMEOUT: Final = 30.0
"""Seconds a new HTTP session may wait for its first frame before it ends.

Its environment is built only when that frame comes, so sessions created and
never used cost no environment, and hold their slot only this long.
"""

# Times a frame request lets other tasks run before it waits for a reply: twice,
# as trio may run the woken session after the request's task once.
_YIELDS_BEFORE_WAITING: Final = 2

# The largest body of POST /poll/sessions (a small JSON object).
_MAX_CREATE_BODY: Final = 64 * 1024

# The accepted spellings of each encoding's media type, in requests.
_ACCEPTED_MEDIA_TYPES: Final = {
    "json": frozenset({"application/json"}),
    "msgpack": frozenset({"application/msgpack", "application/x-msgpack", "application/vnd.msgpack"}),
}

_SEQ = SEQ_HEADER.lower().encode()
_ACK = ACK_HEADER.lower().encode()
_WAIT = WAIT_HEADER.lower().encode()
_IDEMPOTENCY_KEY = IDEMPOTENCY_KEY_HEADER.lower().encode()
_RECEIVED = RECEIVED_HEADER.lower().encode()
_SESSION_KEY = SESSION_KEY_HEADER.lower().encode()
_CONTENT_TYPE = b"content-type"
_CONTENT_LENGTH = b"content-length"
_NO_STORE = (b"cache-control", b"no-store")
_JSON_TYPE = (b"content-type", b"application/json")

_IDEMPOTENCY_KEY_LENGTHS: Final = range(16, 256)

# Seconds a queued creation keeps its place with no request waiting on it (the
# client's next one comes at once after a 202, or after a retry's backoff);
# also how long a slot admitted meanwhile waits for it.
_COME_BACK: Final = 5.0


class _CreateRequest(msgspec.Struct):
    """The body of ``POST /poll/sessions`` (every field optional; unknown fields ignored)."""

    encoding: str = "json"


_json_encode = msgspec.json.Encoder().encode
_decode_create = msgspec.json.Decoder(_CreateRequest).decode


class _HTTPError(Exception):
    """An error response, raised from anywhere in a request's handling."""

    def __init__(self, status: int, code: str, message: str, headers: Iterable[tuple[bytes, bytes]] = ()) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.headers = list(headers)


class _Disconnected(Exception):
    """The client went away while its request was being read."""


class _Session:
    """One HTTP session: the frames queued for its environment, and its replies until acknowledged.

    Request frames are numbered by the client (``received`` is the highest one
    queued), replies by the server (``sent``). ``outbox`` holds each reply not
    yet acknowledged, with the number of the request it answers, so a request
    whose reply the client has acknowledged is known to be done with (``answered``).
    """

    __slots__ = (
        "acked",
        "answered",
        "clock",
        "current",
        "deleted",
        "dialect",
        "end_reason",
        "forgotten",
        "held",
        "id",
        "idempotency_key",
        "inbox",
        "inbox_bytes",
        "key",
        "lease",
        "media_type",
        "new_event",
        "outbox",
        "outbox_bytes",
        "received",
        "scope",
        "sent",
        "served",
        "waiter",
    )

    def __init__(
        self,
        session_id: str,
        dialect: Dialect,
        new_event: Callable[[], anyio.Event],
        clock: Clock,
        held: _Held | None = None,
    ) -> None:
        self.id = session_id
        self.clock = clock
        self.held = held if held is not None else _Held()  # the endpoint's count, shared by its sessions
        self.inbox_bytes = 0  # the requests queued and not yet taken by the environment
        self.key = secrets.token_urlsafe(32).encode()
        self.dialect = dialect
        self.media_type = MEDIA_TYPES[dialect.encoding].encode()
        self.lease: SessionLease | None = None
        self.scope = anyio.CancelScope()
        self.inbox: FrameQueue[tuple[int, bytes]] = FrameQueue()
        self.outbox: deque[tuple[int, int, bytes]] = deque()  # (reply seq, request seq, frame)
        self.outbox_bytes = 0
        self.received = 0
        self.sent = 0
        self.acked = 0
        self.answered = 0
        self.current = 0  # the request being handled (0 before any)
        self.served = False  # whether the environment was built and asked for a request
        self.end_reason: str | None = None  # set once the session has ended
        self.deleted = False
        self.idempotency_key: tuple[str, str] | None = None  # (client, key): a retry must come from its client
        self.new_event = new_event
        self.waiter: anyio.Event | None = None  # set when a reply comes or the session ends
        self.forgotten = new_event()  # set when the record is dropped (DELETE)

    # -- the environment's side (host_session's receive and send) ------------------

    async def receive_request(self) -> bytes:
        lease = self.lease
        assert lease is not None
        if lease.close_reason is not None:  # asked to end while it was busy
            raise ConnectionClosed(lease.close_reason)
        if self.deleted:  # frames queued behind the DELETE never run
            raise ConnectionClosed("the client deleted the session")
        self.served = True
        inbox = self.inbox
        if not inbox:
            lease.touch()  # waiting for the client: the idle clock runs
        try:
            seq, frame = await inbox.get()
        except QueueClosed:
            raise ConnectionClosed("the client deleted the session") from None
        self.inbox_bytes -= len(frame)
        self.held.bytes -= len(frame)
        lease.mark_busy()
        self.current = seq
        return frame

    async def send_reply(self, frame: bytes) -> None:
        if self.deleted:
            raise ConnectionClosed("the client deleted the session")
        self.push(frame)

    def push(self, frame: bytes) -> None:
        """Keep a reply for the client until it acknowledges it, and wake whoever waits for one."""
        self.sent += 1
        self.outbox.append((self.sent, self.current, frame))
        self.outbox_bytes += len(frame)
        self.held.bytes += len(frame)
        self.wake()

    def wake(self) -> None:
        """Wake whoever waits for a reply, or for the first frame."""
        waiter = self.waiter
        if waiter is not None:
            self.waiter = None
            waiter.set()

    def vacate_unless_lingering(self) -> None:
        """Free the slot once the session is over, unless large replies the client has yet to fetch keep it."""
        if self.lease is not None and self.outbox_bytes <= _LINGER_FREE_BYTES:
            self.lease.vacate()

    @property
    def holds(self) -> int:
        """The bytes it holds for its client: replies not acknowledged, and requests not taken yet."""
        return self.outbox_bytes + self.inbox_bytes

    def queue_request(self, seq: int, frame: bytes) -> None:
        """Queue a request frame for the environment, counted as held until it is taken."""
        self.inbox_bytes += len(frame)
        self.held.bytes += len(frame)
        self.inbox.put((seq, frame))

    def forget_held(self) -> None:
        """Uncount what it holds: its record is gone, and all it held with it."""
        self.held.bytes -= self.outbox_bytes + self.inbox_bytes
        self.outbox_bytes = self.inbox_bytes = 0
        self.outbox.clear()

    def end(self, reason: str) -> None:
        """Note that the session has ended (its environment is closed); wake every waiter."""
        if self.end_reason is None:
            self.end_reason = reason
        self.inbox.close()
        self.wake()

    def stop(self) -> None:
        """End the session at the registry's request (idle too long, the server stopping): its ``on_close``.

        The session's task is cancelled, and its record ends now, so a request
        waiting for a reply gets ``410`` with the reason at once, even while a
        plain environment's step still holds the session's thread.
        """
        self.scope.cancel()
        lease = self.lease
        if lease is not None and lease.close_reason is not None:
            self.end(lease.close_reason)

    def delete(self) -> None:
        """End the session at the client's request: after the request in hand, if any."""
        self.deleted = True
        if self.end_reason is None:
            self.end_reason = "the client deleted the session"
        self.inbox.close()
        self.forgotten.set()
        self.wake()

    # -- the client's side (the HTTP requests) -----------------------------------

    def holds_key(self, key: bytes | None) -> bool:
        """Whether a request carries this session's key (compared in constant time)."""
        return key is not None and hmac.compare_digest(key, self.key)

    async def first_request(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for the first frame; whether one came (or the session ended)."""
        with self.clock.move_on_after(timeout):
            while not self.inbox and self.end_reason is None:
                waiter = self.waiter
                if waiter is None:  # shared with long polls waiting for a reply
                    waiter = self.waiter = self.new_event()
                await waiter.wait()
            return True
        return False

    def acknowledge(self, ack: int) -> None:
        """Forget the replies up to ``ack``; the client holds them."""
        if ack <= self.acked:
            return
        outbox = self.outbox
        while outbox and outbox[0][0] <= ack:
            _, request_seq, frame = outbox.popleft()
            self.outbox_bytes -= len(frame)
            self.held.bytes -= len(frame)
            if request_seq > self.answered:
                self.answered = request_seq
        self.acked = ack

    async def next_reply(self, wait: float) -> tuple[int, bytes] | None:
        """The oldest unacknowledged reply, waiting up to ``wait`` seconds; ``None`` if none came."""
        outbox = self.outbox
        if outbox:
            reply = outbox[0]
            return reply[0], reply[2]
        if self.end_reason is not None or wait <= 0:
            return None
        # A request just queued is often answered at once (an async environment
        # steps on the event loop): let the session run before arming a timed
        # wait, which costs more than such a step.
        for _ in range(_YIELDS_BEFORE_WAITING):
            await anyio.lowlevel.checkpoint()
            if outbox:
                reply = outbox[0]
                return reply[0], reply[2]
        with self.clock.move_on_after(wait):
            while not outbox and self.end_reason is None:
                waiter = self.waiter
                if waiter is None:
                    waiter = self.waiter = self.new_event()
                await waiter.wait()
        if outbox:
            reply = outbox[0]
            return reply[0], reply[2]
        return None


class _QueuedCreation:
    """A session's creation waiting in the registry's queue, over as many ``POST`` requests as it takes.

    Its ticket keeps the place while a request waits on it, and `_COME_BACK`
    seconds after the last one ended: a client that gave up (its request
    timed out, it went) loses its place instead of being admitted and holding
    a slot nobody uses.
    """

    __slots__ = ("_changed", "claimed", "client", "key", "lease", "session", "settled", "ticket", "waiting")

    def __init__(self, session: _Session, ticket: QueueTicket, key: tuple[str, str] | None, client: str | None) -> None:
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


# The most digits a numeric header may have: far beyond any count a session
# reaches, and far below what Python refuses to parse (4,300 digits).
_MAX_HEADER_DIGITS: Final = 18


def _header_int(value: bytes, name: str, minimum: int) -> int:
    if not value.isdigit() or len(value) > _MAX_HEADER_DIGITS or int(value) < minimum:
        raise _HTTPError(400, "invalid_header", f"{name} must be an integer of at least {minimum}, not {value!r}")
    return int(value)


def _header_seconds(value: bytes, name: str) -> float:
    try:
        seconds = float(value)
    except ValueError:
        seconds = math.nan
    if not (seconds >= 0 and math.isfinite(seconds)):
        raise _HTTPError(400, "invalid_header", f"{name} must be a number of seconds (0 or more), not {value!r}")
    return seconds


def _media_type(value: bytes) -> str:
    return value.split(b";", 1)[0].strip().lower().decode("latin-1")


async def _read_body(receive: Receive, limit: int, content_length: bytes | None) -> bytes:
    """Read a request's whole body; ``413`` past ``limit`` bytes."""
    if (
        content_length is not None
        and content_length.isdigit()
        and (len(content_length) > _MAX_HEADER_DIGITS or int(content_length) > limit)
    ):
        raise _HTTPError(413, "body_too_large", f"the body of {content_length.decode()} bytes exceeds {limit} bytes")
    message = await receive()
    if message["type"] != "http.request":
        raise _Disconnected
    body: bytes = message.get("body", b"")
    if not message.get("more_body", False):
        if len(body) > limit:
            raise _HTTPError(413, "body_too_large", f"the body exceeds {limit} bytes")
        return body
    chunks = [body]
    size = len(body)
    while True:
        message = await receive()
        if message["type"] != "http.request":
            raise _Disconnected
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise _HTTPError(413, "body_too_large", f"the body exceeds {limit} bytes")
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


async def _respond(send: Send, status: int, headers: list[tuple[bytes, bytes]], body: bytes = b"") -> None:
    headers.append((_CONTENT_LENGTH, b"%d" % len(body)))
    try:
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})
    except OSError:  # the client is gone: what it did not get, it will ask for again
        pass


async def _respond_error(send: Send, error: _HTTPError) -> None:
    body = encode_error(error.code, error.message)
    await _respond(send, error.status, [_JSON_TYPE, _NO_STORE, *error.headers], body)


class _Handler:
    """A bound method as an ASGI app (Starlette routes call methods as request/response endpoints)."""

    __slots__ = ("_handle",)

    def __init__(self, handle: Callable[[Scope, Receive, Send], Any]) -> None:
        self._handle = handle

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await self._handle(scope, receive, send)
        except _HTTPError as error:
            await _respond_error(send, error)
        except _Disconnected:
            pass


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
        linger: float = _LINGER,
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
        self._held = _Held()
        self.factory = factory
        self.registry = registry
        self.max_wait = max_wait
        self.max_message_size = max_message_size
        self.linger = linger
        self._sessions: dict[str, _Session] = {}
        # By client and idempotency key, until the first frame: only the client that
        # created a session gets its credentials again for the key.
        self._created: dict[tuple[str, str], _Session] = {}
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
            Route(FRAMES_PATH, _Handler(self._frames), name="poll_frames"),
            Route(SESSION_PATH, _Handler(self._session), name="poll_session"),
            Route(SESSIONS_PATH, _Handler(self._create), name="poll_sessions"),
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
            raise _HTTPError(405, "method_not_allowed", "use POST to create a session", [(b"allow", b"POST")])
        content_type = content_length = key = None
        hold: float | None = None  # how long the client waits for this answer, if it says
        for name, value in scope["headers"]:
            if name == _CONTENT_TYPE:
                content_type = value
            elif name == _CONTENT_LENGTH:
                content_length = value
            elif name == _IDEMPOTENCY_KEY:
                key = value
            elif name == _WAIT:
                hold = min(_header_seconds(value, WAIT_HEADER), self.max_wait)
        body = await _read_body(receive, _MAX_CREATE_BODY, content_length)
        if body.strip():
            if content_type is None or _media_type(content_type) != "application/json":
                raise _HTTPError(415, "unsupported_media_type", "the body of POST /poll/sessions must be JSON")
            try:
                options = _decode_create(body)
            except msgspec.DecodeError as exc:
                raise _HTTPError(400, "invalid_body", f"invalid body: {exc}") from None
        else:
            options = _CreateRequest()
        try:
            dialect = dialect_for(options.encoding)
        except ValueError as exc:
            raise _HTTPError(400, "invalid_body", str(exc)) from None
        idempotency_key = None
        if key is not None:
            text = key.decode("latin-1")
            if len(text) not in _IDEMPOTENCY_KEY_LENGTHS or not text.isprintable():
                raise _HTTPError(
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
                    raise _HTTPError(
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
            raise _HTTPError(503, "not_running", "the server's lifespan is not running: it cannot host sessions")

        client = client_of(scope)
        session = _Session(secrets.token_urlsafe(32), dialect, self._new_event, self.registry.clock, self._held)
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
        self, session: _Session, lease: SessionLease, idempotency_key: tuple[str, str] | None, scope: Scope
    ) -> None:
        """Start a session that has its slot."""
        task_group = self._task_group
        if task_group is None:  # the server stopped meanwhile
            lease.release()
            raise _HTTPError(503, "not_running", "the server's lifespan is not running: it cannot host sessions")
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
            body = _json_encode(Queued(QueuePlace(position, self.registry.queue_timeout or 0.0)))
            await _respond(send, 202, [_JSON_TYPE, _NO_STORE, (b"retry-after", b"0")], body)
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

    async def _respond_created(self, send: Send, session: _Session) -> None:
        body = _json_encode(
            Created(session.id, session.key.decode(), session.dialect.encoding, self.max_message_size, self.max_wait)
        )
        location = SESSION_PATH.replace("{session_id}", session.id).encode()
        await _respond(send, 201, [_JSON_TYPE, _NO_STORE, (b"location", location)], body)

    async def _refuse_at_capacity(self, send: Send, dialect: Dialect, client: str | None) -> None:
        frame = self.registry.capacity_reached_frame(dialect, client)
        headers = [
            (_CONTENT_TYPE, MEDIA_TYPES[dialect.encoding].encode()),
            _NO_STORE,
            (ERROR_HEADER.lower().encode(), b"CAPACITY_REACHED"),
            (b"retry-after", b"1"),
        ]
        await _respond(send, 503, headers, frame)

    async def _run_session(self, session: _Session) -> None:
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
                if session.outbox_bytes <= _LINGER_FREE_BYTES:
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

    def _forget_key(self, session: _Session) -> None:
        key, session.idempotency_key = session.idempotency_key, None
        if key is not None and self._created.get(key) is session:
            del self._created[key]

    # -- DELETE /poll/sessions/{id} ----------------------------------------------

    async def _session(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["method"] != "DELETE":
            raise _HTTPError(405, "method_not_allowed", "use DELETE to end a session", [(b"allow", b"DELETE")])
        session = self._sessions.get(scope["path_params"]["session_id"])
        if session is None or not session.holds_key(_header(scope, _SESSION_KEY)):
            raise _not_found()
        del self._sessions[session.id]
        self._forget_key(session)
        session.delete()
        await _respond(send, 204, [_NO_STORE])

    # -- POST and GET /poll/sessions/{id}/frames ---------------------------------

    async def _frames(self, scope: Scope, receive: Receive, send: Send) -> None:
        method = scope["method"]
        posting = method == "POST"
        if not posting and method != "GET":
            raise _HTTPError(405, "method_not_allowed", "use POST or GET", [(b"allow", b"GET, POST")])
        session = self._sessions.get(scope["path_params"]["session_id"])
        if session is None:
            raise _not_found()
        seq = ack = 0
        wait = self.max_wait
        content_type = content_length = key = None
        for name, value in scope["headers"]:
            if name == _SESSION_KEY:
                key = value
            elif name == _SEQ:
                seq = _header_int(value, SEQ_HEADER, 1)
            elif name == _ACK:
                ack = _header_int(value, ACK_HEADER, 0)
            elif name == _WAIT:
                wait = min(_header_seconds(value, WAIT_HEADER), self.max_wait)
            elif name == _CONTENT_TYPE:
                content_type = value
            elif name == _CONTENT_LENGTH:
                content_length = value
        if not session.holds_key(key):  # its id alone (seen in a URL, a log) does not drive it
            raise _not_found()
        if session.lease is not None:
            session.lease.seen()
        if ack > session.sent:
            raise _HTTPError(
                409,
                "ack_out_of_range",
                f"{ACK_HEADER} {ack} acknowledges replies never sent (the last is {session.sent})",
            )
        if posting:
            if seq == 0:
                raise _HTTPError(400, "invalid_header", f"a frame needs its {SEQ_HEADER}")
            encoding = session.dialect.encoding
            if content_type is None or _media_type(content_type) not in _ACCEPTED_MEDIA_TYPES[encoding]:
                raise _HTTPError(
                    415,
                    "unsupported_media_type",
                    f"this session's frames are {MEDIA_TYPES[encoding]}, not "
                    f"{'nothing' if content_type is None else content_type.decode('latin-1')!r}",
                )
            frame = await _read_body(receive, self.max_message_size, content_length)
            session.acknowledge(ack)
            self._accept(session, seq, frame)
        else:
            session.acknowledge(ack)
        reply = await session.next_reply(wait)
        received = (_RECEIVED, b"%d" % session.received)
        if session.end_reason is not None and reply is None:
            raise _HTTPError(410, "session_ended", f"the session has ended: {session.end_reason}", [received])
        # A 2xx to a POST says the server has every frame up to its OpenEnv-Seq,
        # and no cache keeps a POST's response: two headers fewer on the hot path.
        headers = [] if posting else [received, _NO_STORE]
        if reply is not None:
            headers.append((_CONTENT_TYPE, session.media_type))
            headers.append((_SEQ, b"%d" % reply[0]))
            await _respond(send, 200, headers, reply[1])
        else:
            await _respond(send, 204, headers)

    def _accept(self, session: _Session, seq: int, frame: bytes) -> None:
        """Queue a request frame for the session, once; a retry of one queued already is not queued again."""
        received = session.received
        if seq <= received:
            if seq <= session.answered:
                raise _HTTPError(
                    409,
                    "sequence_acknowledged",
                    f"{SEQ_HEADER} {seq} was answered and its reply acknowledged already; nothing to replay",
                )
            return  # a retry: answer it with the reply (or "pending"), never run it twice
        if seq > received + 1:
            raise _HTTPError(
                409, "sequence_gap", f"{SEQ_HEADER} {seq} skips ahead: the next frame expected is {received + 1}"
            )
        if session.end_reason is not None:
            raise _HTTPError(
                410,
                "session_ended",
                f"the session has ended: {session.end_reason}",
                [(_RECEIVED, b"%d" % received)],
            )
        if received - session.answered >= _MAX_UNACKNOWLEDGED:
            raise _HTTPError(
                409,
                "too_many_unacknowledged",
                f"{_MAX_UNACKNOWLEDGED} requests await an acknowledged reply; acknowledge replies first",
            )
        holds = session.holds
        if holds:  # one request and its reply are always let in; more count against the bounds
            size = len(frame)
            if holds + size > self.max_unacknowledged_bytes:
                raise _HTTPError(
                    409,
                    "too_many_unacknowledged",
                    f"the session holds {holds} bytes of replies and requests for its client, and this frame "
                    f"would pass {self.max_unacknowledged_bytes}; acknowledge replies first",
                )
            if self._held.bytes + size > self.max_unacknowledged_total:
                raise _HTTPError(
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


def _header(scope: Scope, name: bytes) -> bytes | None:
    for key, value in scope["headers"]:
        if key == name:
            return value  # type: ignore[no-any-return]
    return None


def _not_found() -> _HTTPError:
    return _HTTPError(404, "session_not_found", "no such session: it never existed, or it ended and was forgotten")
