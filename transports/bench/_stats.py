"""Latency statistics: percentiles by linear interpolation, and the summary a benchmark reports."""

from __future__ import annotations

import math
from collections.abc import Sequence

import msgspec

__all__ = ["LatencySummary", "percentile", "summarize_latencies"]


class LatencySummary(msgspec.Struct, kw_only=True):
    """The distribution of step latencies, in milliseconds; each is ``None`` when no step succeeded.

    Attributes:
        mean: The arithmetic mean.
        p50: The median.
        p90: The 90th percentile.
        p99: The 99th percentile.
        max: The slowest step.
    """

    mean: float | None = None
    p50: float | None = None
    p90: float | None = None
    p99: float | None = None
    max: float | None = None


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile of sorted values, by linear interpolation between closest ranks.

    This is the usual definition (NumPy's default ``"linear"`` method, Hyndman and
    Fan's type 7, ``statistics.quantiles(method="inclusive")``): the value at
    fractional rank ``(n - 1) * q / 100``, interpolated between its two neighbours.
    ``q = 0`` gives the minimum, ``q = 100`` the maximum.

    Args:
        sorted_values: The values, in ascending order (not checked).
        q: The percentile, from 0 to 100.

    Returns:
        The percentile.

    Raises:
        ValueError: No values, or ``q`` outside [0, 100].
    """
    if not sorted_values:
        raise ValueError("the percentile of no values is undefined")
    if not 0 <= q <= 100:
        raise ValueError(f"a percentile lies between 0 and 100, not {q}")
    rank = (len(sorted_values) - 1) * q / 100
    low = math.floor(rank)
    high = min(low + 1, len(sorted_values) - 1)
    fraction = rank - low
    lower, upper = sorted_values[low], sorted_values[high]
    # Written so that equal neighbours give that value exactly (no rounding drift).
    return lower + (upper - lower) * fraction if fraction else lower


def summarize_latencies(seconds: Sequence[float]) -> LatencySummary:
    """Summarise step latencies measured in seconds, in milliseconds.

    Args:
        seconds: Each step's wall time, in seconds, in any order.

    Returns:
        The mean, median, 90th and 99th percentiles (see `percentile`) and
        maximum, in milliseconds; all ``None`` for no values.
    """
    if not seconds:
        return LatencySummary()
    ordered = sorted(seconds)
    return LatencySummary(
        mean=math.fsum(ordered) / len(ordered) * 1000,
        p50=percentile(ordered, 50) * 1000,
        p90=percentile(ordered, 90) * 1000,
        p99=percentile(ordered, 99) * 1000,
        max=ordered[-1] * 1000,
    )
