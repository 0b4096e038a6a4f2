"""EnvPool at scale: over ws:// to one `openenv serve`, over ray:// on a local Ray, and a Ray-call step path.

Not a test: run it by hand. It runs in a loopback-only network namespace (`tests.loopback`;
it enters one itself), where it starts a local Ray with ``--ray-cpus`` CPUs and one
``openenv serve``.

    python -m tests.benchmarks.bench_pool [--sizes 256 1024] [--rounds 20] [--runs 3] [--json FILE]

For each pool size, interleaved run by run so that drift hits all alike:

- ``ws``: an `EnvPool` over ``ws://`` to one ``openenv serve`` process (uvicorn);
  its steps per second, and the server's and the client's steps per CPU
  second (per core: robust to a loaded machine; the client's is its event
  loop thread's, as Ray's driver threads share this process); and,
  on a new server, its resident memory per open session;
- ``ray``: the same pool over ``ray://`` (actors of ``--sessions-per-actor``
  sessions, ``num_cpus=0`` so that the actors never wait for a CPU); its steps
  per second, the actors' steps per CPU second, and the time to open the pool
  on new actors (cold) and on the actors the previous pool left (warm);
- ``ray-call``: the alternative step path, one Ray actor method call per step
  (``await ref`` on asyncio) to actors holding the same environments in-process,
  with no WebSocket: the figure the default (WebSocket to the actor) is chosen against.

Every figure is the median of ``--runs``; the pool's driver runs on asyncio, the
environment is the async echo (``tests.envs:AsyncMessageEchoEnv``). Compare
ratios within one run.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anyio

from openenv import EnvClient, EnvPool, State
from tests import loopback
from tests.benchmarks._memory import rss_kib
from tests.benchmarks._servers import cpu_seconds, our_server
from tests.envs import AsyncMessageEchoEnv, MessageAction, MessageObservation

FACTORY = "tests.envs:AsyncMessageEchoEnv"
# The ray-call actors run at the priority of the ray:// actors (nice 0), as openenv serve does.
NORMAL_PRIORITY = {"env_vars": {"RAY_worker_niceness": "0"}}
ROOT = Path(__file__).resolve().parents[2]


class EchoClient(EnvClient[MessageAction, MessageObservation, State]):
    pass


async def step_rate(pool: EnvPool[Any, Any, Any], rounds: int) -> float:
    actions = [MessageAction(message=f"m{index}") for index in range(pool.size)]
    await pool.reset()
    for _ in range(3):  # warm-up
        await pool.step(actions)
    started = time.perf_counter()
    for _ in range(rounds):
        await pool.step(actions)
    return pool.size * rounds / (time.perf_counter() - started)


async def measure_ws(url: str, pid: int, size: int, rounds: int) -> dict[str, float]:
    async with EnvPool(url, size=size, client=EchoClient, max_connecting=128) as pool:
        await pool.reset()
        # The client's CPU is its event loop thread's: this process also runs Ray's driver threads.
        cpu_before, client_before = cpu_seconds(pid), time.thread_time()
        rate = await step_rate(pool, rounds)
        steps = size * (rounds + 3)
        cpu, client_cpu = cpu_seconds(pid) - cpu_before, time.thread_time() - client_before
    return {
        "steps_per_s": rate,
        "server_steps_per_core_s": steps / cpu if cpu else float("nan"),
        "client_steps_per_core_s": steps / client_cpu if client_cpu else float("nan"),
    }


async def session_memory(size: int) -> dict[str, float]:
    """A new server's resident memory per open session: its growth from idle to ``size`` sessions after a reset."""
    with our_server(FACTORY, "asyncio", "--max-sessions", str(size)) as server:
        url = server.url.replace("http://", "ws://")
        async with EnvPool(url, size=1, client=EchoClient) as pool:  # the first session's one-off imports
            await pool.reset()
        idle_kib = rss_kib(server.pid)
        async with EnvPool(url, size=size, client=EchoClient, max_connecting=128) as pool:
            await pool.reset()
            open_kib = rss_kib(server.pid)
    return {"server_kib_per_session": (open_kib - idle_kib) / size, "server_idle_mib": idle_kib / 1024}


async def measure_ray(size: int, rounds: int, sessions_per_actor: int) -> dict[str, float]:
    url = f"ray://{FACTORY}?num_cpus=0&sessions_per_actor={sessions_per_actor}"
    import ray

    started = time.perf_counter()
    async with EnvPool(url, size=size, client=EchoClient, max_connecting=128) as pool:
        cold = time.perf_counter() - started
        handles = {client.transport.actor.handle for client in pool.clients}  # type: ignore[union-attr]
        pids = [ray.get(handle.__ray_call__.remote(lambda host: os.getpid())) for handle in handles]
        cpu_before = sum(cpu_seconds(pid) for pid in pids)
        rate = await step_rate(pool, rounds)
        cpu = sum(cpu_seconds(pid) for pid in pids) - cpu_before
    started = time.perf_counter()
    async with EnvPool(url, size=size, client=EchoClient, max_connecting=128) as pool:
        warm = time.perf_counter() - started
    fleet = pool.clients[0].transport.fleet  # type: ignore[union-attr]
    for actor in list(fleet.actors):  # stopped now, so that the next run measures a cold start again
        ray.kill(actor.handle, no_restart=True)
    fleet.actors.clear()
    steps = size * (rounds + 3)
    return {
        "steps_per_s": rate,
        "actor_steps_per_core_s": steps / cpu if cpu else float("nan"),
        "open_cold_s": cold,
        "open_warm_s": warm,
    }


