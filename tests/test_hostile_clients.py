"""Hostile clients and broken networks: each probe's defect, reproduced and shown fixed.

Every test runs on asyncio and trio, against each real server that can host
the app there: uvicorn and hypercorn on asyncio, hypercorn on trio. A test
asserts two things: the hostile client gets a clean, typed answer, and a
well-behaved session on the same server keeps working.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import pytest

from tests.test_server_app import RawWebSocket, WireEchoEnv, registry_of, wait_until
from transports.runner import RunningServer, ServerName, current_backend, serve

pytestmark = pytest.mark.anyio

LIMIT = 60  # seconds: the bound of every test's waits


@pytest.fixture(params=["uvicorn", "hypercorn"])
def server_name(request: pytest.FixtureRequest, anyio_backend: str) -> ServerName:
    """Each ASGI server the app runs on under the test's backend."""
    if request.param == "uvicorn" and anyio_backend != "asyncio":
        pytest.skip("uvicorn runs on asyncio only")
    name: ServerName = request.param
    return name


@asynccontextmanager
async def serving(server_name: ServerName, factory: Any = WireEchoEnv, **options: Any) -> AsyncIterator[RunningServer]:
    assert server_name == "hypercorn" or current_backend() == "asyncio"
    async with serve(factory, server=server_name, **options) as server:
        yield server


# -- defect 1: refusals at capacity killed hypercorn on trio ----------------------


async def _refused(url: str, manner: int) -> None:
    """A client turned away at capacity that leaves in one of three manners."""
    async with RawWebSocket.connect(url) as ws:
        assert (await ws.receive_json())["data"]["code"] == "CAPACITY_REACHED"
        if manner == 0:  # closes at once: both ends close together
            await ws.close()
        elif manner == 1:  # asks anyway, then closes
            await ws.send_text('{"type":"reset"}')
            await ws.close()
        # manner 2: drops the connection without a closing handshake


async def test_refusals_at_capacity_leave_the_server_serving(server_name: ServerName) -> None:
    with anyio.fail_after(LIMIT):
        async with serving(server_name, max_sessions=1) as server:
            url = server.ws_url
            async with RawWebSocket.connect(url) as held:
                await held.request('{"type":"reset"}')
                for _ in range(20):
                    async with anyio.create_task_group() as task_group:
                        for manner in range(12):
                            task_group.start_soon(_refused, url, manner % 3)
                    assert (await held.request('{"type":"state"}'))["type"] == "state"
                await held.close()
            await wait_until(lambda: registry_of(server).active == 0, "the held slot is released")
            async with RawWebSocket.connect(url) as newcomer:
                assert (await newcomer.request('{"type":"reset"}'))["type"] == "observation"
                await newcomer.close()
