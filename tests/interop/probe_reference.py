"""Probe the reference openenv-core 0.3.0 server with raw frames; print what it does.

Run with the reference venv's python (it has ``websockets``):

    python probe_reference.py                 # starts its own reference servers
    python probe_reference.py --url http://127.0.0.1:PORT --cap-url http://127.0.0.1:PORT2

(``--cap-url`` must be a reference_server.py started with ``--max-sessions 1``.)
Prints one JSON object per case on stdout: what was sent, every frame received
(verbatim text), and how the socket ended. Every wait is bounded.
This is the evidence behind NOTES.md; rerun it after upgrading anything.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import sys
import urllib.request
from pathlib import Path
from typing import Any

# Skip the reference's eager gradio import (see reference_server.py).
sys.modules.setdefault("openenv.core.env_server.web_interface", None)  # type: ignore[arg-type]

import websockets  # noqa: E402
from websockets.asyncio.client import connect  # noqa: E402
from websockets.exceptions import ConnectionClosed, InvalidHandshake  # noqa: E402

RECV_TIMEOUT = 3.0
OPEN_TIMEOUT = 10.0


def out(case: str, **fields: Any) -> None:
    print(json.dumps({"case": case, **fields}, default=repr), flush=True)


def show(item: Any) -> Any:
    """How a sent frame appears in the output (long ones abbreviated)."""
    if isinstance(item, bytes):
        return {"binary": item.hex()} if len(item) <= 200 else {"binary_bytes": len(item)}
    return item if len(item) <= 200 else f"<text frame of {len(item)} bytes: {item[:60]}...>"


def ws_url(base: str) -> str:
    return base.replace("http://", "ws://", 1).rstrip("/") + "/ws"


async def drain(ws, n_max: int = 5, timeout: float = RECV_TIMEOUT) -> tuple[list[Any], dict[str, Any] | None]:
    """Receive up to n_max frames until a timeout or close; return (frames, close_info)."""
    frames: list[Any] = []
    for _ in range(n_max):
        try:
            msg = await asyncio.wait_for(ws.recv(), timeout)
        except TimeoutError:
            return frames, None
        except ConnectionClosed as exc:
            rcvd = exc.rcvd
            return frames, {
                "code": rcvd.code if rcvd else None,
                "reason": rcvd.reason if rcvd else None,
                "sent_code": exc.sent.code if exc.sent else None,
            }
        frames.append(msg if isinstance(msg, str) else {"binary": msg.hex()})
    return frames, None


async def exchange(url: str, sends: list[Any], case: str, per_send: int = 1, **connect_kw: Any) -> None:
    """One connection; send each item (str -> text frame, bytes -> binary), record replies."""
    async with connect(ws_url(url), open_timeout=OPEN_TIMEOUT, close_timeout=3, **connect_kw) as ws:
        log = []
        closed = None
        for item in sends:
            if closed:
                log.append({"sent": show(item), "skipped": "closed"})
                continue
            try:
                await ws.send(item)
            except ConnectionClosed as exc:
                closed = {"code": exc.rcvd.code if exc.rcvd else None, "on": "send"}
                log.append({"sent": show(item), "send_failed": closed})
                continue
            frames: list[Any] = []
            for _ in range(per_send):
                got, closed = await drain(ws, n_max=1)
                frames += got
                if closed or not got:
                    break
            entry: dict[str, Any] = {"sent": show(item), "received": frames}
            if closed:
                entry["closed"] = closed
            log.append(entry)
        out(case, exchanges=log)


async def case_handshake_headers(url: str) -> None:
    """Raw HTTP upgrade offering a subprotocol and deflate; show the server's reply head."""
    host, port = url.split("//", 1)[1].rstrip("/").split(":")
    for name, protos in (("unknown_subprotocol", "openenv.v1, something-else"), ("no_subprotocol", None)):
        req = (
            "GET /ws HTTP/1.1\r\n"
            f"Host: {host}:{port}\r\n"
            "Upgrade: websocket\r\nConnection: Upgrade\r\n"
            "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
            "Sec-WebSocket-Extensions: permessage-deflate; client_max_window_bits\r\n"
            + (f"Sec-WebSocket-Protocol: {protos}\r\n" if protos else "")
            + "\r\n"
        )
        with socket.create_connection((host, int(port)), timeout=5) as s:
            s.settimeout(5)
            s.sendall(req.encode())
            data = b""
            while b"\r\n\r\n" not in data:
                chunk = s.recv(4096)
                if not chunk:
                    break
                data += chunk
        out(
            f"handshake_{name}",
            request_subprotocols=protos,
            response_head=data.split(b"\r\n\r\n")[0].decode("latin-1").split("\r\n"),
        )
    # And with the websockets client offering a subprotocol: does it accept a reply without one?
    try:
        async with connect(ws_url(url), open_timeout=OPEN_TIMEOUT, subprotocols=["openenv.v1"]) as ws:
            await ws.send('{"type":"state"}')
            frames, closed = await drain(ws, 1)
            out("websockets_client_offering_subprotocol", selected=ws.subprotocol, received=frames, closed=closed)
    except InvalidHandshake as exc:
        out("websockets_client_offering_subprotocol", handshake_error=f"{type(exc).__name__}: {exc}")


