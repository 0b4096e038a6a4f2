"""The whole comparison in one run: openenv against the reference and the raw floors; writes docs/benchmarks.md.

Not a test. From a fresh clone:

    python3 -m venv .venv && .venv/bin/pip install -q -e ".[test,bench]" && .venv/bin/python -m tests.benchmarks.compare

    python -m tests.benchmarks.compare --quick            # a smoke run: short, 1 run, 1, 16 and 1024 sessions
    python -m tests.benchmarks.compare --runs 5 --seconds 3 --scale-runs 3 --scale-seconds 5 --sessions 1,16,64,256,1024
    python -m tests.benchmarks.compare --from-json docs/benchmarks.json   # only rewrite the page and plot
    python -m tests.benchmarks.compare --fleet-only --out /tmp/fleet      # only the fleet rows and their goals
    python -m tests.benchmarks.compare --quick --fleet-only --fleet-rows ws-pool --fleet-sessions 1024  # one row

Five parts, every server and every client a process of its own on loopback
(the in-process rows excepted), the same echo logic everywhere (action
``{message}``, observation ``{echoed_message}``):

1. **Echo**: one session's steps per second, for each client/server pair:
   ours over ws:// (asyncio and trio clients; uvicorn, hypercorn+websockets and hypercorn servers),
   http+poll:// and inproc://; the reference (openenv 0.10.0) client against its
   server, and openenv-core 0.3.0's against its own; and the floors, a raw ``websockets`` echo, raw asyncio Protocols
   exchanging the same frames, and a bare httpx POST loop. Each client also
   reports its CPU time per step.
2. **Large observation**: 1 MiB of bytes per step, in MB/s of payload.
3. **Scale**: C sessions at once against one server process (``openenv bench``
   for ours, ``reference_bench_client.py --sessions`` for the reference):
   aggregate steps/s, p99 latency, server memory per session, and the client
   process's CPU time per step (its whole run, opening the sessions included).
4. **Fleets**: N sessions from one process (64 to 4,096): an ``EnvPool`` or N
   independent clients, on a shared connection or a connection per session,
   async and plain echo, over ws://, http+poll:// and inproc://, beside the
   reference's clients at the same N (`tests.benchmarks.fleet`): steps/s, p99,
   errors, TCP connections held, server memory per session, time to open; the
   floors of a fleet's step on this machine (`tests.benchmarks.fleet_floor`: bare
   threads, openenv's thread hand-over, the in-process loop); and issue 21's
   goals, met or not. ``--fleet-only`` runs this part alone (``--fleet-rows floors``: the floors alone).
5. **EnvPool**: one pool of 256 and of 1,024 sessions over ws:// to one
   ``openenv serve`` against the same pool over ray:// on a local Ray
   (``tests.benchmarks.bench_pool``, in a process and a loopback-only network
   namespace of its own; only with ``--pool``).

Each figure is the median of ``--runs`` runs, the pairs interleaved run by run so
that drift hits all alike: compare the ratios, not the absolute figures.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.benchmarks import _fleet_plot, _machine, _plot, _report
from tests.benchmarks._memory import PeakRSS, rss_kib
from tests.benchmarks._pairs import Pair, measure_pairs, our_client, say, with_scheme
from tests.benchmarks._servers import (
    REFERENCE_CLIENT,
    ROOT,
    Server,
    http_floor_server,
    our_env,
    our_server,
    protocol_floor_server,
    reference_server,
    run_client,
    ws_floor_server,
)
from tests.benchmarks.envs import BLOB_SIZE
from tests.benchmarks.fleet import COUNTS, GOAL_ROWS, QUICK_COUNTS, measure_fleet, measure_floors, one_session_before
from tests.interop.reference_venv import OPENENV_0_10, OPENENV_CORE_0_3, ensure_reference_python, reference_versions

REFERENCE = OPENENV_0_10
"""The reference every figure is divided by: upstream's current release."""
SECOND_REFERENCE = OPENENV_CORE_0_3
"""The first reference, kept where it is cheap: its one-session echo pairs."""
ECHO = "tests.benchmarks.envs:AsyncMessageEchoEnv"
SYNC_ECHO = "tests.benchmarks.envs:MessageEchoEnv"
BLOB = "tests.benchmarks.envs:BlobEnv"
ACTION = '{"message": "hello"}'
DOCS = ROOT / "docs"


