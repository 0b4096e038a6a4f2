"""The benchmark page (docs/benchmarks.md), written from the results of `tests.benchmarks.compare`.

Ratios are the headline; absolute figures stand beside them, because on a shared,
noisy machine only what was measured in the same run compares.
"""

from __future__ import annotations

from typing import Any

from tests.benchmarks import _fleet_report
from tests.benchmarks._sync_report import sync_section

ONE_COMMAND = (
    'python3 -m venv .venv && .venv/bin/pip install -q -e ".[test,bench]"'
    " && .venv/bin/python -m tests.benchmarks.compare"
)


def _ratio(value: float | None, base: float | None) -> str:
    return f"**{value / base:.2f}x**" if value and base else "-"


def _number(value: float | None, digits: int = 0) -> str:
    return f"{value:,.{digits}f}" if value is not None else "-"


def _medians(rows: list[dict[str, Any]]) -> dict[str, float | None]:
    return {row["key"]: row["median"] for row in rows}


def _headline(results: dict[str, Any]) -> list[str]:
    echo, blob = _medians(results["echo"]), _medians(results["blob"])
    lines = []

    def line(text: str, value: float | None, base: float | None) -> None:
        if value and base:
            lines.append(f"- {text}: **{value / base:.2f}x**")

    line("openenv ws client and server ÷ the reference's, sync env", echo.get("ws-asyncio-sync"), echo.get("ref-sync"))
    second = results["meta"].get("second_reference")
    if second:
        line(f"{second}'s client and server ÷ the reference's, sync env", echo.get("ref03-sync"), echo.get("ref-sync"))
        line(f"{second}'s client and server ÷ the reference's, async env", echo.get("ref03-async"),
             echo.get("ref-async"))  # fmt: skip
    line("openenv ws client and server ÷ the reference's, async env", echo.get("ws-asyncio"), echo.get("ref-async"))
    line("openenv ws client ÷ the reference client, both against the reference server", echo.get("ws-to-ref"),
         echo.get("ref-sync"))  # fmt: skip
    line("openenv ws ÷ the raw websockets floor (how much of the stack's ceiling is left)", echo.get("ws-asyncio"),
         echo.get("ws-floor"))  # fmt: skip
    line("openenv ws ÷ raw asyncio Protocols exchanging the same frames (the practical limit of one session)",
         echo.get("ws-asyncio"), echo.get("protocol-floor"))  # fmt: skip
    line("openenv http+poll ÷ a bare httpx POST loop", echo.get("poll-asyncio"), echo.get("http-floor"))
    cpu = {row["key"]: row.get("cpu_us_per_step") for row in results["echo"]}
    for ours, theirs, server in (("ws-to-ref", "ref-sync", "the reference server"), ("ws-asyncio", "ref-async", "")):
        if cpu.get(ours) and cpu.get(theirs):
            against = f"both against {server}" if server else "each against its own server, async env"
            figures = f"**{cpu[ours] / cpu[theirs]:.2f}x** ({cpu[ours]:.0f} µs vs {cpu[theirs]:.0f} µs)"
            lines.append(f"- client CPU per step, openenv ws ÷ the reference client ({against}): {figures}")
    line("1 MiB observations, openenv ws msgpack ÷ the reference (MB/s)", blob.get("ws-msgpack"), blob.get("ref-blob"))
    line("1 MiB observations, openenv ws json ÷ the reference (MB/s)", blob.get("ws-json"), blob.get("ref-blob"))
    scale = {(row["target"], row["sessions"]): row for row in results["scale"]}
    counts = sorted({row["sessions"] for row in results["scale"]})
    if counts:
        most = counts[-1]
        ours, ref = scale.get(("ws", most)), scale.get(("reference", most))
        one = scale.get(("ws", counts[0]))
        if ours and one:
            line(f"openenv ws aggregate steps/s with {most} sessions ÷ with {counts[0]}", ours["steps_per_second"],
                 one["steps_per_second"])  # fmt: skip
        for count in [c for c in counts if c >= 256 and c != most] + [most]:
            ours, ref = scale.get(("ws", count)), scale.get(("reference", count))
            if not (ours and ref):
                continue
            line(f"openenv ws ÷ the reference, aggregate steps/s with {count} sessions", ours["steps_per_second"],
                 ref["steps_per_second"])  # fmt: skip
            if ours["p99_ms"] and ref["p99_ms"]:
                lines.append(f"- p99 latency with {count} sessions: openenv ws {ours['p99_ms']:.1f} ms, "
                             f"the reference {ref['p99_ms']:.1f} ms")  # fmt: skip
            if ref["error"]:
                lines.append(f"- the reference with {count} sessions: failed ({ref['error']})")
        ours_sync, ref_sync = scale.get(("ws-sync", most)), scale.get(("reference-sync", most))
        if ours_sync and ref_sync:
            line(f"openenv ws ÷ the reference, sync env, aggregate steps/s with {most} sessions",
                 ours_sync["steps_per_second"], ref_sync["steps_per_second"])  # fmt: skip
        for key, text in (
            ("ref-to-ours", "the openenv server ÷ the reference server, both driven by the reference client"),
            ("ours-to-ref", "the openenv client ÷ the reference client, both against the reference server"),
        ):
            crossed = scale.get((key, most))
            if crossed and ref:
                line(f"{text}, {most} sessions", crossed["steps_per_second"], ref["steps_per_second"])
    return lines


