"""The fleet part of the comparison: N sessions from one process, an EnvPool or N independent clients.

`measure_fleet` runs every `FleetTarget` at each session count, each measurement
against a server started for it (so that its idle memory is idle), the targets
interleaved run by run; the client is `tests.benchmarks.fleet_client` (ours)
or `tests.benchmarks.reference_fleet_client` (the reference's, one connection
per session). A target whose feature this openenv lacks yet (the http+poll
link, EnvPool's ``send``/``recv``) is kept with ``available`` saying why, and
is measured once the feature is there.
"""

from __future__ import annotations

import json
import re
import statistics
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from openenv import EnvPool
from openenv._registry import takes_option
from tests.benchmarks._pairs import say
from tests.benchmarks._servers import ROOT, Server, our_server, reference_server, run_client

FACTORIES = {"async": "tests.benchmarks.envs:AsyncMessageEchoEnv", "plain": "tests.benchmarks.envs:MessageEchoEnv"}
# The plain echo with ``thread_affinity = False``: a batch's steps share a thread on the server.
UNBOUND_FACTORY = "tests.benchmarks.envs:UnboundMessageEchoEnv"
COUNTS = (64, 256, 1024, 4096)
# --quick: every row at 256 sessions, the rows of the goals at 1,024 too.
QUICK_COUNTS = (256, 1024)
GOAL_ROWS = frozenset(
    {
        "reference-async",
        "ws-pool-shared-async",
        "ws-clients-shared-async",
        "ws-pool-shared-plain",
        "ws-pool-shared-unbound-plain",
        "inproc-pool-async",
    }
)
REFERENCE_FLEET_CLIENT = ROOT / "tests" / "benchmarks" / "reference_fleet_client.py"
# http+poll with a connection per session: the scale part measures it up to 1,024 sessions already.
UNSHARED_POLL_MOST = 256
# A plain echo on a connection per session: one thread and one socket per session, as the async echo's
# rows show already; 4,096 of them add minutes to the run and nothing to the comparison.
UNSHARED_PLAIN_MOST = 1024
# Seconds a session may take to open; one that does not is an error.
OPEN_TIMEOUT = 60.0
# The last page before sessions shared connections (issue 21): the one-session figures "before".
BEFORE_FLEET = "1cb4ccc"
# The one-session pairs the goal "no slower than before" compares, each with its reference.
ONE_SESSION = {"ws-asyncio": "ref-async", "ws-asyncio-sync": "ref-sync"}

_MODES = {"pool": "EnvPool", "clients": "independent clients", "pool-recv": "EnvPool send/recv"}
_ENVS = {"async": "async echo", "plain": "plain echo"}


@dataclass(frozen=True)
class FleetTarget:
    """One kind of fleet row: who drives the sessions, over what, sharing a connection or not, which echo.

    ``share`` is ``None`` where it does not apply (in-process), ``False`` for a
    connection per session (``share=False``; the reference's only way).
    ``available`` is ``None`` when it can be measured, else why not. ``unbound``:
    the plain echo without thread affinity (`UNBOUND_FACTORY`).
    """

    key: str
    transport: str  # ws, http+poll, inproc, reference
    mode: str  # pool, clients, pool-recv
    share: bool | None
    env: str  # async, plain
    most: int | None = None  # measured up to this many sessions (None: every count)
    available: str | None = None
    unbound: bool = False

    @property
    def factory(self) -> str:
        return UNBOUND_FACTORY if self.unbound else FACTORIES[self.env]

    @property
    def label(self) -> str:
        if self.transport == "reference":
            return f"reference clients, one connection each ({_ENVS[self.env]})"
        share = {None: "", True: ", shared connection", False: ", a connection per session"}[self.share]
        unbound = ", no thread affinity" if self.unbound else ""
        return f"{_MODES[self.mode]} over {self.transport}{share}{unbound} ({_ENVS[self.env]})"


def _http_poll_shares() -> bool:
    return takes_option("http+poll://127.0.0.1:1", "share")


def _pool_has_send_recv() -> bool:
    return hasattr(EnvPool, "send") and hasattr(EnvPool, "recv")


