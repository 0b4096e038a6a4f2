"""`RequestLock`: one request at a time on a client, taken by its calls and, many at once, by a pool.

It does what ``anyio.Semaphore(1, fast_acquire=True)`` does: a free lock is
taken without going through the event loop, and a held one is waited for,
first come first served. Its state is one attribute, `RequestLock.held`, so
that an `openenv.EnvPool` stepping a thousand clients as a batch takes the
free ones by reading and setting it, with no call per client, and gives them
all back with one call (`RequestLock.release_all`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from types import TracebackType

import anyio

__all__ = ["RequestLock"]


class RequestLock:
    """A lock for one client's requests (see the module's docstring).

    No task owns it: one task may take it and another give it back, as a pool
    does when one task sends a request and another takes its reply.

    Attributes:
        held: Whether it is held. Reading it tells whether `acquire_nowait`
            would succeed; setting it from ``False`` to ``True`` is
            `acquire_nowait`, for a caller that checked it first.
    """

    __slots__ = ("_waiters", "held")

    def __init__(self) -> None:
        self.held = False
        # One event per call waiting, in order; the lock is handed to the first, held all along.
        self._waiters: deque[anyio.Event] = deque()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} held={self.held} waiting={len(self._waiters)}>"

    def acquire_nowait(self) -> None:
        """Take the lock if it is free.

        Raises:
            anyio.WouldBlock: It is held.
        """
        if self.held:
            raise anyio.WouldBlock
        self.held = True

    async def acquire(self) -> None:
        """Take the lock: at once if it is free, else when the calls before this one have had it."""
        if not self.held:
            self.held = True
            return
        turn = anyio.Event()
        self._waiters.append(turn)
        try:
            await turn.wait()
        except BaseException:
            if turn.is_set():
                self.release()  # handed the lock as it was cancelled: it goes to the next in line
            else:
                self._waiters.remove(turn)
            raise

    def release(self) -> None:
        """Give the lock back: to the first call waiting for it, if any."""
        if self._waiters:
            self._waiters.popleft().set()  # it stays held, by that call now
        else:
            self.held = False

    @staticmethod
    def release_all(locks: Iterable[RequestLock]) -> None:
        """Give back many locks held by one caller, in one call (`release` for each)."""
        for lock in locks:
            if lock._waiters:
                lock.release()
            else:
                lock.held = False

    async def __aenter__(self) -> None:
        await self.acquire()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.release()
