"""Hostile clients and broken networks: each probe's defect, reproduced and shown fixed.

Every test runs on asyncio and trio, against each real server that can host
the app there: uvicorn and hypercorn on asyncio; hypercorn, and hypercorn with
its WebSocket connections served by websockets' protocol, on trio. A test
asserts two things: the hostile client gets a clean, typed answer, and a
well-behaved session on the same server keeps working.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import socket
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, ClassVar

import anyio
import anyio.abc
import httpx
import pytest
from websockets.client import ClientProtocol
from websockets.typing import Subprotocol
from websockets.uri import parse_uri

import openenv
from openenv import ConnectionClosed, EnvClient, State
from openenv.server import Environment
from tests.helpers import ManualClock
from tests.server.test_server_app import (
    MessageAction,
    MessageObservation,
    RawWebSocket,
    WireEchoEnv,
    registry_of,
    wait_until,
)
from transports.admission._sessions import SessionRegistry
from transports.http import HTTPPollingTransport
from transports.http._protocol import LINKS_PATH, SESSIONS_PATH
from transports.server.app import create_app
from transports.server.runner import RunningServer, ServerName, _bind, current_backend, serve
from transports.shared._public_io import public_io_only
from transports.websocket import LINK_JSON_SUBPROTOCOL, WebSocketTransport

pytestmark = pytest.mark.anyio

LIMIT = 60  # seconds: the bound of every test's waits


@pytest.fixture(
    params=[("asyncio", "uvicorn"), ("asyncio", "hypercorn"), ("trio", "hypercorn"), ("trio", "hypercorn+websockets")],
    ids=["asyncio-uvicorn", "asyncio-hypercorn", "trio-hypercorn", "trio-hypercorn+websockets"],
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
    assert (server_name == "uvicorn") == (current_backend() == "asyncio") or server_name == "hypercorn"
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
    WireEchoEnv.closed.clear()
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


@pytest.mark.parametrize("scheme", SCHEMES)
async def test_a_refused_client_is_told_how_to_send_a_token(server_name: ServerName, scheme: str) -> None:
    with anyio.fail_after(LIMIT):
        async with serving(server_name, CountedEnv, auth_token="s3cret") as server:
            url = _url(server, scheme)
            with pytest.raises(openenv.AuthenticationError, match="none was sent") as missing:
                async with MessageEnv(url):
                    pass
            assert "auth_token=" in str(missing.value)
            assert "OPENENV_AUTH_TOKEN" in str(missing.value)
            with pytest.raises(openenv.AuthenticationError, match="refused the token") as wrong:
                async with MessageEnv(url, auth_token="wrong"):
                    pass
            assert "{" not in str(wrong.value)  # the server's JSON error is told in words


async def test_a_websocket_path_the_server_does_not_serve_says_so(server_name: ServerName) -> None:
    with anyio.fail_after(LIMIT):
        async with serving(server_name, CountedEnv) as server:
            with pytest.raises(openenv.ConnectError, match="no WebSocket endpoint there"):
                async with MessageEnv(f"{server.url}/nothing/here/ws"):
                    pass


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


async def _handshake_status(server: RunningServer, origin: str | None, subprotocol: str | None = None) -> int:
    """The HTTP status a WebSocket handshake to ``/ws`` gets (101 when accepted), offering ``subprotocol``."""
    key = base64.b64encode(os.urandom(16)).decode()
    lines = [
        "GET /ws HTTP/1.1",
        f"Host: {server.host}:{server.port}",
        "Upgrade: websocket",
        "Connection: Upgrade",
        f"Sec-WebSocket-Key: {key}",
        "Sec-WebSocket-Version: 13",
    ]
    if subprotocol is not None:
        lines.append(f"Sec-WebSocket-Protocol: {subprotocol}")
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
            # A shared connection is refused the same, over either transport.
            assert await _handshake_status(server, "https://evil.example", LINK_JSON_SUBPROTOCOL) == 403
            assert await _handshake_status(server, None, LINK_JSON_SUBPROTOCOL) == 101
            evil = {"Origin": "https://evil.example", "Content-Type": "text/plain"}
            for path in (SESSIONS_PATH, LINKS_PATH):
                created = await http.post(f"{server.url}{path}", headers=evil)
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


# -- raw HTTP long-polling sessions --------------------------------------------------


class PollSession:
    """One HTTP long-polling session driven by hand."""

    def __init__(self, http: httpx.AsyncClient, server: RunningServer, created: dict[str, Any]) -> None:
        self.http = http
        self.frames = f"{server.url}/poll/sessions/{created['session_id']}/frames"
        self.key = {"OpenEnv-Session-Key": created["session_key"]}

    async def post(self, seq: int, frame: bytes, *, ack: int = 0, key: bool = True) -> httpx.Response:
        headers = {"Content-Type": "application/json", "OpenEnv-Seq": str(seq), "OpenEnv-Ack": str(ack)}
        headers["OpenEnv-Wait"] = "5"
        return await self.http.post(self.frames, content=frame, headers={**headers, **(self.key if key else {})})


async def _poll_session(http: httpx.AsyncClient, server: RunningServer) -> PollSession:
    created = await http.post(f"{server.url}/poll/sessions")
    assert created.status_code == 201, created.text
    return PollSession(http, server, created.json())


def _server_errors(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [record.getMessage() for record in caplog.records if record.levelno >= logging.ERROR]


# -- defect 9: undecodable input gets a decode error, with no server traceback -------

DEEP = b"[" * 980 + b"]" * 980


@pytest.mark.parametrize(
    "frame",
    [
        b'{"type":"step","data":{"message":1e999}}',
        b'{"type":"reset","data":{"seed":1e999}}',
        b'{"type":"step","data":{"message":' + DEEP + b"}}",
        b'{"type":"step","data":' + b"[" * 5000 + b"]" * 5000 + b"}",
    ],
    ids=["huge-number-in-step", "huge-number-in-reset", "980-deep", "5000-deep"],
)
async def test_undecodable_input_is_invalid_json_without_a_traceback(
    server_name: ServerName, frame: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    with anyio.fail_after(LIMIT):
        async with serving(server_name) as server:
            async with RawWebSocket.connect(server.ws_url) as ws:
                await ws.send_text(frame.decode())
                reply = await ws.receive_json()
                assert (reply["type"], reply["data"]["code"]) == ("error", "INVALID_JSON")
                assert (await ws.request('{"type":"state"}'))["type"] == "state"  # the session goes on
                await ws.close()
            async with httpx.AsyncClient(timeout=LIMIT) as http:
                session = await _poll_session(http, server)
                response = await session.post(1, frame)
                assert response.status_code == 200
                assert response.json()["data"]["code"] == "INVALID_JSON"
    assert _server_errors(caplog) == []


async def test_a_too_deep_action_is_an_encoding_error_in_the_client(server_name: ServerName) -> None:
    deep: Any = "bottom"
    for _ in range(990):
        deep = [deep]
    with anyio.fail_after(LIMIT):
        async with serving(server_name) as server, EnvClient(server.url) as client:
            # Where msgspec's encoder runs out of stack (Python 3.12 and older), the client
            # refuses it; where it does not (3.13), the server's limit of 128 levels does.
            with pytest.raises((openenv.EncodingError, openenv.InvalidJSONError), match="nested"):
                await client.step({"message": deep})
            assert (await client.step({"message": "fine"})).reward == 4.0  # the session goes on


async def test_an_absurd_sequence_number_is_a_bad_request(server_name: ServerName) -> None:
    with anyio.fail_after(LIMIT):
        async with serving(server_name) as server, httpx.AsyncClient(timeout=LIMIT) as http:
            session = await _poll_session(http, server)
            for seq in ("9" * 4301, "1" + "0" * 18):
                response = await session.http.post(
                    session.frames,
                    content=b'{"type":"state"}',
                    headers={"Content-Type": "application/json", "OpenEnv-Seq": seq, **session.key},
                )
                assert response.status_code == 400
                assert response.json()["error"]["code"] == "invalid_header"
            assert (await session.post(1, b'{"type":"state","id":1}')).status_code == 200


# -- defect 11: server internals can be kept out of error replies ----------------------


def broken_factory() -> WireEchoEnv:
    raise OSError("/srv/secret/path/weights.bin is missing")


@pytest.mark.parametrize("error_details", [True, False])
async def test_error_details_can_be_hidden(server_name: ServerName, error_details: bool) -> None:
    async def first_reply(factory: Any, request: str | None) -> dict[str, Any]:
        async with (
            serving(server_name, factory, error_details=error_details) as server,
            RawWebSocket.connect(server.ws_url) as ws,
        ):
            reply: dict[str, Any] = await (ws.request(request) if request else ws.receive_json())
            await ws.close()
            return reply["data"]

    with anyio.fail_after(LIMIT):
        execution = await first_reply(WireEchoEnv, '{"type":"step","data":{"message":"raise"}}')
        assert execution["code"] == "EXECUTION_ERROR"
        assert ("echo env: step raised" in execution["message"]) is error_details
        assert ("RuntimeError" in execution["message"]) is error_details
        factory = await first_reply(broken_factory, None)
        assert factory["code"] == "FACTORY_ERROR"
        assert ("/srv/secret" in factory["message"]) is error_details
        assert ("factory_name" in factory) is error_details


# -- defects 5 and 2: one large message, and replies nobody fetches ---------------------


async def test_a_message_over_the_default_limit_ends_only_its_own_session(server_name: ServerName) -> None:
    too_big = b'{"type":"step","data":{"message":"' + b"x" * (16 * 1024 * 1024) + b'"}}'
    with anyio.fail_after(LIMIT):
        async with serving(server_name) as server, MessageEnv(server.url) as bystander:
            await bystander.reset()
            async with RawWebSocket.connect(server.ws_url) as ws:
                await ws.send_text(too_big.decode())
                # 1009, or a reset if the server closed while the message still flowed in.
                assert (await ws.expect_close()).code in (1009, None)
            async with httpx.AsyncClient(timeout=LIMIT) as http:
                session = await _poll_session(http, server)
                # Refused at its headers: the body is never sent, let alone buffered.
                head = (
                    f"POST {session.frames.removeprefix(server.url)} HTTP/1.1\r\n"
                    f"Host: {server.host}\r\nContent-Type: application/json\r\n"
                    f"Content-Length: {len(too_big)}\r\nOpenEnv-Seq: 1\r\n"
                    f"OpenEnv-Session-Key: {session.key['OpenEnv-Session-Key']}\r\n\r\n"
                )
                async with await anyio.connect_tcp(server.host, server.port) as stream:
                    await stream.send(head.encode())
                    assert (await stream.receive()).startswith(b"HTTP/1.1 413")
            assert (await bystander.step(MessageAction(message="ok"))).reward == 2.0


async def test_a_text_message_of_bad_utf8_ends_only_its_own_session(server_name: ServerName) -> None:
    with anyio.fail_after(LIMIT):
        async with serving(server_name) as server, MessageEnv(server.url) as bystander:
            await bystander.reset()
            async with RawWebSocket.connect(server.ws_url) as ws:
                # One whole, masked text frame (as the servers' quick read takes them), not UTF-8.
                await ws._stream.send(b"\x81\x82" + b"\x00\x00\x00\x00" + b"\xc3\x28")
                # Plain hypercorn (wsproto) drops the connection without a close frame.
                assert (await ws.expect_close()).code == (None if server_name == "hypercorn" else 1007)
            assert (await bystander.step(MessageAction(message="ok"))).reward == 2.0


async def test_a_validation_error_does_not_echo_a_large_input(server_name: ServerName) -> None:
    with anyio.fail_after(LIMIT):
        async with serving(server_name) as server, RawWebSocket.connect(server.ws_url) as ws:
            small = await ws.request('{"type":"step","data":{"message":"x","extra":1}}')
            assert small["data"]["errors"][0]["input"] == {"message": "x", "extra": 1}  # as OpenEnv echoes it
            padding = "y" * 1_000_000
            large = await ws.request('{"type":"step","data":{"message":"x","pad":"' + padding + '"}}')
            assert large["data"]["code"] == "VALIDATION_ERROR"
            assert "input" not in large["data"]["errors"][0]
            await ws.close()


async def test_replies_nobody_fetches_are_bounded(server_name: ServerName) -> None:
    with anyio.fail_after(LIMIT):
        async with serving(server_name, max_sessions=1) as server, httpx.AsyncClient(timeout=LIMIT) as http:
            server.app.state.http_polling.max_unacknowledged_bytes = 256 * 1024
            server.app.state.http_polling.linger = LIMIT  # past the test: only a DELETE frees the slot
            session = await _poll_session(http, server)
            reply = b'{"type":"step","id":%d,"data":{"message":"' + b"z" * 50_000 + b'"}}'
            statuses = [(await session.post(seq, reply % seq)).status_code for seq in range(1, 7)]
            # Each reply is kept until acknowledged, up to 256 KiB with the frame that comes: then frames are refused.
            assert statuses == [200] * 5 + [409]
            # The session ends with 200 kB of replies unfetched: they keep its slot while they linger.
            assert (await session.post(6, b'{"type":"close"}', ack=1)).status_code == 200
            await wait_until(lambda: len(WireEchoEnv.closed) == 1, "the session ends")
            assert registry_of(server).active == 1
            delete = await http.delete(session.frames.removesuffix("/frames"), headers=session.key)
            assert delete.status_code == 204
            await wait_until(lambda: registry_of(server).active == 0, "the slot is released once deleted")


# -- defect 6: sessions created and never used ------------------------------------------


async def test_unused_http_sessions_build_nothing_and_end_soon(server_name: ServerName) -> None:
    clock = ManualClock()  # the app's: the sessions' wait for a first frame runs out when the test says
    app = create_app(CountedEnv, max_sessions=16, clock=clock)
    with anyio.fail_after(LIMIT):
        async with serving(server_name, app) as server, httpx.AsyncClient() as http:
            unused_timeout = server.app.state.http_polling.unused_timeout
            for _ in range(16):
                assert (await http.post(f"{server.url}/poll/sessions")).status_code == 201
            await clock.advance_when_blocked(unused_timeout - 1.0)
            assert registry_of(server).active == 16
            await clock.advance_when_blocked(1.0)
            assert CountedEnv.built == 0
            await wait_until(lambda: registry_of(server).active == 0, "the unused sessions end")
            async with MessageEnv(_url(server, "http+poll")) as client:
                assert (await client.step(MessageAction(message="in"))).reward == 2.0
            assert CountedEnv.built == 1


def test_every_transport_has_a_session_limit_and_an_idle_timeout_by_default() -> None:
    registry = create_app(WireEchoEnv).state.sessions
    assert registry.max_sessions == 256
    assert registry.idle_timeout_of("websocket") == 600.0
    assert registry.idle_timeout_of("http") == 300.0


# -- defect 8: a session id alone does not drive a session ----------------------------


async def test_a_session_id_without_its_key_cannot_inject_frames(
    server_name: ServerName, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    caplog.set_level(logging.INFO)
    with anyio.fail_after(LIMIT):
        async with serving(server_name, log_level="debug") as server, httpx.AsyncClient(timeout=LIMIT) as http:
            owner = await _poll_session(http, server)
            first = await owner.post(1, b'{"type":"step","id":1,"data":{"message":"mine"}}')
            assert first.json()["data"]["observation"]["echoed_message"] == "mine"
            # The intruder knows the id (from a URL, a log) and guesses the next number.
            intruder = await owner.post(2, b'{"type":"step","id":2,"data":{"message":"theirs"}}', key=False)
            assert intruder.status_code == 404
            wrong_key = await http.post(
                owner.frames,
                content=b'{"type":"state","id":2}',
                headers={"Content-Type": "application/json", "OpenEnv-Seq": "2", "OpenEnv-Session-Key": "guess"},
            )
            assert wrong_key.status_code == 404
            # The owner's frame 2, and its retry, get the owner's own reply.
            for _ in range(2):
                second = await owner.post(2, b'{"type":"step","id":2,"data":{"message":"mine too"}}', ack=1)
                assert second.json()["data"]["observation"]["echoed_message"] == "mine too"
            session_id = owner.frames.split("/")[-2]
    server_loggers = ("uvicorn", "hypercorn", "openenv")
    logged = "\n".join(record.getMessage() for record in caplog.records if record.name.startswith(server_loggers))
    logged += capsys.readouterr().out  # hypercorn writes its access log to stdout
    assert "/poll/sessions/" in logged  # the access log was on
    assert session_id not in logged


# -- defect 3: pings from a client that never reads ------------------------------------


async def test_a_ping_flood_from_a_client_that_never_reads_is_held_back(server_name: ServerName) -> None:
    """The server stops reading once its pongs back up: the flooder's sends stall, its memory stays bounded."""
    if server_name == "uvicorn" and public_io_only():
        pytest.skip("uvicorn's stock WebSocket protocol has no backpressure on pongs (docs/reliability.md)")
    limit = 64 * 1024 * 1024  # far beyond what the socket buffers on the way hold
    with anyio.fail_after(LIMIT):
        async with serving(server_name) as server, MessageEnv(server.url) as bystander:
            await bystander.reset()
            async with RawWebSocket.connect(server.ws_url) as flooder:

                def pings(protocol: ClientProtocol) -> None:
                    for _ in range(2000):
                        protocol.send_ping(b"p" * 125)

                await flooder.flood(pings, limit)
            assert (await bystander.step(MessageAction(message="ok"))).reward == 2.0


