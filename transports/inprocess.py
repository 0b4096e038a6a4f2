"""The in-process transport: an environment served in the caller's own event loop.

For unit tests and local runs. Nothing crosses a process, but every message is
still encoded and decoded as it would be on a network, so a test that passes
in-process also proves the messages serialise. The server side runs as a task of
its own (`InProcessTransport.keep`, in the task group of the client's owner),
exactly as a network server's session would, so timeouts, late replies and
cancellation behave as they do over a socket. A client without an owner (opened
with ``await client.connect()``) has its requests served in its own task, each
shielded from the caller's cancellation: a timeout then takes effect once the
environment has answered, and the late reply is dropped as over a socket.

Most environments' calls never wait (an echo, a game's rules), and handing each
to the session's task costs a wake-up, two events and a trip through the event
loop for a few microseconds of work. So, as a server does on a shared link
(`transports.link._host`), sessions' tasks run the first
`openenv._inline.TRIAL_CALLS` requests to the environments of one factory (in
one event loop: the sessions of a pool learn together); if none of them
waited, the requests that follow are served at once, in the task that waits
for their reply (`receive`), with no task and no wake-up. A call served so
that waits after all is finished there, in the caller's task, and from then on
every request to that factory's environments goes to its session's task again. Such a call is the caller's, though: a
timeout or cancellation of the caller cuts it, and the session then ends
(its environment's state is unknown), where a call in the session's task would
have run on and had its reply dropped.

URL form: ``inproc://package.module:Factory`` (the ``module:attribute`` form
uvicorn uses); or pass ``factory=`` directly.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable, Coroutine, Sequence
from operator import attrgetter
from typing import Any, Final, TypeVar, cast

import anyio
import anyio.lowlevel

from openenv import ConnectError, ConnectionClosed, Dialect, Transport
from openenv._batch import StepBatcher
from openenv._codec import ServerCodec
from openenv._inline import TRIAL_CALLS, Suspended, finish, start
from openenv._limits import DEFAULT_CLIENT_CLOSE_TIMEOUT
from openenv._messages import StepBatchReply
from openenv._session import StepsAtOnce
from openenv.channel import FrameQueue, QueueClosed
from openenv.server import ServerSession, factory_failed_frame, load_factory, served_factory
from transports.shared._deprecated import renamed_option

__all__ = ["InProcessTransport"]

_T = TypeVar("_T")

logger = logging.getLogger("openenv.server")

SCHEME = "inproc://"
"""The prefix of the URLs this transport takes."""


class _Habits:
    """What an event loop has learned of one factory's environments: whether their calls wait.

    Attributes:
        trials: Calls left to run in sessions' tasks before the calls that follow run at once.
        waits: A call waited: every call runs in its session's task.
        at_once: Calls run at once, in the task waiting for the reply: the trials
            are over, and no call waited.
        parked: The transports whose `keep` waits while their calls run at once.
    """

    __slots__ = ("at_once", "batchers", "parked", "trials", "waits")

    def __init__(self) -> None:
        self.trials = TRIAL_CALLS
        self.waits = False
        self.at_once = self.trials <= 0  # read for every call: kept, not worked out each time
        self.parked: weakref.WeakSet[InProcessTransport] = weakref.WeakSet()
        self.batchers: dict[ServerCodec[Any], _Batcher] = {}  # one per codec: a batch's actions are of one type

    def batcher(self, codec: ServerCodec[Any]) -> _Batcher:
        """What steps a batch of these environments' sessions whose actions ``codec`` reads."""
        batcher = self.batchers.get(codec)
        if batcher is None:
            batcher = self.batchers[codec] = _Batcher(self, codec)
        return batcher

    def ran(self, waited: bool) -> None:
        """Note how a call ran; the first that waited sends every parked session back to its task."""
        if waited:
            if not self.waits:
                self.waits = True
                self.at_once = False
                for transport in list(self.parked):
                    transport._unpark()
        elif self.trials > 0:
            self.trials -= 1
            self.at_once = self.trials <= 0 and not self.waits


