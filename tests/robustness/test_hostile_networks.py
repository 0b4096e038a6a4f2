"""Hostile networks II (issue 23): each finding of the second probe, reproduced and shown fixed.

As in `tests.robustness.test_hostile_clients`, each test runs on asyncio and trio against
every real server that hosts the app there (uvicorn and hypercorn on asyncio;
hypercorn, and hypercorn+websockets, openenv's trio server, on trio) where the
finding concerns the server, and checks two things: the hostile or unlucky
client gets a clean, typed answer, and well-behaved sessions go on.
"""

from __future__ import annotations

import base64
import logging
import os
import socket
import struct
import subprocess
import sys
import threading
import time
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import anyio
import httpx
import pytest

import openenv
from openenv import State
from openenv.server import Environment, abandoned_calls
from tests.helpers import ManualClock, all_tasks_blocked, free_port
from tests.robustness.test_hostile_clients import (
    LIMIT,
    MessageEnv,
    RawWebSocket,
    ServerName,
    entries,
    link_ws,
    registry_of,
    serving,
    wait_until,
)

# The fixtures that run each test on each server: uvicorn and hypercorn on asyncio, both hypercorns on trio.
from tests.robustness.test_hostile_clients import anyio_backend as anyio_backend
from tests.robustness.test_hostile_clients import backend_and_server as backend_and_server
from tests.robustness.test_hostile_clients import server_name as server_name
from tests.server.test_server_app import MessageAction, MessageObservation, WireEchoEnv
from transports.server.app import create_app
from transports.shared._public_io import public_io_only

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "transports.cli"]


async def _raw_request(server: Any, head: str) -> tuple[int, bytes]:
    """Send one raw HTTP/1.1 request head (no body); the status and the whole response, read until it closes."""
    async with await anyio.connect_tcp(server.host, server.port) as stream:
        await stream.send(head.encode("latin-1"))
        response = b""
        try:
            while True:
                response += await stream.receive()
                if b"\r\n\r\n" in response and _complete(response):
                    break
        except (anyio.EndOfStream, anyio.BrokenResourceError):
            pass
    return int(response.split(b" ", 2)[1]), response


def _complete(response: bytes) -> bool:
    head, _, body = response.partition(b"\r\n\r\n")
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return len(body) >= int(value)
    return head.startswith(b"HTTP/1.1 101")


def _handshake(server: Any, *, host: str | None = None, extra: tuple[str, ...] = ()) -> str:
    """A WebSocket handshake to ``/ws``, with the ``Host`` given (the server's own by default)."""
    key = base64.b64encode(os.urandom(16)).decode()
    lines = [
        "GET /ws HTTP/1.1",
        f"Host: {host if host is not None else f'{server.host}:{server.port}'}",
        "Upgrade: websocket",
        "Connection: Upgrade",
        f"Sec-WebSocket-Key: {key}",
        "Sec-WebSocket-Version: 13",
        *extra,
    ]
    return "\r\n".join(lines) + "\r\n\r\n"


def _get(path: str, host: str, *extra: str) -> str:
    return "\r\n".join([f"GET {path} HTTP/1.1", f"Host: {host}", *extra]) + "\r\n\r\n"


# -- finding 7: a trailing slash in an allowed origin -----------------------------------


async def test_an_origin_allowed_with_a_trailing_slash_gets_cors_headers(server_name: ServerName) -> None:
    with anyio.fail_after(LIMIT):
        async with (
            serving(server_name, allow_origins=["https://app.example/"]) as server,
            httpx.AsyncClient() as http,
        ):
            answer = await http.get(f"{server.url}/schema", headers={"Origin": "https://app.example"})
            assert answer.status_code == 200
            assert answer.headers["access-control-allow-origin"] == "https://app.example"


# -- finding 7: DNS rebinding (no Host check without a token) ---------------------------


async def test_a_server_without_a_token_answers_only_its_own_hosts(server_name: ServerName) -> None:
    with anyio.fail_after(LIMIT):
        async with serving(server_name) as server:
            port = server.port
            # A page at rebinding.example, resolved to this machine, is same-origin with itself: no Origin.
            for path in ("/schema", "/metadata", "/openapi.json", "/state"):
                status, response = await _raw_request(server, _get(path, f"rebinding.example:{port}"))
                assert status == 403, response
                assert b"host_not_allowed" in response
            status, _ = await _raw_request(server, _handshake(server, host=f"rebinding.example:{port}"))
            assert status == 403
            # Addresses and localhost are served.
            for host in (f"127.0.0.1:{port}", f"localhost:{port}", f"[::1]:{port}", "127.0.0.1"):
                status, response = await _raw_request(server, _get("/schema", host))
                assert status == 200, (host, response)
            async with MessageEnv(server.url) as client:
                assert (await client.step(MessageAction(message="ok"))).reward == 2.0


async def test_the_host_names_a_server_answers_can_be_allowed(server_name: ServerName) -> None:
    with anyio.fail_after(LIMIT):
        async with serving(server_name, create_app(WireEchoEnv, allowed_hosts=["env.internal"])) as server:
            for host in ("env.internal", f"ENV.internal.:{server.port}"):
                status, response = await _raw_request(server, _get("/schema", host))
                assert status == 200, (host, response)
            status, _ = await _raw_request(server, _get("/schema", "other.internal"))
            assert status == 403
        async with serving(server_name, create_app(WireEchoEnv, allowed_hosts=["*"])) as server:
            status, _ = await _raw_request(server, _get("/schema", "other.internal"))
            assert status == 200


