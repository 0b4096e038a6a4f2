"""OpenEnv's plain HTTP routes: ``POST /reset``, ``POST /step``, ``GET /state``, ``POST /mcp`` and ``/openapi.json``.

These are OpenEnv's "simulation mode" HTTP API, for the tools that speak it
(``openenv validate --url``, curl, OpenEnv's own clients). Like the reference
server's, they are stateless: each request builds a fresh environment from the
factory, runs one request on it through an I/O-free `openenv.server.ServerSession`
(so validation, reset keywords and threads behave as on ``/ws``), and closes it.
An episode spanning requests needs ``/ws`` or HTTP long-polling.

```text
POST /reset   {"seed": 42, "episode_id": "ep-1"}    -> {"observation": {...}, "reward": r, "done": d, "metadata": m}
POST /step    {"action": {...}}                       -> {"observation": {...}, "reward": r, "done": d, "metadata": m}
GET  /state                                                 -> the state of a fresh environment
POST /mcp     {"jsonrpc": "2.0", "method": "tools/list", "id": 1}  -> a JSON-RPC 2.0 response (always 200)
GET  /openapi.json                                          -> OpenAPI 3.1, with the environment's schemas
```

A request that does not fit gets ``422`` with ``{"detail": [errors]}``; an
environment that raises, ``500`` with ``{"detail": message}``. Each request's
environment takes a slot in the app's session registry while it lives (``503``
at capacity), and a body over the app's message limit gets ``413`` before it is
read whole.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

import anyio
import anyio.to_thread
import msgspec
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

import openenv
from openenv._codec import MAX_NESTING, nested_deeper_than
from openenv.server import (
    SERVER_DEFAULTS,
    ServerSession,
    SessionMetrics,
    factory_error_message,
    factory_name,
    jsonrpc_error,
)
from transports.admission._guard import client_of
from transports.admission._lease import SessionLease
from transports.admission._sessions import (
    CLIENT_GONE_REASON,
    STEP_TIMEOUT_REASON,
    GivingUp,
    SessionRegistry,
)
from transports.server._json_response import JSONResponse
from transports.server.routes._mcp_sessions import MCPSessions, is_session_request
from transports.shared._deprecated import renamed_option

__all__ = ["OPENAPI_VERSION", "openapi_document", "openenv_http_routes"]

OPENAPI_VERSION = "1.0.0"
"""The version of OpenEnv's HTTP API these routes implement (``info.version`` of ``/openapi.json``)."""

logger = logging.getLogger("openenv.server")

_PARSE_ERROR = -32700
_INVALID_REQUEST = -32600


class ResetRequest(msgspec.Struct, kw_only=True):
    """The body of ``POST /reset`` (optional), for ``/openapi.json``.

    Any other keyword is passed on too, if the environment's ``reset`` takes it.

    Attributes:
        seed: The episode's random seed.
        episode_id: The episode's id.
    """

    seed: int | None = None
    episode_id: str | None = None


class StepRequest(msgspec.Struct, kw_only=True):
    """The body of ``POST /step``.

    Attributes:
        action: The action's fields.
        timeout_s: Accepted for OpenEnv's clients, and unused (as on ``/ws``).
    """

    action: dict[str, Any]
    timeout_s: float | None = None


class HealthResponse(msgspec.Struct):
    """The answer of ``GET /health``.

    Attributes:
        status: Always ``"healthy"``.
    """

    status: str = "healthy"


class JSONRPCRequest(msgspec.Struct, kw_only=True):
    """A JSON-RPC 2.0 request to ``POST /mcp``, for ``/openapi.json``.

    Attributes:
        jsonrpc: Always ``"2.0"``.
        method: ``"tools/list"`` or ``"tools/call"``.
        params: The method's parameters (``name`` and ``arguments`` for a call).
        id: The request's id, echoed in the response.
    """

    jsonrpc: str
    method: str
    params: dict[str, Any] = msgspec.field(default_factory=dict)
    id: int | str | None = None


class _Limits:
    """What bounds the routes (the session registry, the largest body, how much errors say), and what counts them."""

    def __init__(
        self,
        registry: SessionRegistry | None,
        max_message_size: int,
        error_details: bool,
        metrics: SessionMetrics | None,
        name: str,
    ) -> None:
        self.registry = registry
        self.max_message_size = max_message_size
        self.error_details = error_details
        self.metrics = metrics
        self.name = name


