"""The server side of one session, without any I/O: a request frame in, a reply frame out.

Every transport's server endpoint feeds frames to a `ServerSession` (through
`serve_frames`), so OpenEnv's behaviour lives here once: which error code a bad
frame gets, which reset keywords reach the environment, how a raising
environment is reported. The session survives every per-message error.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
import time
import types
from collections.abc import Awaitable, Callable, Coroutine, Generator, Sequence
from typing import Any, Protocol, cast

import anyio
import anyio.from_thread
import anyio.lowlevel
import msgspec

from ._codec import RequestError, ServerCodec, error_data, server_codec
from ._environment import Environment
from ._error_details import hiding_error_details
from ._exceptions import ConnectionClosed
from ._inline import Suspended, finish, start
from ._messages import Dialect
from ._tools import mcp_through_step, mcp_unsupported, runs_plain_steps, takes_tool_actions
from ._worker import Call, CallBatch, SessionWorker

__all__ = [
    "ServerSession",
    "SessionMetrics",
    "StepsAtOnce",
    "encode_fatal_error",
    "factory_error_message",
    "factory_failed_frame",
    "factory_name",
    "host_session",
    "serve_frames",
]

logger = logging.getLogger("openenv.server")

# What an error reply says instead of the exception when a server hides error details.
_HIDDEN_EXECUTION_ERROR = "the environment raised an exception (details are in the server's log)"
_HIDDEN_FACTORY_ERROR = "Failed to create environment (details are in the server's log)"


def _accepted_keywords(method: Callable[..., Any]) -> frozenset[str] | None:
    """The keyword names ``method`` accepts, or ``None`` if it takes ``**kwargs``."""
    try:
        parameters = inspect.signature(method).parameters.values()
    except (TypeError, ValueError):
        return None
    names = set()
    for parameter in parameters:
        if parameter.kind is inspect.Parameter.VAR_KEYWORD:
            return None
        if parameter.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY):
            names.add(parameter.name)
    return frozenset(names)


class SessionMetrics(Protocol):
    """What a server counts of its sessions' requests, per environment (for its ``/metrics``).

    `ServerSession` calls it once per request, from the event loop or from the
    session's thread; ``env`` is the environment's name (`factory_name`).
    ``transports.server._metrics.ServerMetrics`` is the server's.
    """

    def step_done(self, env: str, seconds: float) -> None:
        """A step was answered (an error reply included) after ``seconds`` on the server."""

    def reset_done(self, env: str, seconds: float) -> None:
        """A reset was answered after ``seconds`` on the server."""

    def error(self, env: str, code: str) -> None:
        """A request got an error reply with ``code`` (``VALIDATION_ERROR``, ``EXECUTION_ERROR``, ...)."""

    def transferred(self, env: str, received: int, sent: int) -> None:
        """A request frame of ``received`` bytes was answered with ``sent`` bytes (0 for none)."""


class ServerSession:
    """Runs one environment for one client session, frame by frame.

    Plain (sync) methods of the environment run on a thread of the session's
    own, one call at a time (see `openenv._worker`), so a slow step never
    blocks the event loop and the environment is never entered from two
    threads at once; the thread ends with the session. So do the plain tools
    and plain ``step_other`` of an `MCPEnvironment`. Async methods are awaited
    on the event loop.

    Examples:
        A session needs no I/O: frames in, frames out.

        ```python
        from openenv.examples.echo import EchoEnvironment
        from openenv.server import ServerSession

        session = ServerSession(EchoEnvironment())
        await session.handle(b'{"type": "reset", "data": {}}')
        step = b'{"type": "step", "data": {"tool_name": "echo_message", "arguments": {"message": "hi"}}}'
        print(await session.handle(step))  # b'{"type":"observation","data":{"observation":{"echoed_message":"hi",...
        await session.aclose()
        ```

    Args:
        env: The environment instance this session owns (it closes it).
        dialect: The dialect its transport negotiated; plain OpenEnv by default.
        strict: Validate actions strictly (no numeric strings for numbers, no
            floats for ints); ``None`` takes the environment's
            ``strict_validation`` (``False`` by default, as OpenEnv is lax).
        error_details: Whether an ``EXECUTION_ERROR`` reply names the
            exception the environment raised and its message (OpenEnv's
            behaviour); ``False`` sends a generic message instead, so no path
            or module name leaves the server (the log keeps the traceback).
            The same holds for the error of a tool that raised, in an
            `openenv.MCPEnvironment`'s observation and ``mcp`` replies.
        on_end: Called once when the session ends (a close request, `aclose`),
            before the environment is closed, which may take a while: a server
            frees the session's slot there, as its client may already open another.
        metrics: Where each request is counted (its kind, time, bytes and
            error code), or ``None``.
        name: The environment's name in ``metrics``; its class's
            (`factory_name`) by default.

    Attributes:
        env: The environment instance.
        dialect: The dialect of its frames.
    """

    def __init__(
        self,
        env: Any,
        *,
        dialect: Dialect = Dialect(),
        strict: bool | None = None,
        error_details: bool = True,
        on_end: Callable[[], object] | None = None,
        metrics: SessionMetrics | None = None,
        name: str | None = None,
    ) -> None:
        self.env = env
        self._on_end = on_end
        self._metrics = metrics
        self._name = name or (factory_name(type(env)) if metrics is not None else "")
        self.dialect = dialect
        self.error_details = error_details
        if strict is None:
            strict = bool(getattr(env, "strict_validation", False))
        self.codec: ServerCodec[Any] = server_codec(dialect, getattr(env, "action_type", dict), strict)
        # An environment without thread affinity lets a batch's plain steps share a thread (`CallBatch`).
        self._worker = SessionWorker(shared=getattr(env, "thread_affinity", True) is False)
        # A tool environment's async step may hand plain tools to the session's thread.
        self._plain_steps = runs_plain_steps(env)
        handle_mcp = getattr(env, "handle_mcp", None)
        self._mcp = self._runner(handle_mcp) if callable(handle_mcp) else None
        self._reset_keywords = _accepted_keywords(env.reset)
        self._reset = self._runner(env.reset)
        self._step = self._runner(env.step)
        if self._mcp is None and takes_tool_actions(getattr(env, "action_type", dict)):
            # No tools of its own, but tool actions: OpenEnv's server answers tools/list and tools/call with a step.
            self._mcp = functools.partial(mcp_through_step, self._step)
        if not error_details:  # a tool environment words its tools' errors: tell it to keep them generic
            self._step = hiding_error_details(self._step)
            if self._mcp is not None:
                self._mcp = hiding_error_details(self._mcp)
        # An async environment lives on the event loop: read its state there too
        # (unless its steps run plain code: then on the session's thread).
        async_env = inspect.iscoroutinefunction(env.step) and not self._plain_steps
        self._state = self._runner(self._read_state_inline if async_env else self._read_state)
        # Whether `handle_on_thread` can answer this session's resets, steps and state reads.
        self.handles_on_thread = not (
            inspect.iscoroutinefunction(env.reset) or inspect.iscoroutinefunction(env.step) or self._plain_steps
        )
        self._token: anyio.lowlevel.EventLoopToken | None = None
        close = getattr(env, "close", None)
        # The base class's close does nothing: no need to hand it to a thread.
        inherited = getattr(type(env), "close", None) is Environment.close
        self._close = self._runner(close) if close is not None and not inherited else None
        # A plain close is queued behind a call given up on (`abandon`), not waited for.
        self._plain_close = close if self._close is not None and not inspect.iscoroutinefunction(close) else None
        self._closed = False
        # One dispatch, two ways of answering: a request's call on the event loop (`handle`) or on
        # the session's thread (`handle_on_thread`, plain environments), and its reply's encoder.
        codec = self.codec
        self._encoders: dict[str, Callable[[Any, int | None], bytes]] = {
            "step": codec.observation,
            "reset": codec.observation,
            "state": codec.state,
        }
        self._loop_calls: dict[str, Callable[[Any], Awaitable[Any]]] = {
            "step": self._step,
            "reset": self._reset_on_loop,
            "state": self._state_on_loop,
        }
        self._thread_calls: dict[str, Callable[[Any], Any]] = {
            "step": env.step,
            "reset": self._reset_on_thread,
            "state": self._state_on_thread,
        }

    @property
    def closed(self) -> bool:
        """Whether the session has ended (a close request, or `aclose`)."""
        return self._closed

    def _runner(self, function: Callable[..., Any]) -> Callable[..., Awaitable[Any]]:
        """Wrap one environment method, once, into a coroutine function that runs it right."""
        if inspect.iscoroutinefunction(function):
            # On the event loop; any plain code it hands over goes to the session's thread.
            return self._worker.serving(function) if self._plain_steps else function
        run = self._worker.run

        async def run_on_session_thread(*args: Any, **kwargs: Any) -> Any:
            result = await run(function, *args, **kwargs)
            # A sync method may still hand back an awaitable (an async property, say).
            if inspect.isawaitable(result):
                result = await result
            return result

        return run_on_session_thread

    def _read_state(self) -> Any:
        return self.env.state

    def _reset_arguments(self, data: dict[str, Any]) -> dict[str, Any]:
        """The reset request's keywords the environment's ``reset`` takes (all, if it takes ``**kwargs``)."""
        return data if self._reset_keywords is None else self._reset_data(data)

    async def _reset_on_loop(self, data: dict[str, Any]) -> Any:
        return await self._reset(**self._reset_arguments(data))

    async def _state_on_loop(self, data: object) -> Any:
        return await self._state()

    def _reset_on_thread(self, data: dict[str, Any]) -> Any:
        return self.env.reset(**self._reset_arguments(data))

    def _state_on_thread(self, data: object) -> Any:
        return self.env.state

    async def _read_state_inline(self) -> Any:
        state = self.env.state
        return (await state) if inspect.isawaitable(state) else state

    async def handle(self, frame: bytes) -> bytes | None:
        """Handle one request frame.

        Never raises for a bad frame or a raising environment: those get an error
        reply (``INVALID_JSON``, ``UNKNOWN_TYPE``, ``VALIDATION_ERROR``,
        ``EXECUTION_ERROR``), and the session goes on.

        Args:
            frame: The request, as the client encoded it.

        Returns:
            The reply frame, or ``None`` for a close request (which ends the
            session, and gets no reply).
        """
        request_id: int | None = None
        metrics = self._metrics
        started = _clock() if metrics is not None else 0.0
        kind = error = None
        reply: bytes | None
        try:
            kind, data, request_id = self.codec.decode_request(frame)
            call = self._loop_calls.get(kind)
            if call is not None:
                reply = self._encoders[kind](await call(data), request_id)
            elif kind == "mcp":
                response = await self._mcp(data) if self._mcp is not None else mcp_unsupported(data)
                reply = self.codec.mcp(response, request_id)
            else:
                await self.aclose()
                reply = None
        except RequestError as exc:  # a frame that does not decode, or an environment refusing a request
            error = exc.code
            if exc.request_id is not None:
                request_id = exc.request_id
            reply = self.codec.error(exc.code, exc.message, extra=exc.extra, request_id=request_id)
        except Exception as exc:
            error = "EXECUTION_ERROR"
            reply = self._execution_error(exc, request_id)
        if metrics is not None:
            self._count(metrics, kind, error, started, len(frame), reply)
        return reply

    def start_handle(self, frame: bytes) -> bytes | Suspended | None:
        """`handle` a frame, run at once in the calling task (`openenv._inline.start`).

        A step whose action fits as it is (`ServerCodec.decode_step`) skips
        `handle`'s own coroutine and its general decoding: a server answering a
        link's envelope at once runs one per session per step. The reply is
        `handle`'s, whatever the frame.

        Args:
            frame: The request, as the client encoded it.

        Returns:
            The reply frame (``None`` for a close request), or the `Suspended`
            call, to be finished with `openenv._inline.finish` in the same task.
        """
        decoded = self.codec.decode_step(frame)
        if decoded is None:
            return start(self.handle(frame))
        action, request_id = decoded
        metrics = self._metrics
        started = _clock() if metrics is not None else 0.0
        try:
            stepping = cast("Coroutine[Any, Any, Any]", self._step(action))  # an async function's, always
            try:
                awaiting = stepping.send(None)
            except StopIteration as stop:
                reply = self.codec.observation(stop.value, request_id)
            else:
                return start(self._finish_step(Suspended(stepping, awaiting), request_id, len(frame), started))
        except Exception as exc:
            return self._stepped(self._execution_error(exc, request_id), True, len(frame), started)
        return self._stepped(reply, False, len(frame), started) if metrics is not None else reply

    async def _finish_step(self, suspended: Suspended, request_id: int | None, size: int, started: float) -> bytes:
        """The rest of a step `start_handle` began that waited, and its reply."""
        try:
            reply = self.codec.observation(await finish(suspended), request_id)
        except Exception as exc:
            return self._stepped(self._execution_error(exc, request_id), True, size, started)
        return self._stepped(reply, False, size, started)

    def _stepped(self, reply: bytes, failed: bool, size: int, started: float) -> bytes:
        """Count a step `start_handle` answered, as `handle` counts its requests; return its reply."""
        metrics = self._metrics
        if metrics is not None:
            self._count(metrics, "step", "EXECUTION_ERROR" if failed else None, started, size, reply)
        return reply

    def _step_decoded_failed(self, exc: Exception, started: float) -> dict[str, Any]:
        """Count a batch's step that raised (or whose observation cannot be encoded); its error reply's data."""
        reply = self.execution_error_data(exc)
        metrics = self._metrics
        if metrics is not None:
            metrics.step_done(self._name, _clock() - started)
            metrics.error(self._name, "EXECUTION_ERROR")
        return reply

    def _count(
        self,
        metrics: SessionMetrics,
        kind: str | None,
        error: str | None,
        started: float,
        size: int,
        reply: bytes | None,
    ) -> None:
        """Tell the metrics of one request: its kind's time, its error, its bytes."""
        name = self._name
        if kind == "step":
            metrics.step_done(name, _clock() - started)
        elif kind == "reset":
            metrics.reset_done(name, _clock() - started)
        if error is not None:
            metrics.error(name, error)
        metrics.transferred(name, size, 0 if reply is None else len(reply))

    def _reset_data(self, data: dict[str, Any]) -> dict[str, Any]:
        """The reset keywords the environment takes; the others are dropped, as OpenEnv's server drops them.

        A keyword dropped is logged (once per environment class and keyword in
        the process): a client's typo (``sed=3``) would otherwise go unseen.
        """
        keywords = self._reset_keywords
        assert keywords is not None
        accepted = {key: value for key, value in data.items() if key in keywords}
        if len(accepted) != len(data):
            _note_dropped(type(self.env), [key for key in data if key not in keywords], keywords)
        return accepted

    def _execution_error(self, exc: Exception, request_id: int | None) -> bytes:
        """The reply when the environment raised, or returned something that cannot be encoded."""
        return self.codec.encode_error(self.execution_error_data(exc), request_id)

    def execution_error_data(self, exc: Exception) -> dict[str, Any]:
        """Log what the environment raised (or returned that cannot be encoded); the ``EXECUTION_ERROR`` reply's data.

        Args:
            exc: The exception.

        Returns:
            The error reply's data: it names the exception unless `error_details` is off.
            An environment that raised `openenv.server.RequestError` refused the
            request with a code of its own (``VALIDATION_ERROR``, say): its code,
            message and fields, as it wrote them.
        """
        if isinstance(exc, RequestError):
            return error_data(exc.code, exc.message, exc.extra)
        logger.exception("environment error in session", exc_info=exc)
        message = f"{type(exc).__name__}: {exc}" if self.error_details else _HIDDEN_EXECUTION_ERROR
        return error_data("EXECUTION_ERROR", message)

    async def run_on_thread(self, function: Callable[[], Any], stop: Callable[[], object]) -> Any:
        """Run ``function`` on the session's thread until it returns; ``stop()`` makes it return soon.

        This is how a transport that can read requests on that thread answers
        them with `handle_on_thread`, with no trip through the event loop per
        request (see `transports.websocket._socket_loan`). Cancelling the
        caller calls ``stop()``, waits for ``function``, then goes on.

        Args:
            function: The plain code that serves requests; it may call `handle_on_thread`.
            stop: Makes ``function`` return soon; called on the event loop, at most once.

        Returns:
            What ``function`` returned.
        """
        self._token = anyio.lowlevel.current_token()
        return await self._worker.run_until_stopped(function, stop)

    def start_on_thread(self, batch: CallBatch, frame: bytes) -> Call:
        """Hand a request to the session's thread, within ``batch``, to be answered as `handle_on_thread` does.

        For a server stepping many sessions at once: ``batch.wait`` wakes the
        event loop once for every call of the batch. Only when `handles_on_thread`.

        Args:
            batch: The batch the call joins.
            frame: The request.

        Returns:
            The call; once completed, its ``outcome()`` is `handle_on_thread`'s
            (``None``: the request must go to `handle`).

        Raises:
            RuntimeError: The session is closed.
        """
        if self._token is None:
            self._token = anyio.lowlevel.current_token()
        return self._worker.start(batch, self.handle_on_thread, frame)

    def handle_on_thread(self, frame: bytes, admit: Callable[[int | None], bool] | None = None) -> bytes | None:
        """Answer a reset, step or state request on the session's thread, as `handle` would.

        Call it only from the function given to `run_on_thread`, and only when
        `handles_on_thread` (the environment's reset and step are plain).
        Anything else is left to `handle` on the event loop, unread: a close
        or MCP request, a frame that does not decode or validate (its error
        reply comes from there), or a request ``admit`` turns down.

        Args:
            frame: The request, as the client encoded it.
            admit: Called with the request's id (``None`` in dialects without
                ids) before the environment sees it; ``False`` leaves the
                request to `handle`. Once it returns ``True``, the request
                gets a reply.

        Returns:
            The reply frame, or ``None``: the request must go to `handle`.
        """
        try:
            kind, data, request_id = self.codec.decode_request(frame)
        except RequestError:
            return None
        call = self._thread_calls.get(kind)
        if call is None or (admit is not None and not admit(request_id)):
            return None
        metrics = self._metrics
        started = _clock() if metrics is not None else 0.0
        error = None
        try:
            reply = self._encoders[kind](self._resolved(call(data)), request_id)
        except Exception as exc:
            error = exc.code if isinstance(exc, RequestError) else "EXECUTION_ERROR"
            reply = self._execution_error(exc, request_id)
        if metrics is not None:
            self._count(metrics, kind, error, started, len(frame), reply)
        return reply

    def _resolved(self, result: Any) -> Any:
        """``result``, awaited on the event loop if a plain method handed back an awaitable."""
        if inspect.isawaitable(result):
            return anyio.from_thread.run(_awaited, result, token=self._token)
        return result

    def abandon(self) -> bool:
        """Give up on the plain call the session waits for (a step that does not return): let the session end.

        Python cannot stop a thread: the call runs on, on the session's
        thread, and the environment's plain ``close`` runs there after it, if
        it ever returns (see `openenv._worker`). Cancel the session's task
        too: it then stops waiting and ends, freeing its slot. An ``async``
        call needs no abandoning: cancelling the task stops it.

        Returns:
            Whether a plain call was in hand.
        """
        return self._worker.abandon()

    async def aclose(self) -> None:
        """End the session and close its environment, once; never raises for the environment."""
        if self._closed:
            return
        self._closed = True
        on_end, self._on_end = self._on_end, None
        if on_end is not None:
            try:
                on_end()
            except Exception:
                logger.exception("the session's on_end callback raised")
        with anyio.CancelScope(shield=True):
            if self._worker.abandoned and self._plain_close is not None:
                self._worker.run_detached(self._plain_close)  # after the call given up on, if it returns
            elif self._close is not None:
                try:
                    await self._close()
                except Exception:
                    logger.exception("environment close() raised")
            await self._worker.aclose()