class _Batcher(StepBatcher):
    """Steps a batch of one factory's in-process sessions (one codec's), one after the other, in the caller's task.

    Only while their calls run at once (`_Habits.at_once`): each step is then
    what the session's own request would have been, served at once. A call
    that waits after all is finished there, and the sessions after it go on
    their own (to their tasks, from then on).
    """

    def __init__(self, habits: _Habits, codec: ServerCodec[Any]) -> None:
        self._habits = habits
        self._codec = codec

    async def step(self, transports: Sequence[Transport], message: bytes) -> bytes | None:
        """Step each session on its action; the replies as one message (see `StepBatcher.step`)."""
        if not self._habits.at_once:  # a call waited meanwhile: each goes on its own, to its task
            return None
        codec = self._codec
        actions = codec.decode_step_batch(message)
        if actions is None or len(actions) != len(transports):
            return None
        sessions = cast("Sequence[InProcessTransport]", transports)
        steps = StepsAtOnce(list(map(_SERVER_SESSION, sessions)), actions, codec)
        waiting = start(steps.run())
        if isinstance(waiting, Suspended):  # that step is finished here; the rest go on their own, to their tasks
            steps.stop()
            await sessions[len(steps.observations)]._finish_step(waiting)
        observations = steps.observations
        observations += [None] * (len(sessions) - len(observations))
        return codec.step_batch_reply(StepBatchReply(observations, steps.errors))


_SERVER_SESSION: Final = attrgetter("_session")  # an in-process transport's, set once it has connected

_LEARNED: Final[anyio.lowlevel.RunVar[weakref.WeakKeyDictionary[Callable[[], Any], _Habits]]] = anyio.lowlevel.RunVar(
    "openenv_inproc_habits"
)


def _habits_of(factory: Callable[[], Any]) -> _Habits:
    """This event loop's habits of ``factory``'s environments (a factory that takes no weak reference learns alone)."""
    learned = _LEARNED.get(None)
    if learned is None:
        learned = weakref.WeakKeyDictionary()
        _LEARNED.set(learned)
    try:
        habits = learned.get(factory)
        if habits is None:
            habits = learned[factory] = _Habits()
    except TypeError:
        habits = _Habits()
    return habits


