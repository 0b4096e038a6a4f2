"""Who gets a session slot, across every server endpoint of one app: the capacity limit, the quota, idle reaping.

One `SessionRegistry` lives on the app (``app.state.sessions``) and counts the
live sessions of every transport together (WebSocket connections and HTTP
long-polling sessions), so ``max_sessions`` bounds them all at once.

An endpoint takes a `SessionLease` before it builds the environment and gives it
back, always, when the session ends:

```text
lease = registry.open(transport="websocket", on_close=scope.cancel)
if lease is None:
    ...  # send CAPACITY_REACHED (registry.active, registry.max_sessions) and close
try:
    with scope:
        ...  # serve: lease.touch() when waiting for the client (end the session
        ...  # there if lease.close_reason is set), lease.mark_busy() on a request;
        ...  # lease.vacate() once the session is over, before closing its environment
finally:
    lease.release()
```

A session's slot is free for the next session as soon as the session is over
(`SessionLease.vacate`, which `openenv.server.host_session` calls through its
``on_end`` before it closes the environment, as the reference server does): its
client may open another session at once, while the old environment is still
closing. The lease stays listed until `SessionLease.release`, so
`SessionRegistry.wait_empty` still waits for every environment to be closed.

``CAPACITY_REACHED``, the whole story: the registry alone decides.
`SessionRegistry.open` refuses a session when `SessionRegistry.full`
(``max_sessions`` slots taken, across every transport), when sessions wait in
the queue (a freed slot is theirs first), or when its client holds
``max_sessions_per_client`` already (counting its sessions in the queue).
`SessionRegistry.admit` is `open` with the queue: given a ``queue_timeout``, a
refused session waits up to that long, in arrival order, and
`SessionLease.vacate` / `SessionLease.release` hand a freed slot straight to
the longest waiting one; `close_all` turns the queue away. An endpoint whose
client may leave or come back while it waits (HTTP long-polling) holds its
place with a `QueueTicket` (`SessionRegistry.enqueue`, `SessionRegistry.leave`).
Only when no lease comes is the client turned away, with the words of
`SessionRegistry.capacity_reached_message` (the reference's, or the client's
quota), and each transport reports it in its own way:

- WebSocket (``/ws``): the connection is accepted, then gets one unsolicited
  `SessionRegistry.capacity_reached_frame` (with ``active_sessions`` and
  ``max_sessions``) and is closed with 1000 once the client sends its first
  request or after a grace (a client that reads only after a request, like
  OpenEnv's, gets the frame as the reply to it);
- HTTP long-polling (``POST /poll/sessions``): ``503`` with the same frame as
  the body, ``OpenEnv-Error: CAPACITY_REACHED`` and ``Retry-After: 1``;
- OpenEnv's stateless HTTP routes (``/reset``, ``/step``): ``503`` with the
  message as ``detail`` and ``Retry-After: 1``.

The client raises `openenv.CapacityReachedError` for each of them.

The registry asks a session to end in two cases: it stayed idle past the
timeout (`SessionRegistry.expire_idle`, run by `SessionRegistry.run_reaper`),
or the server is shutting down (`SessionRegistry.close_all`; once the
shutdown's grace is over, `SessionRegistry.cut_all` ends the busy ones too).
Idle means with no request in hand and no open connection to its client: a
session whose client keeps a connection open (`SessionLease.connected`: a
WebSocket's, while it lasts) is never reaped as idle, however quiet, since a
client that is still there (OpenEnv's reconnects without a word when its socket
is closed) would otherwise find a fresh, never-reset session in its place; a
dead peer is found by the connection's own checks instead (keepalive pings, TCP
keepalive). The idle timeout
is the registry's own (every transport's), or a transport's own where that is
shorter: HTTP long-polling cannot see a client leave, so its sessions always
have one (``transport_idle_timeouts={"http": 300.0}``). Either way the
lease's `SessionLease.close_reason` is set; an idle session's ``on_close`` is
called at once, a busy one ends when it next goes idle, after its reply.

A session whose request runs long is watched too (`SessionRegistry.watch_steps`,
run by the reaper as well): once busy for `LONG_STEP` seconds, its endpoint is
told (`SessionLease.on_long_step`), to watch for its client going away
meanwhile; and the registry gives up on the request (`SessionLease.give_up`,
which calls the endpoint's `SessionLease.on_give_up`: end the session now,
abandoning a plain step's thread) when it runs past the ``step_timeout``, or
when an HTTP session's client (`SessionLease.seen`) stops asking for longer
than its idle timeout. Python cannot kill a thread: a plain step given up on
runs on, and once `openenv.server.abandoned_calls` reaches ``max_sessions``
no more are abandoned (`SessionRegistry.may_abandon`: their sessions keep
their slots until their steps return).

A slot is a `SessionLease` (`transports.admission._lease`), a place in the
queue a `QueueTicket` (`transports.admission._queue`); both are named here too.

The registry does no I/O: `SessionRegistry.expire_idle` and
`SessionRegistry.watch_steps` are plain functions of the clock, and
`SessionRegistry.run_reaper` only sleeps between calls to them. Every time it
reads or waits is its `openenv.Clock`'s, so a test gives it a clock it
advances by hand.
"""