_clock = time.perf_counter

# The (environment class, keyword) pairs whose dropping was logged already.
_dropped_noted: set[tuple[type, str]] = set()


class StepsAtOnce:
    """A batch's steps on actions decoded already, one session's after the other, in the calling task.

    As `ServerSession.start_handle` does for a frame, each step runs at once
    unless it waits, and its reply is what `ServerSession.handle` would answer.
    `run` takes them with no coroutine of its own per step, and no exception per
    step that returns: each step's coroutine is driven as ``await`` drives it.
    Start it with `openenv._inline.start`. It is done at once unless a step
    waits; it is then `openenv._inline.Suspended` on that step (the one at
    ``len(observations)``), to be finished in the same task, after `stop` if
    the steps after it are to go on their own.

    Args:
        sessions: The sessions, one per step (of one codec: ``codec``).
        actions: Their actions, decoded already.
        codec: Their codec.

    Attributes:
        observations: The reply of each step taken, in order, as a batch carries
            it (`openenv._codec.ServerCodec.batch_observation`); ``None`` where
            the step failed.
        errors: The ``EXECUTION_ERROR`` reply's data of each step that failed
            (the environment raised, or returned what cannot be encoded), by position.
    """

    __slots__ = ("_actions", "_codec", "_sessions", "_stopped", "errors", "observations")

    def __init__(self, sessions: Sequence[ServerSession], actions: Sequence[Any], codec: ServerCodec[Any]) -> None:
        self._sessions = sessions
        self._actions = actions
        self._codec = codec
        self._stopped = False
        self.observations: list[msgspec.Raw | None] = []
        self.errors: dict[int, dict[str, Any]] = {}

    def stop(self) -> None:
        """Take no step after the one running (the one that waits)."""
        self._stopped = True

    @types.coroutine
    def run(self) -> Generator[Any, Any, None]:
        """Take the steps, in order, until the last or `stop` (a generator-based coroutine: see the class)."""
        observations, errors, codec = self.observations, self.errors, self._codec
        # `ServerCodec.batch_observation`, inline for a Struct or a dict (what steps return): no call per step.
        encode, raw, whole = codec.encode_value, msgspec.Raw, (msgspec.Struct, dict)
        for session, action in zip(self._sessions, self._actions, strict=True):
            if self._stopped:
                return
            metrics = session._metrics
            started = _clock() if metrics is not None else 0.0
            try:
                observation = yield from session._step(action)  # type: ignore[misc]  # an async function's coroutine
                reply = (
                    raw(encode(observation)) if isinstance(observation, whole) else codec.batch_observation(observation)
                )
            except Exception as exc:
                errors[len(observations)] = session._step_decoded_failed(exc, started)
                observations.append(None)
                continue
            if metrics is not None:
                metrics.step_done(session._name, _clock() - started)
            observations.append(reply)


