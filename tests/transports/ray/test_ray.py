"""The Ray transport on a real local Ray: slots, actors started and retired, failures, no leaks."""

from __future__ import annotations

import ipaddress
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import pytest

import openenv
from openenv import EnvClient, EnvPool
from tests.dropin.sessions import walk_the_grid
from tests.envs import AsyncCounterEnv, CountAction
from tests.helpers import CounterClient, wait_until
from tests.serving import ROOT, factory_path, start_local_ray
from transports.link._batch import LinkBatcher
from transports.ray import ACTOR_NAME_PREFIX, RayTransport
from transports.ray._transport import parse_ray_url

# Run in the loopback-only namespace only, by tests.transports.ray.test_ray_loopback (see tests.loopback).
pytestmark = pytest.mark.ray

LIMIT = 120  # seconds: actors start in a few seconds on a loaded machine; this bounds every wait


def ray_url(**options: Any) -> str:
    """A URL for the counter, with options that make its fleet this test's own (num_cpus=0: never waits for a CPU)."""
    query = "&".join(f"{name}={value}" for name, value in {"num_cpus": 0, **options}.items())
    return f"ray://{factory_path(AsyncCounterEnv)}?{query}"


async def live_actor_names() -> set[str]:
    import ray

    named = await anyio.to_thread.run_sync(lambda: ray.util.list_named_actors(all_namespaces=True))
    return {entry["name"] for entry in named if entry["name"].startswith(ACTOR_NAME_PREFIX)}


async def active_sessions(actors: list[Any]) -> list[int]:
    import ray

    return await anyio.to_thread.run_sync(lambda: ray.get([actor.handle.active_sessions.remote() for actor in actors]))


async def wait_until_gone(names: set[str]) -> None:
    # Ray offers no event for an actor's death; its name is released once the GCS has seen it die.
    async def gone() -> bool:
        return not names & await live_actor_names()

    await wait_until(gone, "the actors' names released", every=0.05)


async def kill_actor_process(handle: Any) -> None:
    """Kill an actor's process outright, as a crash would, and wait until it is gone."""
    import ray

    pid = await anyio.to_thread.run_sync(lambda: ray.get(handle.__ray_call__.remote(lambda host: os.getpid())))
    os.kill(pid, signal.SIGKILL)
    await wait_until(lambda: process_is_gone(pid), "the actor's process gone")  # another process: no event


def process_is_gone(pid: int) -> bool:
    """Whether process ``pid`` has exited (its sockets are closed), reaped or not."""
    try:
        return "State:\tZ" in Path(f"/proc/{pid}/status").read_text()
    except (FileNotFoundError, ProcessLookupError):  # reaped before or while the file is read
        return True


@pytest.fixture(autouse=True)
def _local_ray() -> None:
    start_local_ray()


def network_interfaces() -> list[str]:
    """The names of this network namespace's interfaces (``/proc/net/dev``)."""
    return [line.split(":")[0].strip() for line in Path("/proc/net/dev").read_text().splitlines()[2:]]


def tcp_local_addresses() -> set[ipaddress.IPv4Address | ipaddress.IPv6Address]:
    """The local addresses of this network namespace's TCP sockets (``/proc/net/tcp`` and ``tcp6``)."""
    addresses = set()
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/net/{table}").read_text().splitlines()[1:]:
            raw = bytes.fromhex(line.split()[1].partition(":")[0])
            # The kernel writes the address as 32-bit words in this machine's (little-endian) order.
            ordered = b"".join(raw[start : start + 4][::-1] for start in range(0, len(raw), 4))
            addresses.add(ipaddress.ip_address(ordered))
    return addresses


@pytest.mark.anyio
async def test_ray_keeps_to_loopback() -> None:
    import ray

    with anyio.fail_after(LIMIT):
        async with CounterClient(ray_url(idle_timeout=0)) as env:
            await env.reset()
            assert env.transport.actor.url.startswith("ws://127.0.0.1:")  # type: ignore[union-attr]
            addresses = tcp_local_addresses()
    assert network_interfaces() == ["lo"]
    assert {node["NodeManagerAddress"] for node in ray.nodes()} == {"127.0.0.1"}
    # Ray's services, its workers, the actor's server and the client: loopback (or a wildcard listener).
    assert addresses, "no TCP socket found"
    for address in addresses:
        mapped = getattr(address, "ipv4_mapped", None)  # an IPv4 address on an IPv6 socket
        assert (mapped or address).is_loopback or address.is_unspecified, addresses


