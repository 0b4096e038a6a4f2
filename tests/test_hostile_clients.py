"""Hostile clients and broken networks: each probe's defect, reproduced and shown fixed.

Every test runs on asyncio and trio, against each real server that can host
the app there: uvicorn and hypercorn on asyncio, hypercorn on trio. A test
asserts two things: the hostile client gets a clean, typed answer, and a
well-behaved session on the same server keeps working.
"""

from __future__ import annotations

import base64
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, ClassVar

import anyio
import httpx
import pytest

import openenv
from openenv import EnvClient, State
from tests.test_server_app import (
    MessageAction,
    MessageObservation,
    RawWebSocket,
    WireEchoEnv,
    registry_of,
    wait_until,
)
from transports.app import create_app
from transports.http import HTTPPollingTransport
from transports.runner import RunningServer, ServerName, current_backend, serve
from transports.websocket import WebSocketTransport

pytestmark = pytest.mark.anyio

LIMIT = 60  # seconds: the bound of every test's waits


@pytest.fixture(
    params=[("asyncio", "uvicorn"), ("asyncio", "hypercorn"), ("trio", "hypercorn")],
    ids=["asyncio-uvicorn", "asyncio-hypercorn", "trio-hypercorn"],
)
def backend_and_server(request: pytest.FixtureRequest) -> tuple[str, ServerName]:
    """Each event loop, with each ASGI server that runs the app on it."""
    pair: tuple[str, ServerName] = request.param
    return pair


@pytest.fixture
def anyio_backend(backend_and_server: tuple[str, ServerName]) -> str:
    return backend_and_server[0]


@pytest.fixture
def server_name(backend_and_server: tuple[str, ServerName]) -> ServerName:
    return backend_and_server[1]


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


# -- defect 4: authentication and Origin checks ------------------------------------


class CountedEnv(WireEchoEnv):
    """The echo environment, counting how many were built (a refused request must build none)."""

    built: ClassVar[int] = 0

    def __init__(self) -> None:
        super().__init__()
        CountedEnv.built += 1


class MessageEnv(EnvClient[MessageAction, MessageObservation, State]):
    pass


@pytest.fixture(autouse=True)
def _count_from_zero(monkeypatch: pytest.MonkeyPatch) -> None:
    CountedEnv.built = 0
    monkeypatch.delenv("OPENENV_AUTH_TOKEN", raising=False)


SCHEMES = ["ws", "http+poll"]


def _url(server: RunningServer, scheme: str) -> str:
    return server.url.replace("http", scheme, 1)


@pytest.mark.parametrize("scheme", SCHEMES)
async def test_a_missing_or_wrong_token_is_refused_before_any_environment(server_name: ServerName, scheme: str) -> None:
    with anyio.fail_after(LIMIT):
        async with serving(server_name, CountedEnv, auth_token=["old-token", "new-token"]) as server:
            url = _url(server, scheme)
            for token in (None, "wrong", "new-token-but-longer", "old"):
                with pytest.raises(openenv.AuthenticationError, match="401"):
                    async with MessageEnv(url, auth_token=token):
                        pass
            assert CountedEnv.built == 0
            assert registry_of(server).active == 0
            for token in ("old-token", "new-token"):  # any of the tokens
                async with MessageEnv(url, auth_token=token) as client:
                    assert (await client.step(MessageAction(message="hi"))).reward == 2.0
            assert CountedEnv.built == 2


async def test_health_is_open_and_every_other_route_needs_the_token(server_name: ServerName) -> None:
    with anyio.fail_after(LIMIT):
        async with serving(server_name, CountedEnv, auth_token="s3cret") as server, httpx.AsyncClient() as http:
            assert (await http.get(f"{server.url}/health")).status_code == 200
            for path in ("/schema", "/metadata"):
                refused = await http.get(f"{server.url}{path}")
                assert refused.status_code == 401
                assert refused.headers["www-authenticate"] == "Bearer"
                assert refused.json()["error"]["code"] == "unauthorized"
                authorized = await http.get(f"{server.url}{path}", headers={"Authorization": "Bearer s3cret"})
                assert authorized.status_code == 200
            created = await http.post(f"{server.url}/poll/sessions", headers={"Authorization": "bearer wrong"})
            assert created.status_code == 401
            assert CountedEnv.built == 0


