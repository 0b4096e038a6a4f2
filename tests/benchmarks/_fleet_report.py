"""The fleet parts of the benchmark page: issue 21's goals (measured, met or not) and the fleet tables.

Everything here is computed from the results `tests.benchmarks.compare` wrote
(``results["fleet"]``, and the one-session rows of ``results["echo"]``), so
``--from-json`` redraws it without measuring.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

# The fleet plot, relative to the page.
IMAGE = "img/fleet.png"
# "No slower than before, within noise": the one-session ratio to the reference may drop this much.
ONE_SESSION_NOISE = 0.10


@dataclass(frozen=True)
class Goal:
    """One goal of issue 21: what it asks, what was measured, and whether that meets it (``None``: not measured).

    ``floor``: not a goal but the floor beside the goal above it (`tests.benchmarks.fleet_floor`).
    """

    text: str
    measured: str
    met: bool | None
    floor: bool = False


def _number(value: float | None, digits: int = 0) -> str:
    return f"{value:,.{digits}f}" if value is not None else "-"


class _Rows:
    """The fleet rows by target key and session count."""

    def __init__(self, results: dict[str, Any]) -> None:
        fleet = results.get("fleet") or {}
        self.by_key = {(row["target"], row["sessions"]): row for row in fleet.get("rows", [])}

    def get(self, key: str, count: int) -> dict[str, Any] | None:
        return self.by_key.get((key, count))

    def figure(self, key: str, count: int, name: str) -> tuple[float | None, str]:
        """A row's figure, or ``None`` and why there is none."""
        row = self.get(key, count)
        if row is None:
            return None, f"{key} at {count:,} sessions not measured in this run"
        if row.get("available"):
            return None, row["available"]
        if row.get(name) is None:
            return None, f"failed: {row['error']}" if row.get("error") else "no figure"
        return row[name], ""


def _at_least(
    rows: _Rows, text: str, key: str, count: int, floor: float, name: str = "steps_per_second", unit: str = "steps/s"
) -> Goal:
    value, why = rows.figure(key, count, name)
    if value is None:
        return Goal(text, why, None)
    return Goal(text, f"{_number(value)} {unit}", value >= floor)


def _ratio(rows: _Rows, text: str, key: str, base: str, count: int, floor: float) -> Goal:
    value, why = rows.figure(key, count, "steps_per_second")
    reference, why_not = rows.figure(base, count, "steps_per_second")
    if value is None or reference is None:
        return Goal(text, why or why_not, None)
    return Goal(text, f"**{value / reference:.2f}x** ({_number(value)} vs {_number(reference)} steps/s)",
                value / reference >= floor)  # fmt: skip


def _at_most(
    rows: _Rows, text: str, keys: list[str], count: int, name: str, ceiling: float, show: Callable[[float], str]
) -> Goal:
    """Every row of ``keys`` at ``count`` has ``name`` at most ``ceiling``."""
    parts, values = [], []
    for key in keys:
        value, why = rows.figure(key, count, name)
        if value is None:
            return Goal(text, why, None)
        values.append(value)
        parts.append(f"{show(value)} ({_short(rows, key)})")
    return Goal(text, ", ".join(parts), max(values) <= ceiling)


def _short(rows: _Rows, key: str) -> str:
    for (target, _), row in rows.by_key.items():
        if target == key:
            return "EnvPool" if row["mode"] == "pool" else "independent clients"
    return key


def _no_errors(rows: _Rows, text: str, keys: list[str], count: int) -> Goal:
    parts, total = [], 0
    for key in keys:
        row = rows.get(key, count)
        if row is None or row.get("available"):
            return Goal(text, f"{key} at {count:,} sessions not measured in this run", None)
        if row.get("error") and not row.get("runs"):
            return Goal(text, f"{_short(rows, key)} failed: {row['error']}", False)
        total += row["errors"]
        parts.append(f"{row['errors']:,} ({_short(rows, key)}, {row.get('opened') or 0:,} of {count:,} opened)")
    return Goal(text, ", ".join(parts), total == 0)


def _http_poll(rows: _Rows) -> Goal:
    """On the shared link where there is one; else a connection per session, said so."""
    text = "http+poll, 256 independent clients: at least the reference's WebSocket at 256"
    shared = rows.get("poll-clients-shared-async", 256)
    if shared is None or not shared.get("available"):
        return _ratio(rows, text, "poll-clients-shared-async", "reference-async", 256, 1.0)
    goal = _ratio(rows, text, "poll-clients-own-async", "reference-async", 256, 1.0)
    return Goal(text, f"{shared['available']}; with a connection per session: {goal.measured}", goal.met)


