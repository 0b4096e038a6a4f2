"""Unchanged upstream environments: the same package served by upstream 0.10.0 and by openenv, timed.

Not a test: run it by hand. The package is the grid world of ``tests/dropin/projects``
(written against upstream's API: pydantic types, ``create_app``); every server is a
process of its own, started from the package's ``server/app.py`` as its users start it
(``reference_server.py --app`` in upstream's environment, ``openenv serve`` in ours).

    python -m tests.benchmarks.bench_dropin [--runs 3] [--seconds 3] [--json docs/benchmarks-dropin.json]

Per environment (the plain one, its calls on a thread per session, and the async one,
``step_async`` on the event loop), interleaved run by run:

- one session: upstream's ``GenericEnvClient`` against each server, steps/s;
- 256 sessions: upstream's clients, 256 at once, against each server;
- 1,024 sessions: upstream's 1,024 clients against upstream's server, and an
  `openenv.EnvPool` of 1,024 sessions sharing one connection against ours;
- what pydantic's validation and serialization cost per step, measured in this
  process, beside our server's CPU per step at one session;
- what bounds the ratios: upstream's client against the fastest server this project
  has (the native async echo, ``tests.envs:AsyncMessageEchoEnv``: no pydantic, no
  thread), at one session and at 256, and the floor of 1,024 sessions with thread
  affinity (`tests.benchmarks.fleet_floor.threads`: bare threads, no server at all).

Writes its JSON (``--json``) and, from it, the section "Unchanged upstream environments"
of ``docs/benchmarks.md`` (`tests.benchmarks._report` reads it when it renders the page).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
import timeit
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anyio

from tests.benchmarks import _report, fleet_floor
from tests.benchmarks._servers import (
    REFERENCE_CLIENT,
    Server,
    cpu_seconds,
    free_port,
    our_server,
    run_client,
    server_process,
)
from tests.dropin.conftest import PROJECTS
from tests.interop.reference_venv import OPENENV_0_10, ReferenceServer, ensure_reference_python

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
ACTION = {"direction": "up"}
ECHO_ACTION = {"message": "hello"}  # the native echo's action, for the client's ceiling
FASTEST_SERVER = "tests.envs:AsyncMessageEchoEnv"
APPS = {"plain": "app", "async": "async_app"}
MAX_SESSIONS = "1100"  # the package's MAX_CONCURRENT_ENVS: room for 1,024 sessions on both servers


def _package_env() -> dict[str, str]:
    return {"PYTHONPATH": str(PROJECTS), "MAX_CONCURRENT_ENVS": MAX_SESSIONS}


@contextmanager
def upstream_server(python: Path, app: str) -> Iterator[Server]:
    """Upstream 0.10.0 serving the package's app (uvicorn, in its own environment)."""
    arguments = ["--app", f"grid_env.server.app:{app}"]
    with ReferenceServer(python, extra_args=arguments, environment=_package_env()) as server:
        assert server.proc is not None
        yield Server(server.base_url, server.proc.pid)


@contextmanager
def our_app_server(app: str) -> Iterator[Server]:
    """``openenv serve package.server.app:app`` (uvicorn, asyncio), from this checkout."""
    port = free_port()
    command = [sys.executable, "-m", "transports.cli", "serve", f"grid_env.server.app:{app}", "--port", str(port)]
    with server_process([*command, "--log-level", "warning"], port, environment=_package_env()) as server:
        yield server


def upstream_client(
    python: Path, url: str, seconds: float, sessions: int = 0, action: dict[str, Any] = ACTION
) -> dict[str, Any]:
    """Upstream's ``GenericEnvClient`` (``reference_bench_client.py``): one session's rate, or C sessions'."""
    command = [str(python), str(REFERENCE_CLIENT), url, "--seconds", str(seconds), "--action", json.dumps(action)]
    if sessions:
        command += ["--sessions", str(sessions)]
    return run_client(command, timeout=600, reference=True)


def pool_client(url: str, seconds: float, size: int) -> dict[str, Any]:
    """An `openenv.EnvPool` of ``size`` sessions on one link, stepping for ``seconds`` (a process of its own)."""
    command = [sys.executable, "-m", "tests.benchmarks.bench_dropin", "pool", url, str(size), str(seconds)]
    return run_client(command, timeout=600)


