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
timeout, however many requests went by. The task starts with the first scope
armed: a client that makes no call with a timeout (or none at all: a fleet
opened and not yet used) costs no task.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable

import anyio

from ._clock import Clock

__all__ = ["Watchdog"]


class Watchdog:
    """Cancels each armed scope once its deadline passes on the clock, while `run` runs.

    Args:
        clock: Where the deadlines are measured, and the task sleeps.
        launch: Starts `run` in a task of the owner's, when the first scope is
            armed; ``None``: the caller runs it.
    """

    def __init__(self, clock: Clock, launch: Callable[[Callable[[], Awaitable[None]]], object] | None = None) -> None:
        self._clock = clock
        self._launch = launch
        # The scopes to cancel, each with its deadline on the clock.
        self._armed: dict[anyio.CancelScope, float] = {}
        # When the task wakes next (infinity: only when a scope is armed).
        self._alarm = math.inf
        # The task's current sleep; cancelled to wake it earlier than planned.
        self._nap = anyio.CancelScope()

    def arm(self, scope: anyio.CancelScope, deadline: float) -> None:
        """Cancel ``scope`` once the clock reaches ``deadline``, unless it is disarmed first.

        Args:
            scope: The scope to cancel.
            deadline: When, as the clock's ``now`` reads it.
        """
        self._armed[scope] = deadline
        launch = self._launch
        if launch is not None:
            self._launch = None
            launch(self.run)
        if deadline < self._alarm:
            self._alarm = deadline
            self._nap.cancel()

    def disarm(self, scope: anyio.CancelScope) -> None:
        """Forget ``scope`` (armed or not): it will not be cancelled by this watchdog."""
        self._armed.pop(scope, None)

    async def run(self) -> None:
        """Stand guard until cancelled: the owner of the client runs it in a task of its own."""
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