def _note_dropped(env_type: type, dropped: list[str], keywords: frozenset[str]) -> None:
    """Log, once per environment class and keyword, reset keywords the environment does not take."""
    new = [name for name in dropped if (env_type, name) not in _dropped_noted]
    if not new:
        return
    _dropped_noted.update((env_type, name) for name in new)
    logger.warning(
        "reset() of %s takes no keyword %s: dropped, as OpenEnv's server drops it (it takes %s)",
        factory_name(env_type),
        ", ".join(f"{name}=" for name in new),
        ", ".join(f"{name}=" for name in sorted(keywords)) or "none",
    )


async def _awaited(awaitable: Awaitable[Any]) -> Any:
    return await awaitable


ServeOnThread = Callable[[ServerSession], Awaitable[bytes | None]]
"""A transport's way to serve requests on a session's thread (see `serve_frames`)."""


async def serve_frames(
    session: ServerSession,
    receive: Callable[[], Awaitable[bytes]],
    send: Callable[[bytes], Awaitable[None]],
    *,
    serve_on_thread: ServeOnThread | None = None,
) -> None:
    """Feed one session from a channel until the client closes it or goes away.

    Args:
        session: The session to feed.
        receive: Returns the next request frame; raises `ConnectionClosed` when
            the client has gone.
        send: Sends one reply frame; may raise `ConnectionClosed`.
        serve_on_thread: For a session whose environment is plain, awaited
            before each ``receive``: it may answer any number of requests on
            the session's thread (with `ServerSession.run_on_thread`), and
            returns a reply it could not send (``send`` sends it), or ``None``.
            The requests it leaves come from ``receive``.

    The environment is closed on the way out, however the loop ends.
    """
    if not session.handles_on_thread:
        serve_on_thread = None
    try:
        while not session.closed:
            try:
                if serve_on_thread is not None:
                    unsent = await serve_on_thread(session)
                    if unsent is not None:
                        await send(unsent)
                frame = await receive()
            except ConnectionClosed:
                return
            reply = await session.handle(frame)
            if reply is not None:
                try:
                    await send(reply)
                except ConnectionClosed:
                    return
    finally:
        await session.aclose()


