"""MCP sessions made over HTTP: OpenEnv 0.10's "production mode" of ``POST /mcp``.

OpenEnv 0.10's ``MCPToolClient`` does not open a session the usual way (one per
WebSocket connection). It asks for one over HTTP, attaches a WebSocket to it,
calls tools over HTTP naming it, and closes it over HTTP:

```text
POST /mcp {"method": "openenv/session/create"}                      -> {"result": {"session_id": "…"}}
GET  /ws?session_id=…   (WebSocket: reset, step, state, as on any /ws connection)
POST /mcp {"method": "tools/call", "params": {"name", "arguments", "session_id"}}
POST /mcp {"method": "openenv/session/close", "params": {"session_id"}}
        -> {"session_id", "closed": true}, or {"closed": false, "closing": true} while
           a WebSocket is attached: the session then ends when the WebSocket does
```

`MCPSessions` holds these sessions for one app. Each is hosted by a task of its
own, running the environment through `openenv.server.serve_frames` over an
in-memory queue of requests; HTTP requests naming it and the frames of its
attached WebSocket join that queue, so the session serves one request at a
time, in order, whoever sends it. A WebSocket's ``close`` request detaches it
and leaves the session open, as OpenEnv's server does.

Bounds: each session holds a slot of the app's `SessionRegistry`
(``CAPACITY_REACHED`` is a JSON-RPC ``-32000`` error here, with
``active_sessions`` and ``max_sessions``). Its idle timeout counts only while no
WebSocket is attached and no request is in hand: a session whose client keeps
a connection open is never reaped as idle (see ``docs/reliability.md``).
"""

from __future__ import annotations

import contextlib
import logging
import uuid
from collections import deque
from collections.abc import Callable
from typing import Any

import anyio
import msgspec
from anyio.abc import TaskGroup
from websockets.frames import CloseCode

from openenv import ConnectionClosed, Dialect
from openenv.server import (
    ServerSession,
    SessionMetrics,
    encode_fatal_error,
    factory_error_message,
    factory_name,
    jsonrpc_error,
    serve_frames,
)
from transports.admission._lease import SessionLease
from transports.admission._sessions import SessionRegistry
from transports.shared._asgi import Receive, Send

__all__ = ["SESSION_CLOSE", "SESSION_CREATE", "MCPSessions", "is_session_request"]

logger = logging.getLogger("openenv.server")

SESSION_CREATE = "openenv/session/create"
"""The JSON-RPC method that makes a session: its result is ``{"session_id": ...}``."""
SESSION_CLOSE = "openenv/session/close"
"""The JSON-RPC method that ends a session named by ``params.session_id``."""

_SERVER_ERROR = -32000
_INVALID_REQUEST = -32600
_INVALID_PARAMS = -32602
_INTERNAL_ERROR = -32603

# Seconds an attached WebSocket is given to close first after its close request (as on /ws).
_CLOSE_GRACE = 1.0


class _SessionEnded(Exception):
    """The session ended before a request could be answered."""


class _Request:
    """One request frame waiting for the session, and then its reply."""

    __slots__ = ("answered", "failure", "frame", "reply")

    def __init__(self, frame: bytes) -> None:
        self.frame = frame
        self.reply: bytes | None = None
        self.failure: str | None = None
        self.answered = anyio.Event()


