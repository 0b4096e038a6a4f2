"""The server end of a link (``openenv.v2.*``): many sessions over one connection, stepped as a batch.

A client that selects a link subprotocol opens sessions on the connection with
`Open` entries and sends their frames in envelopes (`transports._envelope`).
`ServerLink` admits each session (a slot of the registry, as a connection of its
own would take), builds its environment, and answers each envelope as one batch:

- an ``async`` environment's reset or step runs in the link's own task, at once,
  when it does not wait (`openenv._inline`): no task, no wake-up per session.
  The first time one waits, the server learns that this environment's steps
  wait: that step is finished there (the link waits for it, once), and from
  then on each session of the environment runs in a task of its own, so that
  waiting steps run concurrently;
- a plain (``def``) environment's calls go to each session's own thread all at
  once, and the link is woken once, when they are done (`openenv._worker.CallBatch`).
  One that takes longer than `BATCH_WAIT` does not hold the others' replies:
  it finishes in a task of its own, and its reply follows;
- every other frame (a close, an MCP call, a frame that does not decode) goes
  through `openenv.server.ServerSession.handle`, in order with the session's others.

The replies of a batch, and those that complete in one turn of the event loop,
leave as one message. Each session keeps today's guarantees: its frames are
handled in order, one at a time; one session's bad input, crash or slow step
reaches no other; its slot, idle timeout and capacity refusal are its own.

The link outlives a dropped connection for ``resume_timeout`` seconds: a new
connection presenting its token (``OpenEnv-Resume``) takes every session over,
and each side sends again what the other lacks (`transports._link_state`).
A connection closed on purpose ends every session still open on it.
"""

from __future__ import annotations

import contextlib
import logging
import secrets
from collections import deque
from collections.abc import Callable
from typing import Any, Final

import anyio
import anyio.lowlevel
import msgspec
from anyio.abc import TaskGroup

from openenv import Dialect
from openenv._inline import Suspended, finish, start
from openenv._worker import Call, CallBatch, wait_for
from openenv.server import ServerSession, encode_fatal_error, factory_name

from .._asgi import Receive, Send
from .._envelope import LINK_CHANNEL, EnvelopeCodec, Hello, Open, Resume
from .._link_state import LinkProtocolError, ServerLinkState
from .._sessions import SHUTDOWN_REASON, SessionLease, SessionRegistry, session_failed_frame

__all__ = ["BATCH_WAIT", "DEFAULT_RESUME_TIMEOUT", "MAX_WAITING_FRAMES", "LinkConnection", "ServerLink"]

logger = logging.getLogger("openenv.server")

DEFAULT_RESUME_TIMEOUT: Final = 30.0
"""Seconds a link's sessions wait for their client to come back after its connection drops."""

BATCH_WAIT: Final = 0.002
"""Seconds the server waits for a batch's plain steps before it sends the replies of those done."""

MAX_WAITING_FRAMES: Final = 4096
"""Frames a link may hold for sessions still busy before the server stops reading it."""

# The close codes ASGI servers report for a connection that dropped without a
# closing handshake (uvicorn says 1005, hypercorn 1006): the client may come back.
_DROPPED = frozenset({1005, 1006})

# WebSocket close codes (RFC 6455).
_NORMAL_CLOSURE = 1000
_GOING_AWAY = 1001
_PROTOCOL_ERROR = 1002
_UNSUPPORTED_DATA = 1003
_INTERNAL_ERROR = 1011

_HIDDEN_FACTORY_ERROR = "Failed to create environment (details are in the server's log)"


class LinkConnection:
    """One WebSocket connection of a link: its ASGI callables, until it is let go.

    Args:
        receive: The connection's ASGI ``receive``.
        send: The connection's ASGI ``send``.
    """

    __slots__ = ("disconnected", "receive", "released", "send")

    def __init__(self, receive: Receive, send: Send) -> None:
        self.receive = receive
        self.send = send
        self.released = anyio.Event()
        self.disconnected = False


class _Session:
    """One session of the link: its slot, its environment, and its frames waiting their turn."""

    __slots__ = ("_settled", "frames", "lease", "number", "running", "session")

    def __init__(self, number: int) -> None:
        self.number = number
        self.lease: SessionLease | None = None
        self.session: ServerSession | None = None
        self.frames: deque[bytes] = deque()  # received, not yet handled (this one is busy, or not admitted yet)
        self.running = False  # a frame of this session is being handled outside the link's task
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


