"""The EnvPool benchmark's bookkeeping (`tests.benchmarks.bench_pool`); its figures are never asserted."""

from __future__ import annotations

from tests.benchmarks import bench_pool


def test_a_smaller_pool_times_as_many_steps_as_the_rounds_of_1024_sessions() -> None:
    assert bench_pool.timed_rounds(20, 1024) == 20
    assert bench_pool.timed_rounds(20, 256) == 80  # 5,120 steps were a few ticks of CPU time
    assert bench_pool.timed_rounds(20, 300) == 69  # rounded up
    assert bench_pool.timed_rounds(20, 4096) == 20  # never fewer than asked
