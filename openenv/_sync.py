"""`SyncEnvClient`: the blocking facade of an `EnvClient`, on anyio's blocking portal.

Two promises shape this module: Ctrl-C interrupts any blocking call at once
(the async work behind it is cancelled, never waited for), and a facade left
open never keeps the interpreter from exiting (its event loop runs in a daemon
thread; a forgotten client is closed, with a `ResourceWarning`, when it is
collected or at exit, as an unclosed file is).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import threading
import warnings
import weakref
from collections.abc import Awaitable, Callable
from concurrent.futures import Future
from types import TracebackType
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import anyio
import anyio.lowlevel
from anyio.from_thread import BlockingPortal

from ._client import USE_CLIENT_DEFAULT, EnvClient, _UseClientDefault
from ._exceptions import ClientStateError
from ._mcp_types import Tool
from ._types import ActT, ObsT, StateT, StepResult

if TYPE_CHECKING:
    from typing import Self

__all__ = ["SyncEnvClient"]

_T = TypeVar("_T")

# How long an interrupted connect, or a close at exit, may take to unwind before
# the caller gets control back regardless (the work is already cancelled).
_UNWIND_TIMEOUT = 5.0


def _in_event_loop() -> bool:
    try:
        anyio.lowlevel.current_token()
    except RuntimeError:
        return False
    return True


def _refuse_inside_event_loop(name: str) -> None:
    if _in_event_loop():
        raise ClientStateError(
            f"SyncEnvClient.{name}() blocks, so it cannot run inside an event loop; "
            "await the EnvClient's own methods instead"
        )


class _LoopThread:
    """One event loop in a daemon thread, shared by every open sync client of a backend.

    Started by the first `acquire` and stopped by the last `release`. anyio's
    `BlockingPortalProvider` does the same, but stopping its portal blocks on the
    loop thread; at interpreter exit that thread is already frozen, so a portal
    still open then (a client nobody closed) hung the process for good.
    """

    def __init__(self, backend: str) -> None:
        self.backend = backend
        self._lock = threading.Lock()
        self._leases = 0
        self._portal: BlockingPortal | None = None
        self._thread: threading.Thread | None = None

    def acquire(self) -> BlockingPortal:
        with self._lock:
            if self._portal is None:
                self._portal, self._thread = self._start()
            self._leases += 1
            return self._portal

    def release(self) -> None:
        with self._lock:
            self._leases -= 1
            if self._leases:
                return
            portal, thread = self._portal, self._thread
            self._portal = self._thread = None
        assert portal is not None
        assert thread is not None
        # Every client of this loop is closed: whatever still runs is abandoned work.
        # Asked, not awaited, so that a loop thread that no longer runs cannot hold
        # the caller; the join is bounded. (RuntimeError: the loop has ended already.)
        with contextlib.suppress(RuntimeError):
            portal.start_task_soon(portal.stop, True)
        thread.join(_UNWIND_TIMEOUT)

    def _start(self) -> tuple[BlockingPortal, threading.Thread]:
        ready: Future[BlockingPortal] = Future()

        async def run_portal() -> None:
            async with BlockingPortal() as portal:
                ready.set_result(portal)
                await portal.sleep_until_stopped()

        def run() -> None:
            try:
                anyio.run(run_portal, backend=self.backend)
            except BaseException as exc:
                if not ready.done():
                    ready.set_exception(exc)

        thread = threading.Thread(target=run, name=f"openenv-sync-{self.backend}", daemon=True)
        thread.start()
        return ready.result(), thread


_loop_threads: dict[str, _LoopThread] = {}
_loop_threads_lock = threading.Lock()


def _loop_thread(backend: str) -> _LoopThread:
    with _loop_threads_lock:
        loop = _loop_threads.get(backend)
        if loop is None:
            loop = _loop_threads[backend] = _LoopThread(backend)
        return loop


def _call(portal: BlockingPortal, function: Callable[[], Awaitable[_T]]) -> _T:
    """Run ``function()`` on the portal and return its result; Ctrl-C cancels it there."""
    future = portal.start_task_soon(function)
    try:
        return future.result()
    except BaseException:
        future.cancel()  # no effect once it has finished: its own error passes through
        raise


class _OpenClient:
    """An async client held open by one task on a loop thread, until `close`.

    Kept apart from the facade, so that a finalizer can still close it once the
    facade is gone.

    Raises:
        BaseException: Whatever connecting raised, or the interrupt (Ctrl-C) that
            cut it short; the connect is then cancelled and unwound.
    """

    def __init__(self, client: EnvClient[Any, Any, Any], loop: _LoopThread) -> None:
        self.client = client
        self._loop = loop
        self.portal = loop.acquire()
        self._connected: Future[None] = Future()
        self._finished = threading.Event()
        self._stop: anyio.Event | None = None
        self._closed = False
        self._task: Future[None] | None = None
        try:
            self._task = self.portal.start_task_soon(self._hold_open)
            self._connected.result()
        except BaseException:
            # Refused, or interrupted: cancel the connect rather than wait it out.
            if self._task is not None:
                self._task.cancel()
            self._release()
            raise

    async def _hold_open(self) -> None:
        # Entered and left in this one task, as the client's task group (it owns its transport's idle work) needs.
        try:
            stop = anyio.Event()
            async with self.client:
                self._stop = stop
                self._connected.set_result(None)
                await stop.wait()
        except BaseException as exc:
            if not self._connected.done():
                self._connected.set_exception(exc)
            raise
        finally:
            self._finished.set()

    def close(self, *, timeout: float | None = None) -> None:
        """Close the client and release the loop; Ctrl-C (or ``timeout``) cancels the close."""
        if self._closed:
            return
        self._closed = True
        assert self._task is not None
        assert self._stop is not None
        try:
            try:
                self.portal.start_task_soon(self._stop.set)  # waited for through the task, below
            except RuntimeError:
                return  # the loop has ended, and the client with it
            self._task.result(timeout)
        except BaseException:
            self._task.cancel()
            raise
        finally:
            self._release()

    def _release(self) -> None:
        self._closed = True
        try:
            self._finished.wait(_UNWIND_TIMEOUT)  # a cancelled task still unwinds: bounded
        finally:
            self._loop.release()


def _close_abandoned(opened: _OpenClient, description: str) -> None:
    """Close a client whose facade was collected, or left open at exit; warn as an unclosed file does."""
    try:
        if _in_event_loop():
            # Collected inside some event loop: close elsewhere rather than block it.
            threading.Thread(target=_close_quietly, args=(opened,), daemon=True).start()
        else:
            _close_quietly(opened)
    finally:
        warnings.warn(f"unclosed {description}: close it, or use it in a `with` block", ResourceWarning, stacklevel=1)


def _close_quietly(opened: _OpenClient) -> None:
    with contextlib.suppress(Exception):  # nobody is left to tell: the client was abandoned
        opened.close(timeout=_UNWIND_TIMEOUT)


class _Holder:
    """What a blocking facade (`SyncEnvClient`, `SyncEnvPool`) keeps while its async object is open.

    The object is held open on an event-loop thread (`_OpenClient`), and a
    finalizer closes it should the facade be abandoned. The facade is passed to
    `open`, never kept: a reference back would leave the facade to the cycle
    collector, and an abandoned one would be closed late.

    Args:
        name: The facade's class name, for the messages.
        state: What the facade is once open ("connected", "open"), for the messages.
    """

    def __init__(self, name: str, state: str) -> None:
        self._name = name
        self._state = state
        self._open: _OpenClient | None = None
        self._finalizer: weakref.finalize[Any, Any] | None = None

    def open(self, facade: object, target: Any, backend: str) -> None:
        """Open ``target`` (an async client or pool) on ``backend``'s loop thread, for ``facade``."""
        _refuse_inside_event_loop("connect")
        if self._open is not None:
            raise ClientStateError(f"this {self._name} is already {self._state}")
        opened = _OpenClient(target, _loop_thread(backend))
        self._open = opened
        self._finalizer = weakref.finalize(facade, _close_abandoned, opened, repr(facade))

    def close(self) -> None:
        """Close the object, if open, and release the loop thread. Idempotent."""
        _refuse_inside_event_loop("close")
        opened, finalizer = self._open, self._finalizer
        self._open = self._finalizer = None
        if finalizer is not None:
            finalizer.detach()
        if opened is not None:
            opened.close()

    def portal(self, name: str) -> BlockingPortal:
        """The portal to call the open object through, for the facade's method ``name``."""
        _refuse_inside_event_loop(name)
        if self._open is None:
            raise ClientStateError(f"the {self._name} is not {self._state}: use `with` or call connect()")
        return self._open.portal


