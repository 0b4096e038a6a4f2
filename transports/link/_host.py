"""The server end of a link, whatever carries its messages: its sessions' frames dispatched, stepped in batches.

A `LinkHost` takes the envelopes a client sends on a link (`take`) and posts its
sessions' replies for the carrier to send (`transports.link._state.ServerLinkState`).
Its sessions are admitted and ended as connections of their own would be
(`transports.link._host_sessions.LinkSessions`, which it builds on); it answers
each envelope as one batch:

- an ``async`` environment's reset or step runs in the carrier's task, at once,
  when it does not wait (`openenv._inline`): no task, no wake-up per session.
  Whether its calls wait, the host learns from the first `TRIAL_CALLS`, which
  run in tasks of their own: if none waited, the calls that follow run at once;
  if one did, every call runs in its session's task from then on, so that
  waiting steps run concurrently (a session's steps that wait for the others',
  a rendezvous, never deadlock). A call run at once that waits after all (a
  rare wait the trials did not see) is finished where it is, the carrier
  waiting for it, once: from then on the host runs every call in a task;
- a plain (``def``) environment's calls go to each session's own thread all at
  once, and the carrier is woken once, when they are done
  (`openenv._worker.CallBatch`; an environment without thread affinity: to
  one thread they share, one after the other). One that takes longer than
  `BATCH_WAIT` does not hold the others' replies: it finishes in a task of
  its own, and its reply follows;
- every other frame (a close, an MCP call, a frame that does not decode) goes
  through `openenv.server.ServerSession.handle`, in order with the session's others.

A link that carries one plain session and nothing else may have its socket lent
to that session's thread (`lend_to_lone_session`, `transports.link._loan`), as a
connection of its own would: the thread reads each envelope, steps, and writes
the reply's envelope itself, one thread wake-up a request and no trip through
the event loop.

Each session keeps the guarantees of a connection of its own: its frames are
handled in order, one at a time; one session's bad input, crash or slow step
reaches no other; its slot, idle timeout and capacity refusal are its own.

The carrier (the WebSocket endpoint's `transports.websocket._link_server.ServerLink`,
the HTTP long-polling endpoint's `transports.http._link_server.PollingServerLink`)
decides when posted entries leave: it is told through ``flush`` once replies
are posted.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Final, TypeVar

import anyio
import anyio.lowlevel
import msgspec
from websockets.frames import CloseCode

from openenv import Dialect
from openenv._codec import ServerCodec
from openenv._inline import TRIAL_CALLS, Suspended, finish, start
from openenv._messages import StepBatchReply
from openenv._session import StepsAtOnce
from openenv._worker import Call, CallBatch, wait_for
from openenv.server import ServerSession, SessionMetrics
from transports.admission._lease import SessionLease
from transports.admission._sessions import SessionRegistry
from transports.link._envelope import (
    ENTRY_OVERHEAD,
    LINK_CHANNEL,
    End,
    Entry,
    Hello,
    Open,
    Resume,
    StepItem,
    Steps,
    fits,
)
from transports.link._host_sessions import LinkSession, LinkSessions
from transports.link._loan import Lender, LentChannel, Loan
from transports.link._state import ChannelState, LinkProtocolError, TakenSteps

__all__ = ["BATCH_WAIT", "MAX_WAITING_FRAMES", "LinkHost"]

logger = logging.getLogger("openenv.server")

BATCH_WAIT: Final = 0.002
"""Seconds the server waits for a batch's plain steps before it sends the replies of those done."""

MAX_WAITING_FRAMES: Final = 4096
"""Frames a link may hold for sessions still busy before the server stops reading it."""

T = TypeVar("T")