async def test_a_server_with_a_token_answers_any_host(server_name: ServerName) -> None:
    with anyio.fail_after(LIMIT):
        async with serving(server_name, auth_token="s3cret") as server:
            status, _ = await _raw_request(server, _get("/schema", "env.example", "Authorization: Bearer s3cret"))
            assert status == 200
            status, _ = await _raw_request(server, _get("/schema", "env.example"))
            assert status == 401


# -- finding 7: a browser cannot send a token on a WebSocket handshake ------------------


def _bearer_entry(token: str) -> str:
    """What a browser offers: ``openenv.bearer.`` and the token in unpadded base64url."""
    return "openenv.bearer." + base64.urlsafe_b64encode(token.encode()).decode().rstrip("=")


async def test_a_browser_can_offer_the_token_as_a_subprotocol(server_name: ServerName) -> None:
    origin = "Origin: https://app.example"
    with anyio.fail_after(LIMIT):
        async with serving(server_name, auth_token="a/token=with:odd+chars", allow_origins=[origin[8:]]) as server:
            offer = f"Sec-WebSocket-Protocol: openenv.v1.json, {_bearer_entry('a/token=with:odd+chars')}"
            status, response = await _raw_request(server, _handshake(server, extra=(origin, offer)))
            assert status == 101, response
            # The token's entry is never selected: the subprotocol the browser asked to speak is.
            assert b"sec-websocket-protocol: openenv.v1.json\r\n" in response.lower()
            wrong = f"Sec-WebSocket-Protocol: openenv.v1.json, {_bearer_entry('another')}"
            status, _ = await _raw_request(server, _handshake(server, extra=(origin, wrong)))
            assert status == 401
            garbled = "Sec-WebSocket-Protocol: openenv.v1.json, openenv.bearer.!!"
            status, _ = await _raw_request(server, _handshake(server, extra=(origin, garbled)))
            assert status == 401


