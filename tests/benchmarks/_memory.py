"""A process's resident memory, read from ``/proc/<pid>/status`` (Linux), and its peak over a span."""

from __future__ import annotations

import threading
from pathlib import Path
from types import TracebackType


def rss_kib(pid: int) -> int:
    """The resident set size (``VmRSS``) of process ``pid`` in KiB; 0 where ``/proc`` has none."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0
    for line in status.splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


class PeakRSS:
    """Samples ``rss_kib(pid)`` from a thread while the ``with`` block runs; ``peak`` is the largest seen.

    Sampling during the run, not after it, is what sees every session open at once.
    """

    def __init__(self, pid: int, interval: float = 0.01) -> None:
        self.pid = pid
        self.interval = interval
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, name=f"rss-{pid}", daemon=True)

    def _sample(self) -> None:
        while not self._stop.wait(self.interval):
            self.peak = max(self.peak, rss_kib(self.pid))

    def __enter__(self) -> PeakRSS:
        self.peak = rss_kib(self.pid)
        self._thread.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self._stop.set()
        self._thread.join(5)
