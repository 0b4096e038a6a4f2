"""Client/server pairs of the benchmark scripts, and the interleaved runs that measure them.

Every client prints one JSON line with its ``rate`` (steps per second); each pair
runs ``runs`` times, the pairs interleaved run by run so that drift hits all alike.
"""

from __future__ import annotations

import statistics
import sys
from collections.abc import Callable
from contextlib import AbstractContextManager, ExitStack
from dataclasses import dataclass, field
from typing import Any

from tests.benchmarks._servers import Server, cpu_seconds, run_client


@dataclass
class Pair:
    """One client against one server: how to run it, and what its figure is compared with."""

    key: str
    label: str
    group: str  # ws, http+poll, inproc, reference, floor
    server: str  # a key of the servers dict ("" for in-process)
    client: Callable[[str], list[str]]  # the client command, given the server's URL
    reference: bool = False  # runs with the reference's python
    versus: list[str] = field(default_factory=list)  # keys of the pairs to divide by


def our_client(*options: str) -> Callable[[str], list[str]]:
    """The command of `tests.benchmarks.our_client` against a URL, with ``options``."""

    def command(url: str) -> list[str]:
        return [sys.executable, "-m", "tests.benchmarks.our_client", url, *options]

    return command


def with_scheme(scheme: str, client: Callable[[str], list[str]]) -> Callable[[str], list[str]]:
    """``client`` given the server's ``http://`` URL with ``scheme`` instead (``ws``, ``http+poll``)."""
    return lambda url: client(url.replace("http://", f"{scheme}://", 1))


# The untimed steps every echo client takes besides the timed ones: reset, 200 to warm up, one after.
_UNTIMED_STEPS = 202


def process_cpu_seconds(pid: int) -> float | None:
    """A process's CPU time so far (user and system), from ``/proc``; ``None`` where there is none."""
    try:
        return cpu_seconds(pid)
    except OSError:
        return None


def say(message: str) -> None:
    """Progress, on stderr."""
    print(message, file=sys.stderr, flush=True)


def measure_pairs(
    pairs: list[Pair], servers: dict[str, AbstractContextManager[Server]], runs: int, seconds: float, title: str
) -> list[dict[str, Any]]:
    """Run every pair ``runs`` times, interleaved; a pair that fails keeps its error instead of a figure.

    Returns one row per pair: its key, label, group, versus, rates, median
    (``None`` if it failed), cpu_us_per_step (the client's CPU time per step, the
    median; ``None`` if the client does not report it), server_cpu_us_per_step
    (the server process's CPU time over the client's whole run, per step, its
    untimed ones included; the median; ``None`` in-process or off Linux),
    payload_bytes and error.
    """
    rows = {pair.key: {"key": pair.key, "label": pair.label, "group": pair.group, "versus": pair.versus,
                       "rates": [], "cpu_us": [], "server_cpu_us": [], "payload_bytes": 0, "error": None}
            for pair in pairs}  # fmt: skip
    with ExitStack() as stack:
        running = {name: stack.enter_context(server) for name, server in servers.items()}
        urls = {name: server.url for name, server in running.items()}
        for run in range(runs):
            for pair in pairs:
                row = rows[pair.key]
                if row["error"]:
                    continue
                server_pid = running[pair.server].pid if pair.server in running else None
                server_cpu = process_cpu_seconds(server_pid) if server_pid is not None else None
                try:
                    figures = run_client(
                        pair.client(urls.get(pair.server, "")), timeout=seconds + 90, reference=pair.reference
                    )
                except Exception as error:  # a pair that cannot run is a finding, not the end of the run
                    row["error"] = str(error).strip().splitlines()[-1][:300]
                    say(f"{title} run {run + 1}/{runs}  {pair.label:62} FAILED: {row['error']}")
                    continue
                row["rates"].append(float(figures["rate"]))
                if "cpu_us_per_step" in figures:
                    row["cpu_us"].append(float(figures["cpu_us_per_step"]))
                server_cpu_after = process_cpu_seconds(server_pid) if server_pid is not None else None
                if server_cpu is not None and server_cpu_after is not None and "steps" in figures:
                    steps = int(figures["steps"]) + _UNTIMED_STEPS  # type: ignore[call-overload]
                    row["server_cpu_us"].append(1e6 * (server_cpu_after - server_cpu) / steps)
                row["payload_bytes"] = int(figures.get("payload_bytes", 0))
                say(f"{title} run {run + 1}/{runs}  {pair.label:62} {row['rates'][-1]:>9,.1f}/s")
    for row in rows.values():
        row["median"] = statistics.median(row["rates"]) if row["rates"] else None
        row["cpu_us_per_step"] = statistics.median(row["cpu_us"]) if row["cpu_us"] else None
        row["server_cpu_us_per_step"] = statistics.median(row["server_cpu_us"]) if row["server_cpu_us"] else None
    return list(rows.values())
