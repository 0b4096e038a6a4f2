"""Running a coroutine in the calling task without a task of its own: at once when it never waits.

Most steps of an ``async`` environment never wait for anything (an echo, a
game's rules): awaiting each in a task of its own costs a task, a wake-up and a
cancel scope for a few microseconds of work. `start` runs a coroutine in the
calling task up to its first wait; one that finishes without waiting is done
there and then, with no trip through the event loop. One that waits is
finished by awaiting `finish` in the same task, which hands the event loop
what the coroutine waits on and passes back what the event loop answers
(exactly what ``await`` does), so the coroutine never changes task: its cancel
scopes, context and the task the event loop will wake are those it started in.
"""

from __future__ import annotations

import types
from collections.abc import Coroutine, Generator
from typing import Any, Final, TypeVar

__all__ = ["TRIAL_CALLS", "Suspended", "finish", "start"]

T = TypeVar("T")

TRIAL_CALLS: Final = 32
"""How many of an environment's calls a server runs in tasks of their own, to learn whether its calls wait."""


class Suspended:
    """A coroutine that `start` left waiting: give it to `finish` in the same task.

    Attributes:
        coroutine: The coroutine.
        awaiting: What it waits on (for the event loop).
    """

    __slots__ = ("awaiting", "coroutine")

    def __init__(self, coroutine: Coroutine[Any, Any, Any], awaiting: object) -> None:
        self.coroutine = coroutine
        self.awaiting = awaiting


def start(coroutine: Coroutine[Any, Any, T]) -> T | Suspended:
    """Run ``coroutine`` in the calling task until it returns or first waits.

    Call it from inside a task (the coroutine may look at the current task, its
    cancel scopes, its context), then either take the value, or await `finish`
    on the `Suspended` before the task does anything else.

    Args:
        coroutine: A coroutine not yet started.

    Returns:
        What it returned, or a `Suspended` that must be finished.

    Raises:
        BaseException: Whatever the coroutine raised before it first waited.
    """
    try:
        awaiting = coroutine.send(None)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]
    return Suspended(coroutine, awaiting)


@types.coroutine
def finish(suspended: Suspended) -> Generator[Any, Any, Any]:
    """Await the rest of a coroutine `start` left waiting, in the same task.

    Args:
        suspended: What `start` returned.

    Returns:
        What the coroutine returned.

    Raises:
        BaseException: Whatever the coroutine raised (a cancellation of the
            task is thrown into it, as ``await`` would).
    """
    coroutine, awaiting = suspended.coroutine, suspended.awaiting
    while True:
        try:
            answer = yield awaiting
        except BaseException as exc:
            try:
                awaiting = coroutine.throw(exc)
            except StopIteration as stop:
                return stop.value
        else:
            try:
                awaiting = coroutine.send(answer)
            except StopIteration as stop:
                return stop.value