def test_url_and_options_are_checked_before_anything_starts() -> None:
    assert parse_ray_url("ray://pkg.mod:Env?num_cpus=0.5&sessions_per_actor=8&address=auto") == (
        "pkg.mod:Env",
        {"num_cpus": 0.5, "sessions_per_actor": 8, "address": "auto"},
    )
    for url, message in [
        ("ray://pkg.mod", "not a ray://package.module:Factory URL"),
        ("ray://pkg.mod:Env/x", "not a ray://package.module:Factory URL"),
        ("ray://pkg.mod:Env?cpus=1", "unknown option 'cpus'"),
        ("ray://pkg.mod:Env?num_cpus=many", "num_cpus='many' .* is not a valid float"),
    ]:
        with pytest.raises(ValueError, match=message):
            RayTransport(url)
    with pytest.raises(ValueError, match="num_cpus is given both in the URL and as an option"):
        RayTransport("ray://pkg.mod:Env?num_cpus=1", num_cpus=2)
    with pytest.raises(ValueError, match="sessions_per_actor must be at least 1"):
        RayTransport("ray://pkg.mod:Env", sessions_per_actor=0)
    with pytest.raises(TypeError):
        RayTransport("ray://pkg.mod:Env", no_such_option=1)
    transport = openenv.create_transport("ray://pkg.mod:Env?idle_timeout=0", num_gpus=0)
    assert isinstance(transport, RayTransport)
    assert transport.factory == "pkg.mod:Env"


def test_actors_run_at_normal_priority_unless_told_otherwise() -> None:
    def actor_env(**options: Any) -> Any:
        return RayTransport("ray://pkg.mod:Env", **options)._fleet_options["actor_options"]["runtime_env"]

    assert actor_env() == {"env_vars": {"RAY_worker_niceness": "0"}}
    assert actor_env(runtime_env={"pip": ["x"], "env_vars": {"A": "1"}}) == {
        "pip": ["x"],
        "env_vars": {"RAY_worker_niceness": "0", "A": "1"},
    }
    assert actor_env(runtime_env={"env_vars": {"RAY_worker_niceness": "15"}}) == {
        "env_vars": {"RAY_worker_niceness": "15"}
    }


@pytest.mark.anyio
async def test_an_actor_runs_at_the_priority_of_the_process_that_started_ray() -> None:
    import ray

    with anyio.fail_after(LIMIT):
        async with CounterClient(ray_url(idle_timeout=0)) as env:
            handle = env.transport.actor.handle  # type: ignore[union-attr]
            niceness = await anyio.to_thread.run_sync(
                lambda: ray.get(handle.__ray_call__.remote(lambda host: os.nice(0)))
            )
    # Ray's own default would put it 15 lower (nice 15 more), behind every ordinary process.
    assert niceness == os.nice(0)


@pytest.mark.anyio
async def test_sessions_fill_actors_and_free_their_slots_on_close() -> None:
    url = ray_url(sessions_per_actor=2, idle_timeout=300)
    with anyio.fail_after(LIMIT):
        async with EnvPool(url, size=5, client=CounterClient) as pool:
            await pool.reset()
            actors = [client.transport.actor for client in pool.clients]  # type: ignore[union-attr]
            assert all(actor is not None for actor in actors)
            assert sorted(actor.leases for actor in set(actors)) == [1, 2, 2]  # type: ignore[union-attr]
            fleet = pool.clients[0].transport.fleet  # type: ignore[union-attr]
        assert [actor.leases for actor in fleet.actors] == [0, 0, 0]
        # Idle actors are kept for idle_timeout, and reused by the next sessions.
        async with EnvPool(url, size=4, client=CounterClient) as pool:
            await pool.reset()
            assert {client.transport.actor for client in pool.clients} <= set(fleet.actors)  # type: ignore[union-attr]
        assert len(fleet.actors) == 3


@pytest.mark.anyio
async def test_an_idle_actor_is_retired_after_its_idle_timeout() -> None:
    with anyio.fail_after(LIMIT):
        async with CounterClient(ray_url(idle_timeout=0.2)) as env:
            await env.reset()
            actor = env.transport.actor  # type: ignore[union-attr]
            fleet = env.transport.fleet  # type: ignore[union-attr]
            assert actor is not None
            assert fleet is not None
        await wait_until_gone({actor.name})
        assert actor not in fleet.actors


@pytest.mark.anyio
async def test_a_thousand_sessions_opened_and_closed_leave_no_actor_behind() -> None:
    url = ray_url(sessions_per_actor=250, idle_timeout=0)
    with anyio.fail_after(LIMIT):
        async with EnvPool(url, size=1000, client=CounterClient) as pool:
            results = await pool.reset(start=list(range(1000)))
            assert [result.observation.count for result in results] == list(range(1000))
            names = {client.transport.actor.name for client in pool.clients}  # type: ignore[union-attr]
            fleet = pool.clients[0].transport.fleet  # type: ignore[union-attr]
            assert len(names) == 4
            # Each actor's server holds the sessions its lease count says.
            assert [actor.leases for actor in fleet.actors] == [250] * 4
            assert await active_sessions(fleet.actors) == [250] * 4
        assert fleet.actors == []
        await wait_until_gone(names)


