"""Background tasks that belong to no caller's task: a transport's reader, an in-process session.

anyio starts a task only in a task group, and a task group must be left by the
task that entered it, in the cancel scope it was entered in. A transport that
opened one on connect could then be closed only by the task that connected it,
and never inside a ``move_on_after`` of its own: a client connected in one task
of a task group and used from another (as ``asyncio.gather`` allows the
reference's client) failed. So background tasks run here instead, in one host
task per event loop, which outlives every caller and ends with the loop.

anyio has no call that starts a task outside a task group; it does start one
when a thread of ours asks the loop through ``anyio.from_thread.run`` with the
loop's token (asyncio then runs a task of its own, trio a system task). So the
first background task of a loop starts a daemon thread that asks once for the
host and waits, blocked, until the loop ends; every later task is started in the
host's task group directly, with no thread involved.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Awaitable, Callable

import anyio
import anyio.from_thread
import anyio.lowlevel
from anyio.abc import TaskGroup

__all__ = ["BackgroundTask", "start_background"]

logger = logging.getLogger("openenv.background")

_HOST: anyio.lowlevel.RunVar[TaskGroup] = anyio.lowlevel.RunVar("openenv_background_host")
_HOST_LOCK: anyio.lowlevel.RunVar[anyio.Lock] = anyio.lowlevel.RunVar("openenv_background_host_lock")


class BackgroundTask:
    """A handle on a task started by `start_background`: cancel it, wait for it, from any task.

    Attributes:
        done: Set once the task has ended (returned, raised or been cancelled).
    """

    __slots__ = ("_scope", "done")

    def __init__(self) -> None:
        self._scope = anyio.CancelScope()
        self.done = anyio.Event()

    def cancel(self) -> None:
        """Cancel the task (before it starts, or wherever it waits); idempotent."""
        self._scope.cancel()

    async def stop(self) -> None:
        """Cancel the task and wait until it has ended; safe under any cancel scope of the caller's."""
        self._scope.cancel()
        with anyio.CancelScope(shield=True):
            await self.done.wait()

    async def _run(self, func: Callable[[], Awaitable[object]]) -> None:
        try:
            with self._scope:
                await func()
        except Exception:
            # The task owns its errors and the host must live on; the log keeps
            # what escaped, for whoever debugs a transport.
            logger.exception("a background task failed: %r", func)
        finally:
            self.done.set()


async def _host(ready: Callable[[TaskGroup], None]) -> None:
    try:
        async with anyio.create_task_group() as task_group:
            ready(task_group)
            await anyio.sleep_forever()
    except anyio.get_cancelled_exc_class():
        # Only the loop's own shutdown cancels the host: end quietly (asyncio would
        # log the cancellation as an unhandled error of a finished task).
        return


async def _host_task_group() -> TaskGroup:
    """This event loop's host task group, started on first use."""
    host = _HOST.get(None)
    if host is not None:
        return host
    lock = _HOST_LOCK.get(None)
    if lock is None:
        lock = anyio.Lock()
        _HOST_LOCK.set(lock)
    async with lock:
        host = _HOST.get(None)
        if host is not None:
            return host
        token = anyio.lowlevel.current_token()
        started = anyio.Event()
        found: list[TaskGroup] = []

        def ready(task_group: TaskGroup) -> None:
            found.append(task_group)
            started.set()

        def ask_the_loop() -> None:
            # It returns, or raises, once the loop ends: so does the host.
            with contextlib.suppress(BaseException):
                anyio.from_thread.run(_host, ready, token=token)

        threading.Thread(target=ask_the_loop, name="openenv-background-host", daemon=True).start()
        with anyio.CancelScope(shield=True):  # a moment: the loop starts the host at its next turn
            await started.wait()
        _HOST.set(found[0])
        return found[0]


async def start_background(func: Callable[[], Awaitable[object]]) -> BackgroundTask:
    """Start ``func()`` as a task of the event loop's own, not of the calling task.

    The task may outlive the caller's task and its cancel scopes; `BackgroundTask.stop`
    ends it, from any task. It must catch its own exceptions: one that escapes
    ends the task and is logged (logger ``openenv.background``), never raised
    in the caller.

    Args:
        func: The coroutine function to run, without arguments.

    Returns:
        A handle to cancel the task and to wait for its end.
    """
    handle = BackgroundTask()
    (await _host_task_group()).start_soon(handle._run, func)
    return handle