@pytest.mark.parametrize("scheme", SCHEMES)
async def test_the_token_can_come_from_the_environment(
    server_name: ServerName, scheme: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENENV_AUTH_TOKEN", "from-env")
    with anyio.fail_after(LIMIT):
        async with serving(server_name, CountedEnv) as server:  # the server reads it too
            async with MessageEnv(_url(server, scheme)) as client:
                assert (await client.step(MessageAction(message="env"))).reward == 3.0
            monkeypatch.delenv("OPENENV_AUTH_TOKEN")
            with pytest.raises(openenv.AuthenticationError):
                async with MessageEnv(_url(server, scheme)):
                    pass


def test_auth_options_are_checked() -> None:
    for transport in (WebSocketTransport, HTTPPollingTransport):
        with pytest.raises(ValueError, match="not both"):
            transport("http://127.0.0.1:1", auth_token="a", headers={"Authorization": "Bearer b"})
    for bad in ("", "two words", "caf\u00e9"):
        with pytest.raises(ValueError, match="auth token"):
            create_app(CountedEnv, auth_token=bad)


async def _handshake_status(server: RunningServer, origin: str | None) -> int:
    """The HTTP status a WebSocket handshake to ``/ws`` gets (101 when accepted)."""
    key = base64.b64encode(os.urandom(16)).decode()
    lines = [
        "GET /ws HTTP/1.1",
        f"Host: {server.host}:{server.port}",
        "Upgrade: websocket",
        "Connection: Upgrade",
        f"Sec-WebSocket-Key: {key}",
        "Sec-WebSocket-Version: 13",
    ]
    if origin is not None:
        lines.append(f"Origin: {origin}")
    async with await anyio.connect_tcp(server.host, server.port) as stream:
        await stream.send(("\r\n".join(lines) + "\r\n\r\n").encode())
        response = b""
        while b"\r\n" not in response:
            response += await stream.receive()
    return int(response.split(b" ", 2)[1])


async def test_a_browser_origin_is_refused_unless_allowed(server_name: ServerName) -> None:
    with anyio.fail_after(LIMIT):
        async with serving(server_name, CountedEnv) as server, httpx.AsyncClient() as http:
            assert await _handshake_status(server, "https://evil.example") == 403
            assert await _handshake_status(server, "null") == 403
            evil = {"Origin": "https://evil.example", "Content-Type": "text/plain"}
            created = await http.post(f"{server.url}/poll/sessions", headers=evil)
            assert created.status_code == 403
            assert "access-control-allow-origin" not in created.headers
            assert CountedEnv.built == 0
            # Clients that are not browsers send no Origin: unaffected.
            async with MessageEnv(server.url) as client:
                assert (await client.step(MessageAction(message="ok"))).reward == 2.0


async def test_an_allowed_origin_gets_cors_headers(server_name: ServerName) -> None:
    app_origin = "https://app.example"
    with anyio.fail_after(LIMIT):
        async with (
            serving(server_name, CountedEnv, auth_token="tok", allow_origins=[app_origin]) as server,
            httpx.AsyncClient() as http,
        ):
            assert await _handshake_status(server, "https://evil.example") == 403
            # A preflight carries no token: it is answered, for the allowed origin only.
            preflight = {
                "Origin": app_origin,
                "Access-Control-Request-Method": "POST",
                "Access-Control-Request-Headers": "authorization, content-type",
            }
            answer = await http.options(f"{server.url}/poll/sessions", headers=preflight)
            assert answer.status_code == 200
            assert answer.headers["access-control-allow-origin"] == app_origin
            assert "authorization" in answer.headers["access-control-allow-headers"].lower()
            created = await http.post(
                f"{server.url}/poll/sessions", headers={"Origin": app_origin, "Authorization": "Bearer tok"}
            )
            assert created.status_code == 201
            assert created.headers["access-control-allow-origin"] == app_origin
            assert "OpenEnv-Seq" in created.headers["access-control-expose-headers"]
            deleted = await http.delete(
                f"{server.url}{created.headers['location']}",
                headers={
                    "Origin": app_origin,
                    "Authorization": "Bearer tok",
                    "OpenEnv-Session-Key": created.json()["session_key"],
                },
            )
            assert deleted.status_code == 204
            # The token is still needed from the allowed origin.
            assert await _handshake_status(server, app_origin) == 401
