"""The timing loop every benchmark client shares (any event loop: it only awaits ``step``)."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable


async def timed_rate(
    step: Callable[[], Awaitable[object]], seconds: float, *, warmup: int = 200, batch: int = 64
) -> dict[str, float]:
    """Await ``step`` for about ``seconds`` after ``warmup`` untimed calls, checking the clock every ``batch``.

    Returns:
        ``{"steps": n, "seconds": elapsed, "rate": n / elapsed}``.
    """
    for _ in range(warmup):
        await step()
    steps = 0
    start = time.perf_counter()
    deadline = start + seconds
    while time.perf_counter() < deadline:
        for _ in range(batch):
            await step()
        steps += batch
    elapsed = time.perf_counter() - start
    return {"steps": steps, "seconds": elapsed, "rate": steps / elapsed}