class _TooLarge(Exception):
    """A request body over the limit."""


async def _run_one(
    factory: Callable[[], Any], frame: dict[str, Any], limits: _Limits, request: Request
) -> dict[str, Any]:
    """Build an environment, run one request frame on it, close it; return the reply frame."""
    registry = limits.registry
    lease = None
    if registry is not None:
        client = client_of(request.scope)
        lease = await registry.admit(transport="http-stateless", client=client)
        if lease is not None:
            lease.mark_busy()  # one request, in hand for the environment's whole life
        else:
            message = registry.capacity_reached_message(client)
            return {"type": "error", "data": {"code": "CAPACITY_REACHED", "message": message}}
    reply: bytes | None = None
    try:
        with anyio.CancelScope() as scope:
            giving_up = GivingUp(registry, lease, scope.cancel) if registry is not None and lease is not None else None
            async with anyio.create_task_group() as beside:
                if lease is not None:  # a request that runs long: watch for its client going
                    lease.on_long_step = functools.partial(beside.start_soon, _give_up_when_gone, request, lease)
                try:
                    env = factory()
                except Exception as exc:
                    logger.exception("environment factory failed")
                    message = factory_error_message(exc, error_details=limits.error_details)
                    return {"type": "error", "data": {"code": "FACTORY_ERROR", "message": message}}
                session = ServerSession(
                    env, error_details=limits.error_details, metrics=limits.metrics, name=limits.name
                )
                if giving_up is not None:
                    giving_up.hosted(session)
                try:
                    reply = await session.handle(msgspec.json.encode(frame))
                finally:
                    await session.aclose()
                    beside.cancel_scope.cancel()
    finally:
        if lease is not None:
            lease.release()
    if reply is None:  # given up on: past the step timeout (its client, if gone, reads nothing)
        reason = lease.close_reason if lease is not None else None
        message = f"the request was ended by the server ({reason or STEP_TIMEOUT_REASON})"
        return {"type": "error", "data": {"code": "EXECUTION_ERROR", "message": message}}
    return msgspec.json.decode(reply)  # type: ignore[no-any-return]


async def _give_up_when_gone(request: Request, lease: SessionLease) -> None:
    """Wait for the request's client to go (its ``http.disconnect``); then end its request."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
    lease.give_up(CLIENT_GONE_REASON)


def _observation_or_error(reply: dict[str, Any]) -> Response:
    data = reply.get("data", {})
    if reply.get("type") != "error":
        # OpenEnv 0.10's response models always have ``metadata``: null when the observation has none.
        return JSONResponse(data if "metadata" in data else {**data, "metadata": None})
    if data.get("code") == "VALIDATION_ERROR":
        return JSONResponse({"detail": data.get("errors", [])}, status_code=422)
    if data.get("code") == "CAPACITY_REACHED":
        return JSONResponse({"detail": data.get("message", "")}, status_code=503, headers={"Retry-After": "1"})
    return JSONResponse({"detail": data.get("message", "")}, status_code=500)


async def _body(request: Request, limit: int) -> bytes:
    """The request's body, refused (`_TooLarge`) as soon as it is known to pass ``limit`` bytes."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and (len(declared) > 18 or int(declared) > limit):
        raise _TooLarge
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise _TooLarge
        chunks.append(chunk)
    return b"".join(chunks)


def _too_large(limit: int) -> Response:
    detail = [{"type": "too_large", "loc": ["body"], "msg": f"the body exceeds {limit} bytes"}]
    return JSONResponse({"detail": detail}, status_code=413)


async def _json_body(request: Request, limit: int) -> Any:
    body = await _body(request, limit)
    try:
        decoded = msgspec.json.decode(body) if body.strip() else None
    except RecursionError as exc:  # msgspec's guard: nested too deeply to be a request
        raise msgspec.DecodeError("JSON is nested too deeply") from exc
    _check_depth(body)
    return decoded


def _check_depth(body: bytes) -> None:
    """Refuse (`msgspec.DecodeError`) a decoded body nested deeper than a session's frames may be.

    msgspec's own guard is the stack, whose depth depends on the Python (3.13
    decodes 5,000 levels): the bound is the codec's, on every Python.
    """
    if body.count(b"[") + body.count(b"{") > MAX_NESTING and nested_deeper_than(body, MAX_NESTING):
        raise msgspec.DecodeError(f"JSON is nested deeper than {MAX_NESTING} levels")


