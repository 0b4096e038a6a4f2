"""WebSocket round trips per second: openenv against the reference and the raw floor, in one run.

Not a test: run it by hand (it builds the reference's throwaway venv on first use).

    python -m tests.benchmarks.bench_websocket [--seconds 3] [--runs 3] [--json FILE]

Every server and every client is a process of its own, on loopback. Each pair
runs the same echo logic (action ``{message}``, observation ``{echoed_message}``)
with small frames; each figure is the median of ``--runs`` timed runs of
``--seconds``, the pairs interleaved run by run so that drift hits all alike.
Compare ratios within one run: absolute figures drift from run to run.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

from tests.interop.reference_venv import ReferenceServer, ensure_reference_python, reference_env

ROOT = Path(__file__).resolve().parents[2]
REFERENCE_CLIENT = ROOT / "tests" / "interop" / "reference_bench_client.py"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _wait_for_port(port: int, process: subprocess.Popen[bytes], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"server exited with {process.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"no server on port {port} after {timeout} s")


def _our_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT)
    return env


@contextmanager
def _process(command: Sequence[str], port: int | None) -> Iterator[int]:
    """Run a server process; yield its port (read from ``READY <port>`` when ``port`` is None)."""
    process = subprocess.Popen(
        command, cwd=ROOT, env=_our_env(), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL
    )
    try:
        if port is None:
            assert process.stdout is not None
            line = process.stdout.readline().decode()
            if not line.startswith("READY "):
                raise RuntimeError(f"server did not start: {line!r}")
            port = int(line.split()[1])
        else:
            _wait_for_port(port, process)
        yield port
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)
        if process.stdout is not None:
            process.stdout.close()


@contextmanager
def our_server(factory: str, backend: str) -> Iterator[str]:
    port = _free_port()
    command = [sys.executable, "-m", "transports.cli", "serve", factory, "--port", str(port), "--backend", backend]
    with _process(command, port):
        yield f"http://127.0.0.1:{port}"


@contextmanager
def floor_server() -> Iterator[str]:
    with _process([sys.executable, "-m", "tests.benchmarks.ws_floor", "server"], None) as port:
        yield f"ws://127.0.0.1:{port}"


@contextmanager
def reference_server(python: Path, *, async_step: bool) -> Iterator[str]:
    extra = ["--async-step"] if async_step else []
    with ReferenceServer(python, max_sessions=4, extra_args=extra) as server:
        yield server.base_url


def _client_rate(command: Sequence[str], env: dict[str, str], cwd: Path, timeout: float) -> float:
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"client failed: {' '.join(command)}\n{done.stderr[-3000:]}")
    return float(json.loads(done.stdout.strip().splitlines()[-1])["rate"])


@dataclass
class Pair:
    label: str
    server: str  # a key of the servers dict
    client: list[str]  # the client command, the server URL appended
    reference: bool = False


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--json", type=Path, help="also write the medians here")
    args = parser.parse_args()

    python = ensure_reference_python()
    ours = [sys.executable, "-m", "tests.benchmarks.our_client", "--seconds", str(args.seconds)]
    pairs = [
        Pair("reference client -> reference server (sync env)", "ref-sync", [], reference=True),
        Pair("reference client -> reference server (step_async env)", "ref-async", [], reference=True),
        Pair(
            "openenv [asyncio] -> openenv server [asyncio] (sync env)",
            "ours-asyncio-sync",
            [*ours, "--backend", "asyncio"],
        ),
        Pair(
            "openenv [asyncio] -> openenv server [asyncio] (async env)",
            "ours-asyncio-async",
            [*ours, "--backend", "asyncio"],
        ),
        Pair("openenv [trio] -> openenv server [trio] (sync env)", "ours-trio-sync", [*ours, "--backend", "trio"]),
        Pair("openenv [trio] -> openenv server [trio] (async env)", "ours-trio-async", [*ours, "--backend", "trio"]),
        Pair(
            "openenv [trio] -> openenv server [asyncio] (async env)",
            "ours-asyncio-async",
            [*ours, "--backend", "trio"],
        ),
        Pair("openenv [asyncio] -> reference server (sync env)", "ref-sync", [*ours, "--backend", "asyncio"]),
        Pair(
            "raw websockets client -> websockets echo server",
            "floor",
            [sys.executable, "-m", "tests.benchmarks.ws_floor", "client", "--seconds", str(args.seconds)],
        ),
    ]
    rates: dict[str, list[float]] = {pair.label: [] for pair in pairs}
    with ExitStack() as stack:
        servers = {
            "ref-sync": stack.enter_context(reference_server(python, async_step=False)),
            "ref-async": stack.enter_context(reference_server(python, async_step=True)),
            "ours-asyncio-sync": stack.enter_context(our_server("tests.envs:MessageEchoEnv", "asyncio")),
            "ours-asyncio-async": stack.enter_context(our_server("tests.envs:AsyncMessageEchoEnv", "asyncio")),
            "ours-trio-sync": stack.enter_context(our_server("tests.envs:MessageEchoEnv", "trio")),
            "ours-trio-async": stack.enter_context(our_server("tests.envs:AsyncMessageEchoEnv", "trio")),
            "floor": stack.enter_context(floor_server()),
        }
        timeout = args.seconds + 60
        for run in range(args.runs):
            for pair in pairs:
                url = servers[pair.server]
                if pair.reference:
                    command = [str(python), str(REFERENCE_CLIENT), url, "--seconds", str(args.seconds)]
                    rate = _client_rate(command, reference_env(), REFERENCE_CLIENT.parent, timeout)
                else:
                    rate = _client_rate([*pair.client, url], _our_env(), ROOT, timeout)
                rates[pair.label].append(rate)
                print(f"run {run + 1}/{args.runs}  {pair.label:60} {rate:>9,.0f}/s", file=sys.stderr, flush=True)

    medians = {label: statistics.median(values) for label, values in rates.items()}
    baseline = medians[pairs[0].label]
    floor = medians[pairs[-1].label]
    print(f"\nmedians of {args.runs} runs of {args.seconds:g} s; {os.cpu_count()} cores\n")
    print(f"{'pair':62} {'steps/s':>9} {'x ref(sync)':>11} {'x floor':>8}")
    for label, value in medians.items():
        print(f"{label:62} {value:>9,.0f} {value / baseline:>11.2f} {value / floor:>8.2f}")
    if args.json:
        args.json.write_text(
            json.dumps({"runs": args.runs, "seconds": args.seconds, "rates": rates, "medians": medians}, indent=2)
        )


if __name__ == "__main__":
    main()