def fleet_targets() -> list[FleetTarget]:
    """Every fleet row kind; those this openenv cannot measure yet carry the reason in ``available``."""
    no_poll_link = None if _http_poll_shares() else "not available: http+poll has no shared link yet"
    no_recv = None if _pool_has_send_recv() else "not available: EnvPool has no send/recv yet"
    # The reference first: every other row is divided by it.
    targets = [FleetTarget(f"reference-{env}", "reference", "clients", False, env) for env in ("async", "plain")]
    for env in ("async", "plain"):
        for mode in ("pool", "clients"):
            for share in (True, False):
                key = f"ws-{mode}-{'shared' if share else 'own'}-{env}"
                most = UNSHARED_PLAIN_MOST if env == "plain" and not share else None
                targets.append(FleetTarget(key, "ws", mode, share, env, most=most))
    targets.append(FleetTarget("ws-pool-shared-unbound-plain", "ws", "pool", True, "plain", unbound=True))
    targets.append(FleetTarget("ws-pool-recv-shared-async", "ws", "pool-recv", True, "async", available=no_recv))
    for mode in ("pool", "clients"):
        targets.append(
            FleetTarget(f"poll-{mode}-shared-async", "http+poll", mode, True, "async", available=no_poll_link)
        )
        targets.append(
            FleetTarget(f"poll-{mode}-own-async", "http+poll", mode, False, "async", most=UNSHARED_POLL_MOST)
        )
    for env in ("async", "plain"):
        for mode in ("pool", "clients"):
            targets.append(FleetTarget(f"inproc-{mode}-{env}", "inproc", mode, None, env))
    return targets


@contextmanager
def _no_server() -> Iterator[None]:
    yield None


def _server(target: FleetTarget, python: Path, count: int) -> AbstractContextManager[Server | None]:
    """A new server for one measurement, with room for ``count`` sessions (and as many connections)."""
    room = str(2 * count + 16)
    if target.transport == "inproc":
        return _no_server()
    if target.transport == "reference":
        options = ["--async-step"] if target.env == "async" else []
        return reference_server(python, *options, max_sessions=2 * count + 16)
    return our_server(target.factory, "asyncio", "--max-sessions", room, "--max-connections", room)


def _command(target: FleetTarget, python: Path, server: Server | None, count: int, seconds: float) -> list[str]:
    figures = ["--sessions", str(count), "--seconds", str(seconds), "--open-timeout", str(OPEN_TIMEOUT)]
    if server is not None:
        figures += ["--server-pid", str(server.pid)]
    if target.transport == "reference":
        assert server is not None
        return [str(python), str(REFERENCE_FLEET_CLIENT), server.url, *figures]
    if target.transport == "inproc":
        url = f"inproc://{target.factory}"
    else:
        assert server is not None
        url = server.url.replace("http://", f"{target.transport}://", 1)
    share = ["--no-share"] if target.share is False else []
    return [sys.executable, "-m", "tests.benchmarks.fleet_client", url, "--mode", target.mode, *figures, *share]


def _failure(error: Exception) -> str:
    """A line saying why a client failed: the last exception its traceback names (in a group's too), or its end."""
    lines = [line.strip(" |") for line in str(error).strip().splitlines()]
    named = [line for line in lines if re.match(r"[\w.]*(Error|Exception|Exit|Timeout\w*)\b", line)]
    return (named or lines or ["no output"])[-1][:300]


def _summary(row: dict[str, Any]) -> None:
    """The row's figures: medians of its runs (errors summed, connections the most seen)."""
    runs = row["runs"]

    def median(pick: Callable[[dict[str, Any]], Any]) -> float | None:
        values = [value for value in map(pick, runs) if value is not None]
        return statistics.median(values) if values else None

    row["steps_per_second"] = median(lambda run: run["steps_per_second"] if run["steps"] else None)
    row["p99_ms"] = median(lambda run: (run["latency_ms"] or {}).get("p99"))
    row["errors"] = sum(run["errors"] for run in runs)
    row["error_examples"] = sorted({example for run in runs for example in run["error_examples"]})[:5]
    row["opened"] = min((run["opened"] for run in runs), default=None)
    connections = [run["connections"] for run in runs if run["connections"] is not None]
    row["connections"] = max(connections) if connections else None
    row["open_s"] = median(lambda run: run["open_s"])
    row["server_kib_per_session"] = median(lambda run: run["server_kib_per_session"])
    row["client_cpu_us_per_step"] = median(lambda run: run["client_cpu_us_per_step"])
    row["server_cpu_us_per_step"] = median(lambda run: run["server_cpu_us_per_step"])


