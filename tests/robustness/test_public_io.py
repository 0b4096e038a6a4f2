"""``OPENENV_PUBLIC_IO=1`` (or ``ServerConfig(public_io=True)``): servers and clients on public classes only."""

from __future__ import annotations

import logging

import anyio
import pytest
from starlette.applications import Starlette
from starlette.routing import WebSocketRoute
from starlette.websockets import WebSocket

from openenv.examples.echo import EchoEnv, EchoEnvironment
from tests.server.test_server_app import RawWebSocket
from transports.server.runner import serve
from transports.shared._public_io import PUBLIC_IO_ENV, public_io_only
from transports.websocket._socket_loan import SOCKET_LOAN

pytestmark = pytest.mark.anyio

LIMIT = 10  # seconds: the bound of every wait


async def _extensions_of(ws: RawWebSocket) -> list[str]:
    text = await ws.receive()
    assert isinstance(text, str)
    return text.split(",")


async def _extensions(websocket: WebSocket) -> None:
    await websocket.accept()
    await websocket.send_text(",".join(sorted(websocket.scope.get("extensions") or {})))
    await websocket.close()


def _extensions_app() -> Starlette:
    return Starlette(routes=[WebSocketRoute("/ws", _extensions)])


@pytest.mark.parametrize(("value", "on"), [("1", True), ("yes", True), ("0", False), ("", False), ("false", False)])
def test_the_switch_reads_the_environment(monkeypatch: pytest.MonkeyPatch, value: str, on: bool) -> None:
    monkeypatch.setenv(PUBLIC_IO_ENV, value)
    assert public_io_only() is on


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_uvicorn_serves_with_its_stock_websocket_protocol(
    anyio_backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(PUBLIC_IO_ENV, raising=False)
    with anyio.fail_after(LIMIT):
        async with serve(_extensions_app()) as server, RawWebSocket.connect(server.ws_url) as ws:
            assert SOCKET_LOAN in await _extensions_of(ws)  # ours, by default
        async with serve(_extensions_app(), public_io=True) as server, RawWebSocket.connect(server.ws_url) as ws:
            assert SOCKET_LOAN not in await _extensions_of(ws)


async def test_the_default_server_is_hypercorn(anyio_backend: str) -> None:
    with anyio.fail_after(LIMIT):
        async with serve(EchoEnvironment, public_io=True) as server:
            assert server.server == "hypercorn"
            async with EchoEnv(server.url) as env:
                await env.reset()


@pytest.mark.parametrize("anyio_backend", ["trio"])
async def test_trio_serves_on_plain_hypercorn(
    anyio_backend: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    with anyio.fail_after(LIMIT):
        monkeypatch.setenv(PUBLIC_IO_ENV, "1")
        with caplog.at_level(logging.WARNING, logger="openenv.server"):
            async with serve(EchoEnvironment, server="hypercorn+websockets") as server:
                assert server.server == "hypercorn"
                async with EchoEnv(server.url) as env:
                    await env.reset()
        assert "serving on plain hypercorn, not hypercorn+websockets" in caplog.text