from __future__ import annotations

import functools
import itertools
import logging
import math
import time
from collections import Counter
from collections.abc import Callable, Mapping

import anyio

from openenv import Clock, Dialect
from openenv.server import ServerSession, abandoned_calls, encode_fatal_error
from transports.admission._lease import SessionLease
from transports.admission._queue import AdmissionQueue, QueueTicket

__all__ = [
    "CLIENT_GONE_REASON",
    "IDLE_TIMEOUT_REASON",
    "GivingUp",
    "LONG_STEP",
    "MONOTONIC_CLOCK",
    "SHUTDOWN_REASON",
    "STEP_TIMEOUT_REASON",
    "SessionRegistry",
    "session_failed_frame",
]

logger = logging.getLogger("openenv.server")

IDLE_TIMEOUT_REASON = "session idle timeout"
"""`SessionLease.close_reason` of a session ended for idleness."""
SHUTDOWN_REASON = "server shutting down"
"""`SessionLease.close_reason` of a session ended because the server is stopping."""
STEP_TIMEOUT_REASON = "step timeout"
"""`SessionLease.close_reason` of a session whose request ran past the step timeout (the registry gave up on it)."""
CLIENT_GONE_REASON = "the client went away during a step"
"""`SessionLease.close_reason` of a session given up on because its client left while a request ran."""

LONG_STEP = 1.0
"""Seconds a session's request runs before its endpoint is asked to watch its client (`SessionLease.on_long_step`)."""


def session_failed_frame(dialect: Dialect) -> bytes:
    """The ``SESSION_ERROR`` frame a session gets when the server fails it (a bug, not the environment).

    Args:
        dialect: The dialect of the client's channel.

    Returns:
        The encoded frame, saying no more than that (the log has the traceback).
    """
    return encode_fatal_error(dialect, "SESSION_ERROR", "the session failed on the server")


class _MonotonicClock(Clock):
    """The event loop's waits, with a `now` any thread may read (a lent socket's thread touches its lease)."""

    __slots__ = ()

    def now(self) -> float:
        return time.monotonic()

    def cancel_scope(self, *, deadline: float = math.inf, shield: bool = False) -> anyio.CancelScope:
        if deadline != math.inf:  # from this clock's time to the event loop's
            deadline = anyio.current_time() + (deadline - time.monotonic())
        return anyio.CancelScope(deadline=deadline, shield=shield)


MONOTONIC_CLOCK = _MonotonicClock()
"""A registry's clock by default: the monotonic time, which any thread may read; waits on the event loop."""


# How often the reaper looks, as a fraction of the idle timeout, and its bounds (s).
_REAP_FRACTION = 0.25
_REAP_MIN_INTERVAL = 0.05
_REAP_MAX_INTERVAL = 5.0


def _nothing() -> None:
    """What `SessionRegistry.notify_closing` returns when it called its callback at once."""