def encode_fatal_error(dialect: Dialect, code: str, message: str, **extra: Any) -> bytes:
    """Encode the error frame a server sends once before ending a session it cannot serve.

    Args:
        dialect: The dialect of the channel.
        code: ``CAPACITY_REACHED``, ``FACTORY_ERROR`` or ``SESSION_ERROR``.
        message: The human-readable message.
        **extra: More fields (``active_sessions``, ``max_sessions``, ``factory_name``).

    Returns:
        The encoded frame.
    """
    return server_codec(dialect, msgspec.Raw, False).error(code, message, extra=extra)


def factory_name(factory: Callable[[], Any]) -> str:
    """A readable name of an environment factory, for logs and ``FACTORY_ERROR`` frames.

    Args:
        factory: The factory: a class, a function, or any callable.

    Returns:
        ``"module:qualified.name"``, or the best name the object has.
    """
    module = getattr(factory, "__module__", None)
    name = getattr(factory, "__qualname__", None) or repr(factory)
    return f"{module}:{name}" if module else name


def factory_error_message(exc: BaseException, *, error_details: bool) -> str:
    """What a client is told when an environment factory raised: the one wording every endpoint uses.

    Args:
        exc: What the factory raised.
        error_details: Whether the message may name the exception (else it points at the log).

    Returns:
        ``"Failed to create environment: RuntimeError: ..."``, or the same without the exception.
    """
    if not error_details:
        return _HIDDEN_FACTORY_ERROR
    return f"Failed to create environment: {type(exc).__name__}: {exc}"


