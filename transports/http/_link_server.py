"""The server end of HTTP long-polling links: ``/poll/links``, many sessions over one client's requests.

A client creates a link (``POST /poll/links``) and opens its sessions on it in
envelopes (`transports.link._envelope`), as over a WebSocket link; the sessions are
a `transports.link._host.LinkHost`'s, in a task of the endpoint's own, so they
outlive the requests that carry their frames. Each link is a `PollingServerLink`:

- **Messages in.** ``POST /poll/links/{id}`` carries one envelope, numbered by
  the client (``OpenEnv-Seq``: 1, 2, 3, ...). The link takes each number once,
  in order: a number it has taken already is a retry (not taken again), one
  beyond the next waits a moment for the ones before it. The link's task reads
  the messages taken, in order, into its host (the carrier's loop of
  `LinkHost.host`).
- **Entries out.** Every entry the host posts (the sessions' replies, their
  ends) goes into the link's *log* at the next place (1, 2, 3, ...). Each
  request carries the last place the client holds (``OpenEnv-Ack``); the link
  forgets the entries up to it, and answers the request with every entry
  after it (``200``, ``OpenEnv-Seq``: the place of the last one). So a response
  lost on the way is simply sent again by the next request, and a duplicate is
  dropped by the client (each frame's own number on its channel).
- **One request waits.** A request with nothing to answer yet waits, up to
  ``OpenEnv-Wait`` seconds, for entries; only one request of a link waits at a
  time: a request that arrives, or starts to wait, answers the one waiting
  before it at once (as BOSH's connection manager does, XEP-0124). So a client
  keeps one request at the server and may always send another, and its frames
  never queue behind a long poll.

Bounds: a link that gets no request for the HTTP idle timeout ends, and so do
its sessions (a new link that gets no message for ``unused_timeout``); while
the entries it keeps unacknowledged weigh more than ``max_unacknowledged_bytes``,
the link takes no message (the response, carrying the entries, says so with
``OpenEnv-Received``: the client acknowledges them and sends the message
again); a body over ``max_message_size`` is ``413``; at most `MAX_QUEUED_MESSAGES`
messages wait for the link's task.
"""

from __future__ import annotations

import hmac
import logging
import secrets
from collections import deque
from collections.abc import Callable
from itertools import islice
from typing import Any, Final

import anyio
import anyio.lowlevel
import msgspec
from anyio.abc import TaskGroup, TaskStatus
from starlette.routing import BaseRoute, Route

from openenv import Clock, Dialect
from openenv.channel import FrameQueue, QueueClosed
from openenv.server import SERVER_DEFAULTS, SessionMetrics
from transports.admission._guard import client_of
from transports.admission._sessions import SHUTDOWN_REASON, SessionRegistry
from transports.http._poll_requests import read_created_dialect, read_frame, read_poll_headers
from transports.http._protocol import (
    ACK_HEADER,
    DEFAULT_MAX_WAIT,
    LINK_KEY_HEADER,
    LINK_PATH,
    LINKS_PATH,
    MEDIA_TYPES,
    RECEIVED_HEADER,
    SEQ_HEADER,
    LinkCreated,
)
from transports.http._server import DEFAULT_LINGER, DEFAULT_MAX_UNACKNOWLEDGED_BYTES, DEFAULT_UNUSED_TIMEOUT
from transports.link._envelope import Entry, EnvelopeCodec
from transports.link._host import LinkHost
from transports.link._state import LinkProtocolError
from transports.shared._asgi import Receive, Scope, Send
from transports.shared._raw_http import (
    CONTENT_LENGTH,
    CONTENT_TYPE,
    JSON_TYPE,
    NO_STORE,
    Handler,
    HTTPError,
    header,
    json_encode,
    respond,
)

__all__ = ["GAP_WAIT", "MAX_QUEUED_MESSAGES", "HTTPLinkEndpoint", "PollingServerLink"]

logger = logging.getLogger("openenv.server")

GAP_WAIT: Final = 1.0
"""Seconds a message numbered beyond the next waits for the ones before it (sent at once, on other connections)."""

MAX_QUEUED_MESSAGES: Final = 4
"""Messages a link holds taken but not yet read by its task; a message beyond waits for room."""

# How much of a link's id the log shows.
_LOGGED_ID_LENGTH = 8

# Times a request lets other tasks run before it waits for entries: a message
# just taken is often answered at once (async steps run on the link's task).
_YIELDS_BEFORE_WAITING: Final = 2

_SEQ = SEQ_HEADER.lower().encode()
_RECEIVED = RECEIVED_HEADER.lower().encode()
_LINK_KEY = LINK_KEY_HEADER.lower().encode()


