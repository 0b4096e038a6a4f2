"""For transport authors: `FrameQueue`, a cheap hand-off of frames between tasks.

anyio's memory object streams are the general tool, but each ``send`` and
``receive`` passes through a full event-loop iteration (a checkpoint) even when
nothing needs to wait, which on the per-frame hot path of a transport costs
about three times what the hand-off itself does. This queue only waits when
it is empty: putting never blocks, and taking a frame that is already there
returns at once.

It is unbounded: use it where the producer is bounded by something else (a
peer that answers requests one by one), never for input nobody limits.
"""

from __future__ import annotations

from collections import deque
from typing import Generic, TypeVar

import anyio

__all__ = ["FrameQueue", "QueueClosed"]

T = TypeVar("T")


class QueueClosed(Exception):
    """The queue was closed: raised by `FrameQueue.put` at once, by `FrameQueue.get` once it is drained."""


class FrameQueue(Generic[T]):
    """An unbounded queue that waits only when empty; concurrent consumers take turns.

    ``len(queue)`` is the number of items waiting.

    Examples:
        ```python
        from openenv.channel import FrameQueue, QueueClosed

        frames: FrameQueue[bytes] = FrameQueue()
        frames.put(b"first")  # from the reader task; never blocks
        frames.put(b"second")
        frames.close()  # get() raises QueueClosed once drained
        print(await frames.get(), await frames.get())  # b'first' b'second'
        try:
            await frames.get()
        except QueueClosed:
            print("drained")
        ```
    """

    __slots__ = ("_closed", "_items", "_waiter")

    def __init__(self) -> None:
        self._items: deque[T] = deque()
        self._waiter: anyio.Event | None = None
        self._closed = False

    def __len__(self) -> int:
        return len(self._items)

    @property
    def closed(self) -> bool:
        """Whether `close` was called (items put before it may still be waiting)."""
        return self._closed

    def put(self, item: T) -> None:
        """Add an item and wake the consumer; never blocks.

        Args:
            item: The item to queue.

        Raises:
            QueueClosed: The queue was closed.
        """
        if self._closed:
            raise QueueClosed("the queue is closed")
        self._items.append(item)
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            waiter.set()

    def close(self) -> None:
        """Close the queue: `get` returns what is left, then raises `QueueClosed`. Idempotent."""
        self._closed = True
        self._wake()

    def get_nowait(self) -> T:
        """Take the oldest item if there is one.

        Returns:
            The oldest item.

        Raises:
            anyio.WouldBlock: The queue is empty.
            QueueClosed: The queue is closed and empty.
        """
        if self._items:
            return self._items.popleft()
        if self._closed:
            raise QueueClosed("the queue is closed")
        raise anyio.WouldBlock

    async def get(self) -> T:
        """Take the oldest item, waiting for one if the queue is empty.

        A cancelled wait takes nothing, so no item is ever lost.

        Returns:
            The oldest item.

        Raises:
            QueueClosed: The queue is closed and empty.
        """
        while not self._items:
            if self._closed:
                raise QueueClosed("the queue is closed")
            # Waiters share one event: every one wakes, the first takes the item.
            waiter = self._waiter
            if waiter is None:
                waiter = self._waiter = anyio.Event()
            await waiter.wait()
        return self._items.popleft()
