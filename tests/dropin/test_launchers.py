"""An environment package's app run as its users run it: ``uvicorn package.server.app:app`` and ``openenv serve``."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import pytest
from grid_env.client import GridEnv
from grid_env.models import GridAction

from tests.dropin.conftest import PROJECTS
from tests.helpers import free_port, wait_for_port

pytestmark = pytest.mark.anyio

LIMIT = 60
APP = "grid_env.server.app:app"
LAUNCHERS = {
    "uvicorn": [sys.executable, "-m", "uvicorn", APP, "--host", "127.0.0.1", "--log-level", "warning", "--port"],
    "openenv serve": [sys.executable, "-m", "transports.cli", "serve", APP, "--port"],
}


def _environment() -> dict[str, str]:
    root = str(PROJECTS.parents[2])
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(PROJECTS), root])}


@asynccontextmanager
async def launched(command: list[str]) -> AsyncIterator[str]:
    port = free_port()
    process = await anyio.open_process([*command, str(port)], env=_environment())
    try:
        with anyio.fail_after(LIMIT):
            await wait_for_port(port)
        yield f"http://127.0.0.1:{port}"
    finally:
        process.terminate()
        with anyio.move_on_after(LIMIT, shield=True):
            await process.wait()
        if process.returncode is None:
            process.kill()
        await process.aclose()


@pytest.mark.parametrize("launcher", sorted(LAUNCHERS))
async def test_the_packages_app_serves_under_each_launcher(launcher: str) -> None:
    with anyio.fail_after(2 * LIMIT):
        async with launched(LAUNCHERS[launcher]) as url, GridEnv(base_url=url) as env:
            await env.reset(seed=0)
            result = await env.step(GridAction(direction="right"))
            assert (result.observation.position, result.reward) == ([1, 0], -0.1)
            # A second session at once: the package's app allows 8.
            async with GridEnv(base_url=url) as other:
                assert (await other.reset()).observation.message == "find [2, 2]"


def test_openenv_serve_refuses_an_option_the_apps_create_app_sets_in_one_line() -> None:
    command = [sys.executable, "-m", "transports.cli", "serve", APP, "--max-sessions", "3", "--port", "0"]
    done = subprocess.run(command, env=_environment(), capture_output=True, text=True, timeout=LIMIT, check=False)
    assert done.returncode == 2
    (line,) = done.stderr.strip().splitlines()
    assert "max_sessions are set in create_app(), not for a ready app" in line