@pytest.mark.anyio
async def test_a_pool_steps_the_sessions_of_each_actor_as_one_entry(monkeypatch: pytest.MonkeyPatch) -> None:
    posted: list[int] = []
    post = LinkBatcher.post

    def counted(self: LinkBatcher, transports: Any, actions: bytes, request_ids: Any) -> bool:
        posted.append(len(transports))
        return post(self, transports, actions, request_ids)

    monkeypatch.setattr(LinkBatcher, "post", counted)
    url = ray_url(sessions_per_actor=4, idle_timeout=0)
    with anyio.fail_after(LIMIT):
        async with EnvPool(url, size=8, client=CounterClient) as pool:
            await pool.reset()
            actors = [client.transport.actor for client in pool.clients]  # type: ignore[union-attr]
            batchers = [client.transport.step_batcher() for client in pool.clients]  # type: ignore[union-attr]
            # One batcher per actor's connection: the sessions of each actor go together.
            assert None not in batchers
            assert len(set(actors)) == len(set(batchers)) == len(set(zip(actors, batchers, strict=True))) == 2
            results = await pool.step([CountAction(by=index) for index in range(8)])
            assert [result.observation.count for result in results] == list(range(8))
            assert sorted(posted) == [4, 4]


@pytest.mark.anyio
async def test_an_actor_that_dies_closes_its_own_sessions_only() -> None:
    url = ray_url(sessions_per_actor=2, idle_timeout=0)
    with anyio.fail_after(LIMIT):
        async with EnvPool(url, size=4, client=CounterClient, on_error="replace") as pool:
            await pool.reset()
            victim = pool.clients[0].transport.actor  # type: ignore[union-attr]
            assert victim is not None
            on_victim = [client.transport.actor is victim for client in pool.clients]  # type: ignore[union-attr]
            assert on_victim.count(True) == 2
            await kill_actor_process(victim.handle)
            results = await pool.step([CountAction(by=1)] * 4)
            for result, hosted_there in zip(results, on_victim, strict=True):
                if hosted_there:
                    assert isinstance(result, openenv.ReplacedStepResult)
                    assert isinstance(result.error, openenv.ConnectionClosed)
                else:
                    assert not isinstance(result, openenv.ReplacedStepResult)
                    assert result.observation.count == 1
            assert victim not in {client.transport.actor for client in pool.clients}  # type: ignore[union-attr]


@pytest.mark.anyio
async def test_a_transport_connects_once() -> None:
    transport = RayTransport(ray_url(idle_timeout=0))
    with anyio.fail_after(LIMIT):
        async with transport:
            pass
    with pytest.raises(openenv.ClientStateError, match="this RayTransport was connected before: a transport connects"):
        await transport.__aenter__()


@pytest.mark.anyio
async def test_a_factory_that_cannot_be_imported_fails_to_connect() -> None:
    with anyio.fail_after(LIMIT):
        with pytest.raises(openenv.ConnectError, match="did not start"):
            async with EnvClient("ray://tests.no_such_module:Env?num_cpus=0&idle_timeout=0"):
                pass


def test_sessions_land_on_several_nodes_and_a_lost_node_fails_only_its_own() -> None:
    # A cluster of three nodes cannot share this process with the session's Ray: it runs in a child.
    completed = subprocess.run(
        [sys.executable, "-m", "tests.ray_nodes"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr[-4000:]
    report = json.loads(completed.stdout.strip().splitlines()[-1])
    for backend in ("asyncio", "trio"):
        outcome = report[backend]
        assert outcome["nodes"] == 3, outcome
        assert outcome["lost_failed"] == outcome["on_lost_node"] > 0, outcome
        assert outcome["others_stepped"] == 6 - outcome["on_lost_node"], outcome


@pytest.mark.anyio
async def test_an_unchanged_upstream_package_is_hosted_by_its_app() -> None:
    # The package's server/app.py (openenv.core's create_app) names the environment, as for inproc://.
    projects = str(ROOT / "tests" / "dropin" / "projects")
    url = "ray://grid_env.server.app:app?num_cpus=0&idle_timeout=0"
    with anyio.fail_after(LIMIT):
        async with EnvClient(url, runtime_env={"env_vars": {"PYTHONPATH": projects}}) as env:
            await walk_the_grid(env)
