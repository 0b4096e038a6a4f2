"""One thread per session for an environment's plain (``def``) methods, with a cheap hand-off.

A `SessionWorker` runs the plain methods of one session's environment on one
thread of its own, one call at a time and in order: a blocking ``step`` holds
up only its own session, and the environment never runs on two threads at
once. The thread starts with the session's first plain call and ends with
`SessionWorker.aclose` (or when the worker is garbage-collected), so a server
keeps one thread per live session, never more.

Most environment methods take microseconds, and waking the event loop from
another thread costs more than that. So the event loop waits for a call on the
spot, blocked, for at most `INLINE_WAIT` seconds, when the session's previous
call ran shorter than that; otherwise (or if the wait runs out) it awaits the
call like any other event, and the other sessions run meanwhile. Either way a
call blocks the event loop for at most `INLINE_WAIT`.

An environment without thread affinity (``thread_affinity = False``) lets a
batch's calls (`CallBatch`) run one after the other on a thread shared by the
sessions instead, one hand-over for them all; the calls a slow one holds up go
to their sessions' own threads, and a session's other calls wait for its call
on the shared thread, so its methods still never run on two threads at once.

An ``async`` method runs on the event loop; wrapped by `SessionWorker.serving`
(the session does so for a tool environment with plain tools), the plain code
it hands to `run_on_session_thread` runs on the session's thread too, so the
code that hands it over need not know which session, or which transport, it
serves.

The thread is not one of anyio's worker threads, so code on it reaches the
event loop through ``anyio.from_thread`` only with a token
(``anyio.lowlevel.current_token()``, taken on the event loop): anyio offers no
public way to make a thread of one's own find the event loop by itself.

A call that never returns cannot be stopped: Python cannot kill a thread. A
server that gives up on one (its client went, or it ran past the step
timeout) calls `SessionWorker.abandon` and cancels the caller: the caller
stops waiting, and the session can end and free its slot, while the thread
runs the call on to its end (then the calls queued behind it, such as the
environment's ``close``) and exits. `abandoned_calls` counts the calls
abandoned and still running in the process, for servers to bound them.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import queue
import threading
import time
import weakref
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import anyio.from_thread
import anyio.lowlevel
import anyio.to_thread

__all__ = ["INLINE_WAIT", "Call", "CallBatch", "SessionWorker", "abandoned_calls", "run_on_session_thread", "wait_for"]

INLINE_WAIT = 200e-6
"""Seconds the event loop may wait, blocked, for a call it expects to be quick."""

_abandoned_lock = threading.Lock()
_abandoned_running = 0  # calls abandoned (SessionWorker.abandon) whose thread still runs them


def abandoned_calls() -> int:
    """How many calls sessions gave up on (`SessionWorker.abandon`) are still running on their threads, process-wide.

    Returns:
        The number; each holds a thread (and what its environment holds) until its call returns.
    """
    return _abandoned_running


class Call:
    """One call handed to the thread, and what came of it."""

    __slots__ = (
        "abandoned",
        "args",
        "batch",
        "completed",
        "detached",
        "error",
        "finished",
        "followers",
        "function",
        "guard",
        "home",
        "kwargs",
        "ran_for",
        "result",
        "taken",
        "waiter",
    )

    def __init__(
        self,
        function: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        batch: CallBatch | None = None,
    ) -> None:
        self.function = function
        self.args = args
        self.kwargs = kwargs
        self.batch = batch
        self.result: Any = None
        self.error: BaseException | None = None
        self.ran_for = 0.0  # seconds the function took, measured on the thread
        # Held until the thread has run the call: the event loop's blocking wait.
        self.finished = threading.Lock()
        self.finished.acquire()
        # Guards the hand-over between the two ways of waiting: ``completed`` (set
        # by the thread) and ``waiter`` (set by the event loop once it stops
        # waiting blocked), so that exactly one side sees the other.
        self.guard = threading.Lock()
        self.completed = False
        self.abandoned = False  # nobody waits for it any more (SessionWorker.abandon)
        self.detached = False  # nobody ever waited for it (SessionWorker.run_detached)
        self.waiter: anyio.Event | None = None
        # A call on a shared thread (`SessionWorker.start` with ``shared``): the session's worker,
        # whether a thread has taken it (a shared one, or the session's own when taken back),
        # and the session's calls queued meanwhile, sent to its own thread once it is done.
        self.home: SessionWorker | None = None
        self.taken = False
        self.followers: list[tuple[queue.SimpleQueue[Call | None], Call | None]] | None = None

    def take(self) -> bool:
        """Claim a shared call for the thread that will run it; ``False``: another thread has it."""
        with self.guard:
            if self.taken:
                return False
            self.taken = True
            return True

    def outcome(self) -> Any:
        """What the function returned, or raise what it raised."""
        if not self.completed:
            raise RuntimeError("the call was abandoned: it still runs on the session's thread")
        if self.error is not None:
            error, self.error = self.error, None  # no cycle through the traceback
            raise error
        return self.result


class CallBatch:
    """Calls handed to many sessions' threads at once, waited for together: one wake-up for them all.

    Handing each call to its thread and awaiting it alone would wake the event
    loop once per call; a batch wakes it once, when its last call finishes (or
    `wait`'s time runs out first, so that slow calls do not hold up the quick).

    The calls of sessions that allow it (``shared``: their environments keep
    no state of a thread's) are not handed to each session's thread: `wait`
    hands them, in order, to one shared thread, one hand-over for them all.
    Those it has not started when `wait`'s time runs out (a slow call holds it)
    go to their sessions' own threads instead.

    Use it on the event loop that hands the calls over.
    """

    __slots__ = ("_done", "_launched", "_left", "_lock", "_shared", "_token", "calls")

    def __init__(self) -> None:
        self.calls: list[Call] = []
        self._left = 0
        self._lock = threading.Lock()
        self._done: anyio.Event | None = None
        self._token = anyio.lowlevel.current_token()
        self._shared: list[Call] = []  # for a shared thread, not handed over yet (`launch`)
        self._launched: list[Call] = []  # handed to shared threads

    def _add(self, call: Call) -> None:
        with self._lock:
            self._left += 1
        self.calls.append(call)

    def _finished_one(self) -> None:
        """On a session's thread: one call is over; the last one wakes the event loop if it waits."""
        with self._lock:
            self._left -= 1
            done = self._done if self._left == 0 else None
        if done is not None:
            with contextlib.suppress(anyio.RunFinishedError):
                anyio.from_thread.run_sync(done.set, token=self._token)

    def launch(self) -> None:
        """Hand the calls for a shared thread added so far to one; `wait` does it first.

        Call it before anything else that may wait, so that those calls never wait on it.
        """
        shared, self._shared = self._shared, []
        if shared:
            self._launched.extend(shared)
            _run_on_a_shared_thread(shared)

    async def wait(self, seconds: float) -> None:
        """Return once every call has finished, or after ``seconds`` (then some may still run).

        Quick calls are waited for on the spot, blocking the event loop for at
        most `INLINE_WAIT`, as `SessionWorker.run` waits for one: waking the
        event loop from a thread costs more than most calls.

        Args:
            seconds: The most to wait.
        """
        self.launch()
        deadline = time.perf_counter() + INLINE_WAIT
        for call in self.calls:
            if call.completed:
                continue
            left = deadline - time.perf_counter()
            if left <= 0 or not call.finished.acquire(timeout=left):
                break
        with self._lock:
            if self._left == 0:
                return
            done = self._done = anyio.Event()
        with anyio.move_on_after(seconds):
            await done.wait()
        with self._lock:
            self._done = None
        for call in self._launched:  # still waiting behind a slow call: to their sessions' own threads
            home = call.home
            if home is not None and call.take():
                home._own_queue().put(call)


class SessionWorker:
    """Runs one session's plain calls on one dedicated thread, in order.

    Use it from the event loop that serves the session, and `aclose` it when
    the session ends: the thread exits once it has run every call queued before.

    Args:
        name: The thread's name.
        shared: The calls handed over within a batch (`start`) may run on a
            thread shared with other sessions instead (see `CallBatch`): for an
            environment that keeps no state of a thread's. Every other call runs
            on the session's own thread, after any shared call still running.
    """

    def __init__(self, *, name: str = "openenv-session", shared: bool = False) -> None:
        self._name = name
        self._shared = shared
        self._calls: queue.SimpleQueue[Call | None] | None = None
        self._thread: threading.Thread | None = None
        self._closed = False
        self._quick = True  # whether the previous call ran within INLINE_WAIT
        self._in_hand: Call | None = None  # the call the event loop waits for, if any
        self._abandoned = False

    @property
    def thread(self) -> threading.Thread | None:
        """The thread, once the first call has started it (``None`` before)."""
        return self._thread

    def _start(self) -> queue.SimpleQueue[Call | None]:
        calls: queue.SimpleQueue[Call | None] = queue.SimpleQueue()
        token = anyio.lowlevel.current_token()
        # A daemon: an environment stuck in a call must not keep the process alive.
        thread = threading.Thread(target=_run_calls, args=(calls, token), name=self._name, daemon=True)
        thread.start()
        self._calls, self._thread = calls, thread
        # A session dropped without aclose() still lets its thread go.
        weakref.finalize(self, calls.put, None)
        return calls

    async def run(self, function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run ``function(*args, **kwargs)`` on the session's thread; return what it returns.

        If the caller is cancelled meanwhile, it still waits for the call to
        finish (as ``anyio.to_thread.run_sync`` does), then the cancellation
        goes on.

        Args:
            function: A plain callable.
            *args: Its positional arguments.
            **kwargs: Its keyword arguments.

        Returns:
            What ``function`` returned.

        Raises:
            RuntimeError: The worker is closed.
            BaseException: Whatever ``function`` raised.
        """
        call = self._queue(function, args, kwargs)
        if not (self._quick and call.finished.acquire(timeout=INLINE_WAIT)):
            self._in_hand = call
            try:
                await _wait_for(call)
            finally:
                self._in_hand = None
        self._quick = call.ran_for < INLINE_WAIT
        return call.outcome()

    async def run_until_stopped(self, function: Callable[[], Any], stop: Callable[[], object]) -> Any:
        """Run a long call on the session's thread, one that ends when ``stop`` is called.

        For a call that serves the session for a while (many requests) rather
        than one quick method: the event loop never waits for it on the spot.
        If the caller is cancelled meanwhile, ``stop()`` is called (on the event
        loop), the call is waited for, then the cancellation goes on.

        Args:
            function: A plain callable taking no argument.
            stop: Makes ``function`` return soon; called at most once.

        Returns:
            What ``function`` returned.

        Raises:
            RuntimeError: The worker is closed.
            BaseException: Whatever ``function`` raised.
        """
        call = self._queue(function, (), {})
        self._in_hand = call
        try:
            await _wait_for(call, on_cancel=stop)
        finally:
            self._in_hand = None
        return call.outcome()

    def start(self, batch: CallBatch, function: Callable[..., Any], *args: Any) -> Call:
        """Hand ``function(*args)`` to the session's thread as part of ``batch``, without waiting.

        Wait for it with ``batch.wait``, then read it with its ``outcome()`` once
        it is ``completed`` (else await `wait_for`). It is the call in hand
        until then: `abandon` lets it go.

        Raises:
            RuntimeError: The worker is closed.
        """
        if self._shared and not self._closed and self._settled():
            call = Call(function, args, {}, batch)
            call.home = self
            batch._add(call)
            batch._shared.append(call)
        else:
            call = self._queue(function, args, {}, batch)
        self._in_hand = call
        return call

    def _settled(self) -> bool:
        """Whether no call handed to a shared thread is still to run or running."""
        call = self._in_hand
        return call is None or call.home is None or call.completed

    @property
    def abandoned(self) -> bool:
        """Whether `abandon` was called."""
        return self._abandoned

    def abandon(self) -> bool:
        """Stop waiting for the call in hand, which runs on; cancel its caller too (it then raises the cancellation).

        For a call that may never return: the caller is let go, the thread runs
        the call on to its end, then the calls queued behind it, and exits once
        the worker is closed. Later calls are not waited for either (see
        `run_detached`). Call it on the event loop.

        Returns:
            Whether a call was in hand (it now counts in `abandoned_calls` until it returns).
        """
        global _abandoned_running
        self._abandoned = True
        call = self._in_hand
        if call is None:
            return False
        with call.guard:
            if call.completed or call.abandoned:
                return False
            call.abandoned = True
            waiter = call.waiter
        with _abandoned_lock:
            _abandoned_running += 1
        if waiter is not None:
            waiter.set()
        return True

    def run_detached(self, function: Callable[..., Any], *args: Any) -> None:
        """Queue ``function(*args)`` on the thread without waiting for it (behind an abandoned call, say).

        What it raises is lost; it runs only if the calls before it return.

        Args:
            function: A plain callable.
            *args: Its positional arguments.

        Raises:
            RuntimeError: The worker is closed.
        """
        call = self._queue(function, args, {})
        with call.guard:
            call.detached = True

    def _queue(
        self,
        function: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        batch: CallBatch | None = None,
    ) -> Call:
        """Hand a call to the thread (started by the first one); raise if the worker is closed."""
        if self._closed:
            raise RuntimeError("the session's worker is closed")
        call = Call(function, args, kwargs, batch)
        if batch is not None:
            batch._add(call)
        self._put(self._own_queue(), call)
        return call

    def _put(self, calls: queue.SimpleQueue[Call | None], call: Call | None) -> None:
        """Queue a call (or the end) on the session's own thread, after a shared call still to run or running."""
        shared = self._in_hand
        if shared is not None and shared.home is not None:
            with shared.guard:
                if not shared.completed:  # never two threads at once: its thread queues it once done
                    if shared.followers is None:
                        shared.followers = []
                    shared.followers.append((calls, call))
                    return
        calls.put(call)

    def _own_queue(self) -> queue.SimpleQueue[Call | None]:
        """The queue of the session's own thread (started by the first call)."""
        return self._calls if self._calls is not None else self._start()

    def serving(self, function: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
        """Wrap a coroutine function so that `run_on_session_thread` calls made inside it use this worker.

        Args:
            function: An ``async`` method of the session's environment.

        Returns:
            A coroutine function that takes the same arguments and returns
            what ``function`` returns.
        """

        async def on_event_loop(*args: Any, **kwargs: Any) -> Any:
            token = _serving.set(self)
            try:
                return await function(*args, **kwargs)
            finally:
                _serving.reset(token)

        return on_event_loop

    async def aclose(self) -> None:
        """Let the thread end once the calls queued before have run; idempotent.

        Returns at once: join `thread` to wait for it to be gone.
        """
        if self._closed:
            return
        self._closed = True
        if self._calls is not None:
            self._put(self._calls, None)


_serving: contextvars.ContextVar[SessionWorker | None] = contextvars.ContextVar("openenv_session_worker", default=None)


async def run_on_session_thread(function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Run a plain callable on the thread of the session being served; return what it returns.

    Inside a method wrapped by `SessionWorker.serving`, the call goes to that
    session's thread, in order with the session's other plain calls. Anywhere
    else (an environment used directly, outside a server), it runs in one of
    anyio's worker threads, as ``anyio.to_thread.run_sync`` runs it.

    Args:
        function: A plain callable.
        *args: Its positional arguments.
        **kwargs: Its keyword arguments.

    Returns:
        What ``function`` returned.

    Raises:
        RuntimeError: The session's worker is closed.
        BaseException: Whatever ``function`` raised.
    """
    worker = _serving.get()
    if worker is None:
        return await anyio.to_thread.run_sync(functools.partial(function, *args, **kwargs))
    return await worker.run(function, *args, **kwargs)


async def wait_for(call: Call) -> Any:
    """Wait for a call handed over with `SessionWorker.start` (letting other tasks run); return its outcome.

    A cancellation waits for the call all the same, then goes on.

    Raises:
        BaseException: Whatever the call raised.
    """
    await _wait_for(call)
    return call.outcome()


async def _wait_for(call: Call, *, on_cancel: Callable[[], object] | None = None) -> None:
    """Await ``call`` on the event loop, letting other tasks run until the thread has run it.

    A cancellation waits for the call all the same; with ``on_cancel``, that is
    called first (to end the call sooner), and the cancellation is raised after.
    """
    waiter = anyio.Event()
    with call.guard:
        if call.completed:
            return
        call.waiter = waiter
    if on_cancel is not None:
        try:
            await waiter.wait()
            return
        except anyio.get_cancelled_exc_class():
            on_cancel()
            with anyio.CancelScope(shield=True):
                await waiter.wait()  # the call's end, or its abandonment
            raise
    with anyio.CancelScope(shield=True):
        await waiter.wait()  # the call's end, or its abandonment
    await anyio.lowlevel.checkpoint_if_cancelled()


def _run_calls(calls: queue.SimpleQueue[Call | None], token: anyio.lowlevel.EventLoopToken) -> None:
    """A session's own thread: run calls in order until the ``None`` that ends it."""
    while True:
        call = calls.get()
        if call is None or not _run_call(call, token):
            return
        del call  # its result is not kept while the thread waits


def _run_call(call: Call, token: anyio.lowlevel.EventLoopToken) -> bool:
    """Run one call on this thread and tell whoever waits; ``False`` once the event loop has ended."""
    global _abandoned_running
    start = time.perf_counter()
    try:
        call.result = call.function(*call.args, **call.kwargs)
    except BaseException as exc:  # handed to the caller, whatever it is
        call.error = exc
    call.ran_for = time.perf_counter() - start
    with call.guard:
        call.completed = True
        waiter = call.waiter
        unwaited = call.abandoned or call.detached
        followers, call.followers = call.followers, None
    call.finished.release()
    if followers:  # the session's calls queued while this one ran elsewhere: to its own thread, in order
        for calls, follower in followers:
            calls.put(follower)
    if call.batch is not None:
        call.batch._finished_one()
    if unwaited:  # nobody waits for it: what it returned or raised goes nowhere
        if call.abandoned:
            with _abandoned_lock:
                _abandoned_running -= 1
        return True
    if waiter is not None:
        try:
            anyio.from_thread.run_sync(waiter.set, token=token)
        except anyio.RunFinishedError:  # the event loop has ended: nobody waits any more
            return False
    return True


SHARED_THREAD_IDLE = 60.0
"""Seconds a shared thread (`CallBatch`) waits for work before it ends."""

_idle_shared: list[queue.SimpleQueue[list[Call]]] = []  # the inboxes of the shared threads waiting for work
_idle_shared_lock = threading.Lock()


def _run_on_a_shared_thread(calls: list[Call]) -> None:
    """Hand ``calls`` to a shared thread that waits for work (one is started if none does); it runs them in order."""
    with _idle_shared_lock:
        inbox = _idle_shared.pop() if _idle_shared else None
    if inbox is None:
        inbox = queue.SimpleQueue()
        # A daemon, as a session's own: a call stuck there must not keep the process alive.
        threading.Thread(target=_run_shared, args=(inbox,), name="openenv-shared", daemon=True).start()
    inbox.put(calls)


def _run_shared(inbox: queue.SimpleQueue[list[Call]]) -> None:
    """A shared thread: run each batch's calls that no other thread took, then wait for more (or end)."""
    while True:
        try:
            calls = inbox.get(timeout=SHARED_THREAD_IDLE)
        except queue.Empty:
            with _idle_shared_lock:
                if inbox in _idle_shared:
                    _idle_shared.remove(inbox)
                    return
            continue  # handed work just now
        for call in calls:
            batch = call.batch
            if batch is not None and call.take() and not _run_call(call, batch._token):
                break
        del calls
        with _idle_shared_lock:
            _idle_shared.append(inbox)
