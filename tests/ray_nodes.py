"""A three-node Ray cluster on this machine, for `tests.transports.ray.test_ray`: run as ``python -m tests.ray_nodes``.

Sessions are spread over the nodes; one node is then removed, as a crash would,
and the sessions it hosted must fail while the others step on. The outcome of
each backend is printed as one JSON line.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import anyio
import ray
from ray.cluster_utils import Cluster

import openenv
from openenv import EnvPool
from tests.envs import CountAction
from tests.helpers import CounterClient
from transports.ray import init_ray

ROOT = Path(__file__).resolve().parents[1]
SESSIONS = 6
URL = (
    "ray://tests.envs:AsyncCounterEnv"
    "?num_cpus=1&sessions_per_actor=2&idle_timeout=0&scheduling_strategy=SPREAD&host=127.0.0.1"
)
LIMIT = 120


async def lose_a_node(cluster: Cluster) -> dict[str, Any]:
    with anyio.fail_after(LIMIT):
        async with EnvPool(URL, size=SESSIONS, client=CounterClient) as pool:
            await pool.reset()
            node_of = [client.transport.actor.node_id for client in pool.clients]  # type: ignore[union-attr]
            # A worker node (not the head, which runs the cluster itself) that hosts sessions.
            lost = next(node for node in cluster.worker_nodes if node.node_id in node_of)
            # A machine that dies takes its processes with it; a simulated node's workers would
            # linger until they noticed their raylet gone, so they go down with it here.
            doomed = {client.transport.actor.handle for client in pool.clients}  # type: ignore[union-attr]
            pids = [
                ray.get(handle.__ray_call__.remote(lambda host: os.getpid()))
                for handle in doomed
                if ray.get(handle.__ray_call__.remote(lambda host: ray.get_runtime_context().get_node_id()))
                == lost.node_id
            ]
            cluster.remove_node(lost, allow_graceful=False)
            for pid in pids:
                os.kill(pid, signal.SIGKILL)
            try:
                results = await pool.step([CountAction(by=1)] * SESSIONS)
                failed: dict[int, Exception] = {}
            except openenv.EnvPoolError as exc:
                failed = dict(exc.errors)
                results = []
            closed = [index for index, error in failed.items() if isinstance(error, openenv.ConnectionClosed)]
            on_lost = [index for index, node in enumerate(node_of) if node == lost.node_id]
            stepped = SESSIONS - len(failed)
    return {
        "nodes": len(set(node_of)),
        "on_lost_node": len(on_lost),
        "lost_failed": len(closed) if sorted(closed) == on_lost else -1,
        "others_stepped": stepped,
        "results": len(results),
    }


def main() -> None:
    # Every simulated node, Ray's own services and the environments' servers (host=127.0.0.1
    # in URL) stay on loopback: each node is this machine.
    node = {"num_cpus": 1, "node_ip_address": "127.0.0.1"}
    cluster = Cluster(initialize_head=True, head_node_args={**node, "include_dashboard": False})
    try:
        for _ in range(2):
            cluster.add_node(**node)
        cluster.wait_for_nodes()
        init_ray(
            address=cluster.address,
            _node_ip_address="127.0.0.1",
            logging_level="warning",
            log_to_driver=False,
            runtime_env={"env_vars": {"PYTHONPATH": str(ROOT)}},
        )
        report = {}
        for backend in ("asyncio", "trio"):
            report[backend] = anyio.run(lose_a_node, cluster, backend=backend)
            cluster.add_node(**node)  # back to three nodes
            cluster.wait_for_nodes()
        print(json.dumps(report))
    finally:
        import ray

        ray.shutdown()
        cluster.shutdown()


if __name__ == "__main__":
    main()