def _body_error(exc: msgspec.DecodeError) -> Response:
    return JSONResponse({"detail": [{"type": "json_invalid", "loc": ["body"], "msg": str(exc)}]}, status_code=422)


def openapi_document(schemas: dict[str, dict[str, Any]], metadata: openenv.EnvironmentMetadata) -> dict[str, Any]:
    """The OpenAPI 3.1 document of an app made by `transports.server.app.create_app`.

    Args:
        schemas: What ``GET /schema`` answers (``action``, ``observation``, ``state``).
        metadata: What ``GET /metadata`` answers.

    Returns:
        The document: ``info.version`` is `OPENAPI_VERSION`; the environment's
        own schemas are under ``components.schemas`` as ``Action``,
        ``Observation`` and ``State``.
    """
    template = "#/components/schemas/{name}"
    (reset_ref, step_ref, _, rpc_ref), components = msgspec.json.schema_components(
        [ResetRequest, StepRequest, HealthResponse, JSONRPCRequest], ref_template=template
    )
    components["Action"] = schemas["action"]
    components["Observation"] = schemas["observation"]
    components["State"] = schemas["state"]
    components["Metadata"] = msgspec.json.schema(openenv.EnvironmentMetadata)
    components["StepResponse"] = {
        "type": "object",
        "properties": {
            "observation": {"type": "object"},
            "reward": {"anyOf": [{"type": "boolean"}, {"type": "number"}, {"type": "null"}]},
            "done": {"type": "boolean"},
        },
        "required": ["observation", "reward", "done"],
    }

    def ok(ref: str, description: str) -> dict[str, Any]:
        content = {"application/json": {"schema": {"$ref": template.format(name=ref)}}}
        return {"200": {"description": description, "content": content}}

    def body(ref: dict[str, Any], required: bool = True) -> dict[str, Any]:
        return {"required": required, "content": {"application/json": {"schema": ref}}}

    errors = {"422": {"description": "The request does not fit"}, "500": {"description": "The environment raised"}}
    paths = {
        "/health": {"get": {"summary": "Health check", "responses": ok("HealthResponse", "Healthy")}},
        "/metadata": {"get": {"summary": "Environment metadata", "responses": ok("Metadata", "The metadata")}},
        "/schema": {
            "get": {
                "summary": "JSON Schemas of the action, observation and state",
                "responses": {"200": {"description": "The schemas"}},
            }
        },
        "/reset": {
            "post": {
                "summary": "Reset a fresh environment",
                "requestBody": body(reset_ref, required=False),
                "responses": {**ok("StepResponse", "The first observation"), **errors},
            }
        },
        "/step": {
            "post": {
                "summary": "Take one step in a fresh environment",
                "requestBody": body(step_ref),
                "responses": {**ok("StepResponse", "The observation"), **errors},
            }
        },
        "/state": {"get": {"summary": "The state of a fresh environment", "responses": ok("State", "The state")}},
        "/mcp": {
            "post": {
                "summary": "MCP JSON-RPC 2.0 (tools/list, tools/call)",
                "requestBody": body(rpc_ref),
                "responses": {"200": {"description": "A JSON-RPC 2.0 response"}},
            }
        },
    }
    return {
        "openapi": "3.1.0",
        "info": {
            "title": f"{metadata.name}: OpenEnv Environment HTTP API",
            "version": OPENAPI_VERSION,
            "description": metadata.description,
            "x-openenv-package-version": openenv.__version__,
        },
        "paths": paths,
        "components": {"schemas": components},
    }