class InProcessTransport(Transport):
    """Serves a fresh environment in this event loop, as a session of its own.

    Registered for ``inproc://``. Each transport builds one environment from the
    factory on connect, and closes it when the transport closes. A factory
    that raises gives the client a `openenv.FactoryError` at its first request,
    as a network server does.

    Examples:
        ```python
        from openenv.examples.echo import CallToolAction, EchoEnv, EchoEnvironment
        from transports.inprocess import InProcessTransport

        # By URL: the module:attribute form uvicorn uses.
        async with EchoEnv("inproc://openenv.examples.echo:EchoEnvironment") as env:
            await env.reset()

        # Or with the factory itself (a class, or any callable without arguments).
        async with EchoEnv(transport=InProcessTransport(factory=EchoEnvironment)) as env:
            await env.reset()
            result = await env.step(CallToolAction(tool_name="echo_message", arguments={"message": "hi"}))
            print(result.observation.echoed_message)  # hi
        ```

    Args:
        url: ``inproc://package.module:Factory``; unused when ``factory`` is given.
        factory: Builds the environment (usually its class); overrides the URL.
        dialect: The dialect to speak. The default, JSON with request ids, is what
            our WebSocket server negotiates; ``Dialect()`` speaks plain OpenEnv.
        close_timeout: Seconds to let the session finish its current request and
            close its environment before it is cancelled (5 by default).
        close_grace: Deprecated: ``close_timeout``, the name every transport uses.

    Attributes:
        url: The URL given, or ``None``.
        dialect: The dialect the session speaks.
        close_timeout: Seconds the session gets to finish when the transport closes.

    Raises:
        ValueError: Neither ``url`` nor ``factory`` was given.
    """

    send_waits = False  # a frame is written, or queued for the next receive: never an answer awaited

    def __init__(
        self,
        url: str | None = None,
        *,
        factory: Callable[[], Any] | None = None,
        dialect: Dialect = Dialect(request_ids=True),
        close_timeout: float = DEFAULT_CLIENT_CLOSE_TIMEOUT,
        close_grace: float | None = None,
    ) -> None:
        if url is None and factory is None:
            raise ValueError("InProcessTransport needs an inproc:// URL or a factory")
        if close_grace is not None:
            close_timeout = renamed_option("InProcessTransport", "close_grace", "close_timeout", close_grace)
        self.url = url
        self.dialect = dialect
        self.close_timeout = close_timeout
        self._factory = factory
        self._session: ServerSession | None = None
        # Unbounded queues are safe here: the client sends one request at a time
        # (plus a close, and any it abandoned), and the session one reply for each.
        self._to_server: FrameQueue[bytes] | None = None
        self._from_server: FrameQueue[bytes] | None = None
        self._serving = False  # a request is being handled (by `keep`'s task, or in a caller's)
        # Frames sent whose replies the client has not taken: while any is, a step waits behind it, or a late
        # reply waits to be dropped (every request is answered but a close, which ends the channel).
        self._in_flight = 0
        self._kept = False  # `keep` serves the session
        self._idle: anyio.Event | None = None  # set when no request is being handled; made by who waits for it
        self._habits = _Habits()  # what is learned of the factory's calls, shared once connected
        self._batcher: _Batcher | None = None  # steps the session with others of its factory, once it has begun
        self._to_task: anyio.Event | None = None  # set when `keep`'s task is to serve again (or the channel ended)
        self._ended = "the in-process session has ended"  # what `ConnectionClosed` says once it has

    def _load_factory(self) -> Callable[[], Any]:
        if self._factory is not None:
            return self._factory
        assert self.url is not None
        if not self.url.lower().startswith(SCHEME):
            raise ConnectError(f"{self.url!r} is not an {SCHEME} URL")
        try:
            return served_factory(load_factory(self.url[len(SCHEME) :]))  # type: ignore[no-any-return]
        except (ImportError, ValueError, TypeError) as exc:
            raise ConnectError(f"cannot load the environment factory of {self.url!r}: {exc}") from exc

    async def __aenter__(self) -> InProcessTransport:
        """Build the environment: the session starts.

        A factory that raises gives the client a ``FACTORY_ERROR`` frame, read
        at its first request, then the channel ends.

        Returns:
            The transport itself.

        Raises:
            ConnectError: The URL is not an ``inproc://`` URL, or its factory
                cannot be imported or is not callable.
        """
        factory = self._load_factory()
        self._to_server, self._from_server = FrameQueue[bytes](), FrameQueue[bytes]()
        self._habits = _habits_of(factory)
        try:
            env = factory()
        except Exception as exc:
            logger.exception("environment factory failed")
            self._from_server.put(factory_failed_frame(self.dialect, factory, exc, error_details=True))
            self._from_server.close()
            self._to_server.close()
            return self
        self._session = ServerSession(env, dialect=self.dialect)
        self._batcher = self._habits.batcher(self._session.codec)
        return self

    async def keep(self) -> None:
        """Serve the session's requests as they come, as a server's task would, until the channel closes.

        While requests are served at once (in the task waiting for the reply),
        it waits for them to come back to it.
        """
        inbox = self._to_server
        if inbox is None or self._session is None:
            return
        self._kept = True
        try:
            while True:
                if self._habits.at_once:
                    if inbox.closed:
                        return
                    self._to_task = to_task = anyio.Event()
                    self._habits.parked.add(self)
                    await to_task.wait()
                    continue
                try:
                    frame = await inbox.get()
                except QueueClosed:
                    return
                await self._serve(frame)
        finally:
            self._kept = False

    async def _serve(self, frame: bytes, *, at_once: bool = False) -> None:
        """Handle one request; queue its reply.

        In the session's task (or shielded, in an ownerless caller's); or, with
        ``at_once``, in the caller's task (see `_run`).

        Raises:
            ConnectionClosed: Served at once, the caller was cancelled while the
                call waited: the call was cut, and the session has ended.
        """
        session = self._session
        if session is None or session.closed:
            return  # the channel was closed meanwhile: the request has nobody to answer
        self._answer(await self._run(session.handle(frame), at_once=at_once))

    async def _run(self, call: Coroutine[Any, Any, _T], *, at_once: bool) -> _T:
        """Run one of the session's calls (a request's handling, a batch's step) in this task; its outcome.

        Learns whether the factory's calls wait: after `TRIAL_CALLS` that did
        not, they run at once, in the caller's task, where one that waits after
        all is finished; the caller's cancellation then cuts it, and ends the session.
        """
        outcome = self._start(call)
        if isinstance(outcome, Suspended):
            return await self._finish(outcome, at_once=at_once)  # type: ignore[no-any-return]
        return outcome

    def _start(self, call: Coroutine[Any, Any, _T]) -> _T | Suspended:
        """`_run`'s first part, without an await: the call's outcome, or a `Suspended` to give `_finish` at once."""
        self._serving = True
        try:
            outcome = start(call)
        except BaseException:
            self._served()
            raise
        waited = isinstance(outcome, Suspended)
        self._habits.ran(waited=waited)
        if not waited:
            self._served()
        return outcome

    async def _finish(self, suspended: Suspended, *, at_once: bool) -> Any:
        """`_run`'s second part, for a call that waited: its outcome."""
        try:
            return await finish(suspended)
        except anyio.get_cancelled_exc_class():
            if at_once:
                self._ended = "the in-process session ended: a call that waited was cut by its caller"
                self._end()
            raise
        finally:
            self._served()

    def step_batcher(self) -> StepBatcher | None:
        """Steps this session with others of its factory while calls run at once and it has nothing in hand."""
        if self._in_flight or self._serving or not self._habits.at_once:
            return None
        return self._batcher  # ``None`` once the channel has ended

    async def _finish_step(self, suspended: Suspended) -> None:
        """Finish a batch's steps, waiting on this session's after all, in the caller's task, as `_run` finishes a call.

        A step that did not wait ran with nothing else between its start and
        its end, so only one that waits marks the session as serving; the
        caller's cancellation meanwhile cuts it, and ends the session.
        """
        self._serving = True
        self._habits.ran(waited=True)
        await self._finish(suspended, at_once=True)

    def _unpark(self) -> None:
        """Wake `keep`: requests go to the session's task again (or the channel ended)."""
        self._habits.parked.discard(self)
        if self._to_task is not None:
            self._to_task.set()
            self._to_task = None

    def _served(self) -> None:
        self._serving = False
        idle, self._idle = self._idle, None
        if idle is not None:
            idle.set()

    def _answer(self, reply: bytes | None) -> None:
        """Queue a request's reply; end the channel if that was the close request."""
        session, outbox = self._session, self._from_server
        assert session is not None
        if reply is not None and outbox is not None and not outbox.closed:  # closed: the reply has nobody to go to
            outbox.put(reply)
        if session.closed:
            self._end()

    def _end(self) -> None:
        self._batcher = None  # nothing more is stepped: the session has ended
        for queue in (self._to_server, self._from_server):
            if queue is not None:
                queue.close()
        self._unpark()  # `keep` returns

    async def send(self, frame: bytes) -> None:
        """Queue one frame for the session; never blocks.

        Args:
            frame: The encoded request.

        Raises:
            ConnectionClosed: The transport is not connected, or the session has ended.
        """
        if self._to_server is None:
            raise ConnectionClosed("the transport is not connected")
        try:
            self._to_server.put(frame)
        except QueueClosed:
            raise ConnectionClosed(self._ended) from None
        self._in_flight += 1

    def send_nowait(self, frame: bytes) -> None:
        """Queue one frame for the session (what `send` does, without the await).

        Raises:
            ConnectionClosed: The transport is not connected, or the session has ended.
        """
        if self._to_server is None:
            raise ConnectionClosed("the transport is not connected")
        try:
            self._to_server.put(frame)
        except QueueClosed:
            raise ConnectionClosed(self._ended) from None
        self._in_flight += 1

    def receive_nowait(self) -> bytes:
        """A reply the session has queued already.

        Raises:
            anyio.WouldBlock: None is queued (or no task serves the session: then `receive` does).
            ConnectionClosed: The session has ended and every frame it sent was returned.
        """
        outbox = self._from_server
        if outbox is None:
            raise ConnectionClosed("the transport is not connected")
        if outbox:
            self._in_flight -= 1
            return outbox.get_nowait()
        if outbox.closed:
            raise ConnectionClosed(self._ended)
        raise anyio.WouldBlock

    async def receive(self) -> bytes:
        """Return the session's next frame, waiting for it.

        The requests queued are handled here first when they are served at
        once, or when no `keep` task serves the session (then shielded from the
        caller's cancellation).

        Returns:
            The reply frame.

        Raises:
            ConnectionClosed: The transport is not connected, or the session has
                ended and every frame it sent was returned.
        """
        inbox, outbox = self._to_server, self._from_server
        if outbox is None or inbox is None:
            raise ConnectionClosed("the transport is not connected")
        while not outbox and inbox and not self._serving:
            if self._habits.at_once:
                await self._serve(inbox.get_nowait(), at_once=True)
            elif self._kept:
                break  # `keep`'s task serves it
            else:
                with anyio.CancelScope(shield=True):
                    await self._serve(inbox.get_nowait())
                # A timeout or cancellation that came meanwhile takes effect now; the reply is then late.
                await anyio.lowlevel.checkpoint_if_cancelled()
        try:
            reply = await outbox.get()
        except QueueClosed:
            raise ConnectionClosed(self._ended) from None
        self._in_flight -= 1
        return reply

    async def aclose(self) -> None:
        """End the channel: the session sees end-of-stream after its current request. Idempotent."""
        self._end()

    async def __aexit__(self, *exc_info: object) -> None:
        """Close, give the session `close_timeout` seconds to finish its request, then close its environment.

        Args:
            *exc_info: The exception that ended the block, if any (unused).
        """
        await self.aclose()
        session = self._session
        if session is None:
            return
        with anyio.CancelScope(shield=True):
            if self._serving:
                self._idle = idle = anyio.Event()
                with anyio.move_on_after(self.close_timeout):
                    await idle.wait()
            await session.aclose()