def test_the_bearer_subprotocol_is_a_valid_subprotocol_name() -> None:
    from transports.admission._guard import bearer_subprotocol

    assert bearer_subprotocol("a/b=c:d@e") == _bearer_entry("a/b=c:d@e")
    token_chars = set("!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
    for token in ("s3cret", "a/b=c:d@e", "~" * 64):
        assert set(bearer_subprotocol(token)) <= token_chars


# -- finding 7: a link's numbers out of range, ahead or behind ---------------------------


async def test_a_links_numbers_out_of_range_or_ahead_end_only_that_link(server_name: ServerName) -> None:
    opened = '[1,0,0,{"type":"open"}],[1,1,0,{"type":"reset","id":1,"data":{}}]'
    step = '{"type":"step","id":2,"data":{"message":"x"}}'
    with anyio.fail_after(LIMIT):
        async with serving(server_name) as server, MessageEnv(server.url) as bystander:
            await bystander.reset()
            for seq, ack in ((-1, 1), (2**63, 1), (2**64 + 5, 1), (3, 1), (2, -1), (2, 2**64)):
                async with link_ws(server.ws_url) as ws:
                    await ws.receive()  # the Hello
                    await ws.send_text(f"[{opened}]")
                    await ws.receive()  # the reset's reply
                    await ws.send_text(f"[[1,{seq},{ack},{step}]]")
                    closed = await ws.expect_close()
                    assert closed.code == 1002, (seq, ack)
                await wait_until(lambda: registry_of(server).active == 1, "the link's session ends")
            # A frame sent again (behind the last taken) is dropped, never run twice: the rule of resumption.
            async with link_ws(server.ws_url) as ws:
                await ws.receive()
                await ws.send_text(f"[{opened}]")
                await ws.receive()
                await ws.send_text(f'[[1,2,1,{step}],[1,2,1,{step}],[1,3,1,{{"type":"state","id":3}}]]')
                replies = [entry[3] for entry in await entries(ws)]
                while len(replies) < 2:
                    replies += [entry[3] for entry in await entries(ws)]
                assert [reply["id"] for reply in replies] == [2, 3]
                assert replies[1]["data"]["step_count"] == 1
            assert (await bystander.step(MessageAction(message="unharmed"))).reward is not None


# -- finding 7: the token on the command line --------------------------------------------


def _wait_for_health(url: str, process: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + LIMIT
    while True:
        assert process.poll() is None, f"the server exited: {process.communicate()}"
        try:
            httpx.get(f"{url}/health", timeout=1.0)
            return
        except httpx.TransportError:
            assert time.monotonic() < deadline
            time.sleep(0.05)  # polls a server in another process, which has no event to wait on


def test_the_server_takes_its_token_from_a_file_kept_out_of_the_process_list(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("# rotated monthly\nfrom-a-file\n\nsecond-token\n")
    port = free_port()
    args = [*CLI, "serve", "openenv.examples.echo:EchoEnvironment", "--port", str(port), "--log-level", "warning"]
    environment = {k: v for k, v in os.environ.items() if not k.startswith("OPENENV_AUTH_TOKEN")}
    process = subprocess.Popen(
        [*args, "--auth-token-file", str(token_file)], env=environment, cwd=ROOT, stderr=subprocess.PIPE, text=True
    )
    try:
        url = f"http://127.0.0.1:{port}"
        _wait_for_health(url, process)
        assert httpx.get(f"{url}/schema", timeout=5).status_code == 401
        for token in ("from-a-file", "second-token"):
            assert httpx.get(f"{url}/schema", headers={"Authorization": f"Bearer {token}"}, timeout=5).is_success
        assert b"from-a-file" not in Path(f"/proc/{process.pid}/cmdline").read_bytes()
    finally:
        process.kill()
        _, errors = process.communicate(timeout=10)
    assert "warning" not in errors
    # Given on the command line, it works, and the server says where else to put it.
    shown = subprocess.run(
        [*CLI, "serve", "no_such_module_here:Env", "--auth-token", "on-the-command-line"],
        env=environment,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=LIMIT,
    )
    assert "--auth-token shows the token to anyone who can list processes" in shown.stderr
    assert "OPENENV_AUTH_TOKEN" in shown.stderr
    # A file that cannot be read is one line saying so.
    missing = subprocess.run(
        [*CLI, "serve", "openenv.examples.echo:EchoEnvironment", "--auth-token-file", str(tmp_path / "none")],
        env=environment,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=LIMIT,
    )
    assert missing.returncode != 0
    assert "cannot read" in missing.stderr
    assert "Traceback" not in missing.stderr


# -- finding 7: a session's credentials for anyone presenting its Idempotency-Key -------


async def test_an_idempotent_retry_gets_the_session_only_from_its_own_client(server_name: ServerName) -> None:
    key = {"Idempotency-Key": "k" * 32}
    with anyio.fail_after(LIMIT):
        async with serving(server_name, auth_token=["alice-token", "mallory-token"]) as server:
            sessions = f"{server.url}/poll/sessions"
            async with httpx.AsyncClient() as alice, httpx.AsyncClient() as mallory:
                alice.headers["Authorization"] = "Bearer alice-token"
                mallory.headers["Authorization"] = "Bearer mallory-token"
                created = await alice.post(sessions, headers=key)
                assert created.status_code == 201
                retried = await alice.post(sessions, headers=key)  # its response was lost: the same session
                assert retried.json() == created.json()
                stolen = await mallory.post(sessions, headers=key)  # the key, seen on the way, from another client
                assert stolen.status_code == 201
                assert stolen.json()["session_id"] != created.json()["session_id"]
                assert stolen.json()["session_key"] != created.json()["session_key"]
        async with serving(server_name) as server:  # without a token, the client is its address
            sessions = f"{server.url}/poll/sessions"
            elsewhere = httpx.AsyncHTTPTransport(local_address="127.0.0.2")
            async with httpx.AsyncClient() as here, httpx.AsyncClient(transport=elsewhere) as there:
                created = await here.post(sessions, headers=key)
                assert (await here.post(sessions, headers=key)).json() == created.json()
                other = await there.post(sessions, headers=key)
                assert other.json()["session_id"] != created.json()["session_id"]


# -- finding 6: permessage-deflate on plain hypercorn ------------------------------------


def _compressed_frame(size: int) -> bytes:
    """A masked binary frame with RSV1 set (permessage-deflate): ``size`` zero bytes, deflated."""
    deflate = zlib.compressobj(wbits=-15)
    payload = deflate.compress(bytes(size)) + deflate.flush(zlib.Z_SYNC_FLUSH)
    payload = payload.removesuffix(b"\x00\x00\xff\xff")
    head = bytes((0x80 | 0x40 | 0x2,))  # FIN, RSV1 (compressed), binary
    length = len(payload)
    if length < 126:
        head += bytes((0x80 | length,))
    elif length < 65536:
        head += bytes((0x80 | 126,)) + length.to_bytes(2, "big")
    else:
        head += bytes((0x80 | 127,)) + length.to_bytes(8, "big")
    return head + b"\x00\x00\x00\x00" + payload  # a zero mask leaves the payload as it is


async def test_no_server_negotiates_compression(server_name: ServerName) -> None:
    offer = "Sec-WebSocket-Extensions: permessage-deflate; client_max_window_bits"
    with anyio.fail_after(LIMIT):
        async with serving(server_name) as server, MessageEnv(server.url) as bystander:
            await bystander.reset()
            async with await anyio.connect_tcp(server.host, server.port) as stream:
                await stream.send(_handshake(server, extra=(offer,)).encode())
                response = b""
                while b"\r\n\r\n" not in response:
                    response += await stream.receive()
                assert response.startswith(b"HTTP/1.1 101")
                assert b"sec-websocket-extensions" not in response.lower()
                # A compressed message is a protocol error, never inflated: 64 MiB of zeros, in 64 KiB.
                await stream.send(_compressed_frame(64 * 1024 * 1024))
                closing = b""
                try:
                    while True:
                        closing += await stream.receive()
                except (anyio.EndOfStream, anyio.BrokenResourceError):
                    pass
            # A close frame with 1002 (protocol error), or a dropped connection; not 1009 (inflated first).
            assert b"\x88\x02\x03\xf1" not in closing
            assert (await bystander.step(MessageAction(message="ok"))).reward == 2.0


# -- finding 3: hypercorn had no connection cap ---------------------------------------------


async def test_every_server_caps_its_connections(server_name: ServerName) -> None:
    with anyio.fail_after(LIMIT):
        async with serving(server_name, max_connections=3) as server:
            held = [await anyio.connect_tcp(server.host, server.port) for _ in range(3)]
            try:
                # Uvicorn answers once it has the request; hypercorn at once.
                status, response = await _raw_request(server, _get("/health", f"127.0.0.1:{server.port}"))
                assert status == 503, response
            finally:
                for stream in held:
                    await stream.aclose()

            async def served() -> bool:
                status, _ = await _raw_request(server, _get("/health", f"127.0.0.1:{server.port}"))
                return status == 200

            await wait_until(served, "the held connections are counted out")


def test_the_connection_cap_fits_the_open_file_limit(caplog: pytest.LogCaptureFixture) -> None:
    import resource

    from transports.server.drivers._hypercorn_limits import fit_to_open_files

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (1024, hard))
    try:
        assert fit_to_open_files(1000) == 960
        assert fit_to_open_files(None) == 960
        assert fit_to_open_files(100) == 100
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert "the open-file limit is 1024" in caplog.text


# -- finding 7: tracebacks for a client's mistakes -------------------------------------------

_SERVER_LOGGERS = ("asyncio", "uvicorn", "hypercorn", "openenv", "trio")


def _server_complaints(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        f"{record.name}: {record.getMessage()}"
        for record in caplog.records
        if record.levelno >= logging.WARNING and record.name.startswith(_SERVER_LOGGERS)
    ]


async def test_a_text_message_of_bad_utf8_is_closed_without_a_traceback(
    server_name: ServerName, caplog: pytest.LogCaptureFixture
) -> None:
    with anyio.fail_after(LIMIT):
        async with serving(server_name) as server, MessageEnv(server.url) as bystander:
            await bystander.reset()
            for _ in range(3):
                async with RawWebSocket.connect(server.ws_url) as ws:
                    await ws._stream.send(b"\x81\x82" + b"\x00\x00\x00\x00" + b"\xc3\x28")
                    assert (await ws.expect_close()).code in (1007, None)
            await wait_until(lambda: registry_of(server).active == 1, "the sessions end")
            assert (await bystander.step(MessageAction(message="ok"))).reward == 2.0
    complaints = _server_complaints(caplog)
    if server_name == "uvicorn" and public_io_only():  # the stock protocol's own log line (docs/reliability.md)
        complaints = [line for line in complaints if line != _UVICORN_STOCK_BAD_UTF8]
    assert complaints == []


_UVICORN_STOCK_BAD_UTF8 = "uvicorn.error: Invalid UTF-8 sequence received from client."


async def test_a_ping_flood_then_a_reset_is_not_logged(
    server_name: ServerName, caplog: pytest.LogCaptureFixture
) -> None:
    with anyio.fail_after(LIMIT):
        async with serving(server_name) as server, MessageEnv(server.url) as bystander:
            await bystander.reset()
            async with RawWebSocket.connect(server.ws_url) as flooder:
                await flooder.request('{"type":"reset"}')
                for _ in range(2000):
                    flooder._protocol.send_ping(b"p" * 125)
                flood = b"".join(flooder._protocol.data_to_send())
                with anyio.move_on_after(1):  # as much as the server takes; it may stop reading
                    await flooder._stream.send(flood)
                raw = flooder._stream.extra(anyio.abc.SocketAttribute.raw_socket)
                raw.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close = reset
            await wait_until(lambda: registry_of(server).active == 1, "the flooder's session ends")
            assert (await bystander.step(MessageAction(message="ok"))).reward == 2.0
    assert _server_complaints(caplog) == []


# -- finding 4: --hide-error-details let tool exceptions through -----------------------------


class LeakyTools(openenv.MCPEnvironment[openenv.CallToolAction, openenv.CallToolObservation, openenv.State]):
    """A tool environment whose tools raise with a server path in the message."""

    def reset(self) -> openenv.Observation:
        return openenv.Observation()

    @property
    def state(self) -> openenv.State:
        return openenv.State()

    @openenv.tool
    async def lookup(self, key: str) -> str:
        """Raise, naming a file on the server."""
        raise OSError(f"/srv/secret/{key}.db is locked")

    @openenv.tool
    def plain_lookup(self, key: str) -> str:
        """The same, from a plain tool (run on the session's thread)."""
        raise OSError(f"/srv/secret/{key}.db is locked")


@pytest.mark.parametrize("error_details", [True, False], ids=["details", "hidden"])
async def test_hidden_error_details_cover_tool_exceptions(server_name: ServerName, error_details: bool) -> None:
    def leaks(text: str) -> bool:
        return "/srv/secret" in text

    call = {"jsonrpc": "2.0", "method": "tools/call", "params": {"name": "lookup", "arguments": {"key": "k"}}, "id": 7}
    with anyio.fail_after(LIMIT):
        async with (
            serving(server_name, LeakyTools, error_details=error_details) as server,
            httpx.AsyncClient() as http,
        ):
            texts = []
            for url in (server.url, server.url.replace("http", "http+poll", 1)):
                async with openenv.EnvClient(url) as client:
                    for tool in ("lookup", "plain_lookup"):  # the step observation's error
                        observation = (
                            await client.step(openenv.CallToolAction(tool_name=tool, arguments={"key": "k"}))
                        ).observation
                        texts.append(str(observation))
                        with pytest.raises(openenv.ToolCallError) as raised:  # an mcp frame
                            await client.call_tool(tool, key="k")
                        texts.append(str(raised.value))
            texts.append((await http.post(f"{server.url}/mcp", json=call)).text)
            step = {"action": {"tool_name": "lookup", "arguments": {"key": "k"}}}
            texts.append((await http.post(f"{server.url}/step", json=step)).text)
    assert len(texts) == 10
    assert [leaks(text) for text in texts] == [error_details] * 10, texts


# -- finding 3: slow request bodies ----------------------------------------------------------


async def _trickle(server: Any, head: str, *, trickle: bool) -> bytes:
    """Send a request head declaring a large body, then a byte at a time (or nothing); what the server answers."""
    async with await anyio.connect_tcp(server.host, server.port) as stream:
        await stream.send(head.encode("latin-1"))
        answer = b""

        async def read() -> None:
            nonlocal answer
            try:
                while True:
                    answer += await stream.receive()
            except (anyio.EndOfStream, anyio.BrokenResourceError):
                pass

        async with anyio.create_task_group() as task_group:
            task_group.start_soon(read)
            if trickle:
                try:
                    while True:
                        await stream.send(b" ")
                        await anyio.sleep(0.05)  # the slow client being tested: a byte every 50 ms
                except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
                    pass
        return answer


class _NoteRequests:
    """An ASGI middleware noting the path of every HTTP request that reaches the app."""

    def __init__(self, app: Any, paths: list[str]) -> None:
        self.app = app
        self.paths = paths

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            self.paths.append(scope["path"])
        await self.app(scope, receive, send)


async def test_a_request_body_that_comes_too_slowly_is_cut(server_name: ServerName) -> None:
    clock = ManualClock()  # the app's: the bodies' deadline passes when the test says
    app = create_app(WireEchoEnv, body_timeout=10.0, clock=clock)
    arrived: list[str] = []
    app.add_middleware(_NoteRequests, paths=arrived)  # outside the body deadline's middleware
    with anyio.fail_after(LIMIT):
        async with (
            serving(server_name, app) as server,
            MessageEnv(server.url) as bystander,
            httpx.AsyncClient() as http,
        ):
            await bystander.reset()
            created = (await http.post(f"{server.url}/poll/sessions")).json()
            arrived.clear()
            frames = f"/poll/sessions/{created['session_id']}/frames"
            routes = [  # each declares a body under its route's limit
                ("/reset", 1_000_000, ""),
                ("/poll/sessions", 60_000, ""),
                (frames, 1_000_000, f"OpenEnv-Seq: 1\r\nOpenEnv-Session-Key: {created['session_key']}\r\n"),
            ]
            answers: list[bytes] = []

            async def one(path: str, size: int, extra: str, trickle: bool) -> None:
                head = (
                    f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                    f"Content-Length: {size}\r\n{extra}\r\n"
                )
                answers.append(await _trickle(server, head, trickle=trickle))

            async with anyio.create_task_group() as task_group:
                for path, size, extra in routes:
                    for trickle in (True, False):  # a byte every 50 ms, or none at all
                        task_group.start_soon(one, path, size, extra, trickle)
                await wait_until(lambda: len(arrived) == 2 * len(routes), "every slow request reached the app")
                # Past the deadline (the few bytes trickled add microseconds), within the new session's 30 s.
                await clock.advance_when_blocked(11.0)
            for answer in answers:  # 408, and the connection closed
                assert answer.startswith(b"HTTP/1.1 408"), answer
                assert b"body_timeout" in answer
            assert (await bystander.step(MessageAction(message="ok"))).reward == 2.0
            assert (await http.get(f"{server.url}/health")).status_code == 200


# -- finding 1: the admission queue ----------------------------------------------------------


class _CountCreations:
    """An ASGI middleware counting the requests that ask for an HTTP long-polling session."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.count = 0

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"] == "/poll/sessions":
            self.count += 1
        await self.app(scope, receive, send)


async def test_http_long_polling_clients_wait_in_the_queue_past_their_connect_timeout(
    server_name: ServerName,
) -> None:
    app = create_app(WireEchoEnv, max_sessions=1, queue_timeout=LIMIT)
    counted: list[_CountCreations] = []
    app.add_middleware(lambda inner: counted.append(_CountCreations(inner)) or counted[-1])
    stepped: list[str] = []
    with anyio.fail_after(LIMIT):
        async with serving(server_name, app) as server:
            url = server.url.replace("http", "http+poll", 1)

            async def latecomer(name: str) -> None:
                # Each of its requests gives up after 0.5 s: the queue must keep its place over several.
                # A session of its own (on a link, a queued session waits within its call's timeout).
                async with MessageEnv(url, connect_timeout=0.5, share=False) as client:
                    stepped.append((await client.step(MessageAction(message=name))).observation.echoed_message)

            async with MessageEnv(server.url) as holder:
                await holder.reset()
                async with anyio.create_task_group() as task_group:
                    task_group.start_soon(latecomer, "first")
                    task_group.start_soon(latecomer, "second")
                    await wait_until(lambda: registry_of(server).queued == 2, "both wait")
                    await wait_until(lambda: counted[0].count >= 8, "each asked again past its connect timeout")
                    assert stepped == []
                    await holder.close()  # the slot goes to one, then to the other
            assert sorted(stepped) == ["first", "second"]
            await wait_until(lambda: registry_of(server).active == 0, "nothing abandoned holds a slot")
            assert registry_of(server).queued == 0


async def test_a_queued_creation_whose_client_went_gives_its_place_up(server_name: ServerName) -> None:
    app = create_app(WireEchoEnv, max_sessions=1, queue_timeout=LIMIT)
    with anyio.fail_after(LIMIT):
        async with serving(server_name, app) as server, MessageEnv(server.url) as holder:
            await holder.reset()
            head = "POST /poll/sessions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 0\r\n\r\n"
            async with await anyio.connect_tcp(server.host, server.port) as stream:
                await stream.send(head.encode())
                await wait_until(lambda: registry_of(server).queued == 1, "it waits")
            await wait_until(lambda: registry_of(server).queued == 0, "it gave its place up when its client went")
            await holder.close()
            await wait_until(lambda: registry_of(server).active == 0, "the slot is free, not held by nobody's session")


async def test_a_websocket_client_queued_past_its_connect_timeout_gets_its_session(server_name: ServerName) -> None:
    clock = ManualClock()
    app = create_app(WireEchoEnv, max_sessions=1, queue_timeout=LIMIT)
    with anyio.fail_after(LIMIT):
        async with serving(server_name, app) as server:
            results: list[str] = []

            async def latecomer() -> None:
                async with MessageEnv(server.url, connect_timeout=1.0, clock=clock) as client:
                    results.append((await client.step(MessageAction(message="in"))).observation.echoed_message)

            async with MessageEnv(server.url) as holder:
                await holder.reset()
                async with anyio.create_task_group() as task_group:
                    task_group.start_soon(latecomer)
                    await wait_until(lambda: registry_of(server).queued == 1, "it waits")
                    await all_tasks_blocked()
                    clock.advance(5.0)  # well past its connect timeout: its session waits on its link's channel
                    await holder.close()
            assert results == ["in"]


async def test_a_websocket_client_that_goes_while_queued_gives_its_place_up(server_name: ServerName) -> None:
    app = create_app(WireEchoEnv, max_sessions=1, queue_timeout=LIMIT)
    opened = '[[1,0,0,{"type":"open"}],[1,1,0,{"type":"reset","id":1,"data":{}}]]'
    with anyio.fail_after(LIMIT):
        async with serving(server_name, app) as server, MessageEnv(server.url, share=False) as holder:
            await holder.reset()
            async with RawWebSocket.connect(server.ws_url) as waiting:  # a session of its own: a plain client
                await waiting.send_text('{"type":"reset"}')  # kept for it while it waits
                await wait_until(lambda: registry_of(server).queued == 1, "it waits")
            await wait_until(lambda: registry_of(server).queued == 0, "it gave its place up")
            # Plain hypercorn reports a client's close as 1006, a drop: the link would wait for its client.
            server.app.state.websocket.resume_timeout = 0.2
            async with link_ws(server.ws_url) as link:
                await link.receive()  # the Hello
                await link.send_text(opened)
                await wait_until(lambda: registry_of(server).queued == 1, "the link's session waits")
                await link.send_text(
                    '[[1,0,0,{"type":"end","reason":"given up","code":1000}]]'
                )  # it leaves the channel
                await wait_until(lambda: registry_of(server).queued == 0, "it gave its place up")
                await link.send_text(opened.replace("[1,", "[2,"))
                await wait_until(lambda: registry_of(server).queued == 1, "another waits")
                await link.close()
            await wait_until(lambda: registry_of(server).queued == 0, "its place is given up with the link")
            assert registry_of(server).active == 1


# -- finding 8: fairness, a per-client quota ----------------------------------------------------


async def test_a_client_at_its_quota_leaves_room_for_the_others(server_name: ServerName) -> None:
    app = create_app(WireEchoEnv, auth_token=["alice", "bob"], max_sessions=4, max_sessions_per_client=2)
    with anyio.fail_after(LIMIT):
        async with serving(server_name, app) as server, httpx.AsyncClient() as http:
            polling = server.url.replace("http", "http+poll", 1)
            async with (
                MessageEnv(server.url, auth_token="alice") as first,
                MessageEnv(polling, auth_token="alice") as second,
            ):
                await first.reset()
                await second.reset()
                for url in (server.url, polling):
                    with pytest.raises(openenv.CapacityReachedError, match="quota"):
                        async with MessageEnv(url, auth_token="alice") as third:
                            await third.reset()
                refused = await http.post(f"{server.url}/reset", json={}, headers={"Authorization": "Bearer alice"})
                assert refused.status_code == 503
                assert "quota" in refused.json()["detail"]
                async with MessageEnv(server.url, auth_token="bob") as other, MessageEnv(polling, auth_token="bob"):
                    assert (await other.step(MessageAction(message="fair"))).reward == 4.0
            async with MessageEnv(server.url, auth_token="alice") as again:  # its sessions ended: room again
                assert (await again.step(MessageAction(message="again"))).reward == 5.0


async def test_without_a_token_the_quota_is_per_address(server_name: ServerName) -> None:
    app = create_app(WireEchoEnv, max_sessions_per_client=1)
    with anyio.fail_after(LIMIT):
        async with serving(server_name, app) as server:
            sessions = f"{server.url}/poll/sessions"
            elsewhere = httpx.AsyncHTTPTransport(local_address="127.0.0.2")
            async with httpx.AsyncClient() as here, httpx.AsyncClient(transport=elsewhere) as there:
                assert (await here.post(sessions)).status_code == 201
                refused = await here.post(sessions)
                assert refused.status_code == 503
                assert refused.headers["openenv-error"] == "CAPACITY_REACHED"
                assert (await there.post(sessions)).status_code == 201


def test_the_quota_counts_sessions_queued_and_held() -> None:
    from transports.admission._sessions import SessionRegistry

    registry = SessionRegistry(max_sessions=2, queue_timeout=LIMIT, max_sessions_per_client=2)
    first = registry.open(client="a")
    assert first is not None
    assert registry.open(client="b") is not None
    ticket = registry.enqueue(client="a")  # the server is full: "a" waits, its second
    assert ticket is not None
    assert registry.position(ticket) == 1
    assert registry.over_quota("a")
    assert registry.enqueue(client="a") is None  # a third, even queued, is past its quota
    assert "quota" in registry.capacity_reached_message("a")
    assert "capacity" in registry.capacity_reached_message("c")
    first.release()  # its slot goes to the ticket: "a" holds one now
    assert ticket.admitted.is_set()
    assert ticket.lease is not None
    assert registry.active == 2
    assert not registry.over_quota("a")
    assert registry.open(client="a") is None  # the server is full
    registry.leave(ticket)  # not wanted any more: its lease is released
    assert registry.active == 1
    second_for_a = registry.open(client="a")  # the place it gave up is free
    assert second_for_a is not None
    assert registry.position(ticket) == 0
    registry.close_all()
    assert registry.enqueue(client="d") is None  # closing: no queue


# -- finding 2: no server-wide cap on unacknowledged HTTP replies -------------------------------


async def test_replies_nobody_acknowledges_are_bounded_server_wide(server_name: ServerName) -> None:
    from tests.robustness.test_hostile_clients import PollSession, _poll_session

    size = 200_000
    budget = 1_000_000
    step = b'{"type":"step","id":%d,"data":{"message":"' + b"z" * size + b'"}}'
    with anyio.fail_after(LIMIT):
        async with serving(server_name) as server, httpx.AsyncClient(timeout=LIMIT) as http:
            server.app.state.http_polling.max_unacknowledged_total = budget
            sessions: list[PollSession] = [await _poll_session(http, server) for _ in range(4)]
            accepted = 0
            sent = [0] * len(sessions)
            for round_number in range(6):
                for index, session in enumerate(sessions):
                    seq = sent[index] + 1
                    response = await session.post(seq, step % seq)  # acknowledging nothing
                    if response.status_code == 200:
                        sent[index] = seq
                        accepted += 1
                    else:
                        assert response.status_code == 409
                        assert response.json()["error"]["code"] == "too_many_unacknowledged"
                    if round_number == 0:
                        assert response.status_code == 200  # one request is always let in
            # Past the first request of each, what they keep fits the budget: not 64 MiB a session.
            assert accepted <= len(sessions) + budget // size
            # A client that acknowledges gets on; so does a well-behaved one.
            first = sessions[0]
            seq = sent[0] + 1
            assert (await first.post(seq, step % seq, ack=sent[0])).status_code == 200
            async with MessageEnv(server.url.replace("http", "http+poll", 1)) as client:
                assert (await client.step(MessageAction(message="fine"))).reward == 4.0


# -- finding 5: a step that never returns ---------------------------------------------------------


class EndlessPlainEnv(Environment[MessageAction, MessageObservation, State]):
    """Plain methods; a step of "block" blocks its thread until the test opens the gate (it never would)."""

    entered: ClassVar[threading.Event] = threading.Event()
    gate: ClassVar[threading.Event] = threading.Event()
    closed: ClassVar[list[str]] = []

    def reset(self, **kwargs: Any) -> MessageObservation:
        return MessageObservation()

    def step(self, action: MessageAction) -> MessageObservation:
        if action.message == "block":
            EndlessPlainEnv.entered.set()
            EndlessPlainEnv.gate.wait(LIMIT)  # bounded: a failed test still lets the thread go
        return MessageObservation(echoed_message=action.message)

    @property
    def state(self) -> State:
        return State()

    def close(self) -> None:
        EndlessPlainEnv.closed.append(threading.current_thread().name)


class EndlessAsyncEnv(WireEchoEnv):
    """A step of "block", a coroutine, waits for ever (until cancelled)."""

    entered: ClassVar[anyio.Event]

    async def step(self, action: MessageAction) -> MessageObservation:
        if action.message == "block":
            EndlessAsyncEnv.entered.set()
            await anyio.sleep_forever()
        return MessageObservation(echoed_message=action.message)


@pytest.fixture
def endless() -> Iterator[None]:
    EndlessPlainEnv.entered.clear()
    EndlessPlainEnv.gate.clear()
    EndlessPlainEnv.closed.clear()
    EndlessAsyncEnv.entered = anyio.Event()
    try:
        yield
    finally:
        EndlessPlainEnv.gate.set()


async def _entered(plain: bool) -> None:
    if plain:
        await anyio.to_thread.run_sync(EndlessPlainEnv.entered.wait, LIMIT)
    else:
        await EndlessAsyncEnv.entered.wait()


async def _drop(ws: RawWebSocket) -> None:
    """Leave without a word: the socket reset, no closing handshake."""
    raw = ws._stream.extra(anyio.abc.SocketAttribute.raw_socket)
    raw.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    await ws._stream.aclose()


async def _newcomer_steps(server: Any) -> None:
    async with MessageEnv(server.url) as newcomer:
        assert (await newcomer.step(MessageAction(message="in"))).observation.echoed_message == "in"


@pytest.mark.parametrize("plain", [True, False], ids=["plain-step", "async-step"])
@pytest.mark.parametrize("channel", ["websocket", "link", "http"])
async def test_the_slot_of_a_step_whose_client_went_is_freed(
    server_name: ServerName, plain: bool, channel: str, endless: None
) -> None:
    from tests.robustness.test_hostile_clients import _poll_session

    factory = EndlessPlainEnv if plain else EndlessAsyncEnv
    clock = ManualClock()  # the server's: its client counts as gone only once the test lets time pass
    app = create_app(factory, max_sessions=1, resume_timeout=10 * LIMIT, clock=clock)  # past the wall's bound
    with anyio.fail_after(LIMIT):
        async with serving(server_name, app) as server:
            if channel == "http":
                async with httpx.AsyncClient(timeout=LIMIT) as http:
                    session = await _poll_session(http, server)
                    headers = {
                        "Content-Type": "application/json",
                        "OpenEnv-Seq": "1",
                        "OpenEnv-Wait": "0",
                        **session.key,
                    }
                    frame = b'{"type":"step","id":1,"data":{"message":"block"}}'
                    assert (await http.post(session.frames, content=frame, headers=headers)).status_code == 204
                    await _entered(plain)
                # ... and never asks again.
            elif channel == "link":  # its client gone, and not back within the resume timeout
                async with link_ws(server.ws_url) as ws:
                    await ws.receive()  # the Hello
                    await ws.send_text(
                        '[[1,0,0,{"type":"open"}],[1,1,0,{"type":"step","id":1,"data":{"message":"block"}}]]'
                    )
                    await _entered(plain)
                    await _drop(ws)
            else:
                async with RawWebSocket.connect(server.ws_url) as ws:
                    await ws.send_text('{"type":"step","id":1,"data":{"message":"block"}}')
                    await _entered(plain)
                    await _drop(ws)
            async with anyio.create_task_group() as task_group:
                # Past a long step's first look (1 s), the HTTP idle timeout (300 s), the resume timeout (600 s).
                task_group.start_soon(clock.keep_advancing, 60.0)
                await wait_until(lambda: registry_of(server).active == 0, "the slot is freed")
                task_group.cancel_scope.cancel()
            await _newcomer_steps(server)
            if plain:  # its thread runs on, and closes the environment once the step returns
                assert abandoned_calls() == 1
                EndlessPlainEnv.gate.set()
                await wait_until(lambda: abandoned_calls() == 0, "the thread is done")
                await wait_until(lambda: len(EndlessPlainEnv.closed) == 2, "both environments closed")
                assert EndlessPlainEnv.closed[0].startswith("openenv-session")


@pytest.mark.parametrize("plain", [True, False], ids=["plain-step", "async-step"])
async def test_a_step_past_the_step_timeout_ends_its_session(
    server_name: ServerName, plain: bool, endless: None
) -> None:
    factory = EndlessPlainEnv if plain else EndlessAsyncEnv
    clock = ManualClock()  # the server's: only the step the test lets run long passes the step timeout
    app = create_app(factory, max_sessions=4, step_timeout=30.0, clock=clock)  # room for two abandoned threads
    with anyio.fail_after(LIMIT):
        async with serving(server_name, app) as server:
            for url in (server.url, server.url.replace("http", "http+poll", 1)):
                EndlessPlainEnv.entered.clear()
                EndlessAsyncEnv.entered = anyio.Event()

                async def run_past_the_step_timeout() -> None:
                    await _entered(plain)
                    await clock.advance_when_blocked(31.0)

                async with MessageEnv(url) as client, anyio.create_task_group() as task_group:
                    task_group.start_soon(run_past_the_step_timeout)
                    with pytest.raises(openenv.ConnectionClosed, match="step timeout"):
                        await client.step(MessageAction(message="block"))
                await wait_until(lambda: registry_of(server).active == 0, "the slot is freed")
                await _newcomer_steps(server)
            EndlessPlainEnv.gate.set()
            await wait_until(lambda: abandoned_calls() == 0, "the threads are done")


async def test_abandoned_threads_are_bounded_by_the_slots(server_name: ServerName, endless: None) -> None:
    app = create_app(EndlessPlainEnv, max_sessions=1)
    with anyio.fail_after(LIMIT):
        async with serving(server_name, app) as server:
            registry = registry_of(server)
            for round_number in range(2):
                EndlessPlainEnv.entered.clear()
                async with RawWebSocket.connect(server.ws_url) as ws:
                    await ws.send_text('{"type":"step","data":{"message":"block"}}')
                    await _entered(plain=True)
                    await _drop(ws)
                if round_number == 0:
                    await wait_until(lambda: registry.active == 0, "the first is abandoned: its slot freed")
            # The second is given up on too, but one thread already runs abandoned: it keeps its slot.
            await wait_until(lambda: registry.leases()[0].given_up, "the second is given up on")
            assert abandoned_calls() == 1
            assert registry.active == 1
            EndlessPlainEnv.gate.set()  # both steps return
            await wait_until(lambda: registry.active == 0, "its step returned: the slot is freed")
            await wait_until(lambda: abandoned_calls() == 0, "the abandoned thread is done")


def test_the_registry_watches_long_requests_without_any_idle_timeout() -> None:
    from transports.admission._sessions import CLIENT_GONE_REASON, STEP_TIMEOUT_REASON, SessionRegistry

    now = [0.0]

    class HandClock(openenv.Clock):
        def now(self) -> float:
            return now[0]

    registry = SessionRegistry(step_timeout=10.0, clock=HandClock())  # no idle timeout at all
    assert registry.reap_interval is None  # the reaper still runs: every LONG_STEP, for the requests
    lease = registry.open()
    assert lease is not None
    noticed: list[str] = []
    lease.on_long_step = lambda: noticed.append("long")
    lease.on_give_up = lambda: noticed.append("given up")
    lease.mark_busy()
    now[0] = 0.5
    registry.watch_steps()
    now[0] = 1.0
    registry.watch_steps()
    now[0] = 5.0
    registry.watch_steps()
    assert noticed == ["long"]  # once per request
    now[0] = 10.5
    assert registry.watch_steps() == [lease]
    assert (noticed, lease.close_reason) == (["long", "given up"], STEP_TIMEOUT_REASON)
    assert registry.watch_steps() == []  # once
    # A client that notes its asking (HTTP) and stops while its request runs has gone.
    registry = SessionRegistry(transport_idle_timeouts={"http": 3.0}, clock=HandClock())
    lease = registry.open(transport="http")
    assert lease is not None
    lease.on_give_up = lambda: None
    lease.seen()
    lease.mark_busy()
    now[0] += 2.0
    lease.seen()  # it polls for the reply
    now[0] += 2.0
    assert registry.watch_steps() == []
    now[0] += 2.0
    assert registry.watch_steps() == [lease]
    assert lease.close_reason == CLIENT_GONE_REASON