class SessionRegistry:
    """The live sessions of one server, across all its transports.

    Not thread-safe: use it from the event loop that serves the app (every call
    is synchronous, so none can interleave with another).

    Args:
        max_sessions: The most sessions open at once; ``None`` for no limit.
        session_idle_timeout: Seconds a session may wait for its client before
            the reaper ends it; ``None`` never ends one.
        transport_idle_timeouts: A shorter idle timeout for the sessions of some
            transports, by transport name (``{"http": 300.0}``); the shorter of
            it and ``session_idle_timeout`` applies.
        clock: Where idleness and the queue's wait are timed, and the reaper
            sleeps; by default the monotonic time, read from any thread (a
            test gives a clock of its own). Its `now` must be safe to call from
            a session's thread.
        queue_timeout: Seconds `admit` lets a new session wait for a slot when
            all are taken (in arrival order); ``None`` refuses it at once.
        max_sessions_per_client: The most sessions one client may hold at
            once, queued ones included (a client is what `open` is told:
            its token, or its address); ``None`` for no quota.
        step_timeout: Seconds a request may run before the registry gives up
            on it and ends its session (see `watch_steps`); ``None`` for never.

    Attributes:
        opened: The sessions given a slot so far, by transport.
        refused: The sessions turned away so far (``CAPACITY_REACHED``), by transport.

    Raises:
        ValueError: ``max_sessions`` or ``max_sessions_per_client`` is below 1,
            or an idle or queue timeout is not positive.
    """

    def __init__(
        self,
        *,
        max_sessions: int | None = None,
        session_idle_timeout: float | None = None,
        transport_idle_timeouts: Mapping[str, float] | None = None,
        clock: Clock = MONOTONIC_CLOCK,
        queue_timeout: float | None = None,
        max_sessions_per_client: int | None = None,
        step_timeout: float | None = None,
    ) -> None:
        if step_timeout is not None and not step_timeout > 0:
            raise ValueError(f"step_timeout must be positive (or None for none), not {step_timeout}")
        self.step_timeout = step_timeout
        if queue_timeout is not None and not queue_timeout > 0:
            raise ValueError(f"queue_timeout must be positive (or None for no queue), not {queue_timeout}")
        if max_sessions_per_client is not None and max_sessions_per_client < 1:
            raise ValueError(
                f"max_sessions_per_client must be at least 1 (or None for no quota), not {max_sessions_per_client}"
            )
        self.queue_timeout = queue_timeout
        self.max_sessions_per_client = max_sessions_per_client
        self._per_client: dict[str, int] = {}  # slots taken and places queued, by client (with a quota only)
        self._queue = AdmissionQueue()
        self._closing = False
        if max_sessions is not None and max_sessions < 1:
            raise ValueError(f"max_sessions must be at least 1 (or None for no limit), not {max_sessions}")
        if session_idle_timeout is not None and not session_idle_timeout > 0:
            raise ValueError(f"session_idle_timeout must be positive (or None for none), not {session_idle_timeout}")
        for transport, timeout in (transport_idle_timeouts or {}).items():
            if not timeout > 0:
                raise ValueError(f"the idle timeout of {transport!r} sessions must be positive, not {timeout}")
        self.max_sessions = max_sessions
        self.session_idle_timeout = session_idle_timeout
        self.transport_idle_timeouts: dict[str, float] = dict(transport_idle_timeouts or {})
        self.clock = clock
        self._leases: dict[int, SessionLease] = {}  # every lease not yet released
        self._slots_taken = 0  # the leases among them not yet vacated
        self._ids = itertools.count(1)
        self._emptied: anyio.Event | None = None
        self._on_closing: set[Callable[[], object]] = set()  # called once by `close_all` (`notify_closing`)
        # Sessions admitted and turned away so far, by transport (for the server's metrics).
        self.opened: Counter[str] = Counter()
        self.refused: Counter[str] = Counter()

    @property
    def active(self) -> int:
        """The number of sessions holding a slot now (not counting those whose environment is closing)."""
        return self._slots_taken

    @property
    def full(self) -> bool:
        """Whether `open` would refuse a new session now."""
        return self.max_sessions is not None and self._slots_taken >= self.max_sessions

    def slot_vacated(self, lease: SessionLease) -> None:
        """Free a lease's slot (its `SessionLease.vacate` calls this): the next session in the queue gets it.

        Args:
            lease: The lease, vacated now.
        """
        self._slots_taken -= 1
        self._uncount(lease.client)
        # A freed slot goes to the longest waiting session first, straight away,
        # so a session arriving meanwhile cannot take it.
        while self._queue and not self.full and not self._closing:
            ticket = self._queue.next()
            ticket.admit(self._new_lease(ticket.transport, ticket.on_close, ticket.client, counted=True))

    def _count(self, client: str | None) -> None:
        if client is not None and self.max_sessions_per_client is not None:
            self._per_client[client] = self._per_client.get(client, 0) + 1

    def _uncount(self, client: str | None) -> None:
        if client is not None and self.max_sessions_per_client is not None:
            held = self._per_client.get(client, 0) - 1
            if held > 0:
                self._per_client[client] = held
            else:
                self._per_client.pop(client, None)

    def over_quota(self, client: str | None) -> bool:
        """Whether ``client`` holds (or waits for) ``max_sessions_per_client`` sessions already.

        Args:
            client: Who asks (see `open`), or ``None`` (never over a quota).

        Returns:
            ``True`` if one more session would pass its quota.
        """
        quota = self.max_sessions_per_client
        return client is not None and quota is not None and self._per_client.get(client, 0) >= quota

    def lease_released(self, lease: SessionLease, *, vacated: bool) -> None:
        """Forget a lease (its `SessionLease.release` calls this), freeing its slot unless it was vacated before.

        Args:
            lease: The lease, released now.
            vacated: Whether its slot was freed already (`SessionLease.vacate`).
        """
        if self._leases.pop(lease.id, None) is not None and not vacated:
            self.slot_vacated(lease)
        if not self._leases and self._emptied is not None:
            self._emptied.set()
            self._emptied = None

    def notify_closing(self, callback: Callable[[], object]) -> Callable[[], None]:
        """Have ``callback`` called once the server starts stopping (`close_all`), unless it is forgotten first.

        For what lasts beyond its sessions, which `close_all` cannot ask to end:
        a link, with no session left or waiting for its client to come back.
        Called at once if the server is stopping already.

        Args:
            callback: Called with no argument, in `close_all`'s task; it must not block.

        Returns:
            What forgets ``callback``; call it once it is no longer wanted.
        """
        if self._closing:
            callback()
            return _nothing
        self._on_closing.add(callback)
        return functools.partial(self._on_closing.discard, callback)

    async def wait_empty(self) -> None:
        """Return once every lease is released: no session is left, nor an environment closing."""
        while self._leases:
            if self._emptied is None:
                self._emptied = anyio.Event()
            await self._emptied.wait()

    def idle_timeout_of(self, transport: str) -> float | None:
        """The idle timeout of a transport's sessions: the shorter of the registry's and its own.

        Args:
            transport: The transport's name.

        Returns:
            Seconds, or ``None`` if its sessions are never reaped.
        """
        timeouts = [
            timeout
            for timeout in (self.session_idle_timeout, self.transport_idle_timeouts.get(transport))
            if timeout is not None
        ]
        return min(timeouts) if timeouts else None

    def capacity_reached_message(self, client: str | None = None) -> str:
        """What a client turned away now is told, worded as the reference words it (or about its quota).

        Args:
            client: Who was turned away, if known: a client over its quota is told so.

        Returns:
            The message, with the sessions active and the limit.
        """
        if self.over_quota(client):
            return (
                f"Client at its quota: it holds {self.max_sessions_per_client} sessions, "
                f"the most one client may (server: {self.active}/{self.max_sessions} sessions active)."
            )
        return f"Server at capacity: {self.active}/{self.max_sessions} sessions active. Cannot accept new connections."

    def capacity_reached_frame(self, dialect: Dialect, client: str | None = None) -> bytes:
        """The ``CAPACITY_REACHED`` error frame for a client turned away now.

        Args:
            dialect: The dialect of the client's channel.
            client: Who was turned away, if known (see `capacity_reached_message`).

        Returns:
            The encoded frame: `capacity_reached_message`, ``active_sessions`` and ``max_sessions``.
        """
        return encode_fatal_error(
            dialect,
            "CAPACITY_REACHED",
            self.capacity_reached_message(client),
            active_sessions=self.active,
            max_sessions=self.max_sessions,
        )

    def leases(self) -> list[SessionLease]:
        """Return the leases held now, oldest first.

        Returns:
            A snapshot: a new list, which later changes do not touch.
        """
        return list(self._leases.values())

    def open(
        self,
        *,
        transport: str = "websocket",
        on_close: Callable[[], object] | None = None,
        client: str | None = None,
    ) -> SessionLease | None:
        """Take a slot for a new session.

        Args:
            transport: Which transport the session runs on, for logs and listings.
            on_close: Called (at most once, with no arguments, on the event loop)
                to end the session while it waits for its client: when it has
                been idle too long, or the server shuts down. It should end the
                session at once, e.g. ``cancel_scope.cancel``, and must not block.
            client: Who asks (its token, or its address: see
                `transports.admission._guard.client_of`), for ``max_sessions_per_client``;
                ``None`` counts toward no quota.

        Returns:
            The lease, idle from now; or ``None`` when `max_sessions` are open
            already, or the client is at its quota (then tell the client
            ``CAPACITY_REACHED``: `capacity_reached_frame`).
        """
        lease = self._take(transport, on_close, client)
        if lease is None:
            self.refused[transport] += 1
        return lease

    def _take(self, transport: str, on_close: Callable[[], object] | None, client: str | None) -> SessionLease | None:
        if self.full or self._queue or self.over_quota(client):  # with sessions queued, a slot is theirs first
            return None
        return self._new_lease(transport, on_close, client)

    def _new_lease(
        self, transport: str, on_close: Callable[[], object] | None, client: str | None, *, counted: bool = False
    ) -> SessionLease:
        lease = SessionLease(
            self,
            next(self._ids),
            transport,
            on_close,
            self.clock.now(),
            idle_timeout=self.idle_timeout_of(transport),
            client=client,
        )
        self._leases[lease.id] = lease
        self._slots_taken += 1
        if not counted:  # a queued session was counted when it joined the queue
            self._count(client)
        self.opened[transport] += 1
        return lease

    @property
    def queued(self) -> int:
        """The number of sessions waiting in `admit` for a slot now."""
        return len(self._queue)

    def enqueue(
        self,
        *,
        transport: str = "websocket",
        on_close: Callable[[], object] | None = None,
        client: str | None = None,
    ) -> QueueTicket | None:
        """Join the queue for a slot, at its end; for a session that `open` refused while a queue is allowed.

        Wait for the ticket's ``admitted``, bounded by `queue_timeout`; give
        it back with `leave` if it is not wanted any more (the client went, the
        wait ran out), which also releases a lease it was handed meanwhile.

        Args:
            transport: As for `open`.
            on_close: As for `open`.
            client: As for `open`.

        Returns:
            The ticket; ``None`` if there is no queue (no `queue_timeout`), the
            server is closing, or the client is at its quota.
        """
        if self.queue_timeout is None or self._closing or self.over_quota(client):
            return None
        ticket = self._queue.join(transport, on_close, client)
        self._count(client)
        return ticket

    def open_or_enqueue(
        self,
        *,
        transport: str = "websocket",
        on_close: Callable[[], object] | None = None,
        client: str | None = None,
    ) -> SessionLease | QueueTicket | None:
        """`open`, or else `enqueue`: a lease now, a place in the queue, or ``None`` (turned away).

        Args:
            transport: As for `open`.
            on_close: As for `open`.
            client: As for `open`.

        Returns:
            The lease, the ticket (wait for it with `wait_admitted`), or ``None``.
        """
        lease = self._take(transport, on_close, client)
        if lease is not None:
            return lease
        ticket = self.enqueue(transport=transport, on_close=on_close, client=client)
        if ticket is None:
            self.refused[transport] += 1
        return ticket

    def position(self, ticket: QueueTicket) -> int:
        """Where a ticket stands in the queue: 1 for the next admitted, 0 once it has left it."""
        return self._queue.position(ticket)

    def leave(self, ticket: QueueTicket) -> None:
        """Give a ticket back: out of the queue, or, if it was admitted, its lease released (idempotent)."""
        if ticket.lease is not None:
            lease, ticket.lease = ticket.lease, None
            lease.release()
        elif self._queue.remove(ticket):
            self._uncount(ticket.client)

    async def admit(
        self,
        *,
        transport: str = "websocket",
        on_close: Callable[[], object] | None = None,
        client: str | None = None,
    ) -> SessionLease | None:
        """Take a slot for a new session, waiting up to `queue_timeout` for one if all are taken.

        Sessions waiting are admitted in the order they came, each as soon as a
        slot is released. Without a `queue_timeout` it is `open`. Cancel it to
        stop waiting (the client went): its place is given up.

        Args:
            transport: As for `open`.
            on_close: As for `open`.
            client: As for `open`.

        Returns:
            The lease; or ``None`` if no slot came free in time, or the client
            is at its quota (tell the client ``CAPACITY_REACHED``, as for `open`).
        """
        taken = self.open_or_enqueue(transport=transport, on_close=on_close, client=client)
        if not isinstance(taken, QueueTicket):
            return taken
        return await self.wait_admitted(taken)

    async def wait_admitted(self, ticket: QueueTicket, timeout: float | None = None) -> SessionLease | None:
        """Wait for a ticket's lease, up to ``timeout`` (`queue_timeout` by default); give the ticket back if none came.

        Cancelled (the client went, the server stops), it gives the ticket back too.

        Args:
            ticket: From `enqueue`.
            timeout: Seconds to wait; `queue_timeout` when ``None``.

        Returns:
            The lease, now the caller's; ``None`` if none came in time (the ticket is given back).
        """
        try:
            with self.clock.move_on_after(self.queue_timeout if timeout is None else timeout):
                await ticket.admitted.wait()
        except BaseException:
            self.leave(ticket)
            raise
        lease, ticket.lease = ticket.lease, None
        if lease is None:
            self.refused[ticket.transport] += 1
            self.leave(ticket)
        return lease

    def expire_idle(self, now: float | None = None) -> list[SessionLease]:
        """Expire every session idle for longer than its idle timeout (see `idle_timeout_of`), unless connected.

        Args:
            now: The clock's current reading; read from `clock` when omitted.

        Returns:
            The leases asked to close by this call (with `IDLE_TIMEOUT_REASON`).
        """
        if self.session_idle_timeout is None and not self.transport_idle_timeouts:
            return []
        if now is None:
            now = self.clock.now()
        expired = []
        for lease in list(self._leases.values()):
            idle_since, timeout = lease.idle_since, lease.idle_timeout
            if (
                not lease.vacated
                and not lease.connected
                and lease.close_reason is None
                and idle_since is not None
                and timeout is not None
                and now - idle_since > timeout
            ):
                logger.info("session %d (%s) idle for %.1f s: closing it", lease.id, lease.transport, now - idle_since)
                lease.request_close(IDLE_TIMEOUT_REASON)
                expired.append(lease)
        return expired

    def may_abandon(self) -> bool:
        """Whether a plain step given up on may be abandoned to its thread (fewer than ``max_sessions`` are).

        Returns:
            ``False`` once `openenv.server.abandoned_calls` reaches ``max_sessions``:
            then a session given up on waits for its step, keeping its slot.
        """
        return self.max_sessions is None or abandoned_calls() < self.max_sessions

    def watch_steps(self, now: float | None = None) -> list[SessionLease]:
        """Look at the requests in hand: tell endpoints of long ones, give up on those past their bounds.

        A request busy for `LONG_STEP` seconds gets its lease's `SessionLease.on_long_step`
        called (once). The registry gives up (`SessionLease.give_up`) on one
        that ran past `step_timeout` (`STEP_TIMEOUT_REASON`), and on one
        whose client, on a transport that notes it (`SessionLease.seen`), has
        not asked for anything for longer than the lease's idle timeout
        (`CLIENT_GONE_REASON`). (The endpoint abandons a plain step only
        if `may_abandon`: else its session waits for the step, keeping its slot.)

        Args:
            now: The clock's current reading; read from `clock` when omitted.

        Returns:
            The leases given up on by this call.
        """
        if now is None:
            now = self.clock.now()
        given_up = []
        step_timeout = self.step_timeout
        for lease in list(self._leases.values()):
            busy_since = lease.busy_since
            if busy_since is None or lease.vacated or lease.given_up:
                continue
            if not lease.long_step_noticed and now - busy_since >= LONG_STEP:
                lease.long_step_noticed = True
                callback = lease.on_long_step
                if callback is not None:
                    try:
                        callback()
                    except Exception:
                        logger.exception("watching session %d's long request failed", lease.id)
            reason = None
            if step_timeout is not None and now - busy_since > step_timeout:
                reason = STEP_TIMEOUT_REASON
            elif (
                lease.seen_at is not None
                and lease.idle_timeout is not None
                and now - max(lease.seen_at, busy_since) > lease.idle_timeout
            ):
                reason = CLIENT_GONE_REASON
            if reason is None:
                continue
            logger.warning(
                "session %d (%s): %s after %.1f s: ending it", lease.id, lease.transport, reason, now - busy_since
            )
            if lease.give_up(reason):
                given_up.append(lease)
        return given_up

    def reopen(self) -> None:
        """Take sessions again: the app is served anew after a server that ran it stopped (`close_all`)."""
        self._closing = False

    def close_all(self, reason: str = SHUTDOWN_REASON) -> None:
        """Ask every session to end (see `SessionLease.request_close`): the server is stopping.

        Args:
            reason: Why, for the clients and the logs.
        """
        for lease in list(self._leases.values()):
            if not lease.vacated:  # the others are over already, their environments closing
                lease.request_close(reason)
        self._closing = True
        for callback in list(self._on_closing):
            callback()
        self._on_closing.clear()
        for ticket in self._queue.turn_away():  # sessions still waiting for a slot are turned away
            self._uncount(ticket.client)

    def cut_all(self, reason: str = SHUTDOWN_REASON) -> int:
        """End every session now, busy ones too (see `SessionLease.cut`): the shutdown's grace is over.

        Args:
            reason: Why, for the clients and the logs, where no reason was given before.

        Returns:
            How many sessions were still there to cut.
        """
        self.close_all(reason)
        leases = [lease for lease in self._leases.values() if not lease.vacated]
        for lease in leases:
            lease.cut(reason)
        return len(leases)

    @property
    def reap_interval(self) -> float | None:
        """How often `run_reaper` looks for idle sessions (``None`` without an idle timeout)."""
        timeouts = [*self.transport_idle_timeouts.values()]
        if self.session_idle_timeout is not None:
            timeouts.append(self.session_idle_timeout)
        if not timeouts:
            return None
        timeout = min(timeouts)
        return min(max(timeout * _REAP_FRACTION, _REAP_MIN_INTERVAL), _REAP_MAX_INTERVAL)

    async def run_reaper(self) -> None:
        """Expire idle sessions, and watch long requests (`watch_steps`), until cancelled.

        Run it as a task for the app's lifetime (the app's lifespan does). A
        session is ended at most `reap_interval` seconds after it passed the
        idle timeout; requests are looked at every `LONG_STEP` seconds at least.
        """
        interval = min(self.reap_interval or LONG_STEP, LONG_STEP)
        while True:
            await self.clock.sleep(interval)
            self.expire_idle()
            self.watch_steps()


class GivingUp:
    """How an endpoint lets the registry give up on a session's request (`SessionLease.give_up`): end it now.

    It becomes the lease's `SessionLease.on_give_up`: the session's task is
    cancelled (``stop``), and a plain step in hand is abandoned to its
    thread (`openenv.server.ServerSession.abandon`), unless abandoned steps
    already hold as many threads as the server has slots
    (`SessionRegistry.may_abandon`): then the session waits for the step.

    Args:
        registry: The registry.
        lease: The session's lease.
        stop: Ends the session now (cancels the scope it runs in), as its lease's ``on_close`` does.
    """

    def __init__(self, registry: SessionRegistry, lease: SessionLease, stop: Callable[[], object]) -> None:
        self.registry = registry
        self.stop = stop
        self.session: ServerSession | None = None
        lease.on_give_up = self.give_up

    def hosted(self, session: ServerSession) -> None:
        """`host_session`'s ``on_session``: the session whose steps may be given up on."""
        self.session = session

    def give_up(self) -> None:
        """End the session: cancel it, and abandon a plain step in hand if the registry allows."""
        self.stop()
        if self.session is not None and self.registry.may_abandon():
            self.session.abandon()
