"""`RequestLock`: one request at a time on a client; free, taken at once; held, waited for in order; never lost."""

from __future__ import annotations

import anyio
import anyio.lowlevel
import pytest

from openenv._request_lock import RequestLock
from tests.helpers import all_tasks_blocked

pytestmark = pytest.mark.anyio

LIMIT = 10  # seconds: the bound of every wait in these tests


async def test_a_free_lock_is_taken_without_waiting_and_a_held_one_refused_at_once() -> None:
    lock = RequestLock()
    with anyio.fail_after(LIMIT):
        async with lock:
            assert lock.held
            with pytest.raises(anyio.WouldBlock):
                lock.acquire_nowait()
        assert not lock.held
        lock.acquire_nowait()
        assert lock.held
        lock.release()
        assert not lock.held


async def test_the_calls_waiting_get_the_lock_in_the_order_they_came() -> None:
    lock = RequestLock()
    order: list[int] = []

    async def take(number: int) -> None:
        async with lock:
            order.append(number)
            await anyio.lowlevel.checkpoint()

    with anyio.fail_after(LIMIT):
        async with anyio.create_task_group() as tasks:
            await lock.acquire()
            for number in range(5):
                tasks.start_soon(take, number)
                await all_tasks_blocked()  # each waits before the next comes
            lock.release()
    assert order == [0, 1, 2, 3, 4]
    assert not lock.held


@pytest.mark.parametrize("handed", [False, True], ids=["while-waiting", "as-the-lock-is-handed-to-it"])
async def test_a_call_cancelled_waiting_for_the_lock_leaves_it_to_the_next(handed: bool) -> None:
    lock = RequestLock()
    got: list[str] = []

    async def take(name: str) -> None:
        async with lock:
            got.append(name)

    with anyio.fail_after(LIMIT):
        async with anyio.create_task_group() as tasks:
            lock.acquire_nowait()
            async with anyio.create_task_group() as cancellable:
                cancellable.start_soon(take, "cancelled")
                await all_tasks_blocked()
                tasks.start_soon(take, "next")
                await all_tasks_blocked()
                cancellable.cancel_scope.cancel()  # its wait is cancelled...
                if handed:
                    lock.release()  # ...and, before it runs again, the lock is handed to it
            if not handed:
                lock.release()
    assert got == ["next"]
    assert not lock.held


async def test_release_all_gives_back_each_lock_or_hands_it_to_its_next_in_line() -> None:
    free, wanted = RequestLock(), RequestLock()
    free.acquire_nowait()
    wanted.acquire_nowait()
    turn = anyio.Event()
    wanted._waiters.append(turn)
    RequestLock.release_all([free, wanted])
    assert not free.held
    assert wanted.held  # by the call waiting, now
    assert turn.is_set()
