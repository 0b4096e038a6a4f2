"""`openenv._watchdog.Watchdog`: the one task (its owner's) that cancels a client's calls' scopes at their deadlines."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import anyio
import pytest

from openenv._watchdog import Watchdog
from tests.envs import AsyncCounterEnv
from tests.helpers import CounterClient, ManualClock, all_tasks_blocked
from tests.serving import factory_path

pytestmark = pytest.mark.anyio


async def test_each_armed_scope_is_cancelled_at_its_own_deadline_and_a_disarmed_one_never() -> None:
    clock = ManualClock()
    with anyio.fail_after(5):
        watchdog = Watchdog(clock)
        async with anyio.create_task_group() as owner:
            owner.start_soon(watchdog.run)
            late, early, disarmed = anyio.CancelScope(), anyio.CancelScope(), anyio.CancelScope()
            watchdog.arm(late, 10.0)
            watchdog.arm(early, 2.0)  # earlier than the deadline the task sleeps towards
            watchdog.arm(disarmed, 1.0)
            watchdog.disarm(disarmed)

            await clock.advance_when_blocked(2.0)
            await all_tasks_blocked()
            assert (early.cancel_called, late.cancel_called, disarmed.cancel_called) == (True, False, False)

            await clock.advance_when_blocked(7.9)
            await all_tasks_blocked()
            assert not late.cancel_called
            await clock.advance_when_blocked(0.1)
            await all_tasks_blocked()
            assert late.cancel_called
            assert not disarmed.cancel_called
            owner.cancel_scope.cancel()


async def test_a_deadline_armed_again_later_moves() -> None:
    """Re-arming a scope replaces its deadline: later (a send's grace) or earlier (back to the call's own)."""
    clock = ManualClock()
    with anyio.fail_after(5):
        watchdog = Watchdog(clock)
        async with anyio.create_task_group() as owner:
            owner.start_soon(watchdog.run)
            scope = anyio.CancelScope()
            watchdog.arm(scope, 1.0)
            watchdog.arm(scope, 3.0)
            await clock.advance_when_blocked(2.0)
            await all_tasks_blocked()
            assert not scope.cancel_called
            watchdog.arm(scope, 2.0)  # already past: cancelled at once
            await all_tasks_blocked()
            assert scope.cancel_called
            owner.cancel_scope.cancel()


async def test_it_stands_guard_only_while_it_runs() -> None:
    clock = ManualClock()
    with anyio.fail_after(5):
        watchdog = Watchdog(clock)
        scope = anyio.CancelScope()
        watchdog.arm(scope, 1.0)
        async with anyio.create_task_group() as owner:
            owner.start_soon(watchdog.run)
            await all_tasks_blocked()
            owner.cancel_scope.cancel()  # its owner is done
        clock.advance(5.0)
        await all_tasks_blocked()
        assert not scope.cancel_called


async def test_given_a_launcher_it_starts_its_task_with_the_first_scope_armed() -> None:
    clock = ManualClock()
    with anyio.fail_after(5):
        async with anyio.create_task_group() as owner:
            launched: list[object] = []

            def launch(run: Callable[[], Awaitable[None]]) -> None:
                launched.append(run)
                owner.start_soon(run)

            watchdog = Watchdog(clock, launch=launch)
            assert launched == []  # no task yet
            first, second = anyio.CancelScope(), anyio.CancelScope()
            watchdog.arm(first, 1.0)
            watchdog.arm(second, 2.0)
            assert len(launched) == 1  # one task, for every scope
            await clock.advance_when_blocked(2.0)
            await all_tasks_blocked()
            assert (first.cancel_called, second.cancel_called) == (True, True)
            owner.cancel_scope.cancel()


async def test_an_owned_client_starts_its_timer_task_with_its_first_call() -> None:
    url = f"inproc://{factory_path(AsyncCounterEnv)}"
    with anyio.fail_after(5):
        before = len(anyio.get_running_tasks())
        async with CounterClient(url, timeout=5) as env:
            await all_tasks_blocked()
            opened = len(anyio.get_running_tasks()) - before  # the transport's idle work alone
            await env.reset()
            await all_tasks_blocked()
            called = len(anyio.get_running_tasks()) - before
    assert (opened, called) == (1, 2)
