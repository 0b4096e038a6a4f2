"""Serving a test environment over each transport, for the contract tests."""

from __future__ import annotations

import importlib.util
import os
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio.to_thread

import openenv

RAY_TESTS = os.environ.get("OPENENV_TEST_RAY") == "1" and importlib.util.find_spec("ray") is not None
"""Whether ray:// is tested: only on request (``OPENENV_TEST_RAY=1`` and ``pip install -e '.[test,ray]'``).

Ray's own processes connect over this machine's network address even when told
to use 127.0.0.1, and the suite keeps its traffic on loopback.
"""
RAY_SKIP_REASON = "ray:// tests run only with OPENENV_TEST_RAY=1 and the ray extra (Ray leaves loopback)"

# Each transport the contract tests run over.
TRANSPORTS = ["inproc", "ws", "http+poll", *(["ray"] if RAY_TESTS else [])]

ROOT = Path(__file__).resolve().parents[1]
# Test actors reserve no CPU, so the test environments' actors never wait for one another.
RAY_TEST_OPTIONS = "num_cpus=0"


def factory_path(factory: Callable[[], Any]) -> str:
    return f"{factory.__module__}:{factory.__qualname__}"


def start_local_ray() -> None:
    """Start the test session's local Ray cluster (2 CPUs, loopback only), once; `conftest` stops it."""
    from transports.ray import init_ray

    init_ray(
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