def echo_pairs(python: Path, seconds: float, python_03: Path | None = None) -> list[Pair]:
    """The small-frame pairs: ours per transport and backend, the reference, the floors.

    ``python_03``: openenv-core 0.3.0's python, for the second reference's pair (``ref03-*``: its client
    against its server, divided by 0.10.0's pair with the same kind of environment); ``None`` leaves it out.
    """
    s = ["--seconds", str(seconds)]
    ref = [str(python), str(REFERENCE_CLIENT)]
    second = []
    if python_03 is not None:
        ref03 = [str(python_03), str(REFERENCE_CLIENT)]
        second = [
            Pair(
                "ref03-sync",
                "openenv-core 0.3.0 client -> its server (sync env)",
                "reference-0.3",
                "ref03-sync",
                lambda url: [*ref03, url, *s],
                reference=True,
                versus=["ref-sync"],
            ),
            Pair(
                "ref03-async",
                "openenv-core 0.3.0 client -> its server (step_async env)",
                "reference-0.3",
                "ref03-async",
                lambda url: [*ref03, url, *s],
                reference=True,
                versus=["ref-async"],
            ),
        ]
    return [
        Pair("ref-sync", "reference client -> reference server (sync env)", "reference", "ref-sync",
             lambda url: [*ref, url, *s], reference=True),
        Pair("ref-async", "reference client -> reference server (step_async env)", "reference", "ref-async",
             lambda url: [*ref, url, *s], reference=True),
        *second,
        Pair("ws-asyncio-sync", "openenv ws [asyncio] -> openenv [uvicorn] (sync env)", "ws", "ours-sync",
             our_client(*s), versus=["ref-sync", "ws-floor"]),
        Pair("ws-asyncio", "openenv ws [asyncio] -> openenv [uvicorn] (async env)", "ws", "ours",
             our_client(*s), versus=["ref-async", "ws-floor", "protocol-floor"]),
        Pair("ws-trio", "openenv ws [trio] -> openenv [uvicorn] (async env)", "ws", "ours",
             our_client(*s, "--backend", "trio"), versus=["ref-async", "ws-floor"]),
        Pair("ws-trio-trio", "openenv ws [trio] -> openenv [hypercorn+websockets, trio] (async env)", "ws",
             "ours-trio", our_client(*s, "--backend", "trio"), versus=["ref-async", "ws-floor"]),
        Pair("ws-asyncio-trio", "openenv ws [asyncio] -> openenv [hypercorn+websockets, trio] (async env)", "ws",
             "ours-trio", our_client(*s), versus=["ref-async", "ws-floor"]),
        Pair("ws-trio-hypercorn", "openenv ws [trio] -> openenv [hypercorn, trio] (async env)", "ws",
             "ours-trio-hypercorn", our_client(*s, "--backend", "trio"), versus=["ref-async", "ws-floor"]),
        Pair("ws-msgpack", "openenv ws msgpack [asyncio] -> openenv [uvicorn] (async env)", "ws", "ours",
             our_client(*s, "--encoding", "msgpack"), versus=["ref-async", "ws-floor"]),
        Pair("ws-to-ref", "openenv ws [asyncio] -> reference server (sync env)", "ws", "ref-sync",
             our_client(*s), versus=["ref-sync", "ws-floor"]),
        Pair("poll-asyncio", "openenv http+poll [asyncio] -> openenv [uvicorn] (async env)", "http+poll", "ours",
             with_scheme("http+poll", our_client(*s)), versus=["ref-async", "http-floor"]),
        Pair("inproc-asyncio", "openenv inproc [asyncio] (async env, one process)", "inproc", "",
             lambda _: our_client(*s)(f"inproc://{ECHO}"), versus=["ref-async"]),
        Pair("inproc-trio", "openenv inproc [trio] (async env, one process)", "inproc", "",
             lambda _: our_client(*s, "--backend", "trio")(f"inproc://{ECHO}"), versus=["ref-async"]),
        Pair("ws-floor", "raw websockets client -> websockets echo server", "floor", "ws-floor",
             lambda url: [sys.executable, "-m", "tests.benchmarks.ws_floor", "client", url, *s]),
        Pair("http-floor", "bare httpx POST loop -> bare Starlette route [uvicorn]", "floor", "http-floor",
             lambda url: [sys.executable, "-m", "tests.benchmarks.http_floor", "client", url, *s]),
        Pair("protocol-floor", "raw asyncio Protocols exchanging the same frames (two processes)", "floor",
             "protocol-floor",
             lambda url: [sys.executable, "-m", "tests.benchmarks.protocol_floor", "client", url, *s]),
    ]  # fmt: skip