def _echo_table(rows: list[dict[str, Any]], runs: int) -> list[str]:
    medians = _medians(rows)
    out = [
        "| pair | x reference | x floor | steps/s (median) | client CPU µs/step | server CPU µs/step |",
        "|---|--:|--:|--:|--:|--:|",
    ]
    for row in rows:
        refs = [key for key in row["versus"] if key.startswith("ref")]
        floors = [key for key in row["versus"] if key.endswith("floor")]
        ref = _ratio(row["median"], medians.get(refs[0])) if refs else ""
        floor = _ratio(row["median"], medians.get(floors[0])) if floors else ""
        figure = _number(row["median"]) if row["median"] else f"failed: {row['error']}"
        cpu = _number(row.get("cpu_us_per_step"), 1)
        server_cpu = _number(row.get("server_cpu_us_per_step"), 1)
        out.append(f"| {row['label']} | {ref} | {floor} | {figure} | {cpu} | {server_cpu} |")
    return out


def _blob_table(rows: list[dict[str, Any]]) -> list[str]:
    medians = _medians(rows)
    out = ["| pair | x reference | MB/s of payload | steps/s |", "|---|--:|--:|--:|"]
    for row in rows:
        ratio = _ratio(row["median"], medians.get(row["versus"][0])) if row["versus"] else ""
        if row["median"]:
            megabytes = row["median"] * row["payload_bytes"] / 1e6
            out.append(f"| {row['label']} | {ratio} | {megabytes:,.1f} | {_number(row['median'], 1)} |")
        else:
            out.append(f"| {row['label']} | - | cannot: {row['error']} | - |")
    return out