def _one_session(results: dict[str, Any], ours: str, reference: str, kind: str) -> Goal:
    text = f"One session alone, {kind} env: no slower than before (÷ the reference, within {ONE_SESSION_NOISE:.0%})"
    before = (results.get("fleet") or {}).get("before") or {}
    then = before.get("medians") or {}
    now = {row["key"]: row["median"] for row in results.get("echo") or []}
    if not (now.get(ours) and now.get(reference)):
        return Goal(text, "the one-session rows were not measured in this run", None)
    if not (then.get(ours) and then.get(reference)):
        return Goal(text, before.get("error", "no figures from before"), None)
    ratio_now, ratio_then = now[ours] / now[reference], then[ours] / then[reference]
    measured = (f"**{ratio_now:.2f}x** the reference ({_number(now[ours])} steps/s), before: {ratio_then:.2f}x "
                f"({_number(then[ours])}; page of {before['date']}, commit {before['commit']})")  # fmt: skip
    return Goal(text, measured, ratio_now >= ratio_then * (1 - ONE_SESSION_NOISE))


def _floor(results: dict[str, Any], text: str, names: dict[str, str]) -> Goal:
    """A floor of this run beside a goal: each of ``names`` (a floor's key, what it is) with its figure."""
    floors = (results.get("fleet") or {}).get("floors")
    if not floors:
        return Goal(text, "the floors were not measured in this run", None, floor=True)
    if floors.get("error"):
        return Goal(text, f"failed: {floors['error']}", None, floor=True)
    measured = ", ".join(f"{_number(floors[name])} steps/s ({what})" for name, what in names.items())
    return Goal(text, measured, None, floor=True)


def goals(results: dict[str, Any]) -> list[Goal]:
    """Issue 21's goals, each with the figure of this run that measures it."""
    rows = _Rows(results)
    counts = sorted({count for _, count in rows.by_key})
    most = counts[-1] if counts else 4096
    kib = lambda value: f"{value:.1f} KiB"  # noqa: E731
    seconds = lambda value: f"{value:.2f} s"  # noqa: E731
    shared_async = ["ws-pool-shared-async", "ws-clients-shared-async"]
    return [
        _at_least(rows, "EnvPool of 1,024 sessions, async echo, one server: ≥ 100,000 steps/s",
                  "ws-pool-shared-async", 1024, 100_000),
        _ratio(rows, "EnvPool of 1,024 sessions, async echo: ≥ 5x the reference's 1,024 clients",
               "ws-pool-shared-async", "reference-async", 1024, 5.0),
        _ratio(rows, "256 independent clients in one process, each stepping in its own task: "
               "≥ 2.5x the reference's 256",
               "ws-clients-shared-async", "reference-async", 256, 2.5),
        _at_most(rows, "... on at most 4 TCP connections to the server", ["ws-clients-shared-async"], 256,
                 "connections", 4, lambda value: f"{value:.0f}"),
        _at_least(rows, "Plain `def step` echo, EnvPool of 1,024: ≥ 30,000 steps/s", "ws-pool-shared-plain", 1024,
                  30_000),
        _at_least(rows, "... the same, its environment without thread affinity (`thread_affinity = False`)",
                  "ws-pool-shared-unbound-plain", 1024, 30_000),
        _floor(results, "... the floor with thread affinity: 1,024 threads, each handed a call that does nothing, "
               "in one process (no network, no environment)",
               {"threads": "bare threads", "session_threads": "openenv's hand-over, `CallBatch`"}),
        _no_errors(rows, "4,096 sessions from one process (shared connection, async echo): 0 errors", shared_async,
                   4096),
        _at_most(rows, "Opening 1,024 sessions (shared connection): ≤ 0.5 s", shared_async, 1024, "open_s", 0.5,
                 seconds),
        _at_most(rows, f"Server memory on a shared connection: ≤ 10 KiB per session (at {most:,} sessions)",
                 shared_async, most, "server_kib_per_session", 10.0, kib),
        _http_poll(rows),
        _at_least(rows, "EnvPool of 1,024 sessions over inproc://: ≥ 250,000 steps/s", "inproc-pool-async", 1024,
                  250_000),
        _floor(results, "... the loop issue 21 names: 1,024 async echoes stepped in one loop, their actions "
               "decoded from one message, their observations encoded as one", {"loop": "no session, no client"}),
        _one_session(results, "ws-asyncio", "ref-async", "async"),
        _one_session(results, "ws-asyncio-sync", "ref-sync", "plain"),
    ]  # fmt: skip


def goals_section(results: dict[str, Any]) -> list[str]:
    """The "Goals" section: each goal of issue 21, the figure measured in this run, met or not."""
    if "fleet" not in results:
        return []
    status = {True: "**met**", False: "not met", None: "not measured"}
    lines = [
        "## Goals of issue 21 (fleets)",
        "",
        "Each goal of issue 21 with the figure of this run that measures it (the rows of",
        "[Fleets](#fleets-many-sessions-from-one-process) below; ratios within this run). *Before* is the",
        "last page before sessions shared connections.",
        "",
        "| goal | measured | |",
        "|---|---|---|",
    ]
    lines += [
        f"| {goal.text} | {goal.measured} | {'floor' if goal.floor else status[goal.met]} |" for goal in goals(results)
    ]
    return [*lines, ""]