def blob_pairs(python: Path, seconds: float) -> list[Pair]:
    """The 1 MiB-observation pairs: ours per transport and encoding, the reference over its ws."""
    s = ["--seconds", str(seconds), "--observation", "blob"]
    return [
        Pair("ref-blob", "reference client -> reference server (base64 str)", "reference", "ref-blob",
             lambda url: [str(python), str(REFERENCE_CLIENT), url, "--seconds", str(seconds), "--blob"],
             reference=True),
        Pair("ws-json", "openenv ws json [asyncio] -> openenv [uvicorn]", "ws", "ours-blob",
             our_client(*s), versus=["ref-blob"]),
        Pair("ws-msgpack", "openenv ws msgpack [asyncio] -> openenv [uvicorn]", "ws", "ours-blob",
             our_client(*s, "--encoding", "msgpack"), versus=["ref-blob"]),
        Pair("poll-json", "openenv http+poll json [asyncio] -> openenv [uvicorn]", "http+poll", "ours-blob",
             with_scheme("http+poll", our_client(*s)), versus=["ref-blob"]),
        Pair("poll-msgpack", "openenv http+poll msgpack [asyncio] -> openenv [uvicorn]", "http+poll", "ours-blob",
             with_scheme("http+poll", our_client(*s, "--encoding", "msgpack")), versus=["ref-blob"]),
        Pair("inproc", "openenv inproc [asyncio] (one process)", "inproc", "",
             lambda _: our_client(*s)(f"inproc://{BLOB}"), versus=["ref-blob"]),
    ]  # fmt: skip


@dataclass
class ScaleTarget:
    """A server measured at scale, and the client command for C sessions over T seconds."""

    key: str
    label: str
    server: Callable[[], AbstractContextManager[Server]]
    client: Callable[[str, int, float], list[str]]
    reference: bool = False
    versus: str = "reference"  # the key of the target whose figures this one's are divided by


def scale_targets(python: Path, max_sessions: int) -> list[ScaleTarget]:
    """Our ws and http+poll (``openenv bench``) on uvicorn, ws on trio's server, the reference, the two crossed."""
    # As many connections as sessions: http+poll holds one per session, past uvicorn's default cap.
    room = str(max(max_sessions, 1) * 2)
    capacity = ["--max-sessions", room, "--max-connections", room]

    def bench(scheme: str, backend: str = "asyncio") -> Callable[[str, int, float], list[str]]:
        def command(url: str, sessions: int, seconds: float) -> list[str]:
            url = url.replace("http://", f"{scheme}://", 1)
            options = ["--sessions", str(sessions), "--seconds", str(seconds), "--action", ACTION, "--json"]
            return [sys.executable, "-m", "transports.cli", "bench", url, *options, "--backend", backend]

        return command

    def reference(url: str, sessions: int, seconds: float) -> list[str]:
        return [str(python), str(REFERENCE_CLIENT), url, "--sessions", str(sessions), "--seconds", str(seconds)]

    return [
        ScaleTarget("ws", "openenv ws [asyncio] -> openenv [uvicorn]", lambda: our_server(ECHO, "asyncio", *capacity),
                    bench("ws")),
        ScaleTarget("ws-to-trio", "openenv ws [asyncio] -> openenv [hypercorn+websockets, trio]",
                    lambda: our_server(ECHO, "trio", "--max-sessions", room), bench("ws")),
        ScaleTarget("ws-trio-to-trio", "openenv ws [trio] -> openenv [hypercorn+websockets, trio]",
                    lambda: our_server(ECHO, "trio", "--max-sessions", room), bench("ws", "trio")),
        ScaleTarget("http+poll", "openenv http+poll [asyncio] -> openenv [uvicorn]",
                    lambda: our_server(ECHO, "asyncio", *capacity), bench("http+poll")),
        ScaleTarget("reference", "reference client -> reference server (step_async env)",
                    lambda: reference_server(python, "--async-step", max_sessions=max(max_sessions, 1) * 2),
                    reference, reference=True),
        # The crossed pairs tell the client's share from the server's.
        ScaleTarget("ref-to-ours", "reference client -> openenv [uvicorn]",
                    lambda: our_server(ECHO, "asyncio", *capacity), reference, reference=True),
        ScaleTarget("ours-to-ref", "openenv ws [asyncio] -> reference server (step_async env)",
                    lambda: reference_server(python, "--async-step", max_sessions=max(max_sessions, 1) * 2),
                    bench("ws")),
    ]  # fmt: skip


