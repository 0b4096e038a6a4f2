"""`Watchdog`: cancels a client's cancel scopes at their deadlines, one sleeping task instead of a timer per call.

A cancel scope given a deadline arms a timer of the event loop when it is
entered and disarms it when it is left: on asyncio, a timer handle pushed on
the loop's heap and cancelled again, for every request. A client's requests come
one at a time and their deadlines only move forwards, so one task can stand
guard for all of them: it sleeps until the earliest deadline armed, and when it
wakes it cancels the scopes whose deadline has passed, then sleeps until the
next. Arming a scope is an update of a dict; the task is woken early only when a
deadline comes before the one it sleeps towards (the first request after an
idle spell, a call's shorter ``timeout``), and otherwise wakes about once per
timeout, however many requests went by.
"""

from __future__ import annotations

import math

import anyio

from ._background import BackgroundTask, start_background
from ._clock import Clock

__all__ = ["Watchdog"]


class Watchdog:
    """Cancels each armed scope once its deadline passes on the clock; built by `start`."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        # The scopes to cancel, each with its deadline on the clock.
        self._armed: dict[anyio.CancelScope, float] = {}
        # When the task wakes next (infinity: only when a scope is armed).
        self._alarm = math.inf
        # The task's current sleep; cancelled to wake it earlier than planned.
        self._nap = anyio.CancelScope()
        self._task: BackgroundTask | None = None

    @classmethod
    async def start(cls, clock: Clock) -> Watchdog:
        """Start a watchdog's task (a background task of the event loop, see `start_background`).

        Args:
            clock: Where the deadlines are measured, and the task sleeps.

        Returns:
            The watchdog, its task running until `stop`.
        """
        watchdog = cls(clock)
        watchdog._task = await start_background(watchdog._run)
        return watchdog

    def arm(self, scope: anyio.CancelScope, deadline: float) -> None:
        """Cancel ``scope`` once the clock reaches ``deadline``, unless it is disarmed first.

        Args:
            scope: The scope to cancel.
            deadline: When, as the clock's ``now`` reads it.
        """
        self._armed[scope] = deadline
        if deadline < self._alarm:
            self._alarm = deadline
            self._nap.cancel()

    def disarm(self, scope: anyio.CancelScope) -> None:
        """Forget ``scope`` (armed or not): it will not be cancelled by this watchdog."""
        self._armed.pop(scope, None)

    async def stop(self) -> None:
        """End the task; safe under any cancel scope of the caller's, and idempotent."""
        if self._task is not None:
            await self._task.stop()

    async def _run(self) -> None:
        clock = self._clock
        armed = self._armed
        while True:
            now = clock.now()
            for scope, deadline in list(armed.items()):
                if deadline <= now:
                    del armed[scope]
                    scope.cancel()
            self._alarm = min(armed.values(), default=math.inf)
            with anyio.CancelScope() as self._nap:
                if self._alarm == math.inf:
                    await anyio.sleep_forever()
                else:
                    await clock.sleep(self._alarm - now)
