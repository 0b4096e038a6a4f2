"""Blocking facades: an async client or pool held open on an event loop in a daemon thread, called through a portal.

`openenv.SyncEnvClient` and `openenv.SyncEnvPool` stand on it. Two promises
shape this module: Ctrl-C interrupts any blocking call at once
(the async work behind it is cancelled, never waited for), and a facade left
open never keeps the interpreter from exiting (its event loop runs in a daemon
thread; a forgotten client is closed, with a `ResourceWarning`, when it is
collected or at exit, as an unclosed file is).
"""

from __future__ import annotations

import contextlib
import os
import threading
import warnings
import weakref
from collections.abc import Awaitable, Callable
from concurrent.futures import Future
from contextlib import AbstractAsyncContextManager
from types import TracebackType
from typing import Any, Self, TypeVar

import anyio
import anyio.lowlevel
from anyio.from_thread import BlockingPortal

from ._exceptions import ClientStateError
from ._lane import BLOCKING_CALLERS

__all__ = ["BlockingFacade", "Holder", "call", "in_event_loop"]

_T = TypeVar("_T")

# How long an interrupted connect, or a close at exit, may take to unwind before
# the caller gets control back regardless (the work is already cancelled).
_UNWIND_TIMEOUT = 5.0


_forks = 0  # processes forked from this one, as seen by the child


def _forked() -> None:
    global _forks
    _forks += 1


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forked)


def in_event_loop() -> bool:
    """Whether an event loop (anyio's: asyncio or trio) runs in this thread."""
    try:
        anyio.lowlevel.current_token()
    except RuntimeError:
        return False
    return True


def _refuse_inside_event_loop(name: str) -> None:
    if in_event_loop():
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


def call(portal: BlockingPortal, function: Callable[[], Awaitable[_T]]) -> _T:
    """Run ``function()`` on the portal and return its result; Ctrl-C cancels it there."""
    future = portal.start_task_soon(function)
    try:
        return future.result()
    except BaseException:
        future.cancel()  # no effect once it has finished: its own error passes through
        raise


class _HeldOpen:
    """An async client (or pool) held open by one task on a loop thread, until `close`.

    Kept apart from the facade, so that a finalizer can still close it once the
    facade is gone.

    Args:
        client: The async client (or pool) to hold open.
        loop: The loop thread to hold it on.
        on_open: Called in the holding task once the client is open (on the event loop).

    Raises:
        BaseException: Whatever connecting raised, or the interrupt (Ctrl-C) that
            cut it short; the connect is then cancelled and unwound.
    """

    def __init__(
        self,
        client: AbstractAsyncContextManager[Any],
        loop: _LoopThread,
        on_open: Callable[[], object] | None = None,
    ) -> None:
        self.client = client
        self._on_open = on_open
        self._loop = loop
        self.generation = _forks  # a forked child has no loop thread, and must not touch the parent's connections
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
            if self._on_open is not None:
                BLOCKING_CALLERS.set(True)  # this task's own context: its transports may lend to the caller's thread
            async with self.client:
                if self._on_open is not None:
                    self._on_open()
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
        """Close the client and release the loop; Ctrl-C (or ``timeout``) cancels the close.

        In a forked child it only forgets the client: its loop thread and its
        connections are the parent's.
        """
        if self._closed:
            return
        self._closed = True
        if self.generation != _forks:
            return
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


def _close_abandoned(opened: _HeldOpen, description: str) -> None:
    """Close a client whose facade was collected, or left open at exit; warn as an unclosed file does."""
    if opened.generation != _forks:
        return  # a forked child's copy: the parent's to close
    try:
        if in_event_loop():
            # Collected inside some event loop: close elsewhere rather than block it.
            threading.Thread(target=_close_quietly, args=(opened,), daemon=True).start()
        else:
            _close_quietly(opened)
    finally:
        warnings.warn(f"unclosed {description}: close it, or use it in a `with` block", ResourceWarning, stacklevel=1)


def _close_quietly(opened: _HeldOpen) -> None:
    with contextlib.suppress(Exception):  # nobody is left to tell: the client was abandoned
        opened.close(timeout=_UNWIND_TIMEOUT)


class Holder:
    """What a blocking facade (`openenv.SyncEnvClient`, `openenv.SyncEnvPool`) keeps while its async object is open.

    The object is held open on an event-loop thread (`_HeldOpen`), and a
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
        self._open: _HeldOpen | None = None
        self._finalizer: weakref.finalize[Any, Any] | None = None

    def open(
        self,
        facade: object,
        target: AbstractAsyncContextManager[Any],
        backend: str,
        on_open: Callable[[], object] | None = None,
    ) -> None:
        """Open ``target`` (an async client or pool) on ``backend``'s loop thread, for ``facade``.

        With ``on_open``, called on the event loop once ``target`` is open, the
        target's transports learn that blocking callers use them
        (`openenv._lane.BLOCKING_CALLERS`).
        """
        _refuse_inside_event_loop("connect")
        if self._open is not None:
            raise ClientStateError(f"this {self._name} is already {self._state}")
        opened = _HeldOpen(target, _loop_thread(backend), on_open)
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
        opened = self._open
        if opened is None:
            raise ClientStateError(f"the {self._name} is not {self._state}: use `with` or call connect()")
        if opened.generation != _forks:
            raise ClientStateError(
                f"this {self._name} was {self._state} in the parent process, before the fork; "
                "make a new one in this process"
            )
        return opened.portal


class BlockingFacade:
    """The ``with`` block of a blocking facade: entering it is `connect`, leaving it `close`."""

    def connect(self) -> Self:
        """Open the async object; the subclass says how."""
        raise NotImplementedError

    def close(self) -> None:
        """Close the async object; the subclass says how."""
        raise NotImplementedError

    def __enter__(self) -> Self:
        """Open (see `connect`); the end of the ``with`` block closes (see `close`).

        Returns:
            This facade.

        Raises:
            ClientStateError: Already open or closed, or called inside an event loop.
            OpenEnvError: Whatever else `connect` raises.
        """
        return self.connect()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc_value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()