def sync_scale_targets(python: Path, max_sessions: int) -> list[ScaleTarget]:
    """Our ws and the reference at scale with a plain ``def step`` environment: each runs it in threads."""
    capacity = max(max_sessions, 1) * 2
    clients = {target.key: target.client for target in scale_targets(python, max_sessions)}
    ours, reference = clients["ws"], clients["reference"]
    return [
        ScaleTarget("ws-sync", "openenv ws [asyncio] -> openenv [uvicorn] (sync env)",
                    lambda: our_server(SYNC_ECHO, "asyncio", "--max-sessions", str(capacity)), ours,
                    versus="reference-sync"),
        ScaleTarget("reference-sync", "reference client -> reference server (sync env)",
                    lambda: reference_server(python, max_sessions=capacity), reference, reference=True,
                    versus="reference-sync"),
    ]  # fmt: skip


def measure_scale(targets: list[ScaleTarget], sessions: list[int], runs: int, seconds: float) -> list[dict[str, Any]]:
    """Each target at each session count, a fresh server per measurement (so idle memory is idle).

    One session warms the server up first (its first connection loads what it
    loads lazily); the server's RSS then is the idle figure, and the peak RSS
    during the C-session run minus it, divided by C, is the memory per session.
    """
    rows = {(t.key, c): {"target": t.key, "label": t.label, "sessions": c, "versus": t.versus, "runs": [],
                         "idle_kib": [], "peak_kib": [], "error": None} for t in targets for c in sessions}  # fmt: skip
    for run in range(runs):
        for count in sessions:
            for target in targets:
                row = rows[(target.key, count)]
                if row["error"]:
                    continue
                try:
                    with target.server() as server:
                        warm = target.client(server.url, 1, 0.3)
                        run_client(warm, timeout=120, reference=target.reference)
                        idle = rss_kib(server.pid)
                        before = resource.getrusage(resource.RUSAGE_CHILDREN)
                        with PeakRSS(server.pid) as peak:
                            figures = run_client(
                                target.client(server.url, count, seconds),
                                timeout=seconds + 180,
                                reference=target.reference,
                            )
                        after = resource.getrusage(resource.RUSAGE_CHILDREN)
                    result = figures["results"][0]
                    if result["errors"] and not result["steps"]:
                        raise RuntimeError(f"every session failed: {result['error_examples'][:1]}")
                except Exception as error:  # recorded: a server that cannot hold C sessions is a finding
                    row["error"] = str(error).strip().splitlines()[-1][:300]
                    say(f"scale run {run + 1}/{runs}  {target.label:50} C={count:<4} FAILED: {row['error']}")
                    continue
                cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
                result["client_cpu_us_per_step"] = 1e6 * cpu / max(result["steps"], 1)
                row["runs"].append(result)
                row["idle_kib"].append(idle)
                row["peak_kib"].append(peak.peak)
                say(
                    f"scale run {run + 1}/{runs}  {target.label:50} C={count:<4} "
                    f"{result['steps_per_second']:>8,.0f}/s  p99 {result['latency_ms']['p99']:>7.1f} ms  "
                    f"{(peak.peak - idle) / count:>7.0f} KiB/session  errors {result['errors']}"
                )
    for row in rows.values():
        results = row["runs"]
        row["steps_per_second"] = statistics.median(r["steps_per_second"] for r in results) if results else None
        row["p99_ms"] = statistics.median(r["latency_ms"]["p99"] for r in results) if results else None
        row["errors"] = sum(r["errors"] for r in results)
        cpus = [r["client_cpu_us_per_step"] for r in results]
        row["client_cpu_us_per_step"] = statistics.median(cpus) if cpus else None
        per_session = [(p - i) / row["sessions"] for p, i in zip(row["peak_kib"], row["idle_kib"], strict=True)]
        row["kib_per_session"] = statistics.median(per_session) if per_session else None
    return list(rows.values())