class _Log:
    """The entries a link has sent and the client has not acknowledged, each at its place (1, 2, 3, ...)."""

    __slots__ = ("end", "entries", "first", "size")

    def __init__(self) -> None:
        self.entries: deque[tuple[Entry, int]] = deque()  # (entry, its frame's size), oldest first
        self.first = 1  # the place of entries[0]
        self.end = 0  # the place of the last entry ever logged
        self.size = 0  # bytes of frames kept

    def append(self, entries: list[Entry]) -> None:
        kept = self.entries
        for entry in entries:
            size = len(memoryview(entry[3]))
            kept.append((entry, size))
            self.size += size
        self.end += len(entries)

    def acknowledge(self, ack: int) -> None:
        """Forget the entries up to place ``ack``: the client holds them."""
        kept = self.entries
        while kept and self.first <= ack:
            self.size -= kept.popleft()[1]
            self.first += 1

    def after(self, ack: int) -> list[Entry]:
        """The entries kept after place ``ack``, oldest first."""
        return [entry for entry, _ in islice(self.entries, max(0, ack + 1 - self.first), None)]


class PollingServerLink:
    """One link of the HTTP long-polling endpoint: its sessions' host, its log, its numbering of messages.

    Args:
        factory: Builds one environment per session.
        registry: The app's session registry.
        dialect: The dialect of the sessions' frames.
        error_details: Whether error replies name the server's exceptions.
        idle_timeout: Seconds without a request after which the link ends (``None``: never).
        unused_timeout: The same, before its first message.
        max_unacknowledged_bytes: The most bytes of entries kept unacknowledged
            before the link stops taking messages.
        clock: Where the link's waits are measured (the registry's clock).
        metrics: Where the sessions' requests are counted, or ``None``.
        client: Who created the link (`transports.admission._guard.client_of`), for the per-client quota.

    Attributes:
        id: The link's id (in its URL).
        key: The secret every request to it carries (``OpenEnv-Link-Key``).
        taken: The number of the last message taken.
        end_reason: Why it is over, once it is (its sessions have ended).
    """

    def __init__(
        self,
        factory: Callable[[], Any],
        *,
        registry: SessionRegistry,
        dialect: Dialect,
        error_details: bool,
        idle_timeout: float | None,
        unused_timeout: float,
        max_unacknowledged_bytes: int,
        clock: Clock,
        metrics: SessionMetrics | None = None,
        client: str | None = None,
    ) -> None:
        self.id = secrets.token_urlsafe(32)
        self.key = secrets.token_urlsafe(32).encode()
        self.dialect = dialect
        self.media_type = MEDIA_TYPES[dialect.encoding].encode()
        self.host = LinkHost(
            factory,
            registry=registry,
            dialect=dialect,
            error_details=error_details,
            transport="http",
            flush=self.flush,
            metrics=metrics,
            client=client,
        )
        self.codec: EnvelopeCodec = self.host.codec
        self.log = _Log()
        self.taken = 0
        self.end_reason: str | None = None
        self.forgotten = anyio.Event()  # set when the record may go (DELETE)
        self._idle_timeout = idle_timeout
        self._unused_timeout = unused_timeout
        self._max_unacknowledged_bytes = max_unacknowledged_bytes
        self._clock = clock
        self._inbox: FrameQueue[list[Entry]] = FrameQueue()
        self._closing: str | None = None  # why the link was asked to end
        self._parked: anyio.Event | None = None  # set to answer the request waiting
        self._taken_event: anyio.Event | None = None  # set when a message is taken, or room is made
        self._changed: anyio.Event | None = None  # set when a request starts or ends, or the link is closed
        self._requests = 0  # in flight
        self._last_request = clock.now()

    # -- the link's task -----------------------------------------------------------

    async def run(self, *, task_status: TaskStatus[None]) -> None:
        """Host the link's sessions until it is over: asked to end, or idle too long."""

        async def carry() -> str:
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(self._watch)
                task_status.started()
                reason = await self.host.serve(self._read)
                tasks.cancel_scope.cancel()
            return reason

        reason = "the link failed on the server"
        try:
            await self.host.host(carry)
            reason = self._closing or reason
        except anyio.get_cancelled_exc_class():
            reason = "the server stopped"
            raise
        except Exception:
            logger.exception("an HTTP long-polling link failed")
            self.host.release_all()
        finally:
            with anyio.CancelScope(shield=True):
                await self.flush()  # the sessions' ends, for a client still polling
            self.end(self._closing or reason)

    async def _read(self) -> str:
        """The carrier's loop (run by `LinkHost.serve`): hand the messages taken to the host, in order, until closed."""
        host, inbox = self.host, self._inbox
        while True:
            await host.room()
            try:
                entries = await inbox.get()
            except QueueClosed:
                assert self._closing is not None
                return self._closing
            self._room_made()
            try:
                await host.take_entries(entries)
            except LinkProtocolError as exc:
                self.close(f"the client broke the link protocol: {exc}")
            await self.flush()

    async def _watch(self) -> None:
        """Close the link once no request has come for its idle timeout (its unused timeout before a message)."""
        clock = self._clock
        while self._closing is None:
            changed = self._changed = anyio.Event()
            limit = self._idle_timeout if self.taken else self._unused_timeout
            if self._requests or limit is None:
                await changed.wait()
                continue
            remaining = self._last_request + limit - clock.now()
            if remaining <= 0:
                self.close(f"no request came for {limit:g} s")
                return
            with clock.move_on_after(remaining):
                await changed.wait()

    async def flush(self) -> None:
        """Move the entries the host posted into the log, and answer the request waiting (the host's ``flush``)."""
        state = self.host.state
        if state.has_outgoing:
            self.log.append(state.outgoing())
            self._answer_parked()
        if self.host.shutting_down:
            # Its last session ended as the server stops: so does the link, so that
            # no request of its waits here while the server waits for its requests.
            self.close(SHUTDOWN_REASON)

    def close(self, reason: str) -> None:
        """Ask the link to end: the messages taken are read, then every session ends with ``reason``."""
        if self._closing is None:
            self._closing = reason
            self._inbox.close()
            self._changed_now()

    def end(self, reason: str) -> None:
        """The link is over (its sessions have ended): answer the request waiting."""
        if self.end_reason is None:
            self.end_reason = reason
            self.close(reason)
            self._answer_parked()
            self._room_made()

    # -- the requests' side ----------------------------------------------------------

    def holds_key(self, key: bytes | None) -> bool:
        """Whether a request carries this link's key (compared in constant time)."""
        return key is not None and hmac.compare_digest(key, self.key)

    def request_started(self) -> None:
        """A request has come: it answers the one waiting; the link is not idle while it is in flight."""
        self._requests += 1
        self._answer_parked()
        self._changed_now()

    def request_ended(self) -> None:
        """A request is over: the link's idle clock runs from now while no other is in flight."""
        self._requests -= 1
        self._last_request = self._clock.now()
        self._changed_now()

    async def accept(self, seq: int, entries: list[Entry], wait: float) -> bool:
        """Take message number ``seq`` once, in order, unless the link is full; its response says whether it was.

        Returns:
            Whether to answer at once: the message was not taken, as the link
            keeps too much unacknowledged (the response carries it) or had no
            room for it in time; the client sends it again.

        Raises:
            HTTPError: ``409 sequence_gap``: the messages before it did not come in time.
        """
        if seq > self.taken + 1:
            with self._clock.move_on_after(min(wait, GAP_WAIT)):
                while seq > self.taken + 1 and self.end_reason is None:
                    await self._wait_taken()
            if seq > self.taken + 1:
                raise HTTPError(
                    409,
                    "sequence_gap",
                    f"{SEQ_HEADER} {seq} skips ahead: the next message expected is {self.taken + 1}",
                    [(_RECEIVED, b"%d" % self.taken)],
                )
        if seq <= self.taken or self._closing is not None:
            return False  # a retry (never taken twice), or the link is ending (its end answers)
        if self.log.size > self._max_unacknowledged_bytes:
            return True  # not taken: the client acknowledges what the response carries, then sends it again
        if len(self._inbox) >= MAX_QUEUED_MESSAGES:
            with self._clock.move_on_after(wait):
                while len(self._inbox) >= MAX_QUEUED_MESSAGES and self._closing is None:
                    await self._wait_taken()
            if seq <= self.taken or self._closing is not None:
                return False
            if len(self._inbox) >= MAX_QUEUED_MESSAGES:
                return True  # not taken in time: sent again
        self._inbox.put(entries)
        self.taken = seq
        self._room_made()
        return False

    async def entries_after(self, ack: int, wait: float) -> list[Entry]:
        """The entries after place ``ack``, waiting up to ``wait`` seconds for one (unless another request comes)."""
        log = self.log
        entries = log.after(ack)
        if entries or wait <= 0 or self.end_reason is not None:
            return entries
        for _ in range(_YIELDS_BEFORE_WAITING):
            await anyio.lowlevel.checkpoint()
            if log.end > ack:
                return log.after(ack)
        self._answer_parked()  # one request waits at a time: the newest
        parked = self._parked = anyio.Event()
        with self._clock.move_on_after(wait):
            await parked.wait()
        if self._parked is parked:
            self._parked = None
        return log.after(ack)

    def _answer_parked(self) -> None:
        parked, self._parked = self._parked, None
        if parked is not None:
            parked.set()

    async def _wait_taken(self) -> None:
        if self._taken_event is None:
            self._taken_event = anyio.Event()
        await self._taken_event.wait()

    def _room_made(self) -> None:
        event, self._taken_event = self._taken_event, None
        if event is not None:
            event.set()

    def _changed_now(self) -> None:
        changed, self._changed = self._changed, None
        if changed is not None:
            changed.set()