def one_session_before() -> dict[str, Any]:
    """The one-session figures of the page at `BEFORE_FLEET` (from git): ``{"commit", "date", "medians"}``.

    ``{"error": ...}`` where git or the commit is not there (a tarball, a shallow clone).
    """
    try:
        shown = subprocess.run(
            ["git", "show", f"{BEFORE_FLEET}:docs/benchmarks.json"], cwd=ROOT, capture_output=True, text=True,
            timeout=30, check=True,
        )  # fmt: skip
        page = json.loads(shown.stdout)
    except (OSError, subprocess.SubprocessError, ValueError) as error:
        return {"commit": BEFORE_FLEET, "error": f"cannot read docs/benchmarks.json at {BEFORE_FLEET}: {error}"}
    keys = {*ONE_SESSION, *ONE_SESSION.values()}
    medians = {row["key"]: row["median"] for row in page["echo"] if row["key"] in keys}
    return {"commit": BEFORE_FLEET, "date": page["meta"]["date"], "medians": medians}


def measure_floors(sessions: int = 1024) -> dict[str, Any]:
    """The floors of a fleet's step (`tests.benchmarks.fleet_floor`) at ``sessions``: its JSON, or ``{"error"}``."""
    command = [sys.executable, "-m", "tests.benchmarks.fleet_floor", "--sessions", str(sessions)]
    try:
        floors = run_client(command, timeout=600)
    except (RuntimeError, subprocess.TimeoutExpired) as error:
        return {"sessions": sessions, "error": _failure(error)}
    say(
        f"fleet floors N={sessions}: threads {floors['threads']:,.0f}/s, session threads "
        f"{floors['session_threads']:,.0f}/s, loop {floors['loop']:,.0f}/s"
    )
    return floors


def measure_fleet(
    python: Path,
    counts: list[int],
    runs: int,
    seconds: float,
    big_seconds: float,
    only: str | None = None,
    big_only: frozenset[str] | None = None,
) -> dict[str, Any]:
    """Every fleet target at every session count: ``runs`` runs up to 256 sessions, one above.

    Args:
        python: The reference venv's python.
        counts: The session counts.
        runs: Runs of each row up to 256 sessions (the median kept); bigger counts run once.
        seconds: Seconds of stepping per run up to 256 sessions.
        big_seconds: Seconds of stepping per run above 256 sessions.
        only: Measure only the targets whose key contains this.
        big_only: Above 256 sessions, measure only these targets (``None``: all of them).

    Returns:
        ``{"counts", "runs", "seconds", "big_seconds", "rows": [...]}``: a row per
        target and count, with its ``runs`` (each client's JSON), their medians,
        ``error`` (why it could not be measured) and ``available``.
    """
    targets = [target for target in fleet_targets() if only is None or only in target.key]

    def measured(target: FleetTarget, count: int) -> bool:
        small = count <= 256 or big_only is None or target.key in big_only
        return small and (target.most is None or count <= target.most)

    rows = {
        (target.key, count): {
            "target": target.key, "label": target.label, "transport": target.transport, "mode": target.mode,
            "share": target.share, "env": target.env, "sessions": count, "available": target.available,
            "runs": [], "error": None,
        }
        for target in targets for count in counts if measured(target, count)
    }  # fmt: skip
    for run in range(runs):
        for count in counts:
            if run > 0 and count > 256:
                continue
            for target in targets:
                row = rows.get((target.key, count))
                if row is None or row["error"] or row["available"]:
                    continue
                wait = (seconds if count <= 256 else big_seconds) + OPEN_TIMEOUT + 180
                try:
                    with _server(target, python, count) as server:
                        command = _command(target, python, server, count, seconds if count <= 256 else big_seconds)
                        result = run_client(command, timeout=wait, reference=target.transport == "reference")
                except (RuntimeError, subprocess.TimeoutExpired) as error:  # a row that cannot run is a finding
                    row["error"] = _failure(error)
                    say(f"fleet run {run + 1}/{runs}  {target.label:70} N={count:<5} FAILED: {row['error']}")
                    continue
                row["runs"].append(result)
                rate, p99 = result["steps_per_second"] or 0, (result["latency_ms"] or {}).get("p99") or 0
                say(
                    f"fleet run {run + 1}/{runs}  {target.label:70} N={count:<5} {rate:>9,.0f}/s  p99 {p99:>7.1f} ms  "
                    f"open {result['open_s'] or 0:6.2f} s  conns {result['connections']}  "
                    f"{result['server_kib_per_session'] or 0:7.1f} KiB/session  errors {result['errors']}"
                )
    for row in rows.values():
        _summary(row)
    return {"counts": counts, "runs": runs, "seconds": seconds, "big_seconds": big_seconds, "rows": list(rows.values())}
