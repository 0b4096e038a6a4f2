"""FrameQueue, the hand-off transports use between the task that reads and the caller."""

from __future__ import annotations

import anyio
import pytest

from openenv.channel import FrameQueue, QueueClosed
from tests.helpers import all_tasks_blocked

pytestmark = pytest.mark.anyio


async def test_items_come_out_in_order() -> None:
    queue: FrameQueue[int] = FrameQueue()
    for item in range(3):
        queue.put(item)
    assert len(queue) == 3
    assert [await queue.get() for _ in range(3)] == [0, 1, 2]


async def test_get_waits_for_a_put_from_another_task() -> None:
    queue: FrameQueue[bytes] = FrameQueue()
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:

            async def producer() -> None:
                await all_tasks_blocked()  # the consumer waits in get()
                queue.put(b"late")

            tg.start_soon(producer)
            assert await queue.get() == b"late"


async def test_close_drains_then_raises() -> None:
    queue: FrameQueue[int] = FrameQueue()
    queue.put(1)
    queue.close()
    queue.close()
    assert queue.closed
    assert await queue.get() == 1
    with pytest.raises(QueueClosed):
        await queue.get()
    with pytest.raises(QueueClosed):
        queue.put(2)


async def test_close_wakes_a_waiting_consumer() -> None:
    queue: FrameQueue[int] = FrameQueue()
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:

            async def closer() -> None:
                await all_tasks_blocked()  # the consumer waits in get()
                queue.close()

            tg.start_soon(closer)
            with pytest.raises(QueueClosed):
                await queue.get()


async def test_a_cancelled_get_loses_nothing() -> None:
    queue: FrameQueue[int] = FrameQueue()
    with anyio.move_on_after(0.01):
        await queue.get()
    queue.put(7)
    with anyio.fail_after(5):
        assert await queue.get() == 7


async def test_concurrent_consumers_each_take_one_item() -> None:
    queue: FrameQueue[int] = FrameQueue()
    taken: list[int] = []

    async def take() -> None:
        taken.append(await queue.get())

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            for _ in range(3):
                tg.start_soon(take)
            await all_tasks_blocked()
            for item in range(3):
                queue.put(item)
    assert sorted(taken) == [0, 1, 2]