class _MCPSession:
    """One session made over HTTP: its slot, its queue of requests, and who is attached to it."""

    def __init__(self, session_id: str) -> None:
        self.id = session_id
        self.lease: SessionLease | None = None
        self.scope = anyio.CancelScope()  # the hosting task's: the registry cancels it to end the session
        self.attachment: anyio.CancelScope | None = None  # the attached WebSocket's, while one is
        self.closing = False  # its client asked to close it
        self.ended = anyio.Event()
        self.end_reason = ""
        self._queue: deque[_Request] = deque()
        self._current: _Request | None = None
        self._wake: anyio.Event | None = None

    @property
    def attached(self) -> bool:
        return self.attachment is not None

    def wake(self) -> None:
        if self._wake is not None:
            self._wake.set()

    async def request(self, frame: bytes) -> bytes:
        """Queue a request frame for the session and return its reply; `_SessionEnded` if it ends first."""
        if self.ended.is_set():
            raise _SessionEnded(self.end_reason)
        request = _Request(frame)
        self._queue.append(request)
        self.wake()
        await request.answered.wait()
        if request.reply is None:
            raise _SessionEnded(request.failure or self.end_reason)
        return request.reply

    # -- the hosting task's channel (serve_frames) --------------------------------

    async def receive(self) -> bytes:
        lease = self.lease
        assert lease is not None
        self._finish(None)  # a request that got no reply (none does today): let its sender go
        while not self._queue:
            if lease.close_reason is not None:
                raise ConnectionClosed(lease.close_reason)
            if self.closing and not self.attached:
                raise ConnectionClosed("closed by its client")
            lease.touch()  # waiting: the idle clock runs, unless a WebSocket is attached
            self._wake = anyio.Event()
            await self._wake.wait()
            self._wake = None
        lease.mark_busy()
        self._current = self._queue.popleft()
        return self._current.frame

    async def send(self, frame: bytes) -> None:
        self._finish(frame)

    def _finish(self, reply: bytes | None) -> None:
        request, self._current = self._current, None
        if request is not None:
            request.reply = reply
            request.answered.set()

    def end(self, reason: str) -> None:
        """The session is over: every request still waiting fails, and an attached WebSocket is let go."""
        self.end_reason = reason
        self.ended.set()
        waiting = [self._current, *self._queue] if self._current is not None else list(self._queue)
        self._current = None
        self._queue.clear()
        for request in waiting:
            request.failure = reason
            request.answered.set()
        if self.attachment is not None:
            self.attachment.cancel()


def is_session_request(message: dict[str, Any]) -> bool:
    """Whether a JSON-RPC request to ``POST /mcp`` is about an MCP session rather than stateless.

    Args:
        message: The request, decoded.

    Returns:
        ``True`` for ``openenv/session/create`` and ``openenv/session/close``, and
        for any request whose ``params`` name a ``session_id``.
    """
    if message.get("method") in (SESSION_CREATE, SESSION_CLOSE):
        return True
    params = message.get("params")
    return isinstance(params, dict) and bool(params.get("session_id"))