async def _pool_rate(url: str, size: int, seconds: float) -> dict[str, Any]:
    import openenv

    async with openenv.EnvPool(url, size=size) as pool:
        await pool.reset()
        actions = [ACTION] * size
        for _ in range(3):  # warm up
            await pool.step(actions)
        rounds, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            await pool.step(actions)
            rounds += 1
        elapsed = time.perf_counter() - start
    return {"sessions": size, "steps": rounds * size, "seconds": elapsed, "steps_per_second": rounds * size / elapsed}


def validation_cost() -> dict[str, float]:
    """Microseconds per step that pydantic's validation of the action and dump of the observation take."""
    sys.path.insert(0, str(PROJECTS))
    from grid_env.models import GridAction, GridObservation

    observation = GridObservation(position=[0, 1], message="keep looking", reward=-0.1)
    repeat = 20_000
    validate = min(timeit.repeat(lambda: GridAction.model_validate(ACTION), number=repeat, repeat=5)) / repeat
    dump = min(timeit.repeat(lambda: observation.model_dump(mode="json"), number=repeat, repeat=5)) / repeat
    return {"validate_us": 1e6 * validate, "dump_us": 1e6 * dump}


class _Figures:
    """Each figure's runs, by key, printed as they come."""

    def __init__(self, which: str) -> None:
        self.which = which
        self.runs: dict[str, list[float]] = {}

    def keep(self, key: str, value: float) -> None:
        self.runs.setdefault(key, []).append(value)
        print(f"{self.which:6} {key:28} {value:12,.1f}", flush=True)

    def medians(self) -> dict[str, float]:
        return {key: statistics.median(values) for key, values in self.runs.items()}


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Every figure, per environment, interleaved run by run."""
    python = ensure_reference_python(reference=OPENENV_0_10)
    results: dict[str, Any] = {"runs": args.runs, "seconds": args.seconds, "pydantic": validation_cost(), "envs": {}}
    bounds = _Figures("bounds")
    for _ in range(args.runs):
        with our_server(FASTEST_SERVER, "asyncio") as fastest:
            one = upstream_client(python, fastest.url, args.seconds, 0, ECHO_ACTION)
            bounds.keep("one/client ceiling", one["rate"])
            many = upstream_client(python, fastest.url, args.seconds, 256, ECHO_ACTION)["results"][0]
            bounds.keep("256/client ceiling", many["steps_per_second"])
        bounds.keep("1024/thread floor", fleet_floor.threads(1024, args.seconds))
    results["bounds"] = bounds.medians()
    for which, app in APPS.items():
        figures = _Figures(which)
        for _ in range(args.runs):
            with upstream_server(python, app) as upstream, our_app_server(app) as ours:
                figures.keep("one/upstream", upstream_client(python, upstream.url, args.seconds)["rate"])
                cpu = cpu_seconds(ours.pid)
                one = upstream_client(python, ours.url, args.seconds)
                figures.keep("one/ours", one["rate"])
                # The server's CPU over the run (its warm-up included): an upper bound per step.
                figures.keep("one/ours server cpu us", 1e6 * (cpu_seconds(ours.pid) - cpu) / one["steps"])
                for sessions in (256, 1024):
                    theirs = upstream_client(python, upstream.url, args.seconds, sessions)["results"][0]
                    figures.keep(f"{sessions}/upstream", theirs["steps_per_second"])
                    figures.keep(f"{sessions}/upstream errors", theirs["errors"])
                many = upstream_client(python, ours.url, args.seconds, 256)["results"][0]
                figures.keep("256/ours", many["steps_per_second"])
                figures.keep("1024/ours pool", pool_client(ours.url, args.seconds, 1024)["steps_per_second"])
        results["envs"][which] = figures.medians()
    return results


def main() -> None:
    """Measure, write the JSON, and render the page again with the new section."""
    if sys.argv[1:2] == ["pool"]:
        url, size, seconds = sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
        print(json.dumps(anyio.run(_pool_rate, url, size, seconds)), flush=True)
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--json", type=Path, default=DOCS / "benchmarks-dropin.json")
    args = parser.parse_args()
    results = measure(args)
    args.json.write_text(json.dumps(results, indent=1) + "\n")
    print("\n".join(_report.dropin_section(results)))
    page = DOCS / "benchmarks.json"
    if page.exists():  # the page again, from the last full comparison, now with this section
        subprocess.run([sys.executable, "-m", "tests.benchmarks.compare", "--from-json", str(page)], check=True)


if __name__ == "__main__":
    main()