# -- a ping while a step runs -------------------------------------------------------------


class BlockingPlainEnv(Environment[MessageAction, MessageObservation, State]):
    """An echo environment of plain methods whose ``step`` blocks its thread until the test opens the gate."""

    entered: ClassVar[threading.Event] = threading.Event()
    gate: ClassVar[threading.Event] = threading.Event()

    def reset(self, **kwargs: Any) -> MessageObservation:
        return MessageObservation()

    def step(self, action: MessageAction) -> MessageObservation:
        if action.message == "block":
            BlockingPlainEnv.entered.set()
            BlockingPlainEnv.gate.wait(LIMIT)  # bounded: a test that fails still lets the thread go
        return MessageObservation(echoed_message=action.message)

    @property
    def state(self) -> State:
        return State()


class BlockingAsyncEnv(WireEchoEnv):
    """The echo environment whose ``step``, a coroutine, awaits the test's gate (set per test: events of its loop)."""

    entered: ClassVar[anyio.Event]
    gate: ClassVar[anyio.Event]

    async def step(self, action: MessageAction) -> MessageObservation:
        if action.message == "block":
            BlockingAsyncEnv.entered.set()
            await BlockingAsyncEnv.gate.wait()
        return MessageObservation(echoed_message=action.message)


@pytest.mark.parametrize("plain", [True, False], ids=["plain-step", "async-step"])
async def test_a_ping_is_answered_while_a_long_step_runs(server_name: ServerName, plain: bool) -> None:
    """A client's keepalive ping gets its pong before the step ends, or a long step would cost the connection."""
    BlockingPlainEnv.entered.clear()
    BlockingPlainEnv.gate.clear()
    BlockingAsyncEnv.entered, BlockingAsyncEnv.gate = anyio.Event(), anyio.Event()
    factory = BlockingPlainEnv if plain else BlockingAsyncEnv
    try:
        with anyio.fail_after(LIMIT):
            async with serving(server_name, factory) as server, RawWebSocket.connect(server.ws_url) as ws:
                assert (await ws.request('{"type":"reset"}'))["type"] == "observation"
                await ws.send_text('{"type":"step","data":{"message":"block"}}')
                if plain:
                    await anyio.to_thread.run_sync(BlockingPlainEnv.entered.wait, LIMIT)
                else:
                    await BlockingAsyncEnv.entered.wait()
                await ws.ping(b"while stepping")
                BlockingPlainEnv.gate.set()
                BlockingAsyncEnv.gate.set()
                assert (await ws.receive_json())["data"]["observation"]["echoed_message"] == "block"
                reply = await ws.request('{"type":"step","data":{"message":"after"}}')
                assert reply["data"]["observation"]["echoed_message"] == "after"
                await ws.ping(b"after")
                await ws.close()
    finally:
        BlockingPlainEnv.gate.set()


