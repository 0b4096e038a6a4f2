"""The section "The blocking client" of the benchmarks page, from `tests.benchmarks.bench_sync`'s JSON."""

from __future__ import annotations

from typing import Any

__all__ = ["sync_section"]

_LABELS = {
    "one": "one sync client, steps in a loop",
    "sequential": "64 sync clients stepped one after another in one thread",
    "threads": "64 threads, each with a sync client",
    "threads_1ms": "the same, `sys.setswitchinterval(0.001)`",
}


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"**{value:.2f}x**"


def sync_section(results: dict[str, Any] | None) -> list[str]:
    """The section's lines (none without results).

    Args:
        results: What ``bench_sync --json`` wrote: ``meta``, ``runs`` and ``medians``.

    Returns:
        Its Markdown lines.
    """
    if not results:
        return []
    meta, medians = results["meta"], results["medians"]
    patterns, floors = medians["patterns"], medians["floors"]
    runs = f"{meta['runs']} run{'s' if meta['runs'] != 1 else ''}"
    lines = [
        "## The blocking client (`.sync()`)",
        "",
        "Each side's blocking client against its own server, a plain `def step` echo (ours:",
        f"`openenv serve {meta['server_factory']}`; upstream 0.10.0: its `create_app` in its own environment, the",
        "`GenericEnvClient(base_url=...).sync()` client). Every client is a process of its own;",
        f"`tests/benchmarks/bench_sync.py`, medians of {runs} of {meta['seconds']:g} s, interleaved run by run; the",
        "ratios are the medians of the ratios of each run. Ours writes each request and reads its reply in the",
        "calling thread, on a connection lent to the process's sync clients; upstream's hands each call to an",
        "event loop in a thread of the client's own.",
        "",
    ]
    before = meta.get("before")
    if before:
        lines += [
            f"*before*: our client as it was at {before} (every call through the event loop's thread), timed in",
            "the same runs against the same server (`bench_sync --before`).",
            "",
        ]
    head = "| pattern | openenv steps/s | upstream steps/s | ratio |"
    rule = "|---|--:|--:|--:|"
    if before:
        head, rule = head + " openenv before | ratio before |", rule + "--:|--:|"
    lines += [
        head + " TCP connections (ours / upstream) | client CPU µs/step (ours / upstream) |",
        rule + "--:|--:|",
    ]
    for pattern, label in _LABELS.items():
        row = patterns[pattern]
        held = "-"
        if row.get("ours_connections") is not None:
            held = f"{row['ours_connections']:.0f} / {row['upstream_connections']:.0f}"
        cpu = f"{_rate(row['ours_cpu_us_per_step'])} / {_rate(row['upstream_cpu_us_per_step'])}"
        failed = [side for side in ("ours", "upstream") if row[f"{side}_failed_runs"]]
        note = f" ({' and '.join(failed)} failed in some runs)" if failed else ""
        was = f" {_rate(row.get('before_rate'))} | {_ratio(row.get('before_over_upstream'))} |" if before else ""
        lines.append(
            f"| {label}{note} | {_rate(row['ours_rate'])} | {_rate(row['upstream_rate'])} "
            f"| {_ratio(row['ours_over_upstream'])} |{was} {held} | {cpu} |"
        )
    if "threads_1ms" in patterns:
        lines += [
            "",
            "64 threads that each do their own I/O spend much of their time handing CPython's interpreter lock",
            "to one another, which the old way (one event-loop thread doing every session's I/O) did less: the",
            "gain over *before* is smallest there. The switch interval (5 ms by default) shapes it: at 1 ms",
            "upstream's client (an event-loop thread per client, 128 threads) slows down, ours does not.",
        ]
    one, asynchronous = patterns["one"], patterns["async_one"]
    ping = floors["thread_ping_pong"]
    lines += [
        "",
        f"Against our own async client, one session on the same server ({_rate(asynchronous['ours_rate'])} steps/s),",
        f"one sync client is {_ratio(one.get('ours_sync_over_async'))} as fast: it goes through no event loop. What a",
        "call cost when each crossed to the event loop's thread and back: a blocking portal's round trip",
        f"(`portal.call` of a coroutine that does nothing) makes {_rate(floors['portal_round_trip'])} calls/s on",
        f"this machine, and the bare hand-off between two threads ({ping['fastest'].replace('_', ' ')}) makes",
        f"{_rate(ping['rate'])} round trips/s.",
        "",
    ]
    return lines