def _row_cells(row: dict[str, Any], reference: dict[str, Any] | None) -> str:
    label = row["label"]
    if not row.get("runs"):
        return f"| {label} | failed: {row['error']} | | | | | | | | |"
    base = (reference or {}).get("steps_per_second")
    ratio = f"**{row['steps_per_second'] / base:.2f}x**" if row["steps_per_second"] and base else ""
    errors = f"{row['errors']:,}"
    if row.get("opened") is not None and row["opened"] < row["sessions"]:
        errors += f" ({row['opened']:,} opened)"
    return (
        f"| {label} | {_number(row['steps_per_second'])} | {ratio} | {_number(row['p99_ms'], 1)} "
        f"| {errors} | {_number(row['connections'])} | {_number(row['open_s'], 2)} "
        f"| {_number(row['server_kib_per_session'], 1)} | {_number(row['client_cpu_us_per_step'], 1)} "
        f"| {_number(row['server_cpu_us_per_step'], 1)} |"
    )


def fleet_section(results: dict[str, Any]) -> list[str]:
    """The "Fleets" section: a table per session count, every fleet row beside the reference's clients."""
    fleet = results.get("fleet")
    if not fleet:
        return []
    rows = fleet["rows"]
    lines = [
        "## Fleets: many sessions from one process",
        "",
        "N sessions opened from one client process (asyncio) against one server process, stepped as fast",
        "as their replies come: one `EnvPool` (`pool.step(actions)` in a loop), or N independent",
        "`EnvClient`s, each opened and stepped in a task of its own (the trainers' way), all opened at",
        "once; on a *shared connection* (the default: sessions to one server ride one link) or on *a",
        "connection per session* (`share=False`); over ws://, http+poll://, or inproc:// (no server",
        "process: both ends in the client's). The async echo is served as an `async def step`, the",
        "plain echo as a `def step`. *÷ reference* divides by the reference's clients (its",
        "`GenericEnvClient`, one WebSocket each, opened at once in tasks of their own, against its server",
        "with the same kind of echo) at the same N. Each measurement starts a new server; one session",
        "opens, steps and closes first, then the server's resident memory is the idle figure. Made by",
        "`tests.benchmarks.fleet_client` (ours) and `tests/benchmarks/reference_fleet_client.py`.",
        "",
        f"- *steps/s*: the steps that succeeded in {fleet['seconds']:g} s ({fleet['big_seconds']:g} s above 256",
        f"  sessions) once every session is open and reset; the median of {fleet['runs']} run(s) up to 256",
        "  sessions, one run above.",
        "- *p99 ms*: of each step; for an `EnvPool`, of each pool step (every session of the pool waits",
        "  that long).",
        "- *errors*: sessions that could not open (within 60 s) and steps that failed, over all runs.",
        "- *TCP conns*: the established TCP connections the client process holds to the server's port",
        "  (from `/proc`), with every session open.",
        "- *open s*: the time to open the N sessions (connected, before their reset).",
        "- *server KiB/session*: the server's resident memory with the sessions open and reset, minus",
        "  before they opened, divided by the sessions open (in-process: the one process's).",
        "- *CPU µs/step*: each process's CPU time (user and system) over the timed window, per step.",
        "",
        f"![Aggregate steps/s against sessions, async and plain echo: each fleet row and the reference]({IMAGE})",
        "",
    ]
    missing = {row["label"]: row["available"] for row in rows if row.get("available")}
    if missing:
        lines += ["Not measured yet, as this openenv lacks what they need:", ""]
        lines += [f"- {label}: {why.removeprefix('not available: ')}" for label, why in missing.items()]
        lines.append("")
    by_key = {(row["target"], row["sessions"]): row for row in rows}
    examples = []
    for count in sorted({row["sessions"] for row in rows}):
        lines += [
            f"### {count:,} sessions",
            "",
            "| | steps/s | ÷ reference | p99 ms | errors | TCP conns | open s | server KiB/session "
            "| client CPU µs/step | server CPU µs/step |",
            "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|",
        ]
        for row in rows:
            if row["sessions"] != count or row.get("available"):
                continue
            reference = by_key.get((f"reference-{row['env']}", count)) if row["transport"] != "reference" else None
            lines.append(_row_cells(row, reference))
            if row.get("error_examples"):
                examples.append(f"- {row['label']}, {count:,} sessions: {row['error_examples'][0]}")
        lines.append("")
    if examples:
        lines += ["The first error of each row that had any:", "", *examples, ""]
    return lines


def fleet_page(results: dict[str, Any], machine: list[str]) -> str:
    """The page of a ``--fleet-only`` run: the goals and the fleet tables, on the machine described."""
    meta = results["meta"]
    quick = (
        ['!!! warning "A quick smoke run"', "    These figures come from `--quick`: they show the harness works, "
         "not how fast anything is.", ""]
        if meta.get("quick") else []
    )  # fmt: skip
    lines = [
        "# Benchmarks: fleets",
        "",
        "<!-- Generated by tests/benchmarks/compare.py --fleet-only: edit that, not this page. -->",
        "",
        *quick,
        "Only the fleet part of the comparison (`--fleet-only`); the full run writes the whole page.",
        "",
        *goals_section(results),
        "## Machine",
        "",
        *machine,
        "",
        *fleet_section(results),
    ]
    return "\n".join(lines)
