"""What one fleet measurement records, and the JSON line a fleet client prints: shared by ours and the reference's.

Standard library only, as `_procfs`: the reference's fleet client imports it
with the reference venv's python.

A fleet client opens N sessions against one server (or in-process), steps them
for a while, and records:

- ``open_s``: the wall time to open the N sessions (connected, not yet reset);
- ``opened``: how many opened (a session that cannot open is an error);
- ``steps``, ``seconds``, ``steps_per_second``: the steps that succeeded in the
  timed window, which starts once every session is open and reset;
- ``latency_ms``: of each session's step, or of each pool step for an
  `EnvPool` (every session of the pool waits that long); ``None`` if no step;
- ``errors`` and a few ``error_examples``: sessions that could not open, steps
  that failed;
- ``connections``: the established TCP connections the client process holds
  to the server's port, counted with every session open (the most of two
  counts: before and after the timed window);
- ``server_kib_idle``, ``server_kib_open``, ``server_kib_per_session``: the
  server's resident memory after one warm-up session closed, then with the N
  sessions open and reset, and the growth divided by the sessions that opened
  (in-process: this process's memory, which holds both ends);
- ``client_cpu_us_per_step``, ``server_cpu_us_per_step``: CPU time (user and
  system) of each process over the timed window, per step.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Any

try:
    from tests.benchmarks._memory import rss_kib
    from tests.benchmarks._procfs import cpu_seconds, tcp_connections_to
except ImportError:  # the reference's python runs its script from this folder, where tests is no package
    from _memory import rss_kib  # type: ignore[no-redef]
    from _procfs import cpu_seconds, tcp_connections_to  # type: ignore[no-redef]

# Distinct error messages kept as examples.
_EXAMPLES = 5


@dataclass
class FleetRecord:
    """The figures of one fleet measurement, filled in as it goes; `document` is the JSON to print."""

    sessions: int
    server_pid: int | None = None  # None in-process: the figures are this process's
    port: int | None = None  # the server's port, whose connections are counted; None: none counted
    opened: int = 0
    open_s: float | None = None
    errors: int = 0
    error_examples: list[str] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)
    steps: int = 0
    connections: int | None = None
    server_kib_idle: int | None = None
    server_kib_open: int | None = None
    _window: tuple[float, float, float | None] | None = None
    _end: tuple[float, float, float | None] | None = None

    def error(self, exc: BaseException) -> None:
        """Count an error, keeping its message as an example if it is a new one."""
        self.errors += 1
        message = f"{type(exc).__name__}: {' '.join(str(exc).split())}"[:300]
        if len(self.error_examples) < _EXAMPLES and message not in self.error_examples:
            self.error_examples.append(message)

    def idle(self) -> None:
        """Read the server's memory before the N sessions open (after a warm-up session closed)."""
        self.server_kib_idle = rss_kib(self._memory_pid())

    def all_open(self) -> None:
        """With the N sessions open and reset: read the server's memory and count the connections."""
        self.server_kib_open = rss_kib(self._memory_pid())
        self.count_connections()

    def count_connections(self) -> None:
        """Count the client's connections to the server's port now; the most counted is kept."""
        if self.port is None:
            self.connections = 0 if self.server_pid is None else None
            return
        count = tcp_connections_to(self.port)
        if count is not None:
            self.connections = max(self.connections or 0, count)

    def start(self) -> None:
        """The timed window starts now."""
        self._window = (time.perf_counter(), time.process_time(), self._server_cpu())

    def stop(self, at: float | None = None) -> None:
        """The timed window ends now (or at ``at``, a `time.perf_counter` reading: the last reply)."""
        self._end = (at if at is not None else time.perf_counter(), time.process_time(), self._server_cpu())

    def _server_cpu(self) -> float | None:
        if self.server_pid is None:
            return None
        try:
            return cpu_seconds(self.server_pid)
        except OSError:
            return None

    def _memory_pid(self) -> int | str:
        return self.server_pid if self.server_pid is not None else "self"

    def document(self, **extra: Any) -> dict[str, Any]:
        """The JSON object the client prints: the figures above, and ``extra``."""
        seconds = client_cpu = server_cpu = None
        if self._window is not None and self._end is not None:
            seconds = max(self._end[0] - self._window[0], 1e-9)
            client_cpu = self._end[1] - self._window[1]
            if self._window[2] is not None and self._end[2] is not None:
                server_cpu = self._end[2] - self._window[2]
        steps = max(self.steps, 1)
        per_session = None
        if self.server_kib_idle is not None and self.server_kib_open is not None and self.opened:
            per_session = (self.server_kib_open - self.server_kib_idle) / self.opened
        ordered = sorted(self.latencies)
        latency = None
        if ordered:
            cuts = statistics.quantiles(ordered, n=100, method="inclusive") if len(ordered) > 1 else ordered * 99
            latency = {"p50": cuts[49], "p90": cuts[89], "p99": cuts[98], "max": ordered[-1]}
            latency = {name: 1000 * value for name, value in latency.items()}
        return {
            "sessions": self.sessions,
            "opened": self.opened,
            "open_s": self.open_s,
            "steps": self.steps,
            "seconds": seconds,
            "steps_per_second": self.steps / seconds if seconds else None,
            "latency_ms": latency,
            "errors": self.errors,
            "error_examples": self.error_examples,
            "connections": self.connections,
            "server_kib_idle": self.server_kib_idle,
            "server_kib_open": self.server_kib_open,
            "server_kib_per_session": per_session,
            "client_cpu_us_per_step": 1e6 * client_cpu / steps if client_cpu is not None else None,
            "server_cpu_us_per_step": 1e6 * server_cpu / steps if server_cpu is not None else None,
            **extra,
        }