class SyncEnvClient(Generic[ActT, ObsT, StateT]):
    """The same client, blocking: for scripts, notebooks and training loops without async.

    Get one from `EnvClient.sync`. It runs the async client on an event loop in a
    background thread (anyio's blocking portal, shared by all sync clients of a
    backend, started with the first and stopped with the last), so it behaves
    exactly as the async client does, under asyncio or trio, and raises the same
    exceptions.

    Every method raises `ClientStateError` when called from inside a running
    event loop, where blocking would stall it: there, await the `EnvClient`
    itself.

    Examples:
        ```python
        from openenv.examples.echo import CallToolAction, EchoEnv

        with EchoEnv("ws://127.0.0.1:8000").sync() as env:
            result = env.reset()
            for message in ("one", "two"):
                result = env.step(CallToolAction(tool_name="echo_message", arguments={"message": message}))
            print(result.observation.echoed_message, env.state().step_count)  # two 2
        ```

        Without a ``with`` block, pair `connect` with `close`:

        ```python
        from openenv.examples.echo import EchoEnv

        env = EchoEnv("ws://127.0.0.1:8000").sync(backend="trio").connect()
        try:
            env.reset()
        finally:
            env.close()
        ```

    Args:
        client: The async client to drive; it must not be connected yet.
        backend: The event loop to run it on: ``"asyncio"`` (the default) or ``"trio"``.

    Attributes:
        client: The async client this facade drives.
        backend: The event loop it runs on.
    """

    def __init__(self, client: EnvClient[ActT, ObsT, StateT], *, backend: str = "asyncio") -> None:
        self.client = client
        self.backend = backend
        self._holder = _Holder("SyncEnvClient", "connected")

    def __repr__(self) -> str:
        return f"<SyncEnvClient of {self.client!r}>"

    def __enter__(self) -> Self:
        """Connect (see `connect`); the end of the ``with`` block closes the client.

        Returns:
            This facade.

        Raises:
            ConnectError: The transport could not connect.
            ClientStateError: Already connected or closed, or called inside an event loop.
        """
        return self.connect()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc_value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def connect(self) -> Self:
        """Connect the client; pair with `close` (or use ``with``).

        Ctrl-C while it connects cancels the connect and raises
        `KeyboardInterrupt` at once. A facade never closed is closed when it is
        garbage-collected, or at the latest when the interpreter exits, with a
        `ResourceWarning` (as an unclosed file is): it never keeps the process alive.

        Returns:
            This facade.

        Raises:
            ConnectError: The transport could not connect.
            ClientStateError: Already connected or closed, or called inside an event loop.
            UnsupportedSchemeError: No transport handles the URL's scheme.
            ValueError: The transport rejected the URL or an option.
            TypeError: msgspec cannot decode into the client's types.
        """
        self._holder.open(self, self.client, self.backend)
        return self

    def close(self) -> None:
        """Close the client (see `EnvClient.close`) and release the event-loop thread. Idempotent.

        Ctrl-C while it closes cuts the close short (the server is then not told).

        Raises:
            ClientStateError: Called inside an event loop.
        """
        self._holder.close()

    def reset(
        self, *, timeout: float | _UseClientDefault | None = USE_CLIENT_DEFAULT, **kwargs: Any
    ) -> StepResult[ObsT]:
        """Start a new episode, blocking; see `EnvClient.reset`.

        Args:
            timeout: Seconds to wait for the reply, instead of the client's
                timeout (``None``: no limit).
            **kwargs: Passed to the environment's ``reset`` (``seed``, ``episode_id``, ...).

        Returns:
            The first observation, with its reward and done flag.

        Raises:
            ServerError: The server answered with an error (a subclass per code).
            TimeoutError: No reply within the timeout.
            TransportError: The connection closed or broke, or the server sent a
                malformed frame.
            ReplyValidationError: The reply does not fit the client's observation type.
            EncodingError: A keyword argument cannot be encoded.
            ClientStateError: Not connected, closed, or called inside an event loop.
        """
        portal = self._holder.portal("reset")
        return _call(portal, lambda: self.client.reset(timeout=timeout, **kwargs))

    def step(self, action: ActT, *, timeout: float | _UseClientDefault | None = USE_CLIENT_DEFAULT) -> StepResult[ObsT]:
        """Take one step, blocking; see `EnvClient.step`.

        Args:
            action: The action to apply.
            timeout: Seconds to wait for the reply, instead of the client's
                timeout (``None``: no limit).

        Returns:
            The observation that followed, with its reward and done flag.

        Raises:
            ValidationError: The server rejected the action; the session survives.
            ExecutionError: The environment raised while stepping; the session survives.
            ServerError: Any other error frame (a subclass per code).
            TimeoutError: No reply within the timeout.
            TransportError: The connection closed or broke, or the server sent a
                malformed frame.
            ReplyValidationError: The reply does not fit the client's observation type.
            EncodingError: The action cannot be encoded.
            ClientStateError: Not connected, closed, or called inside an event loop.
        """
        portal = self._holder.portal("step")
        return _call(portal, lambda: self.client.step(action, timeout=timeout))

    def state(self, *, timeout: float | _UseClientDefault | None = USE_CLIENT_DEFAULT) -> StateT:
        """Ask for the environment's state, blocking; see `EnvClient.state`.

        Args:
            timeout: Seconds to wait for the reply, instead of the client's
                timeout (``None``: no limit).

        Returns:
            The state, of the client's state type (a dict for an untyped client).

        Raises:
            ServerError: The server answered with an error (a subclass per code).
            TimeoutError: No reply within the timeout.
            TransportError: The connection closed or broke, or the server sent a
                malformed frame.
            ReplyValidationError: The reply does not fit the client's state type.
            ClientStateError: Not connected, closed, or called inside an event loop.
        """
        portal = self._holder.portal("state")
        return _call(portal, lambda: self.client.state(timeout=timeout))

    def list_tools(self, *, timeout: float | _UseClientDefault | None = USE_CLIENT_DEFAULT) -> list[Tool]:
        """List the tools of an MCP tool environment, blocking; see `EnvClient.list_tools`.

        Args:
            timeout: Seconds to wait for the reply, instead of the client's
                timeout (``None``: no limit).

        Returns:
            One `Tool` per tool.

        Raises:
            ServerError: The server answered with an error (``VALIDATION_ERROR``:
                the environment has no tools).
            TimeoutError: No reply within the timeout.
            TransportError: The connection closed or broke.
            ReplyValidationError: The reply is not a list of tools.
            ClientStateError: Not connected, closed, or called inside an event loop.
        """
        portal = self._holder.portal("list_tools")
        return _call(portal, lambda: self.client.list_tools(timeout=timeout))

    def call_tool(
        self, name: str, *, timeout: float | _UseClientDefault | None = USE_CLIENT_DEFAULT, **arguments: Any
    ) -> Any:
        """Call one tool and return its result, blocking; see `EnvClient.call_tool`.

        Args:
            name: The tool's name.
            timeout: Seconds to wait for the reply, instead of the client's
                timeout (``None``: no limit).
            **arguments: The tool's arguments.

        Returns:
            What the tool returned.

        Raises:
            ToolCallError: The tool failed; the session survives.
            ServerError: The server answered with an error.
            TimeoutError: No reply within the timeout.
            TransportError: The connection closed or broke.
            EncodingError: An argument cannot be encoded.
            ClientStateError: Not connected, closed, or called inside an event loop.
        """
        portal = self._holder.portal("call_tool")
        return _call(portal, lambda: self.client.call_tool(name, timeout=timeout, **arguments))

    def mcp(
        self,
        method: str,
        params: dict[str, Any] | None = None,
        *,
        timeout: float | _UseClientDefault | None = USE_CLIENT_DEFAULT,
    ) -> Any:
        """Send one MCP (JSON-RPC 2.0) request and return its result, blocking; see `EnvClient.mcp`.

        Args:
            method: The JSON-RPC method.
            params: Its parameters.
            timeout: Seconds to wait for the reply, instead of the client's
                timeout (``None``: no limit).

        Returns:
            The response's ``result``.

        Raises:
            MCPError: The response is an error; the session survives.
            ServerError: The server answered with an error frame.
            TimeoutError: No reply within the timeout.
            TransportError: The connection closed or broke.
            ClientStateError: Not connected, closed, or called inside an event loop.
        """
        portal = self._holder.portal("mcp")
        return _call(portal, lambda: self.client.mcp(method, params, timeout=timeout))

    def __getattr__(self, name: str) -> Any:
        """The client's own attribute of that name; a coroutine method of a subclass comes as a blocking one.

        As OpenEnv's sync wrapper does: a typed client's own ``async def``
        helpers (``async def solve(self, ...)``) are called blocking on the
        facade (``env.solve(...)``), on the client's event loop; any other
        attribute is the client's own.

        Args:
            name: The attribute's name.

        Returns:
            The attribute, or a blocking function that runs the coroutine method.

        Raises:
            AttributeError: The client has no such attribute.
        """
        if name.startswith("__") or name in _OWN_ATTRIBUTES:
            raise AttributeError(name)
        client = self.__dict__.get("client")
        if client is None:
            raise AttributeError(name)
        attribute = getattr(client, name)
        if not inspect.iscoroutinefunction(attribute):
            return attribute

        @functools.wraps(attribute)
        def blocking(*args: Any, **kwargs: Any) -> Any:
            portal = self._holder.portal(name)
            return _call(portal, lambda: getattr(client, name)(*args, **kwargs))

        return blocking


_OWN_ATTRIBUTES = frozenset({"client", "backend", "_holder"})