def _scale_table(rows: list[dict[str, Any]]) -> list[str]:
    out = [
        "| server | sessions | steps/s x 1 session | p99 x 1 session | ÷ reference (steps/s) "
        "| aggregate steps/s | p99 ms | server KiB per session | client CPU µs/step | errors |",
        "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    by_key = {(row["target"], row["sessions"]): row for row in rows}
    counts = sorted({row["sessions"] for row in rows})
    for row in rows:
        if row["steps_per_second"] is None:
            out.append(f"| {row['label']} | {row['sessions']} | - | - | - | failed: {row['error']} | - | - | - | - |")
            continue
        one = by_key.get((row["target"], counts[0]), {})
        base = row.get("versus", "reference")  # the reference with the same kind of environment
        ref = by_key.get((base, row["sessions"]), {})
        versus = _ratio(row["steps_per_second"], ref.get("steps_per_second")) if row["target"] != base else ""
        failed = f"; a later run failed: {row['error']}" if row["error"] else ""
        out.append(
            f"| {row['label']} | {row['sessions']} | {_ratio(row['steps_per_second'], one.get('steps_per_second'))} "
            f"| {_ratio(row['p99_ms'], one.get('p99_ms'))} | {versus} | {_number(row['steps_per_second'])} "
            f"| {_number(row['p99_ms'], 1)} | {_number(row['kib_per_session'], 1)} "
            f"| {_number(row.get('client_cpu_us_per_step'))} | {row['errors']}{failed} |"
        )
    return out


def _pool_section(pool: dict[str, Any] | None) -> list[str]:
    if pool is None:
        return []
    niceness = pool.get("worker_niceness")
    niceness = "15, Ray's default" if niceness is None else niceness
    lines = [
        "## EnvPool: ws:// against ray://",
        "",
        "One `EnvPool` (asyncio) of N sessions of the async echo, stepped together: over ws:// to one",
        "`openenv serve` process, and over ray:// on a local Ray (actors of "
        f"{pool.get('sessions_per_actor', '?')} sessions, `num_cpus=0`,",
        f"workers at nice {niceness}); *ray-call* is the step path not taken, one Ray actor method call",
        "per step. Made by `python -m tests.benchmarks.bench_pool`, medians of its runs, the server, Ray",
        "and the pool all in one loopback-only network namespace (`tests.loopback`); *open* is the",
        "time to open the pool on new actors (cold) and on the actors left by the previous pool (warm).",
        "",
    ]
    if "error" in pool:
        return [*lines, f"Not measured: {pool['error']}", ""]
    lines += [
        "| sessions | ws steps/s | ray steps/s | ray ÷ ws | ray-call steps/s | open cold s | open warm s "
        "| server steps per core-second | actor steps per core-second | client steps per core-second "
        "| server KiB per session |",
        "|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for size, row in pool["sizes"].items():
        ws, ray, call, memory = row["ws"], row["ray"], row["ray-call"], row.get("memory", {})
        lines.append(
            f"| {size} | {_number(ws['steps_per_s'])} | {_number(ray['steps_per_s'])} "
            f"| {_ratio(ray['steps_per_s'], ws['steps_per_s'])} | {_number(call['steps_per_s'])} "
            f"| {_number(ray['open_cold_s'], 2)} | {_number(ray['open_warm_s'], 2)} "
            f"| {_number(ws['server_steps_per_core_s'])} | {_number(ray.get('actor_steps_per_core_s'))} "
            f"| {_number(ws.get('client_steps_per_core_s'))} "
            f"| {_number(memory.get('server_kib_per_session'), 1)} |"
        )
    return [*lines, ""]


def _machine(meta: dict[str, Any]) -> list[str]:
    machine = meta["machine"]
    packages = ", ".join(f"{name} {version}" for name, version in machine["packages"].items())
    reference = ", ".join(f"{name} {version}" for name, version in machine["reference_packages"].items())
    second = ", ".join(f"{name} {version}" for name, version in meta.get("second_reference_packages", {}).items())
    load = " ".join(f"{x:.2f}" for x in machine["load_average"])
    after = " ".join(f"{x:.2f}" for x in machine.get("load_average_after", []))
    parts = {"echo": "echo", "blob": "1 MiB", "scale": "scale", "pool": "EnvPool", "fleet": "fleet"}
    durations = ", ".join(f"{parts.get(part, part)} {took:.0f} s" for part, took in meta["durations_s"].items())
    return [
        f"- CPU: {machine['cpu']}, {machine['cores']} cores; {machine['memory_gib']} GiB RAM",
        f"- OS: {machine['os']}; Python {machine['python']}",
        f"- ours: {packages}",
        f"- the reference's venv: {reference}",
        *([f"- the second reference's venv: {second}"] if second else []),
        f"- load average before: {load}; after: {after or '-'}",
        f"- date: {meta['date']}; `{meta['command']}` took {meta.get('total_s', 0) / 60:.1f} min ({durations})",
    ]


def dropin_section(results: dict[str, Any] | None) -> list[str]:
    """The section "Unchanged upstream environments", from `tests.benchmarks.bench_dropin`'s JSON (none without)."""
    if not results:
        return []
    pydantic = results["pydantic"]
    lines = [
        "## Unchanged upstream environments",
        "",
        "An environment package written against upstream's API (`tests/dropin/projects/grid_env`: pydantic types,",
        "`create_app` in its `server/app.py`) served by upstream 0.10.0 in its own environment and by openenv",
        "(`openenv serve grid_env.server.app:app`), the same files on both; `tests/benchmarks/bench_dropin.py`,",
        f"medians of {results['runs']} runs of {results['seconds']:g} s. The clients are upstream's `GenericEnvClient`",
        "(one, or C at once, each a WebSocket of its own), except the last row's `EnvPool` of 1,024 sessions on one",
        "connection. *plain*: `step` runs on a thread per session; *async*: `step_async` on the event loop.",
        "",
        "| steps/s | upstream's server | openenv | ratio |",
        "|---|--:|--:|--:|",
    ]
    for which, figures in results["envs"].items():
        rows = [
            ("1 session", figures["one/upstream"], figures["one/ours"]),
            ("256 sessions", figures["256/upstream"], figures["256/ours"]),
            ("1,024 sessions (ours: one EnvPool)", figures["1024/upstream"], figures["1024/ours pool"]),
        ]
        for label, theirs, ours in rows:
            lines.append(f"| {which}, {label} | {theirs:,.0f} | {ours:,.0f} | **{ours / theirs:.2f}x** |")
    plain = results["envs"]["plain"]["one/ours server cpu us"]
    cost = pydantic["validate_us"] + pydantic["dump_us"]
    bounds = results.get("bounds")
    if bounds:
        ceiling_one, ceiling_many = bounds["one/client ceiling"], bounds["256/client ceiling"]
        floor = bounds["1024/thread floor"]
        most = ", ".join(
            f"{which} {ceiling_one / figures['one/upstream']:.2f}x and {ceiling_many / figures['256/upstream']:.2f}x"
            for which, figures in results["envs"].items()
        )
        lines += [
            "",
            "What bounds these ratios on this machine, measured in the same run: upstream's client against the",
            "fastest server this project has (the native async echo: no pydantic, no thread) makes",
            f"{ceiling_one:,.0f} steps/s at one session and {ceiling_many:,.0f} at 256 (client and server share the",
            "machine's cores). Divided by upstream's own figures above, that is about the most a server could show",
            f"with this client (that echo's own cost is small, not nil), at one session and at 256: {most}.",
            "The plain environment's 1,024 sessions, each on a thread of its own as upstream's are, cannot pass",
            f"the floor of bare threads handed a call that does nothing: {floor:,.0f} calls/s,",
            f"{floor / results['envs']['plain']['1024/upstream']:.2f}x upstream's.",
        ]
    lines += [
        "",
        f"Pydantic's share: validating the action takes {pydantic['validate_us']:.1f} µs and dumping the observation",
        f"{pydantic['dump_us']:.1f} µs, {cost:.1f} µs a step in all (measured alone, `timeit`), against {plain:.0f} µs",
        "of our server's CPU per step at one session (the plain environment, its whole process, warm-up included).",
        "",
    ]
    return lines


def render(results: dict[str, Any], image: str) -> str:
    """The whole page, in Markdown; ``image`` is the plot's path relative to the page."""
    meta = results["meta"]
    if "echo" not in results:  # a --fleet-only run
        return _fleet_report.fleet_page(results, _machine(meta))
    quick = (
        [
            '!!! warning "A quick smoke run"',
            f"    These figures come from `--quick` ({meta['runs']} run of {meta['seconds']:g} s per figure): "
            "they show the harness works, not how fast anything is. Run the full comparison for figures.",
            "",
        ]
        if meta["quick"]
        else []
    )
    blob = f"{meta['blob_bytes'] / 2**20:g} MiB"
    runs = f"{meta['runs']} run{'s' if meta['runs'] != 1 else ''}"
    scale_runs = meta.get("scale_runs", meta["runs"])
    scale_runs = f"{scale_runs} run{'s' if scale_runs != 1 else ''}"
    lines = [
        "# Benchmarks",
        "",
        "<!-- Generated by tests/benchmarks/compare.py: edit that, not this page. -->",
        "",
        *quick,
        f"openenv against the reference implementation ({meta.get('reference', 'openenv-core 0.3.0')} from PyPI,",
        "in its own virtual environment"
        + (f"; {meta['second_reference']} too, one session" if meta.get("second_reference") else "")
        + ") and against the floors of the stack it is built on, in one run on one",
        "machine. **Read the ratios**: the absolute figures drift with the machine and its load; the",
        "ratios between figures measured in the same run, interleaved run by run, do not.",
        "",
        "## Headline",
        "",
        *_headline(results),
        "",
        *_fleet_report.goals_section(results),
        # A link to the image itself: the full size, a click away.
        f"[![Steps per second normalised to the reference; MB/s of 1 MiB observations; aggregate steps/s "
        f"and p99 against sessions]({image})]({image})",
        "",
        "*Click the plot for its full size.*",
        "",
        "## Reproduce",
        "",
        "From a fresh clone (it builds the reference's throwaway venv on first use):",
        "",
        "```bash",
        ONE_COMMAND,
        "```",
        "",
        "Options: `--quick` (a smoke run: 0.5 s, 1 run, 1, 16 and 1024 sessions; fleets at 256, and at 1024",
        "for the goals' rows), `--runs N` (runs per figure, the median kept; default 5), `--seconds S` (per",
        "echo and 1 MiB run; default 3), `--scale-seconds S` (per scale run; default 5), `--scale-runs N`",
        "(default 3), `--sessions 1,16,64,256,1024`, `--out DIR`, `--fleet-only` (only the fleet rows),",
        "`--no-fleet`, `--fleet-sessions 64,256,1024,4096`, `--fleet-runs N` (runs up to 256 sessions;",
        "default 3), `--fleet-seconds S` (default 1.5), `--fleet-big-seconds S` (above 256 sessions;",
        "default 3), `--fleet-rows TEXT` (only the fleet rows whose key holds TEXT: `ws-pool`, `reference`), and",
        "`--from-json docs/benchmarks.json` to rewrite this page and the plot from the raw figures",
        "without measuring again.",
        "",
        "## Machine",
        "",
        *_machine(meta),
        "",
        "## One session, small frames",
        "",
        f"Steps per second of one session, the median of {runs} of {meta['seconds']:g} s. Every",
        "server and client is a process of its own on loopback (inproc:// excepted: one process); all run",
        "the same echo (action `{message}`, observation `{echoed_message}`). *x reference* divides by the",
        "reference client against its own server, with the same kind of environment (a sync `step`,",
        "which the reference runs in a thread and ours on the session's thread, which reads and writes the",
        "socket itself, or an async one); *x floor* by the raw `websockets` echo",
        "(pre-built frames, no protocol) for WebSocket rows, by a bare httpx POST loop against a bare",
        "Starlette route for http+poll. A third floor, raw asyncio Protocols in two processes exchanging the",
        "bytes of a step's frames (no parsing, no library), is what the event loop and the system calls alone",
        "allow one session. *Client CPU* is the client process's CPU time (user and system) over the timed",
        "span, per step; *server CPU* the server process's over the client's whole run (its connection and",
        "untimed steps included), per step.",
        "",
        *_echo_table(results["echo"], meta["runs"]),
        "",
        f"## Large observations: {blob} of bytes per step",
        "",
        f"Every step's observation carries {blob} of random bytes (about five 256x256x3 uint8 images).",
        "msgspec writes `bytes` as base64 in JSON (4/3 of the size on the wire) and as raw bytes in",
        "msgpack; the reference's pydantic observations cannot carry raw bytes in JSON, so its",
        "environment sends the same base64 as a string and its client decodes it, as a user must. Both",
        "WebSocket clients offer permessage-deflate, which the random payload defeats. MB/s counts the",
        "decoded payload, 10⁶ bytes a second.",
        "",
        *_blob_table(results["blob"]),
        "",
        "## Many sessions against one server process",
        "",
        f"C sessions open at once, each stepping as fast as its replies come, for {meta['scale_seconds']:g} s",
        f"after all are open; medians of {scale_runs}. Ours is measured with `openenv bench URL",
        "--sessions C --seconds T --json` (one client process, asyncio); the reference with",
        "`tests/interop/reference_bench_client.py --sessions C` (its `GenericEnvClient`, asyncio, sessions",
        "opened 16 at a time), against its step_async echo env (ours is async too); the *sync env* rows",
        "serve a plain `def step` echo instead (the reference runs it in its thread pool, ours on a thread",
        "per session, reading and writing its socket) and are divided by the reference's sync env. Each measurement",
        "starts a fresh server, warms it with one session, reads its RSS (`VmRSS` in `/proc/<pid>/status`)",
        "as the idle figure, then samples it every 10 ms during the run: *KiB per session* is (peak - idle)",
        "÷ C (at one session, that is within the noise of page-sized growth). *x 1 session* divides by",
        "the same server's figure with the fewest sessions; *÷ reference* by the reference at the same C.",
        "The reference's server holds one thread per session. The two crossed pairs (the reference's",
        "client against our server, ours against the reference's) tell the client's share of a figure",
        "from the server's: on two cores the client process and the server process each have one.",
        "*Client CPU* is the client process's CPU time (user and system) over its whole run, opening the",
        "sessions included, per step.",
        "",
        *_scale_table(results["scale"]),
        "",
        *_fleet_report.fleet_section(results),
        *_pool_section(results.get("pool")),
        *dropin_section(results.get("dropin")),
        *sync_section(results.get("sync")),
    ]
    return "\n".join(lines)