class MCPSessions:
    """The MCP sessions of one app made over ``POST /mcp`` (see the module's docs).

    Args:
        factory: Builds one environment per session.
        registry: The app's session registry: each session holds a slot.
        error_details: Whether errors name the server's exceptions (see
            `openenv.server.ServerSession`).
        metrics: Where the sessions' requests are counted, or ``None``.
    """

    def __init__(
        self,
        factory: Callable[[], Any],
        *,
        registry: SessionRegistry,
        error_details: bool = True,
        metrics: SessionMetrics | None = None,
    ) -> None:
        self.factory = factory
        self.registry = registry
        self.error_details = error_details
        self.metrics = metrics
        self._sessions: dict[str, _MCPSession] = {}
        self._task_group: TaskGroup | None = None

    def __len__(self) -> int:
        return len(self._sessions)

    @property
    def attached_count(self) -> int:
        """How many sessions have a WebSocket attached now."""
        return sum(session.attached for session in self._sessions.values())

    async def run(self) -> None:
        """Host the sessions until cancelled (the app's lifespan runs it); their environments close then."""
        try:
            async with anyio.create_task_group() as task_group:
                self._task_group = task_group
                await anyio.sleep_forever()
        finally:
            self._task_group = None

    # -- POST /mcp -----------------------------------------------------------------

    async def handle(self, message: dict[str, Any], client: str | None = None) -> dict[str, Any]:
        """Answer a JSON-RPC request about a session (`is_session_request`).

        Args:
            message: The request: ``jsonrpc``, ``method``, ``params``, ``id``.
            client: Who sent it (`transports.admission._guard.client_of`): a new session
                counts toward that client's quota (``max_sessions_per_client``).

        Returns:
            The JSON-RPC response, as OpenEnv 0.10's server words it.
        """
        request_id = message.get("id")
        params = message.get("params", {})
        if not isinstance(params, dict):
            return jsonrpc_error(_INVALID_PARAMS, "Params must be an object", request_id)
        method = message.get("method")
        if method == SESSION_CREATE:
            return await self._create(request_id, client)
        session_id = params.get("session_id")
        if not session_id or not isinstance(session_id, str):
            return jsonrpc_error(_INVALID_PARAMS, "Invalid params - 'session_id' is required", request_id)
        session = self._sessions.get(session_id)
        if session is None or session.ended.is_set():
            return jsonrpc_error(_INVALID_PARAMS, f"Unknown session_id: {session_id}", request_id)
        if method == SESSION_CLOSE:
            return await self._close(session, request_id)
        frame = msgspec.json.encode({"type": "mcp", "data": message})
        try:
            reply = msgspec.json.decode(await session.request(frame))
        except _SessionEnded as exc:
            return jsonrpc_error(_INTERNAL_ERROR, f"Session {session_id} ended: {exc}", request_id)
        if reply.get("type") == "mcp":
            return reply["data"]  # type: ignore[no-any-return]
        return jsonrpc_error(_INVALID_REQUEST, reply.get("data", {}).get("message", ""), request_id)

    async def _create(self, request_id: Any, client: str | None) -> dict[str, Any]:
        task_group = self._task_group
        if task_group is None:
            message = "the server's lifespan is not running: it cannot host sessions"
            return jsonrpc_error(_SERVER_ERROR, message, request_id)
        session = _MCPSession(str(uuid.uuid4()))
        lease = await self.registry.admit(transport="mcp", on_close=session.scope.cancel, client=client)
        if lease is None:
            registry = self.registry
            data = {"active_sessions": registry.active, "max_sessions": registry.max_sessions}
            return jsonrpc_error(_SERVER_ERROR, registry.capacity_reached_message(client), request_id, data)
        try:
            env = self.factory()
        except Exception as exc:
            lease.release()
            logger.exception("environment factory failed")
            message = factory_error_message(exc, error_details=self.error_details)
            if not self.error_details:
                return jsonrpc_error(_SERVER_ERROR, message, request_id)
            return jsonrpc_error(_SERVER_ERROR, message, request_id, {"factory_name": factory_name(self.factory)})
        session.lease = lease
        self._sessions[session.id] = session
        served = ServerSession(env, error_details=self.error_details, on_end=lease.vacate, metrics=self.metrics)
        task_group.start_soon(self._host, session, served)
        logger.info("MCP session %s… opened", session.id[:8])
        return {"jsonrpc": "2.0", "id": request_id, "result": {"session_id": session.id}}

    async def _host(self, session: _MCPSession, served: ServerSession) -> None:
        lease = session.lease
        assert lease is not None
        reason = "closed by its client"
        try:
            with session.scope:
                await serve_frames(served, session.receive, session.send)
            if lease.close_reason is not None:
                reason = lease.close_reason
        finally:
            if lease.close_reason is not None:
                reason = lease.close_reason
            session.end(reason)
            self._sessions.pop(session.id, None)
            lease.release()
            logger.info("MCP session %s… ended (%s)", session.id[:8], reason)

    async def _close(self, session: _MCPSession, request_id: Any) -> dict[str, Any]:
        session.closing = True
        if session.attached:  # it ends when its WebSocket does
            result: dict[str, Any] = {"session_id": session.id, "closed": False, "closing": True}
            return {"jsonrpc": "2.0", "id": request_id, "result": result}
        session.wake()
        await session.ended.wait()
        return {"jsonrpc": "2.0", "id": request_id, "result": {"session_id": session.id, "closed": True}}

    # -- /ws?session_id=… ------------------------------------------------------------

    async def attach(self, session_id: str, asgi_receive: Receive, asgi_send: Send) -> None:
        """Serve an accepted WebSocket connection attached to a session (``/ws?session_id=…``).

        Its frames go to the session as any request does; a ``close`` request
        detaches it and leaves the session open. An unknown session, or one that
        has a WebSocket already, gets one ``SESSION_ERROR`` frame, then the
        connection is closed. While it is attached the session is exempt from
        idle reaping.

        Args:
            session_id: The session named in the query string.
            asgi_receive: The connection's ASGI ``receive``.
            asgi_send: The connection's ASGI ``send``.
        """
        session = self._sessions.get(session_id)
        refusal = None
        if session is None or session.ended.is_set():
            refusal = f"Unknown session_id: {session_id}"
        elif session.attached:
            refusal = f"Session {session_id} already has an attached WebSocket"
        if refusal is not None or session is None:
            await _send_text(asgi_send, encode_fatal_error(_PLAIN, "SESSION_ERROR", refusal or ""))
            await _close_after_grace(asgi_receive, asgi_send, CloseCode.NORMAL_CLOSURE, "")
            return
        lease = session.lease
        assert lease is not None
        scope = session.attachment = anyio.CancelScope()
        lease.connected = True
        client_left = detached = False
        try:
            with scope:
                while True:
                    message = await asgi_receive()
                    kind = message["type"]
                    if kind == "websocket.disconnect":
                        client_left = True
                        break
                    if kind != "websocket.receive":
                        continue
                    text = message.get("text")
                    if text is None:
                        error = "Invalid JSON: expected a text frame, got a binary frame"
                        await _send_text(asgi_send, encode_fatal_error(_PLAIN, "INVALID_JSON", error))
                        continue
                    frame = text.encode()
                    if _is_close(frame):
                        detached = True
                        break
                    try:
                        reply = await session.request(frame)
                    except _SessionEnded:
                        break
                    await _send_text(asgi_send, reply)
        except OSError:  # the client went away while we wrote
            client_left = True
        finally:
            session.attachment = None
            lease.connected = False
            if lease.idle_since is not None:
                lease.touch()  # idle from now, not from before it was attached
            session.wake()  # a close asked for meanwhile takes effect now
        if client_left:
            return
        if detached:
            await _close_after_grace(asgi_receive, asgi_send, CloseCode.NORMAL_CLOSURE, "")
        else:  # the session ended on the server's side
            await _close(asgi_send, CloseCode.GOING_AWAY, session.end_reason)


_PLAIN = Dialect()


class _FrameType(msgspec.Struct):
    type: str = ""


_decode_type = msgspec.json.Decoder(_FrameType).decode


def _is_close(frame: bytes) -> bool:
    try:
        return _decode_type(frame).type == "close"
    except msgspec.DecodeError:
        return False


async def _send_text(asgi_send: Send, frame: bytes) -> None:
    await asgi_send({"type": "websocket.send", "text": frame.decode()})


async def _close(asgi_send: Send, code: int, reason: str) -> None:
    with contextlib.suppress(OSError, RuntimeError):  # gone, or closed already
        await asgi_send({"type": "websocket.close", "code": code, "reason": reason})


async def _close_after_grace(asgi_receive: Receive, asgi_send: Send, code: int, reason: str) -> None:
    """Let the client close first (OpenEnv's does, after a close request); close after a grace otherwise."""
    with anyio.move_on_after(_CLOSE_GRACE):
        with contextlib.suppress(OSError):
            while (await asgi_receive())["type"] != "websocket.disconnect":
                pass
            return
    await _close(asgi_send, code, reason)