class HTTPLinkEndpoint:
    """The ``/poll/links`` routes: links, each carrying many sessions of one client.

    Mount its `routes` in the app and run `run` for the app's lifetime (its
    lifespan does both, in `transports.server.app.create_app`); each link is a task of
    `run`'s. Its sessions take slots in ``registry`` one by one (a session
    turned away gets ``CAPACITY_REACHED`` on its channel, or waits in the
    admission queue), and are reaped when idle, as over a WebSocket link.

    Args:
        factory: Builds one environment per session.
        registry: The app's session registry. Its clock times the links' waits:
            a long poll, a link's idleness, an ended link's record lingering.
        max_wait: The longest the server holds a request waiting for entries, in seconds.
        max_message_size: The largest envelope accepted, in bytes (``413``
            beyond); told to each client as its link's ``max_body_size``.
        linger: Seconds an ended link's record stays (its last entries can be
            fetched, and requests get ``410``) before its id is forgotten.
        unused_timeout: Seconds a new link may wait for its first message.
        idle_timeout: Seconds a link may go without a request before it ends,
            with its sessions; ``None`` (the default) takes the registry's for
            HTTP sessions (``idle_timeout_of("http")``).
        error_details: Whether error replies name the server's exceptions.
        max_unacknowledged_bytes: The most bytes of entries a link keeps for
            its client; beyond, it takes no message until the client acknowledges them.
        metrics: Where the sessions' requests are counted, or ``None``.

    Raises:
        ValueError: ``max_wait``, ``max_message_size``, ``unused_timeout`` or
            ``max_unacknowledged_bytes`` is not positive, or ``linger`` is negative.
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
        idle_timeout: float | None = None,
        error_details: bool = True,
        max_unacknowledged_bytes: int = DEFAULT_MAX_UNACKNOWLEDGED_BYTES,
        metrics: SessionMetrics | None = None,
    ) -> None:
        if not max_wait > 0 or not max_message_size > 0 or not linger >= 0:
            raise ValueError("max_wait and max_message_size must be positive, linger 0 or more")
        if idle_timeout is not None and not idle_timeout > 0:
            raise ValueError(f"idle_timeout must be positive (or None for the registry's), not {idle_timeout}")
        if not unused_timeout > 0 or not max_unacknowledged_bytes > 0:
            raise ValueError("unused_timeout and max_unacknowledged_bytes must be positive")
        self.factory = factory
        self.registry = registry
        self.max_wait = max_wait
        self.max_message_size = max_message_size
        self.idle_timeout = idle_timeout
        self.linger = linger
        self.unused_timeout = unused_timeout
        self.error_details = error_details
        self.max_unacknowledged_bytes = max_unacknowledged_bytes
        self.metrics = metrics
        self._links: dict[str, PollingServerLink] = {}
        self._task_group: TaskGroup | None = None

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {len(self._links)} links>"

    @property
    def link_count(self) -> int:
        """The links known now, live or ended but not yet forgotten."""
        return len(self._links)

    def routes(self) -> list[BaseRoute]:
        """The Starlette routes to mount: ``/poll/links`` and ``/poll/links/{id}``.

        Returns:
            The routes (`transports.server.app.create_app` mounts them).
        """
        return [
            Route(LINK_PATH, Handler(self._link), name="poll_link"),
            Route(LINKS_PATH, Handler(self._create), name="poll_links"),
        ]

    async def run(self) -> None:
        """Host the links until cancelled (the app's lifespan runs it); their sessions end with them."""
        try:
            async with anyio.create_task_group() as task_group:
                self._task_group = task_group
                await anyio.sleep_forever()
        finally:
            self._task_group = None
            for link in list(self._links.values()):
                link.end("the server stopped")
            self._links.clear()

    # -- POST /poll/links ------------------------------------------------------------

    async def _create(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["method"] != "POST":
            raise HTTPError(405, "method_not_allowed", "use POST to create a link", [(b"allow", b"POST")])
        content_type = content_length = None
        for name, value in scope["headers"]:
            if name == CONTENT_TYPE:
                content_type = value
            elif name == CONTENT_LENGTH:
                content_length = value
        dialect = await read_created_dialect(receive, content_type, content_length, LINKS_PATH)
        task_group = self._task_group
        if task_group is None:
            raise HTTPError(503, "not_running", "the server's lifespan is not running: it cannot host links")
        link = PollingServerLink(
            self.factory,
            registry=self.registry,
            dialect=dialect,
            error_details=self.error_details,
            idle_timeout=self.idle_timeout if self.idle_timeout is not None else self.registry.idle_timeout_of("http"),
            unused_timeout=self.unused_timeout,
            max_unacknowledged_bytes=self.max_unacknowledged_bytes,
            clock=self.registry.clock,
            metrics=self.metrics,
            client=client_of(scope),
        )
        self._links[link.id] = link
        await task_group.start(self._run_link, link)
        created = LinkCreated(link.id, link.key.decode(), dialect.encoding, self.max_message_size, self.max_wait)
        location = LINK_PATH.replace("{link_id}", link.id).encode()
        await respond(send, 201, [JSON_TYPE, NO_STORE, (b"location", location)], json_encode(created))
        client = scope.get("client")
        logger.info(
            "%s - HTTP long-polling link %s… opened",
            f"{client[0]}:{client[1]}" if client else "-",
            link.id[:_LOGGED_ID_LENGTH],
        )

    async def _run_link(self, link: PollingServerLink, *, task_status: TaskStatus[None]) -> None:
        try:
            await link.run(task_status=task_status)
            logger.info("HTTP long-polling link %s… ended: %s", link.id[:_LOGGED_ID_LENGTH], link.end_reason)
            with self.registry.clock.move_on_after(self.linger):
                await link.forgotten.wait()
        finally:
            if self._links.get(link.id) is link:
                del self._links[link.id]

    # -- POST, GET and DELETE /poll/links/{id} -----------------------------------------

    async def _link(self, scope: Scope, receive: Receive, send: Send) -> None:
        method = scope["method"]
        if method not in ("POST", "GET", "DELETE"):
            raise HTTPError(405, "method_not_allowed", "use POST, GET or DELETE", [(b"allow", b"GET, POST, DELETE")])
        link = self._links.get(scope["path_params"]["link_id"])
        if link is None or not link.holds_key(header(scope, _LINK_KEY)):
            raise _not_found()  # its id alone (seen in a URL, a log) does not drive it
        if method == "DELETE":
            link.close("the client ended the link")
            link.forgotten.set()
            del self._links[link.id]
            await respond(send, 204, [NO_STORE])
            return
        posting = method == "POST"
        _, seq, ack, wait, content_type, content_length = read_poll_headers(scope, self.max_wait)
        log = link.log
        if ack > log.end:
            raise HTTPError(
                409, "ack_out_of_range", f"{ACK_HEADER} {ack} acknowledges entries never sent (the last is {log.end})"
            )
        link.request_started()
        try:
            if posting:
                if seq == 0:
                    raise HTTPError(400, "invalid_header", f"a message needs its {SEQ_HEADER}")
                body = await read_frame(
                    receive,
                    content_type,
                    content_length,
                    encoding=link.dialect.encoding,
                    limit=self.max_message_size,
                    what="link's envelopes",
                )
                try:
                    entries = link.codec.decode(body)
                except msgspec.DecodeError as exc:
                    raise HTTPError(400, "invalid_envelope", f"not an envelope: {exc}"[:300]) from None
                log.acknowledge(ack)
                if await link.accept(seq, entries, wait):
                    wait = 0.0
            else:
                log.acknowledge(ack)
            entries = await link.entries_after(ack, wait)
            received = (_RECEIVED, b"%d" % link.taken)
            if entries:
                headers = [(CONTENT_TYPE, link.media_type), (_SEQ, b"%d" % log.end), received, NO_STORE]
                await respond(send, 200, headers, link.codec.encode(entries))
            elif link.end_reason is not None:
                raise HTTPError(410, "link_ended", f"the link has ended: {link.end_reason}", [received])
            else:
                await respond(send, 204, [received, NO_STORE])
        finally:
            link.request_ended()


def _not_found() -> HTTPError:
    return HTTPError(404, "link_not_found", "no such link: it never existed, or it ended and was forgotten")
