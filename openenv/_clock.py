"""`Clock`: where a client and its transport read the time and wait, so that tests can drive it.

Every timeout the client side computes itself (a reply's deadline, the
keepalive's interval and pong timeout, a retry's backoff, the grace for
resuming a session) goes through the clock it was given. The default is the
event loop's own time; a test gives a clock it advances by hand, and what
would take minutes takes no time at all.
"""

from __future__ import annotations

import math

import anyio

__all__ = ["EVENT_LOOP_CLOCK", "Clock"]


class Clock:
    """The event loop's time, and waits measured on it: the base of every clock.

    A subclass that keeps its own time overrides all three methods: `now`
    reads it, `sleep` returns once it has advanced by that much, and
    `cancel_scope` cancels the scope once it reaches the deadline.

    Examples:
        ```python
        import anyio

        from openenv import EVENT_LOOP_CLOCK


        async def main() -> None:
            start = EVENT_LOOP_CLOCK.now()
            with EVENT_LOOP_CLOCK.cancel_scope(deadline=start + 0.01) as scope:
                await anyio.sleep_forever()
            print(scope.cancelled_caught)  # True


        anyio.run(main)
        ```
    """

    __slots__ = ()

    def __repr__(self) -> str:
        # What a signature shows for the default (help(EnvClient)): its name, not an address.
        return "EVENT_LOOP_CLOCK" if self is EVENT_LOOP_CLOCK else f"<{type(self).__name__}>"

    def now(self) -> float:
        """The current time, in seconds (monotonic; only differences mean anything)."""
        return anyio.current_time()

    async def sleep(self, seconds: float) -> None:
        """Wait ``seconds`` (a checkpoint when it is 0 or less).

        Args:
            seconds: How long.
        """
        await anyio.sleep(seconds)

    def cancel_scope(self, *, deadline: float = math.inf, shield: bool = False) -> anyio.CancelScope:
        """A cancel scope that cancels itself at ``deadline`` on this clock.

        Args:
            deadline: When, as `now` reads it (``math.inf``: never).
            shield: Shield the scope from cancellation outside it.

        Returns:
            The scope, to enter.
        """
        return anyio.CancelScope(deadline=deadline, shield=shield)

    def move_on_after(self, seconds: float | None) -> anyio.CancelScope:
        """A cancel scope that cancels itself ``seconds`` from now (``None``: never).

        Args:
            seconds: How long the block may run.

        Returns:
            The scope, to enter; its ``cancelled_caught`` tells whether time ran out.
        """
        return self.cancel_scope(deadline=math.inf if seconds is None else self.now() + seconds)


EVENT_LOOP_CLOCK = Clock()
"""The default clock: the event loop's time."""