async def case_reference_client_handshake() -> None:
    """What does the reference GenericEnvClient send in its upgrade request? Capture it on a dummy socket."""
    captured: dict[str, Any] = {}
    got = asyncio.Event()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
            captured["request_head"] = head.decode("latin-1").rstrip("\r\n").split("\r\n")
        finally:
            got.set()
            writer.write(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            await writer.drain()
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    from openenv.core import GenericEnvClient

    client = GenericEnvClient(base_url=f"http://127.0.0.1:{port}", connect_timeout_s=5)
    try:
        await client.connect()
    except Exception as exc:
        captured["connect_error"] = f"{type(exc).__name__}: {exc}"[:300]
    await asyncio.wait_for(got.wait(), 5)
    server.close()
    await server.wait_closed()
    captured["ws_url_for_http_base"] = client._ws_url
    captured["max_size_bytes"] = client._max_message_size
    captured["ws_url_conversions"] = {
        u: GenericEnvClient(base_url=u)._ws_url
        for u in ("http://h:1", "https://h:1/", "h:1", "ws://h:1/prefix/", "wss://h")
    }
    out("reference_client_handshake", **captured)


async def case_capacity(cap_url: str) -> None:
    """Server started with --max-sessions 1: second connection while the first is open."""
    async with connect(ws_url(cap_url), open_timeout=OPEN_TIMEOUT) as a:
        await a.send('{"type": "reset", "data": {}}')
        first, _ = await drain(a, 1)
        try:
            async with connect(ws_url(cap_url), open_timeout=OPEN_TIMEOUT) as b:
                # Do not send anything: does the server volunteer the error?
                unprompted, closed = await drain(b, 3, timeout=3)
                after = None
                if not closed:
                    try:
                        await b.send('{"type": "reset", "data": {}}')
                        after, closed = await drain(b, 2)
                    except ConnectionClosed as exc:
                        closed = {"code": exc.rcvd.code if exc.rcvd else None, "on": "send"}
                out(
                    "capacity_second_connection",
                    handshake="accepted",
                    response_status=b.response.status_code,
                    first_conn_reply=first,
                    received_without_sending=unprompted,
                    received_after_send=after,
                    closed=closed,
                )
        except InvalidHandshake as exc:
            out("capacity_second_connection", handshake_error=f"{type(exc).__name__}: {exc}")
        # The reference client against a full server: connect() vs first call vs later calls.
        from openenv.core import GenericEnvClient

        client = GenericEnvClient(base_url=cap_url, connect_timeout_s=5, message_timeout_s=5)
        steps: list[Any] = []
        for name, call in (
            ("connect", client.connect),
            ("reset", client.reset),
            ("state", client.state),
            ("close", client.close),
        ):
            try:
                res = await asyncio.wait_for(call(), 10)
                steps.append({name: "ok", "result": repr(res)[:200]})
            except Exception as exc:
                steps.append({name: f"{type(exc).__name__}: {exc}"[:300]})
        out("capacity_reference_client", calls=steps)
        # first connection still fine?
        await a.send('{"type": "state"}')
        still, _ = await drain(a, 1)
        out("capacity_first_connection_after", received=still)
    # after the first closes, can a new one get in?
    await asyncio.sleep(0.5)
    async with connect(ws_url(cap_url), open_timeout=OPEN_TIMEOUT) as c:
        await c.send('{"type": "state"}')
        again, closed = await drain(c, 1)
        out("capacity_after_release", received=again, closed=closed)


def http_get(url: str, path: str) -> Any:
    with urllib.request.urlopen(url.rstrip("/") + path, timeout=10) as r:
        return {"status": r.status, "content_type": r.headers.get("content-type"), "body": json.loads(r.read())}


def http_post(url: str, path: str, body: Any) -> Any:
    req = urllib.request.Request(
        url.rstrip("/") + path,
        data=json.dumps(body).encode(),
        headers={"content-type": "application/json"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return {"status": r.status, "body": json.loads(r.read())}
    except urllib.error.HTTPError as e:
        return {"status": e.code, "body": json.loads(e.read() or b"null")}


async def run_all(url: str, cap_url: str | None) -> None:
    out("versions", websockets=websockets.__version__, python=sys.version.split()[0])
    for path in ("/health", "/schema", "/metadata", "/state"):
        out(f"GET {path}", **http_get(url, path))
    out("POST /reset", **http_post(url, "/reset", {"seed": 42, "episode_id": "ep-1"}))
    out("POST /step", **http_post(url, "/step", {"action": {"message": "hello"}}))
    out("POST /step invalid", **http_post(url, "/step", {"action": {"messag": "typo"}}))

    await exchange(
        url,
        [
            '{"type": "reset", "data": {"seed": 42, "episode_id": "ep-1"}}',
            '{"type": "step", "data": {"message": "hello"}}',
            '{"type": "state"}',
            '{"type": "step", "data": {"messag": "typo"}}',
            '{"type": "bogus"}',
            "not json",
            '{"type": "step", "data": {"message": "raise"}}',
            '{"type": "state"}',
            '{"type": "close"}',
        ],
        "wire_doc_sequence_then_close",
    )

    await exchange(
        url,
        [
            '{"type": "step", "id": 1, "data": {"message": "hi"}}',
            '{"type": "reset", "id": 1, "data": {}}',
            '{"type": "state", "id": 1}',
            '{"type": "state", "data": {}}',
            '{"type": "close", "data": {}}',
            '{"type": "step", "data": {"message": "hi", "id": 1}}',
            '{"type": "step"}',
            '{"type": "step", "data": "hi"}',
            '{"type": "step", "data": {"message": 5}}',
            '{"type": "step", "data": {"message": "hi", "metadata": {"k": 1}}}',
            '{"data": {}}',
            '{"type": null}',
            '{"type": "reset", "data": {"seed": 1, "episode_id": "ep-x", "foo": "bar"}}',
            '{"type": "reset", "data": {"seed": "not-an-int"}}',
            '{"type": "reset"}',
            '{"type": "state"}',
            '{"type": "step", "data": {"message": "done"}}',
            '{"type": "step", "data": {"message": "after-done"}}',
            '{"type": "mcp", "data": {"jsonrpc": "2.0", "id": 7, "method": "tools/list", "params": {}}}',
            '{"type": "mcp", "data": {"nonsense": true}}',
        ],
        "strictness_per_message_errors",
    )

    async with connect(ws_url(url), open_timeout=OPEN_TIMEOUT) as ws:
        for i in range(3):
            await ws.send(json.dumps({"type": "step", "data": {"message": f"p{i}"}}))
        await ws.send("not json")
        await ws.send('{"type": "state"}')
        frames, closed = await drain(ws, 5)
        out("pipelined_5_frames_then_read", received=frames, closed=closed)

    await exchange(
        url, ['{"type": "step", "data": {"message": "before-reset"}}', '{"type": "state"}'], "step_before_reset"
    )
    await exchange(url, [b'{"type": "state"}', '{"type": "state"}'], "binary_frame")
    await exchange(url, ["[1, 2]", '{"type": "state"}'], "json_array_not_object")
    await exchange(url, ['"just a string"', '{"type": "state"}'], "json_string_not_object")
    await exchange(url, ['{"type": "close"}', '{"type": "state"}'], "close_message_reply")
    await exchange(
        url,
        ['{"type": "step", "data": {"message": "' + "x" * (17 * 1024 * 1024) + '"}}'],
        "oversized_17MiB_text_frame_uncompressed",
        max_size=None,
        compression=None,
    )
    await exchange(
        url,
        ['{"type": "step", "data": {"message": "' + "x" * (17 * 1024 * 1024) + '"}}'],
        "oversized_17MiB_text_frame_deflated",
        max_size=None,
    )
    await exchange(url, ['{"type": "state"}'], "compression_disabled_client", compression=None)

    async with connect(ws_url(url), open_timeout=OPEN_TIMEOUT) as ws:
        out(
            "negotiated_extensions_default_client",
            response_headers={k: v for k, v in ws.response.headers.raw_items()},
            subprotocol=ws.subprotocol,
        )

    await case_handshake_headers(url)
    await case_reference_client_handshake()
    if cap_url:
        await case_capacity(cap_url)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url")
    p.add_argument("--cap-url")
    args = p.parse_args()
    if args.url:
        asyncio.run(run_all(args.url, args.cap_url))
        return 0
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from reference_venv import ReferenceServer  # stdlib-only helper beside this file

    with (
        ReferenceServer(Path(sys.executable), max_sessions=4) as srv,
        ReferenceServer(Path(sys.executable), max_sessions=1) as cap,
    ):
        asyncio.run(asyncio.wait_for(run_all(srv.base_url, cap.base_url), 300))
    return 0


if __name__ == "__main__":
    sys.exit(main())