class LinkHost(LinkSessions):
    """The server end of one link: see the module's docstring.

    Args:
        factory: Builds one environment per session.
        registry: The app's session registry.
        dialect: The dialect of the sessions' frames.
        error_details: Whether error replies name the server's exceptions.
        transport: The transport's name, for the registry's leases (``"websocket"``, ``"http"``).
        flush: Called once replies were posted, to send them.
        metrics: Where the sessions' requests are counted, or ``None``.
        client: Who holds the link (`transports.admission._guard.client_of`): its
            sessions count toward that client's quota; ``None`` for nobody's.

    Attributes:
        codec: The link's envelope codec.
        state: The link's numbering, and the entries waiting to be sent.
        shutting_down: Its last session was ended because the server stops.
        left_by_client: The client said it closes the link (an `End` on channel 0):
            its connection's end is no drop, whatever code the server reports.
        client_max_message_size: The largest message its client takes (``None``: no limit).
        on_lendable: Called when the link's lone session may be lent the socket
            while the carrier waits for the client (see `lend_to_lone_session`), or ``None``.
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
        flush: Callable[[], Awaitable[None]],
        metrics: SessionMetrics | None = None,
        client: str | None = None,
    ) -> None:
        super().__init__(
            factory,
            registry=registry,
            dialect=dialect,
            error_details=error_details,
            transport=transport,
            metrics=metrics,
            client=client,
        )
        self._flush = flush
        self._flush_soon_pending = False
        self._waiting_frames = 0  # frames held for busy sessions, across the link
        self._room: anyio.Event | None = None  # set when they fall below MAX_WAITING_FRAMES
        self._suspends = False  # the environment's calls wait: each session runs in a task of its own
        self._trials = TRIAL_CALLS  # calls left to run in tasks before the host trusts them not to wait
        self._calls: anyio.CancelScope | None = None  # where calls answered at once run (`serve`)
        # An envelope a give-up cut short: its entries left, and the plain calls it started.
        self._cut: tuple[list[tuple[int, Any]], _Batch | None] | None = None
        self.on_lendable: Callable[[], object] | None = None
        self.left_by_client = False
        self.client_max_message_size: int | None = None

    def hello(self, token: str, resume_timeout: float, max_message_size: int | None) -> None:
        """Post the link's `Hello`: the first entry a client gets on a new link."""
        self.state.post_control(
            LINK_CHANNEL,
            Hello(token=token, resume_timeout=resume_timeout, max_message_size=max_message_size, batches=True),
        )

    async def host(self, carry: Callable[[], Awaitable[str]]) -> None:
        """Run ``carry`` (the carrier's loop) with the sessions' tasks beside it; end every session after.

        Args:
            carry: Reads the client's messages into `take` until the link is
                over; returns why, the reason every session still open ends with.
        """
        reason = "the link failed"
        async with anyio.create_task_group() as tasks:
            self._tasks = tasks
            try:
                reason = await carry()
            finally:
                for session in list(self._sessions.values()):
                    self._leave(session, reason)

    async def room(self) -> None:
        """Return once the sessions hold few enough waiting frames that another message may be read."""
        while self._waiting_frames >= MAX_WAITING_FRAMES:
            self._room = anyio.Event()
            await self._room.wait()  # the client sends faster than the sessions step: hold it back

    async def take(self, message: bytes) -> None:
        """Take one message from the client and answer what can be answered at once (from `serve`'s ``read``).

        Raises:
            msgspec.DecodeError: It is not an envelope.
            transports.link._state.LinkProtocolError: It breaks the link protocol.
        """
        await self._dispatch(self.state.take(self.codec.decode(message)))

    async def take_entries(self, entries: list[Entry]) -> None:
        """Take the entries of one envelope the carrier decoded already (`codec`); see `take`.

        Raises:
            transports.link._state.LinkProtocolError: They break the link protocol.
        """
        await self._dispatch(self.state.take(entries))

    async def lend_to_lone_session(self, lend: Lender) -> None:
        """Lend the socket to the thread of the link's only session, if it is plain and nothing else is going on.

        Returns once the socket is back with the event loop: the loan ended,
        or the thread has been answering one request for long (the reply then
        follows from a task, and the link reads on meanwhile). Does nothing
        when the link carries anything else: several sessions, one not yet
        admitted or ``async``, frames waiting, entries to send.

        On the thread, each whole data frame that is one envelope holding the
        session's next frame and nothing else is answered there; anything
        else (another session's `Open`, a control, a close or MCP request)
        ends the loan, unread, for the event loop to take.

        Args:
            lend: The connection's way to lend its socket (`transports.link._loan.Lender`).
        """
        session = self._lendable()
        if session is None or self._tasks is None:
            return
        loan = lend()
        if loan is None:
            return
        server_session, lease = session.session, session.lease
        channel = self.state.channels[session.number]
        assert server_session is not None
        assert lease is not None
        released = anyio.Event()
        loan.on_released = released.set
        self._loan = loan
        session.running = True
        self._tasks.start_soon(self._serve_on_loan, session, server_session, lease, channel, loan, released)
        await released.wait()

    def may_lend_later(self) -> bool:
        """Whether the socket may be lent before the client's next message (`on_lendable` may be called).

        The link carries at most two sessions, one of them plain or not built yet: its lone
        session's reply may come from a task, or its neighbour may end.
        """
        sessions = self._sessions
        if len(sessions) > 2:
            return False
        return any(session.session is None or session.session.handles_on_thread for session in sessions.values())

    def _lendable(self) -> LinkSession | None:
        """The link's lone session, if it is plain, idle, and the link has nothing else to do; else ``None``."""
        if len(self._sessions) != 1:
            return None
        (session,) = self._sessions.values()
        server_session = session.session
        if (
            server_session is None
            or not server_session.handles_on_thread
            or self.state.has_outgoing
            or self._loan is not None
            or session.lease is None
            or session.number not in self.state.channels
            or session.running
            or session.frames
        ):
            return None
        return session

    async def _serve_on_loan(
        self,
        session: LinkSession,
        server_session: ServerSession,
        lease: SessionLease,
        channel: ChannelState,
        loan: Loan,
        released: anyio.Event,
    ) -> None:
        """Run a loan on the session's thread (`lend_to_lone_session`); then post a reply it left, if any."""
        answering = LentChannel(
            session.number,
            server_session,
            lease,
            channel,
            loan,
            codec=self.codec,
            binary=self.dialect.encoding == "msgpack",
            client_limit=self.client_max_message_size,
        )
        unsent: bytes | None = None
        session.scope = scope = anyio.CancelScope()  # `_give_up` cancels it
        try:
            with scope:
                unsent = await server_session.run_on_thread(
                    functools.partial(loan.serve, answering.on_frame, answering.on_idle, answering.on_sent),
                    loan.stop,
                )
        finally:
            self._loan = None
            session.scope = None
            loan.end()  # what the thread read and left goes back to the connection
            released.set()
        if unsent is not None and answering.in_hand is not None:
            # Answered, not written (the loan was stopped meanwhile): posted as a reply of the event loop's.
            self._replied(session, answering.take_in_hand())
        session.stop_running()
        if lease.close_reason is not None:
            # Asked to end right after a reply, before the thread's next wait marked it idle: the
            # request left it to the session, as for a busy one (`SessionLease.request_close`).
            self._end(session, lease.close_reason, CloseCode.GOING_AWAY)
        if session.frames and session.number in self._sessions:
            self._run_in_task(session)
        await self._flush_soon()

    async def serve(self, read: Callable[[], Awaitable[T]]) -> T:
        """Run the carrier's loop, ``read``, which hands the client's messages to `take`; return what it returns.

        The calls answered at once, in the carrier's task, run inside one cancel
        scope entered here for all the messages, not one per message (a scope
        costs more than a quick step). A call answered at once that waits after
        all is finished in that scope, and its own scopes nest within it; giving
        it up (the step timeout, the server's cut) cancels the scope. Then the
        rest of its message is handled and sent in a new scope, and ``read`` is
        run again to read on.
        """
        while True:
            with anyio.CancelScope() as self._calls:
                cut, self._cut = self._cut, None
                if cut is not None:
                    await self._dispatch(*cut)
                    await self._flush()
                return await read()

    async def _dispatch(self, events: list[tuple[int, Any]], batch: _Batch | None = None) -> None:
        """Act on one envelope's entries, in order; the replies of those answered at once are posted.

        ``batch`` holds the plain calls started already for this envelope (its
        first entries, before a give-up cut it short: see `serve`).
        """
        scope = self._calls
        assert scope is not None, "messages are taken within LinkHost.serve"
        sessions = self._sessions
        taken = -1
        while taken + 1 < len(events):
            taken += 1
            number, item = events[taken]
            if type(item) is TakenSteps:
                if batch is not None:
                    batch.calls.launch()  # the plain calls started already run while these steps do
                apart = await self._steps(item, events, taken, batch, scope)
                if apart:  # stepped as frames of their own, in order, right where the steps were
                    events = events[: taken + 1] + apart + events[taken + 1 :]
                continue
            if type(item) is not msgspec.Raw:
                self._control(number, item)
                continue
            session = sessions.get(number)
            if session is None:
                continue  # ended meanwhile: nobody to hand it to
            frame = bytes(item)
            server_session = session.session
            if server_session is None or session.running or session.frames:
                session.frames.append(frame)  # after those waiting, in order
                self._count_waiting(1)
            elif server_session.handles_on_thread:
                if batch is None:
                    batch = _Batch()
                session.running = True
                assert session.lease is not None
                session.lease.mark_busy()
                batch.started.append((session, server_session.start_on_thread(batch.calls, frame), frame))
            elif self._suspends or self._trials > 0:
                session.frames.append(frame)
                self._count_waiting(1)
                self._run_in_task(session)
            else:
                # At once, in this task: a call that does not wait is done before anything else runs.
                outcome = server_session.start_handle(frame)
                if isinstance(outcome, Suspended):
                    if batch is not None:
                        batch.calls.launch()  # the plain calls started already run while this one waits
                    self._cut = (events[taken + 1 :], batch)  # what is left of the envelope, should it be given up
                    outcome = await self._finish_here(session, outcome, scope)
                    self._cut = None
                self._replied(session, outcome)
        if batch is not None:
            await self._collect(batch)

    async def _steps(
        self,
        steps: TakenSteps,
        events: list[tuple[int, Any]],
        taken: int,
        batch: _Batch | None,
        scope: anyio.CancelScope,
    ) -> list[tuple[int, Any]]:
        """Run a `Steps`' steps at once where each can be, and answer them in one `Stepped`; the others, as frames.

        A step runs at once, with its action from the batch's one decoding, when
        its session would run its frame at once (admitted, idle, nothing
        waiting, an async environment whose calls do not wait) and the action
        fits as it is. Every other step becomes the frame it stands for, handled
        as any frame right after (``events[taken]`` is the steps' place).

        Returns:
            The frames of the steps not run here, as events.

        Raises:
            transports.link._state.LinkProtocolError: The actions are not one per step.
        """
        control = steps.steps
        sessions = self._sessions
        at_once = not (self._suspends or self._trials > 0)
        codec: ServerCodec[Any] | None = None
        actions: list[Any] | None = None
        split: list[msgspec.Raw] | None = None
        apart: list[tuple[int, Any]] = []
        apart_sessions: set[int] = set()
        # The steps run here, in order: each one's session and item, its server session and its action.
        here: list[tuple[LinkSession, tuple[int, int, int]]] = []
        here_sessions: list[ServerSession] = []
        here_actions: list[Any] = []
        for item in steps.taken:
            position, number, request_id = item
            session = sessions.get(number)
            if session is None:
                continue  # ended meanwhile: nobody to answer
            server_session = session.session
            if (
                at_once
                and server_session is not None
                and not server_session.handles_on_thread
                and not session.running
                and not session.frames
                and number not in apart_sessions
            ):
                if codec is None:
                    codec = server_session.codec
                    actions = codec.decode_step_batch(bytes(control.actions))
                    if actions is not None and len(actions) != len(control.channels):
                        actions = None  # not one per step: said below, where they are split
                if actions is not None and server_session.codec is codec:
                    here.append((session, item))
                    here_sessions.append(server_session)
                    here_actions.append(actions[position])
                    continue
            if split is None:
                split = self._split_actions(control)
            apart.append((number, self.codec.step_frame(split[position], request_id)))
            apart_sessions.add(number)
        if not here:
            return apart
        assert codec is not None
        run = StepsAtOnce(here_sessions, here_actions, codec)
        waiting = start(run.run())
        if not isinstance(waiting, Suspended):
            self._post_stepped(here, run, codec)
            return apart
        # A step waits after all: what is answered goes now; the steps after it go as frames (should it be given
        # up, they are the first of what is left), each before its session's steps apart.
        run.stop()
        done = len(run.observations)
        self._post_stepped(here[:done], run, codec)
        later = self._step_frames(control, [item for _, item in here[done + 1 :]], split)
        self._cut = (later + apart + events[taken + 1 :], batch)
        await self._finish_here(here[done][0], waiting, scope)  # the host runs every call in a task from now on
        self._cut = None
        self._post_stepped(here[done : done + 1], run, codec, first=done)
        return later + apart

    def _split_actions(self, control: Steps) -> list[msgspec.Raw]:
        """A `Steps`' actions, each encoded on its own.

        Raises:
            transports.link._state.LinkProtocolError: They are not an array of one per step.
        """
        try:
            split = self.codec.split_actions(control.actions)
        except msgspec.DecodeError as exc:
            raise LinkProtocolError(f"a steps control whose actions are not an array: {exc}") from exc
        if len(split) != len(control.channels):
            raise LinkProtocolError(f"a steps control with {len(control.channels)} steps and {len(split)} actions")
        return split

    def _step_frames(
        self, control: Steps, taken: list[tuple[int, int, int]], split: list[msgspec.Raw] | None
    ) -> list[tuple[int, Any]]:
        """The frames the steps ``taken`` of a `Steps` stand for, as events."""
        if not taken:
            return []
        if split is None:
            split = self._split_actions(control)
        return [(number, self.codec.step_frame(split[position], request_id)) for position, number, request_id in taken]

    def _post_stepped(
        self,
        here: list[tuple[LinkSession, tuple[int, int, int]]],
        run: StepsAtOnce,
        codec: ServerCodec[Any],
        first: int = 0,
    ) -> None:
        """Post the replies of steps run together as one `Stepped` (as frames of their own, should it not fit).

        Args:
            here: Each step's session and item (``(position, channel, request id)``).
            run: Where they ran: their replies are its, from ``first`` on.
            codec: Their codec.
            first: The place of the first of them in ``run``.
        """
        sessions, state = self._sessions, self.state
        channels = state.channels
        answered: list[tuple[LinkSession, int, msgspec.Raw | dict[str, Any], ChannelState]] = []
        observations: list[msgspec.Raw | None] = []
        errors: dict[int, dict[str, Any]] = {}
        failed = run.errors
        for place, ((session, (_, _, request_id)), observation) in enumerate(
            zip(here, run.observations[first:], strict=False), first
        ):
            number = session.number
            channel = channels.get(number)
            if channel is None or number not in sessions:
                continue  # ended meanwhile: its reply has nobody to go to
            reply: msgspec.Raw | dict[str, Any]
            if observation is None:
                reply = errors[len(observations)] = failed[place]
            else:
                reply = observation
            observations.append(observation)
            answered.append((session, request_id, reply, channel))
        if not answered:
            return
        message = codec.step_batch_reply(StepBatchReply(observations, errors))
        if not fits(len(message) + 2 * ENTRY_OVERHEAD * len(answered), self.client_max_message_size):
            # Each as the frame it stands for: one too large for the client ends its session alone.
            for session, request_id, reply, _ in answered:
                self._replied(session, codec.batch_reply_frame(reply, request_id))
            return
        items: list[StepItem] = []
        ending: list[tuple[LinkSession, str]] = []
        now = self._registry.clock.now()
        for session, request_id, reply, channel in answered:
            items.append(state.post_held(channel, _HeldReply(codec, reply, request_id), request_id))
            lease = session.lease
            assert lease is not None
            lease.touch(now)  # waiting for the client again: the idle clock runs (as `_replied` does)
            if lease.close_reason is not None:
                ending.append((session, lease.close_reason))
        state.post_stepped(items, msgspec.Raw(message))
        for session, reason in ending:  # after the replies: their ends follow them
            self._end(session, reason, CloseCode.GOING_AWAY)

    def _control(self, number: int, control: Any) -> None:
        """Act on a control entry from the client."""
        if isinstance(control, Open):
            self._open(number)
        elif isinstance(control, Resume):
            self.state.resumed(control)
        elif isinstance(control, End):
            if number == LINK_CHANNEL:
                self.left_by_client = True
                return
            session = self._sessions.get(number)
            if session is not None:
                self._end(session, "given up by the client", CloseCode.NORMAL_CLOSURE)

    async def _finish_here(self, session: LinkSession, suspended: Suspended, scope: anyio.CancelScope) -> Any:
        """A call run at once that waits after all: finish it here, once; the host runs every call in a task now.

        ``scope`` (`serve`'s) was entered before the call started (a scope
        entered now would enclose the call's own, which it entered before it
        waited); the registry gives the call up by cancelling it (`_give_up`),
        and the cancellation leaves the scope.
        """
        self._suspends = True
        session.running = True
        assert session.lease is not None
        session.lease.mark_busy()
        session.scope = scope
        try:
            reply = await finish(suspended)
        finally:
            session.scope = None
            session.stop_running()
        if scope.cancel_called:
            # Given up as it returned: leave the scope now, before anything else of the carrier's waits in it.
            await anyio.lowlevel.checkpoint()
        return reply

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
                self._fail(session)
                continue
            if reply is None:  # not for the thread (a close, an MCP call): on the event loop, in order
                session.frames.insert(0, frame)
                self._count_waiting(1)
                self._run_in_task(session)
                continue
            session.stop_running()
            self._replied(session, reply)
            if session.frames and session.number in self._sessions:
                self._run_in_task(session)

    def _replied(self, session: LinkSession, reply: bytes | None) -> None:
        """Post a session's reply, and end the session if that was its close (or it was asked to end)."""
        if session.number not in self._sessions:
            return  # ended meanwhile (given up on): its reply has nobody to go to
        server_session, lease = session.session, session.lease
        assert server_session is not None
        assert lease is not None
        channel = self.state.channels.get(session.number)
        if reply is not None and channel is not None:
            if not fits(len(reply), self.client_max_message_size):
                logger.warning("a reply of %d bytes is over its client's limit: the session ends", len(reply))
                self._end(
                    session,
                    f"a reply of {len(reply)} bytes is over the client's limit of {self.client_max_message_size} bytes",
                    CloseCode.MESSAGE_TOO_BIG,
                )
                return
            self.state.post(channel, msgspec.Raw(reply))
        if server_session.closed:
            self._end(session, "closed by the client", CloseCode.NORMAL_CLOSURE)
            return
        lease.touch()  # waiting for the client again: the idle clock runs
        if lease.close_reason is not None:
            self._end(session, lease.close_reason, CloseCode.GOING_AWAY)

    def _run_in_task(self, session: LinkSession, *, call: Call | None = None, frame: bytes = b"") -> None:
        """Handle the session's waiting frames in a task of its own; first, the ``call`` of ``frame`` on its thread."""
        assert self._tasks is not None
        session.running = True
        self._tasks.start_soon(self._run_session, session, call, frame)

    async def _run_session(self, session: LinkSession, call: Call | None, frame: bytes) -> None:
        server_session = session.session
        assert server_session is not None
        session.scope = scope = anyio.CancelScope()
        try:
            with scope:
                await self._run_frames(session, server_session, call, frame)
        finally:
            session.scope = None
            session.stop_running()
        await self._flush_soon()

    async def _run_frames(
        self, session: LinkSession, server_session: ServerSession, call: Call | None, frame: bytes
    ) -> None:
        """Handle ``call``'s frame (when given), then the session's frames waiting, in order."""
        if call is not None:
            try:
                reply = await wait_for(call)
            except Exception:
                logger.exception("a plain call failed on its session's thread")
                self._fail(session)
                return
            if reply is None:
                reply = await server_session.handle(frame)
            self._replied(session, reply)
        while session.frames and session.number in self._sessions:
            waiting = session.frames.pop(0)
            self._count_waiting(-1)
            assert session.lease is not None
            session.lease.mark_busy()
            outcome = server_session.start_handle(waiting)
            if isinstance(outcome, Suspended):
                self._suspends = True
                outcome = await finish(outcome)
            elif self._trials > 0:
                self._trials -= 1
            self._replied(session, outcome)

    def _count_waiting(self, change: int) -> None:
        self._waiting_frames += change
        if change < 0 and self._room is not None and self._waiting_frames < MAX_WAITING_FRAMES:
            self._room.set()
            self._room = None

    # -- sending -------------------------------------------------------------------------

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
            if self.on_lendable is not None and self._lendable() is not None:
                self.on_lendable()  # a reply came from a task, or a neighbour ended: the socket may be lent now


class _HeldReply(msgspec.Struct, gc=False):
    """A reply that went out in a `Stepped`, kept until acknowledged (`transports.link._state.Held`).

    A Struct, made in one call (one per session per step), and not tracked by
    the garbage collector: what it refers to never refers back to it.
    """

    _codec: ServerCodec[Any]
    _reply: msgspec.Raw | dict[str, Any]
    _request_id: int

    def frame(self) -> msgspec.Raw:
        """The reply as a frame of its own: what its session would have sent."""
        return msgspec.Raw(self._codec.batch_reply_frame(self._reply, self._request_id))


class _Batch:
    """The plain calls one envelope handed to its sessions' threads."""

    __slots__ = ("calls", "started")

    def __init__(self) -> None:
        self.calls = CallBatch()
        self.started: list[tuple[LinkSession, Call, bytes]] = []
