"""`openenv._watchdog.Watchdog`: the client's one task that cancels its calls' scopes at their deadlines."""

from __future__ import annotations

import anyio
import pytest

from openenv._watchdog import Watchdog
from tests.helpers import ManualClock

pytestmark = pytest.mark.anyio


async def test_each_armed_scope_is_cancelled_at_its_own_deadline_and_a_disarmed_one_never() -> None:
    clock = ManualClock()
    with anyio.fail_after(5):
        watchdog = await Watchdog.start(clock)
        try:
            late, early, disarmed = anyio.CancelScope(), anyio.CancelScope(), anyio.CancelScope()
            watchdog.arm(late, 10.0)
            watchdog.arm(early, 2.0)  # earlier than the deadline the task sleeps towards
            watchdog.arm(disarmed, 1.0)
            watchdog.disarm(disarmed)

            await clock.advance_when_blocked(2.0)
            await anyio.wait_all_tasks_blocked()
            assert (early.cancel_called, late.cancel_called, disarmed.cancel_called) == (True, False, False)

            await clock.advance_when_blocked(7.9)
            await anyio.wait_all_tasks_blocked()
            assert not late.cancel_called
            await clock.advance_when_blocked(0.1)
            await anyio.wait_all_tasks_blocked()
            assert late.cancel_called
            assert not disarmed.cancel_called
        finally:
            await watchdog.stop()


async def test_a_deadline_armed_again_later_moves() -> None:
    """Re-arming a scope replaces its deadline: later (a send's grace) or earlier (back to the call's own)."""
    clock = ManualClock()
    with anyio.fail_after(5):
        watchdog = await Watchdog.start(clock)
        try:
            scope = anyio.CancelScope()
            watchdog.arm(scope, 1.0)
            watchdog.arm(scope, 3.0)
            await clock.advance_when_blocked(2.0)
            await anyio.wait_all_tasks_blocked()
            assert not scope.cancel_called
            watchdog.arm(scope, 2.0)  # already past: cancelled at once
            await anyio.wait_all_tasks_blocked()
            assert scope.cancel_called
        finally:
            await watchdog.stop()


async def test_stop_ends_the_task_and_may_be_repeated() -> None:
    with anyio.fail_after(5):
        watchdog = await Watchdog.start(ManualClock())
        await watchdog.stop()
        await watchdog.stop()
        assert watchdog._task is not None
        assert watchdog._task.done.is_set()
