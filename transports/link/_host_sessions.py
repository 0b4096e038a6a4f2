"""The sessions of one link, server side: each admitted to a slot of the registry, its environment built, and ended.

Each session of a link is admitted as a connection of its own would be: a slot
of the app's `transports.admission._sessions.SessionRegistry` (at once, after a
wait in its queue, or turned away with one fatal error frame), then its
environment, built on the event loop. It ends when its client closes or gives it
up, when the registry asks (idle too long, the server stopping, a call given
up), when the server fails it, or with the link: its client is told (an `End`),
its environment closed once nothing of it runs, and its slot given back.

`LinkSessions` is that bookkeeping; `transports.link._host.LinkHost` builds on
it what the sessions' frames do (dispatch, batches, the socket loan), and
supplies the three things ending and admission need of it: `LinkSessions._run_in_task`,
`LinkSessions._flush_soon` and `LinkSessions._count_waiting`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import anyio
import msgspec
from anyio.abc import TaskGroup
from websockets.frames import CloseCode

from openenv import Dialect
from openenv.server import ServerSession, SessionMetrics, factory_failed_frame
from transports.admission._lease import SessionLease
from transports.admission._sessions import SHUTDOWN_REASON, SessionRegistry, session_failed_frame
from transports.link._envelope import EnvelopeCodec
from transports.link._loan import Loan
from transports.link._state import ServerLinkState

__all__ = ["LinkSession", "LinkSessions"]

logger = logging.getLogger("openenv.server")


class LinkSession:
    """One session of a link, server side: its slot, its environment, and its frames waiting their turn."""

    __slots__ = ("_settled", "frames", "lease", "number", "running", "scope", "session")

    def __init__(self, number: int) -> None:
        self.number = number
        self.lease: SessionLease | None = None
        self.session: ServerSession | None = None
        # Received, not yet handled (this one is busy, or not admitted yet): mostly none or one, so a
        # list (an empty deque takes ten times its memory).
        self.frames: list[bytes] = []
        self.running = False  # a frame of this session is being handled outside the link's task
        self.scope: anyio.CancelScope | None = None  # the task handling its frames, or its wait for a slot
        self._settled: anyio.Event | None = None

    def stop_running(self) -> None:
        """Its frame is handled: nothing of the session runs outside the link's task now."""
        self.running = False
        settled, self._settled = self._settled, None
        if settled is not None:
            settled.set()

    async def wait_settled(self) -> None:
        """Return once nothing of the session runs (its environment may then be closed)."""
        while self.running:
            if self._settled is None:
                self._settled = anyio.Event()
            await self._settled.wait()


