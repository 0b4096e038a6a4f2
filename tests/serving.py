"""Serving a test environment over each transport, for the contract tests."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio.to_thread
import pytest

import openenv

# Each transport the contract tests run over. ray:// is marked `ray`: those tests run in the
# loopback-only network namespace of tests.loopback, and only there (see conftest).
TRANSPORTS: list[Any] = ["inproc", "ws", "http+poll", pytest.param("ray", marks=pytest.mark.ray)]

ROOT = Path(__file__).resolve().parents[1]
# Test actors reserve no CPU, so the test environments' actors never wait for one another.
RAY_TEST_OPTIONS = "num_cpus=0"


def factory_path(factory: Callable[[], Any]) -> str:
    return f"{factory.__module__}:{factory.__qualname__}"


def start_local_ray() -> None:
    """Start the test session's local Ray cluster (2 CPUs, loopback only), once; `conftest` stops it."""
    from transports.ray import init_ray

    init_ray(
        address="local",  # a new cluster of its own, never one found in RAY_ADDRESS or Ray's temp dir
        num_cpus=2,
        include_dashboard=False,
        logging_level="warning",
        log_to_driver=False,
        _node_ip_address="127.0.0.1",
        # The workers import the test environments (tests.envs) from this checkout.
        runtime_env={"env_vars": {"PYTHONPATH": str(ROOT)}},
    )


@asynccontextmanager
async def serving(kind: str, factory: Callable[[], Any], **server_options: Any) -> AsyncIterator[str]:
    """Yield a URL at which ``factory``'s environments are served over transport ``kind``."""
    if kind == "inproc":
        if server_options:
            raise NotImplementedError(f"in-process serving takes no server options: {server_options}")
        yield f"inproc://{factory_path(factory)}"
        return
    if kind == "ray":
        if server_options:
            raise NotImplementedError(f"ray:// serving takes server options as transport options: {server_options}")
        await anyio.to_thread.run_sync(start_local_ray)
        yield f"ray://{factory_path(factory)}?{RAY_TEST_OPTIONS}"
        return
    async with openenv.serve(factory, port=0, **server_options) as server:
        if kind == "ws":
            yield server.url.replace("http://", "ws://")
        elif kind == "http+poll":
            yield server.url.replace("http://", "http+poll://")
        else:
            raise ValueError(kind)