def factory_failed_frame(
    dialect: Dialect, factory: Callable[[], Any], exc: BaseException, *, error_details: bool
) -> bytes:
    """Encode the ``FACTORY_ERROR`` frame that ends a session whose environment could not be built.

    Args:
        dialect: The dialect of the channel.
        factory: The factory that raised (named in the frame when details are shown).
        exc: What it raised.
        error_details: Whether the frame may name the exception and the factory.

    Returns:
        The encoded frame.
    """
    message = factory_error_message(exc, error_details=error_details)
    if not error_details:
        return encode_fatal_error(dialect, "FACTORY_ERROR", message)
    return encode_fatal_error(dialect, "FACTORY_ERROR", message, factory_name=factory_name(factory))


async def host_session(
    factory: Callable[[], Any],
    receive: Callable[[], Awaitable[bytes]],
    send: Callable[[bytes], Awaitable[None]],
    *,
    dialect: Dialect = Dialect(),
    error_details: bool = True,
    on_end: Callable[[], object] | None = None,
    serve_on_thread: ServeOnThread | None = None,
    metrics: SessionMetrics | None = None,
    on_session: Callable[[ServerSession], object] | None = None,
) -> None:
    """Run one whole server session over a channel: build the environment, then serve it.

    This is what every transport's server endpoint runs per connection, once the
    connection is accepted and any capacity check passed.

    Args:
        factory: Builds the session's environment; called once, on the event loop.
        receive: Returns the next request frame; raises `ConnectionClosed` when
            the client has gone.
        send: Sends one reply frame; may raise `ConnectionClosed`.
        dialect: The dialect the channel negotiated.
        error_details: Whether error replies say what failed (see
            `ServerSession`); also whether ``FACTORY_ERROR`` names the factory
            and its exception.
        on_end: Called once when the session ends, before its environment is
            closed (see `ServerSession`); not called if the factory raised.
        serve_on_thread: The transport's way to answer requests on the
            session's thread, if it has one (see `serve_frames`).
        metrics: Where the session's requests are counted (see
            `ServerSession`), under the factory's name; ``None`` for nowhere.
        on_session: Called with the `ServerSession` once the environment is
            built: to give up on a step later (`ServerSession.abandon`), say.

    If the factory raises, the client gets one ``FACTORY_ERROR`` frame and the
    session ends. The environment is closed however the session ends. It returns
    when the client sends ``close`` or goes away (``receive`` raised
    `ConnectionClosed`); cancelling it ends the session too.

    Examples:
        A session over two in-memory queues, as an endpoint would run it over a
        connection:

        ```python
        from openenv import ConnectionClosed
        from openenv.channel import FrameQueue, QueueClosed
        from openenv.examples.echo import EchoEnvironment
        from openenv.server import host_session

        requests: FrameQueue[bytes] = FrameQueue()
        replies: FrameQueue[bytes] = FrameQueue()


        async def receive() -> bytes:
            try:
                return await requests.get()
            except QueueClosed:
                raise ConnectionClosed("the client went away") from None


        async def send(frame: bytes) -> None:
            replies.put(frame)


        requests.put(b'{"type": "reset", "data": {}}')
        requests.put(b'{"type": "close"}')
        await host_session(EchoEnvironment, receive, send)  # returns at the close request
        print(await replies.get())  # b'{"type":"observation","data":{"observation":{"echoed_message":"",...
        ```
    """
    try:
        env = factory()
    except Exception as exc:
        logger.exception("environment factory failed")
        frame = factory_failed_frame(dialect, factory, exc, error_details=error_details)
        with contextlib.suppress(ConnectionClosed):
            await send(frame)
        return
    session = ServerSession(
        env,
        dialect=dialect,
        error_details=error_details,
        on_end=on_end,
        metrics=metrics,
        name=factory_name(factory) if metrics is not None else None,
    )
    if on_session is not None:
        on_session(session)
    await serve_frames(session, receive, send, serve_on_thread=serve_on_thread)