class LinkSessions:
    """The sessions of one link, admitted and ended: see the module's docstring.

    Args:
        factory: Builds one environment per session.
        registry: The app's session registry.
        dialect: The dialect of the sessions' frames.
        error_details: Whether error replies name the server's exceptions.
        transport: The transport's name, for the registry's leases (``"websocket"``, ``"http"``).
        metrics: Where the sessions' requests are counted, or ``None``.
        client: Who holds the link (`transports.admission._guard.client_of`): its
            sessions count toward that client's quota; ``None`` for nobody's.

    Attributes:
        codec: The link's envelope codec.
        state: The link's numbering, and the entries waiting to be sent.
        shutting_down: Its last session was ended because the server stops.
        on_shutting_down: Called once `shutting_down` turns true (its sessions'
            `End` entries are posted then, not yet sent), or ``None``.
    """

    def __init__(
        self,
        factory: Callable[[], Any],
        *,
        registry: SessionRegistry,
        dialect: Dialect,
        error_details: bool,
        transport: str,
        metrics: SessionMetrics | None = None,
        client: str | None = None,
    ) -> None:
        self.dialect = dialect
        self.codec = EnvelopeCodec(dialect.encoding)
        self.state = ServerLinkState(self.codec)
        self._factory = factory
        self._registry = registry
        self._error_details = error_details
        self._transport = transport
        self._metrics = metrics
        self._client = client
        self._sessions: dict[int, LinkSession] = {}
        self._tasks: TaskGroup | None = None  # where the sessions' tasks run, while the link is hosted
        self._loan: Loan | None = None  # the socket lent to the lone session's thread, while it is
        self.on_shutting_down: Callable[[], object] | None = None
        self.shutting_down = False

    @property
    def sessions(self) -> int:
        """How many sessions are open on the link."""
        return len(self._sessions)

    def release_all(self) -> None:
        """Give back every slot still held (after a failure of the carrier)."""
        for session in self._sessions.values():
            if session.lease is not None:
                session.lease.release()

    # -- what the host supplies ------------------------------------------------------------

    def _run_in_task(self, session: LinkSession) -> None:
        """Handle the session's waiting frames in a task of its own (the host's)."""
        raise NotImplementedError

    async def _flush_soon(self) -> None:
        """Send what is posted once the other tasks of this turn have posted theirs (the host's)."""
        raise NotImplementedError

    def _count_waiting(self, change: int) -> None:
        """Count frames held for busy sessions, across the link (the host's: it stops reading at too many)."""
        raise NotImplementedError

    # -- admission and ending ----------------------------------------------------------------

    def _open(self, number: int) -> None:
        """A client opens a session on channel ``number``: admit it, or turn it away."""
        session = self._sessions[number] = LinkSession(number)
        registry = self._registry
        client = self._client
        lease = registry.open(transport=self._transport, on_close=lambda: self._asked_to_end(session), client=client)
        if lease is not None:
            self._build(session, lease)
        elif registry.queue_timeout is not None and not registry.over_quota(client):
            assert self._tasks is not None
            self._tasks.start_soon(self._admit, session)
        else:
            self._turn_away(session, registry.capacity_reached_frame(self.dialect, client))

    async def _admit(self, session: LinkSession) -> None:
        """Wait in the registry's queue for a slot; then serve what the session sent meanwhile."""
        registry, client = self._registry, self._client
        lease = None
        session.scope = scope = anyio.CancelScope()  # `_end` gives the place up: its client left it, or the link ended
        with scope:
            lease = await registry.admit(
                transport=self._transport, on_close=lambda: self._asked_to_end(session), client=client
            )
        session.scope = None
        if session.number not in self._sessions:  # ended meanwhile
            if lease is not None:
                lease.release()
            return
        if lease is None:
            self._turn_away(session, registry.capacity_reached_frame(self.dialect, client))
        else:
            self._build(session, lease)
            if session.frames and not session.running:
                self._run_in_task(session)
        await self._flush_soon()

    def _build(self, session: LinkSession, lease: SessionLease) -> None:
        """Build the session's environment (on the event loop, as a connection of its own would)."""
        session.lease = lease
        # Never reaped as idle: the link's own bounds (its resume wait, an HTTP link's silence) end it.
        lease.connected = True
        lease.on_give_up = lambda: self._give_up(session)
        try:
            env = self._factory()
        except Exception as exc:
            logger.exception("environment factory failed")
            frame = factory_failed_frame(self.dialect, self._factory, exc, error_details=self._error_details)
            self._turn_away(session, frame)
            return
        session.session = ServerSession(
            env, dialect=self.dialect, error_details=self._error_details, on_end=lease.vacate, metrics=self._metrics
        )

    def _turn_away(self, session: LinkSession, frame: bytes) -> None:
        """End a session that never started with one fatal error frame (``CAPACITY_REACHED``, ``FACTORY_ERROR``)."""
        channel = self.state.channels.get(session.number)
        if channel is not None:
            self.state.post(channel, msgspec.Raw(frame))
        self._count_waiting(-len(session.frames))
        session.frames.clear()
        self._end(session, "the session could not start", CloseCode.NORMAL_CLOSURE)

    def _asked_to_end(self, session: LinkSession) -> None:
        """The registry asks a session to end: idle too long, the server stopping (cut, even when busy)."""
        lease = session.lease
        reason = lease.close_reason if lease is not None else None
        if session.running and session.scope is not None:
            # Cut while a call of its runs in its task: cancel it (a plain call runs on to its end
            # on the session's thread; nobody waits for it).
            session.scope.cancel()
        self._ended_by_server(session, reason or SHUTDOWN_REASON)

    def _give_up(self, session: LinkSession) -> None:
        """The registry gives up on the session's call in hand (the step timeout, the shutdown's cut): end it now.

        Its task is cancelled; a plain call is abandoned to its thread unless
        abandoned calls already hold as many threads as the server has slots
        (`SessionRegistry.may_abandon`): then the session waits for it.
        """
        if session.scope is not None:
            session.scope.cancel()
        if session.session is not None and self._registry.may_abandon():
            session.session.abandon()
        lease = session.lease
        self._ended_by_server(session, (lease.close_reason if lease is not None else None) or SHUTDOWN_REASON)

    def _ended_by_server(self, session: LinkSession, reason: str) -> None:
        """End a session the server ends (see `_end`), and send its `End` soon."""
        if session.number in self._sessions:
            self._end(session, reason, CloseCode.GOING_AWAY)
            if self._tasks is not None:
                self._tasks.start_soon(self._flush_soon)
        if reason == SHUTDOWN_REASON and not self._sessions and not self.shutting_down:
            self.shutting_down = True
            if self.on_shutting_down is not None:
                self.on_shutting_down()

    def _leave(self, session: LinkSession, reason: str) -> None:
        """The link is over: end the session; one with a call in hand is given up on, as its client has gone."""
        lease = session.lease
        if session.running and lease is not None and lease.give_up(reason):
            return
        self._end(session, reason, CloseCode.GOING_AWAY)

    def _end(self, session: LinkSession, reason: str, code: int) -> None:
        """End a session: tell the client (an `End`), close its environment, give its slot back."""
        if self._sessions.pop(session.number, None) is None:
            return
        if self._loan is not None:
            self._loan.stop()  # the thread lets go of the link's numbering and socket before they change
        if session.lease is None and session.scope is not None:
            session.scope.cancel()  # still waiting in the queue for a slot: it gives its place up
        self.state.end(session.number, reason, code)
        self._count_waiting(-len(session.frames))
        session.frames.clear()
        if self._tasks is not None:
            self._tasks.start_soon(self._close_session, session)
        elif session.lease is not None:
            session.lease.release()

    async def _close_session(self, session: LinkSession) -> None:
        with anyio.CancelScope(shield=True):
            try:
                await session.wait_settled()  # a step in flight finishes first, as on a connection of its own
                if session.session is not None:
                    await session.session.aclose()
            finally:
                if session.lease is not None:
                    session.lease.release()

    def _fail(self, session: LinkSession) -> None:
        """End a session the server failed (a bug, not the environment): one ``SESSION_ERROR``, then `End`."""
        session.stop_running()
        channel = self.state.channels.get(session.number)
        if channel is not None:
            self.state.post(channel, msgspec.Raw(session_failed_frame(self.dialect)))
        self._end(session, "the session failed on the server", CloseCode.INTERNAL_ERROR)