# -- defect 7: connections that never finish their request headers ----------------------


async def _closed_by_server(stream: Any) -> bool:
    """Read until the server closes the connection; whether it did (rather than answer)."""
    try:
        while True:
            if await stream.receive():
                return False
    except (anyio.EndOfStream, anyio.BrokenResourceError):
        return True


async def test_slow_and_silent_connections_are_closed(server_name: ServerName) -> None:
    with anyio.fail_after(LIMIT):
        async with serving(server_name, header_timeout=0.5) as server, MessageEnv(server.url) as bystander:
            await bystander.reset()
            host, port = server.host, server.port
            async with (
                await anyio.connect_tcp(host, port) as silent,
                await anyio.connect_tcp(host, port) as slow,
                await anyio.connect_tcp(host, port) as slow_second,
            ):
                await slow.send(b"GET /health HTTP/1.1\r\nHost: x\r\n")  # and never the rest
                await slow_second.send(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
                response = b""
                while not response.endswith(b'{"status":"healthy"}'):
                    response += await slow_second.receive()
                assert response.startswith(b"HTTP/1.1 200")
                await slow_second.send(b"GET /health HTTP/1.1\r\n")  # a second request, never finished
                for stream in (silent, slow, slow_second):
                    assert await _closed_by_server(stream)
            # A WebSocket session idle for longer than the header timeout is a session, not a slow client.
            assert (await bystander.step(MessageAction(message="still"))).reward == 5.0


# -- admission at capacity: a bounded queue, in arrival order ---------------------------


async def test_the_admission_queue_admits_in_arrival_order() -> None:
    registry = SessionRegistry(max_sessions=1, queue_timeout=LIMIT)
    held = registry.open()
    assert held is not None
    admitted: list[str] = []

    async def arrive(name: str, *, task_status: Any = anyio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        lease = await registry.admit()
        assert lease is not None
        admitted.append(name)

    with anyio.fail_after(LIMIT):
        async with anyio.create_task_group() as task_group:
            for name in ("first", "second", "third"):
                await task_group.start(arrive, name)
                await wait_until(lambda n=name: registry.queued == ("first", "second", "third").index(n) + 1, "queued")
            await wait_until(lambda: registry.queued == 3, "all three wait")
            assert registry.open() is None  # a newcomer does not jump the queue
            held.release()
            await wait_until(lambda: admitted == ["first"], "the first is admitted")
            registry.leases()[0].release()
            await wait_until(lambda: admitted == ["first", "second"], "then the second")
            registry.leases()[0].release()
    assert admitted == ["first", "second", "third"]


async def test_the_admission_queue_is_bounded_in_time() -> None:
    clock = ManualClock()
    registry = SessionRegistry(max_sessions=1, queue_timeout=30.0, clock=clock)
    assert registry.open() is not None
    admitted: list[object] = []

    async def queue_up() -> None:
        admitted.append(await registry.admit())

    with anyio.fail_after(LIMIT):
        async with anyio.create_task_group() as task_group:
            task_group.start_soon(queue_up)
            await clock.advance_when_blocked(29.0)
            assert (admitted, registry.queued) == ([], 1)  # still waiting
            await clock.advance_when_blocked(1.0)
    assert admitted == [None]
    assert registry.queued == 0


@pytest.mark.parametrize("scheme", SCHEMES)
async def test_a_session_at_capacity_waits_for_a_slot(server_name: ServerName, scheme: str) -> None:
    with anyio.fail_after(LIMIT):
        async with serving(server_name, max_sessions=1, queue_timeout=LIMIT) as server:
            url = _url(server, scheme)
            results: list[float | None] = []

            async def latecomer() -> None:
                async with MessageEnv(url) as client:
                    results.append((await client.step(MessageAction(message="late"))).reward)

            async with MessageEnv(url) as first:
                await first.reset()
                async with anyio.create_task_group() as task_group:
                    task_group.start_soon(latecomer)
                    await wait_until(lambda: registry_of(server).queued == 1, "the latecomer waits")
                    assert results == []
                    await first.close()  # its slot goes to the latecomer
            assert results == [4.0]


# -- links: many sessions on one connection, resumable (the server's side) ------------

LINK = "openenv.v2.json"


@asynccontextmanager
async def link_ws(url: str, token: str | None = None) -> AsyncIterator[RawWebSocket]:
    """A raw connection offering the link subprotocol, taking ``token``'s link over if given."""
    uri = parse_uri(url)
    stream = await anyio.connect_tcp(uri.host, uri.port)
    protocol = ClientProtocol(uri, subprotocols=[Subprotocol(LINK)], max_size=None)
    try:
        request = protocol.connect()
        if token is not None:
            request.headers["OpenEnv-Resume"] = token
        protocol.send_request(request)
        await stream.send(b"".join(protocol.data_to_send()))
        events: list[Any] = []
        while not events:
            protocol.receive_data(await stream.receive())
            events = protocol.events_received()
        assert protocol.subprotocol == LINK
        websocket = RawWebSocket(stream, protocol)
        websocket._frames.extend(events[1:])
        yield websocket
    finally:
        await stream.aclose()


async def entries(ws: RawWebSocket) -> list[list[Any]]:
    """The entries of the next envelope: ``[channel, seq, ack, frame]`` each."""
    envelope = json.loads(await ws.receive())
    assert isinstance(envelope, list)
    return envelope


async def test_a_link_survives_a_dropped_connection(server_name: ServerName) -> None:
    with anyio.fail_after(LIMIT):
        async with serving(server_name) as server:
            url = server.ws_url
            async with link_ws(url) as ws:
                [[channel, seq, _, hello]] = await entries(ws)
                assert (channel, seq, hello["type"]) == (0, 0, "hello")
                token = hello["token"]
                await ws.send_text('[[1,0,0,{"type":"open"}],[1,1,0,{"type":"reset","id":1,"data":{}}]]')
                assert [entry[:2] for entry in await entries(ws)] == [[1, 1]]
                await ws.send_text('[[1,2,1,{"type":"step","id":2,"data":{"message":"one"}}]]')
                [[_, seq, ack, reply]] = await entries(ws)
                assert (seq, ack, reply["id"]) == (2, 2, 2)
                # Frame 3 goes out, and the connection drops before its reply comes.
                await ws.send_text('[[1,3,2,{"type":"step","id":3,"data":{"message":"two"}}]]')
            # The connection is gone without a closing handshake; the link waits.
            async with link_ws(url, token) as ws:
                await ws.send_text('[[0,0,0,{"type":"resume","received":[[1,2]]}]]')
                resumed, *received = await entries(ws)
                assert resumed[3]["type"] == "resumed"
                assert resumed[3]["opened"] == 1
                [(channel, held)] = resumed[3]["received"]
                if held == 2:  # the server had not read frame 3 when the connection dropped: sent again
                    await ws.send_text('[[1,3,2,{"type":"step","id":3,"data":{"message":"two"}}]]')
                else:
                    assert (channel, held) == (1, 3)
                while not received:  # the reply the client lacks
                    received += await entries(ws)
                [replayed] = received
                assert replayed[:2] == [1, 3]
                assert (replayed[3]["id"], replayed[3]["data"]["observation"]["echoed_message"]) == (3, "two")
                # A frame sent again anyway is dropped: never run twice.
                await ws.send_text(
                    '[[1,3,3,{"type":"step","id":3,"data":{"message":"two"}}],[1,4,3,{"type":"state","id":4}]]'
                )
                [[_, seq, _, state]] = await entries(ws)
                assert (seq, state["data"]["step_count"]) == (4, 2)  # the same environment, two steps
                assert registry_of(server).active == 1
                await ws.send_text('[[1,5,4,{"type":"close"}]]')
                [[_, _, _, end]] = await entries(ws)
                assert end["type"] == "end"
                await ws.close()
            await wait_until(lambda: registry_of(server).active == 0, "the session ends on close")
            assert len(WireEchoEnv.closed) == 1


async def test_a_link_ends_when_its_client_does_not_come_back(server_name: ServerName) -> None:
    clock = ManualClock()  # the app's: the link's wait for its client runs out when the test says
    app = create_app(WireEchoEnv, resume_timeout=10 * LIMIT, clock=clock)  # past the test's bound on the wall
    with anyio.fail_after(LIMIT):
        async with serving(server_name, app) as server:
            async with link_ws(server.ws_url) as ws:
                token = (await entries(ws))[0][3]["token"]
                await ws.send_text('[[1,0,0,{"type":"open"}],[1,1,0,{"type":"reset","id":1,"data":{}}]]')
                await entries(ws)
            assert registry_of(server).active == 1
            async with anyio.create_task_group() as task_group:
                task_group.start_soon(clock.keep_advancing, 60.0)  # a link's session is never idle: only its wait ends
                await wait_until(lambda: registry_of(server).active == 0, "the session ends")
                task_group.cancel_scope.cancel()
            assert len(WireEchoEnv.closed) == 1
            async with link_ws(server.ws_url, token) as late:
                closed = await late.expect_close()
                assert closed.code == 1008
                assert "unknown or expired" in closed.reason


@pytest.mark.parametrize("opened", [1, 0], ids=["a-session", "no-session"])
async def test_a_server_stopping_ends_a_link_that_waits_for_its_client(server_name: ServerName, opened: int) -> None:
    clock = ManualClock()  # the app's: the link's wait for its client never runs out by itself
    app = create_app(WireEchoEnv, resume_timeout=10 * LIMIT, clock=clock)
    # The shutdown's grace is past the test's bound too: the server stops in time only if the wait ends.
    with anyio.fail_after(LIMIT):
        async with serving(server_name, app, shutdown_timeout=10 * LIMIT) as server:
            async with link_ws(server.ws_url) as ws:
                await entries(ws)  # the Hello
                if opened:
                    await ws.send_text('[[1,0,0,{"type":"open"}],[1,1,0,{"type":"reset","id":1,"data":{}}]]')
                    await entries(ws)
            # The connection is gone without a closing handshake: the link waits for its client.
            assert registry_of(server).active == opened
        assert len(WireEchoEnv.closed) == opened


@pytest.mark.parametrize("share", [True, False], ids=["shared", "one-session"])
async def test_a_server_stopping_closes_an_idle_clients_link_at_once(server_name: ServerName, share: bool) -> None:
    stop, stopped = anyio.Event(), anyio.Event()

    async def run_server(*, task_status: anyio.abc.TaskStatus[str]) -> None:
        # A grace past the test's bound: the server stops in time only if it closes the link itself.
        async with serving(server_name, shutdown_timeout=10 * LIMIT) as server:
            task_status.started(server.url)
            await stop.wait()
        stopped.set()

    with anyio.fail_after(LIMIT):
        async with anyio.create_task_group() as task_group:
            url = await task_group.start(run_server)
            async with MessageEnv(url, share=share) as client:
                await client.reset()
                stop.set()  # the client's session is idle, its owner's keeper the only reader
                await stopped.wait()
                with pytest.raises(ConnectionClosed, match="server shutting down"):
                    await client.step(MessageAction(message="late"))
        assert len(WireEchoEnv.closed) == 1


@pytest.mark.parametrize("old_answers", [True, False], ids=["old-answers", "old-never-answers"])
async def test_a_link_can_be_taken_over_from_a_connection_still_open(
    server_name: ServerName, old_answers: bool
) -> None:
    with anyio.fail_after(LIMIT):
        async with serving(server_name) as server, link_ws(server.ws_url) as old:
            token = (await entries(old))[0][3]["token"]
            await old.send_text('[[1,0,0,{"type":"open"}],[1,1,0,{"type":"reset","id":1,"data":{}}]]')
            await entries(old)
            async with link_ws(server.ws_url, token) as new:
                await new.send_text('[[0,0,0,{"type":"resume","received":[]}]]')  # as if the reply was lost
                received = await entries(new)
                while len(received) < 2:
                    received += await entries(new)
                assert received[0][3]["type"] == "resumed"
                assert received[1][3]["id"] == 1  # the reply it lacked, sent again
                if old_answers:
                    assert (await old.expect_close()).code == 1001  # the half-open one is let go
                # Else the old connection is never read again: no close reply, no FIN (a dead path).
                await new.send_text('[[1,2,1,{"type":"step","id":2,"data":{"message":"moved"}}]]')
                [[_, _, _, step]] = await entries(new)
                assert step["data"]["observation"]["echoed_message"] == "moved"
                await new.send_text('[[1,3,2,{"type":"close"}]]')
                await new.close()


# -- OpenEnv's stateless HTTP routes get the same bounds --------------------------------


async def test_the_stateless_routes_are_bounded(server_name: ServerName, caplog: pytest.LogCaptureFixture) -> None:
    with anyio.fail_after(LIMIT):
        async with (
            serving(server_name, CountedEnv, max_sessions=1, error_details=False) as server,
            httpx.AsyncClient(timeout=LIMIT) as http,
        ):
            # A body over the limit is refused at its headers, never read.
            head = (
                f"POST /step HTTP/1.1\r\nHost: {server.host}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {17 * 1024 * 1024}\r\n\r\n"
            )
            async with await anyio.connect_tcp(server.host, server.port) as stream:
                await stream.send(head.encode())
                assert (await stream.receive()).startswith(b"HTTP/1.1 413")
            deep = b'{"action":' + b"[" * 5000 + b"]" * 5000 + b"}"
            for path in ("/step", "/reset"):
                response = await http.post(f"{server.url}{path}", content=deep)
                assert response.status_code == 422
            raised = await http.post(f"{server.url}/step", json={"action": {"message": "raise"}})
            assert raised.status_code == 500
            assert "echo env" not in raised.text  # error details hidden
            assert CountedEnv.built == 1
            # Each request's environment takes a slot: none is left while a session holds the only one.
            async with MessageEnv(server.url) as holder:
                await holder.reset()
                refused = await http.post(f"{server.url}/reset", json={})
                assert refused.status_code == 503
            assert CountedEnv.built == 2
    assert [r for r in _server_errors(caplog) if "Traceback" in r or "Exception in ASGI" in r] == []


# -- defect 6: a peer that vanishes without a word ----------------------------------------


def test_connections_have_tcp_keepalive() -> None:
    """A dead peer (no FIN, no RST) is found out by the kernel's keepalive, on every server."""
    listener = _bind("127.0.0.1", 0)
    with listener, socket.create_connection(listener.getsockname()[:2]):
        listener.setblocking(True)
        accepted, _ = listener.accept()
        with accepted:
            assert accepted.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
            if hasattr(socket, "TCP_KEEPIDLE"):
                idle = accepted.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE)
                interval = accepted.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL)
                probes = accepted.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT)
                assert idle + interval * probes <= 120  # found out within two minutes