def openenv_http_routes(
    factory: Callable[[], Any],
    *,
    schemas: dict[str, dict[str, Any]],
    metadata: openenv.EnvironmentMetadata | Callable[[], openenv.EnvironmentMetadata],
    registry: SessionRegistry | None = None,
    max_message_size: int = SERVER_DEFAULTS.max_message_size,
    error_details: bool = True,
    mcp_sessions: MCPSessions | None = None,
    max_body_size: int | None = None,
    metrics: SessionMetrics | None = None,
) -> list[BaseRoute]:
    """OpenEnv's stateless HTTP routes for an environment factory (see the module's docs).

    Args:
        factory: Builds one environment per request.
        schemas: What ``GET /schema`` answers, for ``/openapi.json``.
        metadata: What ``GET /metadata`` answers, for ``/openapi.json``; or a function that
            reads it (called on a worker thread at the first request: it may build an environment).
        registry: The app's session registry: each request's environment holds
            a slot while it lives (``503`` at capacity); ``None`` for no limit.
        max_message_size: The largest request body, in bytes (``413`` beyond).
        error_details: Whether errors name the server's exceptions (see
            `openenv.server.ServerSession`).
        mcp_sessions: Where ``POST /mcp`` requests about a session go
            (``openenv/session/create``, ``openenv/session/close``, and any naming
            a ``session_id``: OpenEnv 0.10's production mode); ``None`` answers
            them statelessly too.
        max_body_size: Deprecated: ``max_message_size``.
        metrics: Where the requests are counted (as a session's), or ``None``.

    Returns:
        The routes: ``POST /reset``, ``POST /step``, ``GET /state``, ``POST /mcp``, ``GET /openapi.json``.
    """
    if max_body_size is not None:
        max_message_size = renamed_option("openenv_http_routes", "max_body_size", "max_message_size", max_body_size)
    documents: list[bytes] = []  # /openapi.json, made at its first request

    def document() -> bytes:
        described = metadata() if callable(metadata) else metadata
        return msgspec.json.encode(openapi_document(schemas, described))

    limits = _Limits(registry, max_message_size, error_details, metrics, factory_name(factory))

    async def reset(request: Request) -> Response:
        try:
            kwargs = await _json_body(request, max_message_size)
        except _TooLarge:
            return _too_large(max_message_size)
        except msgspec.DecodeError as exc:
            return _body_error(exc)
        if kwargs is None:
            kwargs = {}
        if not isinstance(kwargs, dict):
            detail = [{"type": "dict_type", "loc": ["body"], "msg": "Input should be a valid dictionary"}]
            return JSONResponse({"detail": detail}, status_code=422)
        return _observation_or_error(await _run_one(factory, {"type": "reset", "data": kwargs}, limits, request))

    async def step(request: Request) -> Response:
        try:
            raw = await _body(request, max_message_size)
            body = msgspec.json.decode(raw, type=StepRequest)
            _check_depth(raw)
        except _TooLarge:
            return _too_large(max_message_size)
        except msgspec.ValidationError as exc:
            errors = [{"type": "value_error", "loc": ["body"], "msg": str(exc)}]
            return JSONResponse({"detail": errors}, status_code=422)
        except msgspec.DecodeError as exc:
            return _body_error(exc)
        except RecursionError as exc:
            return _body_error(msgspec.DecodeError(f"JSON is nested too deeply ({exc})"))
        return _observation_or_error(await _run_one(factory, {"type": "step", "data": body.action}, limits, request))

    async def state(request: Request) -> Response:
        reply = await _run_one(factory, {"type": "state"}, limits, request)
        if reply.get("type") == "error":
            return _observation_or_error(reply)
        return JSONResponse(reply["data"])

    async def mcp(request: Request) -> Response:
        try:
            message = await _json_body(request, max_message_size)
        except _TooLarge:
            return _too_large(max_message_size)
        except msgspec.DecodeError:
            return JSONResponse(jsonrpc_error(_PARSE_ERROR, "Parse error"))
        if not isinstance(message, dict):
            return JSONResponse(jsonrpc_error(_INVALID_REQUEST, "Invalid Request"))
        if message.get("jsonrpc") != "2.0" or not isinstance(message.get("method"), str):
            request_id = message.get("id")
            return JSONResponse(jsonrpc_error(_INVALID_REQUEST, "Invalid Request", request_id))
        if mcp_sessions is not None and is_session_request(message):
            return JSONResponse(await mcp_sessions.handle(message, client_of(request.scope)))
        reply = await _run_one(factory, {"type": "mcp", "data": message}, limits, request)
        if reply.get("type") == "error":
            return JSONResponse(jsonrpc_error(_INVALID_REQUEST, reply["data"].get("message", ""), message.get("id")))
        return JSONResponse(reply["data"])

    async def openapi(request: Request) -> Response:
        if not documents:
            documents.append(await anyio.to_thread.run_sync(document))
        return Response(documents[0], media_type="application/json")

    return [
        Route("/reset", reset, methods=["POST"], name="reset"),
        Route("/step", step, methods=["POST"], name="step"),
        Route("/state", state, methods=["GET"], name="state"),
        Route("/mcp", mcp, methods=["POST"], name="mcp"),
        Route("/openapi.json", openapi, methods=["GET"], name="openapi"),
    ]