class CallHost:
    """The Ray-call alternative: an actor holding environments in-process, stepped by method calls."""

    def __init__(self) -> None:
        self.envs: dict[int, AsyncMessageEchoEnv] = {}

    async def reset(self, index: int) -> bytes:
        env = self.envs[index] = AsyncMessageEchoEnv()
        observation = await env.reset()
        return observation.echoed_message.encode()

    async def step(self, index: int, message: str) -> bytes:
        observation = await self.envs[index].step(MessageAction(message=message))
        return observation.echoed_message.encode()


async def measure_ray_call(size: int, rounds: int, sessions_per_actor: int) -> dict[str, float]:
    import asyncio

    import ray

    actors = [
        ray.remote(CallHost)
        .options(num_cpus=0, max_concurrency=sessions_per_actor, runtime_env=NORMAL_PRIORITY)
        .remote()
        for _ in range(-(-size // sessions_per_actor))
    ]
    host = [actors[index // sessions_per_actor] for index in range(size)]
    await asyncio.gather(*(host[index].reset.remote(index) for index in range(size)))

    async def one_round() -> None:
        await asyncio.gather(*(host[index].step.remote(index, f"m{index}") for index in range(size)))

    for _ in range(3):
        await one_round()
    started = time.perf_counter()
    for _ in range(rounds):
        await one_round()
    rate = size * rounds / (time.perf_counter() - started)
    for actor in actors:
        ray.kill(actor, no_restart=True)
    return {"steps_per_s": rate}


def median_of(runs: list[dict[str, float]]) -> dict[str, float]:
    return {name: statistics.median(run[name] for run in runs) for name in runs[0]}


def timed_rounds(rounds: int, size: int) -> int:
    """Pool steps to time for ``size`` sessions: as many sessions' steps as ``rounds`` of 1,024, at least ``rounds``.

    Linux counts a process's CPU time in 10 ms ticks: 20 steps of 256 sessions
    take a few ticks, too few for a figure per CPU-second good to a few per cent.
    """
    return max(rounds, math.ceil(rounds * 1024 / size))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[256, 1024])
    parser.add_argument(
        "--rounds", type=int, default=20, help="timed pool steps per run of 1,024 sessions (smaller pools: more)"
    )
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--sessions-per-actor", type=int, default=256)
    parser.add_argument("--ray-cpus", type=int, default=2)
    parser.add_argument("--json", type=Path, help="also write the medians here")
    args = parser.parse_args()
    if not loopback.inside():
        # Ray's processes leave loopback unless there is nothing else: run again in a namespace with only lo.
        sys.exit(subprocess.call(loopback.command(sys.executable, "-m", "tests.benchmarks.bench_pool", *sys.argv[1:])))

    from transports.ray import init_ray

    init_ray(
        address="local",  # a new cluster of its own
        num_cpus=args.ray_cpus,
        include_dashboard=False,
        logging_level="warning",
        log_to_driver=False,
        _node_ip_address="127.0.0.1",
        runtime_env={"env_vars": {"PYTHONPATH": str(ROOT)}},
    )
    report: dict[str, Any] = {
        "sessions_per_actor": args.sessions_per_actor,
        "worker_niceness": 0,  # the ray:// actors' (the transport's default), and the ray-call actors' here
        "load_average": os.getloadavg(),
        "sizes": {},
    }
    with our_server(FACTORY, "asyncio", "--max-sessions", str(max(args.sizes))) as server:
        url = server.url.replace("http://", "ws://")
        for size in args.sizes:
            runs: dict[str, list[dict[str, float]]] = {"ws": [], "ray": [], "ray-call": []}
            rounds = timed_rounds(args.rounds, size)
            for _ in range(args.runs):
                runs["ws"].append(anyio.run(measure_ws, url, server.pid, size, rounds))
                runs["ray"].append(anyio.run(measure_ray, size, rounds, args.sessions_per_actor))
                runs["ray-call"].append(anyio.run(measure_ray_call, size, args.rounds, args.sessions_per_actor))
            medians = {kind: median_of(kind_runs) for kind, kind_runs in runs.items()}
            medians["memory"] = anyio.run(session_memory, size)
            medians["ratio_ray_to_ws"] = {"steps_per_s": medians["ray"]["steps_per_s"] / medians["ws"]["steps_per_s"]}
            report["sizes"][str(size)] = medians
            print(f"{size} sessions:")
            for kind, figures in medians.items():
                print(f"  {kind:16}" + "  ".join(f"{name}={value:,.3f}" for name, value in figures.items()))
    print(f"load average {os.getloadavg()}")
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