def measure_pool(args: argparse.Namespace) -> dict[str, Any]:
    """EnvPool over ws:// and over ray:// (`tests.benchmarks.bench_pool`, in its own process and network namespace)."""
    sizes = ["16"] if args.quick else ["256", "1024"]
    with tempfile.TemporaryDirectory() as directory:
        out = Path(directory) / "pool.json"
        command = [sys.executable, "-m", "tests.benchmarks.bench_pool", "--sizes", *sizes]
        command += ["--runs", str(args.scale_runs), "--rounds", "3" if args.quick else "20", "--json", str(out)]
        say("pool: " + " ".join(command[1:]))
        completed = subprocess.run(command, cwd=ROOT, env=our_env(), capture_output=True, text=True, timeout=3600)
        if completed.returncode != 0 or not out.exists():
            lines = completed.stderr.strip().splitlines() or ["no output"]
            return {"error": f"exit {completed.returncode}: {lines[-1]}"}
        return dict(json.loads(out.read_text()))


@contextmanager
def _timer(into: dict[str, Any], key: str) -> Iterator[None]:
    start = time.monotonic()
    try:
        yield
    finally:
        into[key] = round(time.monotonic() - start, 1)


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Run the parts; return everything the page and the plot are made from."""
    python = ensure_reference_python(reference=REFERENCE, log=say)
    python_03 = ensure_reference_python(reference=SECOND_REFERENCE, log=say)
    meta: dict[str, Any] = {
        "reference": REFERENCE.label, "second_reference": SECOND_REFERENCE.label,
        "quick": args.quick, "runs": args.runs, "seconds": args.seconds, "scale_seconds": args.scale_seconds,
        "scale_runs": args.scale_runs,
        "sessions": args.sessions, "blob_bytes": BLOB_SIZE, "date": time.strftime("%Y-%m-%d %H:%M %Z"),
        "command": " ".join(["python -m tests.benchmarks.compare", *sys.argv[1:]]),
        "machine": _machine.describe(reference_versions(reference=REFERENCE)),
        "second_reference_packages": reference_versions(reference=SECOND_REFERENCE),
    }  # fmt: skip
    results: dict[str, Any] = {"meta": meta}
    durations: dict[str, Any] = {}
    if not args.fleet_only:
        _measure_classic(args, python, python_03, results, durations)
    if not args.no_fleet:
        with _timer(durations, "fleet"):
            results["fleet"] = measure_fleet(
                python, args.fleet_sessions, args.fleet_runs, args.fleet_seconds, args.fleet_big_seconds,
                only=args.fleet_rows, big_only=args.fleet_big_only,
            )  # fmt: skip
            results["fleet"]["before"] = one_session_before()
            if args.fleet_rows is None or args.fleet_rows in "floors":
                results["fleet"]["floors"] = measure_floors()
    if args.pool and not args.fleet_only:  # it starts a local Ray (in a loopback-only network namespace)
        with _timer(durations, "pool"):
            results["pool"] = measure_pool(args)
    meta["durations_s"] = durations
    meta["machine"]["load_average_after"] = _machine.describe({})["load_average"]
    return results


def _measure_classic(
    args: argparse.Namespace, python: Path, python_03: Path, results: dict[str, Any], durations: dict[str, Any]
) -> None:
    """The echo, 1 MiB and scale parts."""
    with _timer(durations, "echo"):
        servers = {
            "ref-sync": reference_server(python),
            "ref-async": reference_server(python, "--async-step"),
            "ref03-sync": reference_server(python_03),
            "ref03-async": reference_server(python_03, "--async-step"),
            "ours-sync": our_server(SYNC_ECHO, "asyncio"),
            "ours": our_server(ECHO, "asyncio"),
            "ours-trio": our_server(ECHO, "trio"),
            "ours-trio-hypercorn": our_server(ECHO, "trio", "--server", "hypercorn"),
            "ws-floor": ws_floor_server(),
            "http-floor": http_floor_server("asyncio"),
            "protocol-floor": protocol_floor_server(),
        }
        pairs = echo_pairs(python, args.seconds, python_03)
        results["echo"] = measure_pairs(pairs, servers, args.runs, args.seconds, "echo")
    with _timer(durations, "blob"):
        servers = {
            "ref-blob": reference_server(python, "--blob-bytes", str(BLOB_SIZE)),
            "ours-blob": our_server(BLOB, "asyncio"),
        }
        results["blob"] = measure_pairs(blob_pairs(python, args.seconds), servers, args.runs, args.seconds, "1 MiB")
    with _timer(durations, "scale"):
        targets = scale_targets(python, max(args.sessions)) + sync_scale_targets(python, max(args.sessions))
        results["scale"] = measure_scale(targets, args.sessions, args.scale_runs, args.scale_seconds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run: 0.5 s, 1 run, 1, 16 and 1024 sessions")
    parser.add_argument("--runs", type=int, help="runs per figure, the median kept (default 5; quick 1)")
    parser.add_argument("--seconds", type=float, help="seconds per echo and 1 MiB run (default 3; quick 0.5)")
    parser.add_argument("--scale-runs", type=int, help="runs per scale figure (default 3; quick 1)")
    parser.add_argument("--scale-seconds", type=float, help="seconds per scale run (default 5; quick 1)")
    parser.add_argument(
        "--sessions", help="session counts for the scale part (default 1,16,64,256,1024; quick 1,16,1024)"
    )
    parser.add_argument("--pool", action="store_true", help="also the EnvPool part: ws:// vs ray:// (starts a Ray)")
    parser.add_argument("--fleet-only", action="store_true", help="only the fleet rows (and their goals)")
    parser.add_argument("--no-fleet", action="store_true", help="without the fleet rows")
    parser.add_argument(
        "--fleet-sessions",
        help="session counts of the fleet rows (default 64,256,1024,4096; quick 256, and 1024 for the goals' rows)",
    )
    parser.add_argument("--fleet-runs", type=int, help="runs of each fleet row up to 256 sessions (default 3; quick 1)")
    parser.add_argument("--fleet-seconds", type=float, help="seconds per fleet run up to 256 sessions (default 1.5)")
    parser.add_argument("--fleet-big-seconds", type=float, help="seconds per fleet run above 256 sessions (default 3)")
    parser.add_argument("--fleet-rows", help="only the fleet rows whose key holds this (ws-pool, reference, ...)")
    parser.add_argument("--out", type=Path, default=DOCS, help="where benchmarks.md/.json and img/ go (docs/)")
    parser.add_argument("--from-json", type=Path, help="skip measuring: rewrite the page and plot from this JSON")
    args = parser.parse_args()
    if importlib.util.find_spec("matplotlib") is None:
        # Said before the run, not after it: the plots are drawn last, once every figure is measured.
        parser.exit(2, "the plots need matplotlib: pip install -e '.[bench]' (the bench extra), then run again\n")
    if args.from_json:
        results = json.loads(args.from_json.read_text())
    else:
        args.runs = args.runs or (1 if args.quick else 5)
        args.seconds = args.seconds or (0.5 if args.quick else 3.0)
        args.scale_seconds = args.scale_seconds or (1.0 if args.quick else 5.0)
        args.scale_runs = args.scale_runs or (1 if args.quick else 3)
        default_sessions = "1,16,1024" if args.quick else "1,16,64,256,1024"
        args.sessions = [int(c) for c in (args.sessions or default_sessions).split(",")]
        # Quick, without counts given: every row at 256 sessions, the goals' rows at 1,024 too.
        args.fleet_big_only = GOAL_ROWS if args.quick and not args.fleet_sessions else None
        fleet_sessions = args.fleet_sessions or ",".join(map(str, QUICK_COUNTS if args.quick else COUNTS))
        args.fleet_sessions = [int(c) for c in fleet_sessions.split(",")]
        args.fleet_runs = args.fleet_runs or (1 if args.quick else 3)
        args.fleet_seconds = args.fleet_seconds or (0.5 if args.quick else 1.5)
        args.fleet_big_seconds = args.fleet_big_seconds or (0.5 if args.quick else 3.0)
        start = time.monotonic()
        results = measure(args)
        results["meta"]["total_s"] = round(time.monotonic() - start, 1)
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "benchmarks.json").write_text(json.dumps(results, indent=1) + "\n")
    (args.out / "img").mkdir(parents=True, exist_ok=True)
    written = [args.out / "benchmarks.md", args.out / "benchmarks.json"]
    if "echo" in results:  # not after --fleet-only
        _plot.plot(results, args.out / "img" / "benchmarks.png")
        written.append(args.out / "img" / "benchmarks.png")
    if "fleet" in results:
        _fleet_plot.plot(results, args.out / "img" / "fleet.png")
        written.append(args.out / "img" / "fleet.png")
    dropin = args.out / "benchmarks-dropin.json"  # bench_dropin's section, measured apart
    if dropin.exists():
        results["dropin"] = json.loads(dropin.read_text())
    blocking = args.out / "benchmarks-sync.json"  # bench_sync's section, measured apart
    if blocking.exists():
        results["sync"] = json.loads(blocking.read_text())
    (args.out / "benchmarks.md").write_text(_report.render(results, "img/benchmarks.png"))
    say(f"wrote {', '.join(map(str, written))}")


if __name__ == "__main__":
    main()
