"""One session's slot in the app's `transports.admission._sessions.SessionRegistry`: a `SessionLease`.

The lease keeps the session's clocks (idle since, busy since, last seen) and how
the registry asks it to end (`SessionLease.request_close`, `SessionLease.cut`,
`SessionLease.give_up`); the registry decides when. The session gives its slot
back in two steps: `SessionLease.vacate` once it is over, `SessionLease.release`
once its environment is closed.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Protocol

from openenv import Clock

__all__ = ["SessionLease", "Slots"]

logger = logging.getLogger("openenv.server")


class Slots(Protocol):
    """What a lease tells the registry that made it (`transports.admission._sessions.SessionRegistry`)."""

    @property
    def clock(self) -> Clock:
        """Where the lease's times are read."""
        ...

    def slot_vacated(self, lease: SessionLease) -> None:
        """The lease's slot is free for another session (`SessionLease.vacate`)."""
        ...

    def lease_released(self, lease: SessionLease, *, vacated: bool) -> None:
        """The lease is given back (`SessionLease.release`); ``vacated``: its slot was freed before."""
        ...


class SessionLease:
    """One session's slot in a `transports.admission._sessions.SessionRegistry`; give it back with `release`.

    The idle clock runs from the last `touch` until the next `mark_busy`: an
    endpoint touches the lease when it starts waiting for the client's next
    request, and marks it busy when one arrives, so a session whose environment
    is working on a long step is never reaped as idle. Nor is one whose client
    holds a connection open to it (`connected`).

    Attributes:
        id: A number unique within the registry (not a secret: transports that
            need an unguessable session token make their own).
        transport: Which transport holds the session (``"websocket"``, ...).
        idle_since: When the session last went idle, or ``None`` while it is busy.
        close_reason: Why the registry asked the session to end, or ``None``
            (`transports.admission._sessions.IDLE_TIMEOUT_REASON`,
            `transports.admission._sessions.SHUTDOWN_REASON`, ...).
        idle_timeout: Seconds it may stay idle before the reaper ends it
            (``None``: never), as its registry and transport set it.
        connected: Whether its client holds a connection open to it (set by
            its endpoint); the reaper leaves it alone while it does.
        client: Who holds it, for the per-client quota (see `transports.admission._guard.client_of`), or ``None``.

    Args:
        registry: The registry that made it (leases come from `transports.admission._sessions.SessionRegistry.open`).
        lease_id: Its number.
        transport: Which transport holds the session.
        on_close: Called once when the registry asks the session to end, or ``None``.
        now: The registry clock's reading when it was taken.
        idle_timeout: Seconds it may stay idle (``None``: never).
        client: Who holds it, or ``None``.
    """

    __slots__ = (
        "_on_close",
        "_registry",
        "_vacated",
        "busy_since",
        "client",
        "close_reason",
        "connected",
        "given_up",
        "id",
        "idle_since",
        "idle_timeout",
        "long_step_noticed",
        "on_give_up",
        "on_long_step",
        "seen_at",
        "transport",
    )

    def __init__(
        self,
        registry: Slots,
        lease_id: int,
        transport: str,
        on_close: Callable[[], object] | None,
        now: float,
        idle_timeout: float | None = None,
        client: str | None = None,
    ) -> None:
        self._registry: Slots | None = registry
        self._on_close = on_close
        self._vacated = False
        self.client = client
        self.id = lease_id
        self.transport = transport
        self.idle_timeout = idle_timeout
        self.idle_since: float | None = now
        self.close_reason: str | None = None
        self.connected = False
        self.busy_since: float | None = None  # when the request in hand began
        self.long_step_noticed = False  # on_long_step was called for the request in hand
        self.given_up = False
        self.seen_at: float | None = None  # when the client last asked (transports that cannot see it leave)
        self.on_long_step: Callable[[], object] | None = None
        """Called (on the event loop) once a request has run ``LONG_STEP`` seconds: watch the client."""
        self.on_give_up: Callable[[], object] | None = None
        """Called once when the registry gives up on the request in hand: end the session now, abandoning it."""

    @property
    def released(self) -> bool:
        """Whether the slot has been given back."""
        return self._registry is None

    def touch(self, now: float | None = None) -> None:
        """Record activity now: the session is idle from this moment (it waits for its client).

        Args:
            now: The registry clock's time, when the caller read it already (a
                batch answers many sessions at once).
        """
        registry = self._registry
        if registry is not None:
            self.idle_since = registry.clock.now() if now is None else now
        self.busy_since = None
        self.long_step_noticed = False

    def mark_busy(self) -> None:
        """Stop the idle clock until the next `touch` (a request is being handled)."""
        self.idle_since = None
        registry = self._registry
        if self.busy_since is None and registry is not None:
            self.busy_since = registry.clock.now()

    def seen(self) -> None:
        """Note that the client asked for something now (for a transport that cannot see it leave: HTTP)."""
        registry = self._registry
        if registry is not None:
            self.seen_at = registry.clock.now()

    def give_up(self, reason: str) -> bool:
        """End the session now, request in hand or not: call `on_give_up` once (an exception is logged).

        Args:
            reason: Why, for the client and the logs (the `close_reason`, unless one was set).

        Returns:
            Whether it gave up now (``False``: released, given up on before, or no `on_give_up`).
        """
        callback = self.on_give_up
        if self.given_up or self._registry is None or callback is None:
            return False
        self.given_up = True
        if self.close_reason is None:
            self.close_reason = reason
        try:
            callback()
        except Exception:
            logger.exception("giving up on session %d (%s) failed", self.id, reason)
        return True

    def idle_for(self, now: float | None = None) -> float:
        """Seconds the session has been idle (0 while it is busy or released).

        Args:
            now: The registry clock's current reading; read from it when omitted.

        Returns:
            The seconds since the last `touch`.
        """
        registry, idle_since = self._registry, self.idle_since
        if registry is None or idle_since is None:
            return 0.0
        return (registry.clock.now() if now is None else now) - idle_since

    def request_close(self, reason: str) -> None:
        """Ask the session to end; the first reason given sticks.

        An idle session's ``on_close`` callback is called now (once); a busy one
        is left to finish its request, and its endpoint ends it when it next goes
        idle (seeing `close_reason`). The slot stays taken until the endpoint
        releases it, once the environment is closed. An exception from the
        callback is logged, never raised.

        Args:
            reason: Why, for the client (a close frame's reason) and the logs.
        """
        if self.close_reason is not None or self._registry is None:
            return
        self.close_reason = reason
        if self.idle_since is None:
            return
        self._close_now("closing", reason)

    def cut(self, reason: str) -> None:
        """End the session now, busy or not: the server is stopping and its grace is over.

        As `request_close`, except that ``on_close`` is called whether or not
        the session is waiting for its client: a request in hand is cancelled
        (a plain environment's call still runs to its end on the session's
        thread; nobody waits for it). Where the endpoint set `on_give_up`, it
        is called instead (`give_up`): a plain step in hand is abandoned, so
        the session ends now. Idempotent.

        Args:
            reason: Why, if no reason was given before (the first one sticks).
        """
        if self._registry is None:
            return
        if self.close_reason is None:
            self.close_reason = reason
        if self.on_give_up is not None:  # its endpoint can also let a plain step's thread go
            self._on_close = None
            self.give_up(reason)
            return
        self._close_now("cutting", reason)

    def _close_now(self, doing: str, reason: str) -> None:
        """Call ``on_close`` once; an exception is logged (``doing``: what failed, for the log), never raised."""
        callback, self._on_close = self._on_close, None
        if callback is None:
            return
        try:
            callback()
        except Exception:
            logger.exception("%s session %d (%s) failed", doing, self.id, reason)

    @property
    def vacated(self) -> bool:
        """Whether the slot is free for another session (`vacate` or `release` was called)."""
        return self._vacated

    def vacate(self) -> None:
        """Free the slot for another session: this one is over, its environment is being closed.

        The lease stays in the registry (not counted in `transports.admission._sessions.SessionRegistry.active`)
        until `release`; idempotent.
        """
        registry = self._registry
        if self._vacated or registry is None:
            return
        self._vacated = True
        registry.slot_vacated(self)

    def release(self) -> None:
        """Give the slot back; idempotent, and safe after the registry has forgotten it."""
        registry, self._registry = self._registry, None
        self._on_close = None
        self.on_give_up = self.on_long_step = None
        if registry is not None:
            vacated, self._vacated = self._vacated, True
            registry.lease_released(self, vacated=vacated)

    def __repr__(self) -> str:
        state = "released" if self.released else ("busy" if self.idle_since is None else "idle")
        return f"<SessionLease {self.id} {self.transport} {state}>"
