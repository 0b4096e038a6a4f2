"""The timing loop every benchmark client shares (any event loop: it only awaits ``step``)."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable


async def timed_rate(
    step: Callable[[], Awaitable[object]], seconds: float, *, warmup: int = 200, batch: int = 64
) -> dict[str, float]:
    """Await ``step`` for about ``seconds`` after ``warmup`` untimed calls, checking the clock every ``batch``.

    Returns:
        ``{"steps": n, "seconds": elapsed, "rate": n / elapsed, "cpu_us_per_step": ...}``: the
        last is this process's CPU time (user and system, every thread) over the timed span,
        per step: what the client costs the machine for each step, beside the server.
    """
    for _ in range(warmup):
        await step()
    steps = 0
    start, cpu_start = time.perf_counter(), time.process_time()
    deadline = start + seconds
    while time.perf_counter() < deadline:
        for _ in range(batch):
            await step()
        steps += batch
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    return {"steps": steps, "seconds": elapsed, "rate": steps / elapsed, "cpu_us_per_step": 1e6 * cpu / steps}
