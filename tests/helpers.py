"""Helpers the test modules share: the counter environment's typed client, and waiting on state."""

from __future__ import annotations

from collections.abc import Callable

import anyio

from openenv import EnvClient
from tests.envs import CountAction, CountObservation, CountState


class CounterClient(EnvClient[CountAction, CountObservation, CountState]):
    """The typed client of the counter environments in `tests.envs`."""


async def wait_until(condition: Callable[[], bool], what: str = "") -> None:
    """Return once ``condition()`` holds; for state that has no event of its own (the caller bounds the wait).

    ``what`` names the awaited state for the reader of the test.
    """
    while not condition():  # noqa: ASYNC110 - polls state that has no event of its own
        await anyio.sleep(0.01)