class ServerLink:
    """The server's side of one link: its sessions, and whichever connection carries them now.

    Args:
        factory: Builds one environment per session.
        registry: The app's session registry.
        dialect: The dialect of the sessions' frames (the link subprotocol's).
        error_details: Whether error replies name the server's exceptions.
        resume_timeout: Seconds the sessions wait for their client after the connection drops.
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
        on_end: Callable[[ServerLink], object],
    ) -> None:
        self.token = secrets.token_urlsafe(32)
        self.dialect = dialect
        self._factory = factory
        self._registry = registry
        self._error_details = error_details
        self._resume_timeout = resume_timeout
        self._on_end = on_end
        self._binary = dialect.encoding == "msgpack"
        self._codec = EnvelopeCodec(dialect.encoding)
        self._state = ServerLinkState(self._codec)
        self._sessions: dict[int, _Session] = {}
        self._tasks: TaskGroup | None = None
        self._current: LinkConnection | None = None
        self._incoming: LinkConnection | None = None  # a connection taking the link over
        self._arrived = anyio.Event()  # set when `_incoming` is set
        self._send_lock = anyio.Lock(fast_acquire=True)
        self._flush_soon_pending = False
        self._waiting_frames = 0  # frames held for busy sessions, across the link
        self._room: anyio.Event | None = None  # set when they fall below MAX_WAITING_FRAMES
        self._suspends = False  # the environment's calls wait: each session runs in a task of its own
        self._close_code = _NORMAL_CLOSURE
        self._close_reason = ""

    # -- the connections ---------------------------------------------------------------

    async def run(self, first: LinkConnection) -> None:
        """Host the link on ``first`` and on every connection that takes it over, until it is over.

        Run by the task of the connection that opened the link; the sessions'
        tasks are its children. Returns once no connection will come back (its
        last one closed on purpose, or none came back in time) and every
        session's environment is closed; the connection in use then is closed.
        """
        reason = "the client is gone"
        try:
            async with anyio.create_task_group() as tasks:
                self._tasks = tasks
                try:
                    self._state.post_control(LINK_CHANNEL, Hello(token=self.token, resume_timeout=self._resume_timeout))
                    connection: LinkConnection | None = first
                    while connection is not None:
                        self._current = connection
                        if await self._serve(connection):
                            reason = "the client closed the connection"
                            break
                        connection = await self._next_connection(connection)
                finally:
                    self._end_all(reason)
        except Exception:
            logger.exception("a WebSocket link failed")
            self._close_code, self._close_reason = _INTERNAL_ERROR, "link error"
        finally:
            self._on_end(self)
            for session in self._sessions.values():  # only after a failure: else all have ended
                if session.lease is not None:
                    session.lease.release()
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
        message must be `Resume`.
        """
        incoming, self._incoming = self._incoming, connection
        if incoming is not None:
            incoming.released.set()  # a connection that was waiting to take over: this one wins
        self._arrived.set()
        current = self._current
        if current is not None and not current.disconnected:
            await _close(current.send, _GOING_AWAY, "the link moved to another connection")
        await connection.released.wait()

    async def _next_connection(self, dropped: LinkConnection) -> LinkConnection | None:
        """Let a dropped connection go and wait for one that takes the link over (``None``: none came)."""
        dropped.released.set()
        self._current = None
        with anyio.move_on_after(self._resume_timeout):
            while self._incoming is None:
                self._arrived = anyio.Event()
                await self._arrived.wait()
        incoming, self._incoming = self._incoming, None
        return incoming

    async def _serve(self, connection: LinkConnection) -> bool:
        """Read envelopes from ``connection`` and answer them until it ends; whether it ended on purpose."""
        binary = self._binary
        await self._flush()  # the Hello, or what a connection that takes over lacks
        while True:
            if self._waiting_frames >= MAX_WAITING_FRAMES:
                self._room = anyio.Event()
                await self._room.wait()  # the client sends faster than the sessions step: hold it back
            if self._incoming is not None:
                return False  # another connection takes the link over
            message = await connection.receive()
            kind = message["type"]
            if kind == "websocket.disconnect":
                connection.disconnected = True
                return self._incoming is None and message.get("code", 1005) not in _DROPPED
            if kind != "websocket.receive":
                continue
            data = message.get("bytes") if binary else message.get("text")
            if data is None:
                expected = "binary" if binary else "text"
                self._close_code, self._close_reason = _UNSUPPORTED_DATA, f"a link's messages are {expected}"
                return True
            try:
                events = self._state.take(self._codec.decode(data if binary else data.encode()))
            except (msgspec.DecodeError, LinkProtocolError) as exc:
                self._close_code, self._close_reason = _PROTOCOL_ERROR, f"not a link message: {exc}"[:120]
                return True
            await self._dispatch(events)
            await self._flush()

    # -- the sessions --------------------------------------------------------------------

    async def _dispatch(self, events: list[tuple[int, Any]]) -> None:
        """Act on one envelope's entries, in order; the replies of those answered at once are posted."""
        batch: _Batch | None = None
        sessions = self._sessions
        for number, item in events:
            if type(item) is msgspec.Raw:
                session = sessions.get(number)
                if session is None:
                    continue  # ended meanwhile: nobody to hand it to
                if session.running or session.frames or session.session is None:
                    session.frames.append(bytes(item))  # after those waiting, in order
                    self._count_waiting(1)
                    continue
                batch = await self._handle(session, bytes(item), batch)
            elif isinstance(item, Open):
                self._open(number)
            elif isinstance(item, Resume):
                self._state.resumed(item)
        if batch is not None:
            await self._collect(batch)

    async def _handle(self, session: _Session, frame: bytes, batch: _Batch | None) -> _Batch | None:
        """Handle one frame of an idle session: at once, on its thread within ``batch``, or in a task."""
        server_session = session.session
        assert server_session is not None
        assert session.lease is not None
        session.lease.mark_busy()
        if server_session.handles_on_thread:
            if batch is None:
                batch = _Batch()
            session.running = True
            batch.started.append((session, server_session.start_on_thread(batch.calls, frame), frame))
            return batch
        if self._suspends:
            session.frames.appendleft(frame)
            self._count_waiting(1)
            self._run_in_task(session)
            return batch
        outcome = start(server_session.handle(frame))
        if isinstance(outcome, Suspended):
            # This environment's calls wait: finish this one here, then give each session a task.
            self._suspends = True
            session.running = True
            try:
                outcome = await finish(outcome)
            finally:
                session.stop_running()
        self._replied(session, outcome)
        return batch

    async def _collect(self, batch: _Batch) -> None:
        """Post the replies of a batch's plain calls; those still running finish in tasks of their own."""
        await batch.calls.wait(BATCH_WAIT)
        for session, call, frame in batch.started:
            if session.number not in self._sessions:
                session.stop_running()  # ended meanwhile: its reply has nobody to go to
                continue
            if not call.completed:
                self._run_in_task(session, call=call, frame=frame)
                continue
            try:
                reply = call.outcome()
            except Exception:
                logger.exception("a plain call failed on its session's thread")
                reply = session_failed_frame(self.dialect)
            if reply is None:  # not for the thread (a close, an MCP call): on the event loop, in order
                session.frames.appendleft(frame)
                self._count_waiting(1)
                self._run_in_task(session)
                continue
            session.stop_running()
            self._replied(session, reply)
            if session.frames and session.number in self._sessions:
                self._run_in_task(session)

    def _replied(self, session: _Session, reply: bytes | None) -> None:
        """Post a session's reply, and end the session if that was its close (or it was asked to end)."""
        server_session, lease = session.session, session.lease
        assert server_session is not None
        assert lease is not None
        channel = self._state.channels.get(session.number)
        if reply is not None and channel is not None:
            self._state.post(channel, msgspec.Raw(reply))
        if server_session.closed:
            self._end(session, "closed by the client", _NORMAL_CLOSURE)
            return
        lease.touch()  # waiting for the client again: the idle clock runs
        if lease.close_reason is not None:
            self._end(session, lease.close_reason, _GOING_AWAY)

    def _run_in_task(self, session: _Session, *, call: Call | None = None, frame: bytes = b"") -> None:
        """Handle the session's waiting frames in a task of its own; first, the ``call`` of ``frame`` on its thread."""
        assert self._tasks is not None
        session.running = True
        self._tasks.start_soon(self._run_session, session, call, frame)

    async def _run_session(self, session: _Session, call: Call | None, frame: bytes) -> None:
        server_session = session.session
        assert server_session is not None
        try:
            if call is not None:
                try:
                    reply = await wait_for(call)
                except Exception:
                    logger.exception("a plain call failed on its session's thread")
                    reply = session_failed_frame(self.dialect)
                if reply is None:
                    reply = await server_session.handle(frame)
                self._replied(session, reply)
            while session.frames and session.number in self._sessions:
                waiting = session.frames.popleft()
                self._count_waiting(-1)
                assert session.lease is not None
                session.lease.mark_busy()
                self._replied(session, await server_session.handle(waiting))
        finally:
            session.stop_running()
        await self._flush_soon()

    def _count_waiting(self, change: int) -> None:
        self._waiting_frames += change
        if change < 0 and self._room is not None and self._waiting_frames < MAX_WAITING_FRAMES:
            self._room.set()
            self._room = None

    def _open(self, number: int) -> None:
        """A client opens a session on channel ``number``: admit it, or turn it away."""
        session = self._sessions[number] = _Session(number)
        registry = self._registry
        lease = registry.open(transport="websocket", on_close=lambda: self._asked_to_end(session))
        if lease is not None:
            self._build(session, lease)
        elif registry.queue_timeout is not None:
            assert self._tasks is not None
            self._tasks.start_soon(self._admit, session)
        else:
            self._turn_away(session, registry.capacity_reached_frame(self.dialect))

    async def _admit(self, session: _Session) -> None:
        """Wait in the registry's queue for a slot; then serve what the session sent meanwhile."""
        lease = await self._registry.admit(transport="websocket", on_close=lambda: self._asked_to_end(session))
        if session.number not in self._sessions:  # the link ended meanwhile
            if lease is not None:
                lease.release()
            return
        if lease is None:
            self._turn_away(session, self._registry.capacity_reached_frame(self.dialect))
        else:
            self._build(session, lease)
            if session.frames and not session.running:
                self._run_in_task(session)
        await self._flush_soon()

    def _build(self, session: _Session, lease: SessionLease) -> None:
        """Build the session's environment (on the event loop, as a connection of its own would)."""
        session.lease = lease
        try:
            env = self._factory()
        except Exception as exc:
            logger.exception("environment factory failed")
            if self._error_details:
                message = f"Failed to create environment: {type(exc).__name__}: {exc}"
                frame = encode_fatal_error(
                    self.dialect, "FACTORY_ERROR", message, factory_name=factory_name(self._factory)
                )
            else:
                frame = encode_fatal_error(self.dialect, "FACTORY_ERROR", _HIDDEN_FACTORY_ERROR)
            self._turn_away(session, frame)
            return
        session.session = ServerSession(
            env, dialect=self.dialect, error_details=self._error_details, on_end=lease.vacate
        )

    def _turn_away(self, session: _Session, frame: bytes) -> None:
        """End a session that never started with one fatal error frame (``CAPACITY_REACHED``, ``FACTORY_ERROR``)."""
        channel = self._state.channels.get(session.number)
        if channel is not None:
            self._state.post(channel, msgspec.Raw(frame))
        self._count_waiting(-len(session.frames))
        session.frames.clear()
        self._end(session, "the session could not start", _NORMAL_CLOSURE)

    def _asked_to_end(self, session: _Session) -> None:
        """The registry asks an idle session to end (idle too long, the server stopping)."""
        lease = session.lease
        reason = lease.close_reason if lease is not None else None
        if session.number in self._sessions:
            self._end(session, reason or SHUTDOWN_REASON, _GOING_AWAY)
            if self._tasks is not None:
                self._tasks.start_soon(self._flush_soon)
        if reason == SHUTDOWN_REASON and not self._sessions:
            self._close_code, self._close_reason = _GOING_AWAY, SHUTDOWN_REASON

    def _end(self, session: _Session, reason: str, code: int) -> None:
        """End a session: tell the client (an `End`), close its environment, give its slot back."""
        if self._sessions.pop(session.number, None) is None:
            return
        self._state.end(session.number, reason, code)
        self._count_waiting(-len(session.frames))
        session.frames.clear()
        if self._tasks is not None:
            self._tasks.start_soon(self._close_session, session)
        elif session.lease is not None:
            session.lease.release()

    async def _close_session(self, session: _Session) -> None:
        with anyio.CancelScope(shield=True):
            try:
                await session.wait_settled()  # a step in flight finishes first, as on a connection of its own
                if session.session is not None:
                    await session.session.aclose()
            finally:
                if session.lease is not None:
                    session.lease.release()

    def _end_all(self, reason: str) -> None:
        for session in list(self._sessions.values()):
            self._end(session, reason, _GOING_AWAY)

    # -- sending -------------------------------------------------------------------------

    async def _flush(self) -> None:
        """Send every posted entry on the connection in use, as one message (nothing without one)."""
        state = self._state
        if not state.has_outgoing:
            return
        async with self._send_lock:
            connection = self._current
            if connection is None or connection.disconnected:
                return  # kept unacknowledged: sent again to the connection that takes the link over
            entries = state.outgoing()
            if not entries:
                return
            message = self._codec.encode(entries)
            try:
                if self._binary:
                    await connection.send({"type": "websocket.send", "bytes": message})
                else:
                    await connection.send({"type": "websocket.send", "text": message.decode()})
            except OSError:
                connection.disconnected = True  # its receive reports the disconnect next

    async def _flush_soon(self) -> None:
        """Flush once the other tasks that run in this turn of the event loop have posted theirs."""
        if self._flush_soon_pending:
            return
        self._flush_soon_pending = True
        try:
            await anyio.lowlevel.checkpoint()
        finally:
            self._flush_soon_pending = False
            with anyio.CancelScope(shield=True):
                await self._flush()


class _Batch:
    """The plain calls one envelope handed to its sessions' threads."""

    __slots__ = ("calls", "started")

    def __init__(self) -> None:
        self.calls = CallBatch()
        self.started: list[tuple[_Session, Call, bytes]] = []


async def _close(send: Send, code: int, reason: str) -> None:
    """Send the close frame; the client may be gone already, which is fine."""
    with contextlib.suppress(OSError, RuntimeError):
        await send({"type": "websocket.close", "code": code, "reason": reason})
