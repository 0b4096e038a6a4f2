"""The ASGI app that serves one environment over every server-side transport.

`create_app` builds a Starlette app with:

- ``/ws``: the WebSocket endpoint (`transports.websocket._server.WebSocketEndpoint`);
- ``/poll/sessions``…: the HTTP long-polling endpoint (`transports.http.HTTPPollingEndpoint`);
- ``GET /health`` → ``{"status": "healthy"}``;
- ``GET /schema`` → ``{"action", "observation", "state"}`` JSON Schemas;
- ``GET /metadata`` → the environment's `openenv.EnvironmentMetadata`;
- ``GET /metrics`` → Prometheus' metrics, with ``metrics=True`` (see `transports._metrics`).

Its lifespan runs the idle-session reaper and the HTTP sessions' host task.
Everything a further transport's routes need is kept on ``app.state``:
``app.state.sessions`` (the one `SessionRegistry`, shared by every transport, so
``max_sessions`` counts all sessions), ``app.state.factory``,
``app.state.schemas`` and ``app.state.metadata``. A transport that adds routes
appends them with `mount_routes`, before the app serves its first request, with
any task they need running for the app's lifetime:

```text
app = create_app(EchoEnvironment, max_sessions=8)
endpoint = MyEndpoint(app.state.factory, registry=app.state.sessions)
mount_routes(app, endpoint.routes(), lifespan_tasks=[endpoint.run])
```
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

import anyio
import msgspec
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route, WebSocketRoute

from openenv import EnvironmentMetadata
from openenv.server import (
    DEFAULT_BODY_TIMEOUT,
    DEFAULT_MAX_SESSIONS,
    DEFAULT_SESSION_IDLE_TIMEOUT,
    check_factory,
    environment_metadata,
    environment_schemas,
    factory_name,
    load_factory,
)

from ._body_deadline import BodyDeadline
from ._guard import RequestGuard, auth_tokens_from, normalized_origins
from ._sessions import SessionRegistry
from .http._protocol import (
    ACK_HEADER,
    DEFAULT_MAX_BODY_SIZE,
    ERROR_HEADER,
    IDEMPOTENCY_KEY_HEADER,
    RECEIVED_HEADER,
    SEQ_HEADER,
    SESSION_KEY_HEADER,
    WAIT_HEADER,
)
from .http._server import DEFAULT_IDLE_TIMEOUT, HTTPPollingEndpoint
from .openenv_http import openenv_http_routes
from .websocket._server import WebSocketEndpoint

__all__ = [
    "DEFAULT_MAX_SESSIONS",
    "DEFAULT_SESSION_IDLE_TIMEOUT",
    "create_app",
    "environment_metadata",
    "environment_schemas",
    "mount_routes",
]


class _JSONResponse(Response):
    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return msgspec.json.encode(content)


def mount_routes(
    app: Starlette,
    routes: Sequence[BaseRoute],
    *,
    lifespan_tasks: Sequence[Callable[[], Awaitable[object]]] = (),
) -> None:
    """Add a transport's routes to an app made by `create_app`.

    This is the extension point for further transports: their routes share
    ``app.state.sessions`` (capacity and idle reaping) and ``app.state.factory``
    with ``/ws`` and ``/poll``. Call it before the app serves.

    Examples:
        A route that reports how many sessions are open:

        ```python
        import httpx
        from starlette.requests import Request
        from starlette.responses import PlainTextResponse
        from starlette.routing import Route

        import openenv
        from openenv.examples.echo import EchoEnvironment
        from transports.app import create_app, mount_routes


        async def active_sessions(request: Request) -> PlainTextResponse:
            return PlainTextResponse(str(request.app.state.sessions.active))


        app = create_app(EchoEnvironment)
        mount_routes(app, [Route("/sessions", active_sessions)])
        async with openenv.serve(app) as server, httpx.AsyncClient() as client:
            print((await client.get(f"{server.url}/sessions")).text)  # 0
        ```

    Args:
        app: The app, made by `create_app`.
        routes: Starlette routes to append.
        lifespan_tasks: Coroutine functions to run, each as a task, for the
            app's lifetime (cancelled when it stops).
    """
    app.router.routes.extend(routes)
    app.state.lifespan_tasks.extend(lifespan_tasks)


def create_app(
    factory: Callable[[], Any] | str,
    *,
    max_sessions: int | None = DEFAULT_MAX_SESSIONS,
    session_idle_timeout: float | None = DEFAULT_SESSION_IDLE_TIMEOUT,
    metadata: EnvironmentMetadata | None = None,
    http_idle_timeout: float | None = DEFAULT_IDLE_TIMEOUT,
    http_max_body_size: int = DEFAULT_MAX_BODY_SIZE,
    auth_token: str | Sequence[str] | None = None,
    allow_origins: Sequence[str] = (),
    error_details: bool = True,
    queue_timeout: float | None = None,
    allowed_hosts: Sequence[str] = (),
    body_timeout: float = DEFAULT_BODY_TIMEOUT,
    max_sessions_per_client: int | None = None,
    step_timeout: float | None = None,
    metrics: bool = False,
) -> Starlette:
    """Build the ASGI app that serves an environment.

    One app speaks every server-side transport: WebSocket at ``/ws``, HTTP
    long-polling under ``/poll/sessions``; plus ``/health``, ``/schema`` and
    ``/metadata``. Serve it with `transports.runner.serve` or
    `transports.runner.run`, or with any ASGI server (``uvicorn module:app``).

    Examples:
        ```python
        from openenv.examples.echo import EchoEnv, EchoEnvironment
        from transports.app import create_app
        from transports.runner import serve

        app = create_app(EchoEnvironment, max_sessions=4, session_idle_timeout=300.0)
        async with serve(app) as server:
            async with EchoEnv(server.url) as env:
                await env.reset()
            print(sorted(app.state.schemas))  # ['action', 'observation', 'state']
        ```

    Args:
        factory: Builds one environment per session: an `openenv.Environment`
            subclass, a function, or its ``"package.module:Factory"`` name.
        max_sessions: The most sessions open at once over all transports
            (256 by default); a client beyond it gets ``CAPACITY_REACHED``.
            ``None`` for no limit.
        session_idle_timeout: Seconds a session may wait for its client's next
            request before the server ends it (600 by default); ``None`` for never.
        metadata: What ``GET /metadata`` answers; by default taken from the
            factory (see `environment_metadata`).
        http_idle_timeout: The same for HTTP long-polling sessions, whose
            clients cannot be seen leaving: a session nobody deletes ends after
            it (or after ``session_idle_timeout``, if shorter). ``None`` leaves
            only ``session_idle_timeout``.
        http_max_body_size: The largest request frame the HTTP long-polling
            endpoint accepts, in bytes (16 MiB, as over WebSocket).
        auth_token: The bearer token every request but ``GET /health`` must
            carry (``Authorization: Bearer <token>``), or several (any one is
            accepted); ``None`` takes it from ``OPENENV_AUTH_TOKEN`` if that is
            set; ``()`` accepts requests without one. A missing or wrong token
            gets ``401`` before any environment is built.
        allow_origins: The browser origins (``"https://app.example"``; ``"*"``
            for any) whose requests are accepted, with CORS headers. A request
            with any other ``Origin`` gets ``403``; requests without one (every
            client but a browser) are not affected.
        error_details: Whether error replies say what failed on the server:
            the exception an environment or its factory raised, and the
            factory's name (OpenEnv's behaviour). ``False`` sends generic
            messages, so no path or module name leaves the server; the log
            keeps the details.
        queue_timeout: Seconds a new session may wait for a slot when
            ``max_sessions`` are open, admitted in arrival order as slots free
            up, before it gets ``CAPACITY_REACHED``; ``None`` (the default)
            refuses it at once, as OpenEnv does.
        allowed_hosts: Host names (``"env.internal"``; ``"*"`` for any) a
            server without a token answers, beside IP addresses and
            ``localhost``: a request for any other ``Host`` gets ``403``, so
            a web page cannot reach the server by a name of its own (DNS
            rebinding). With a token, every ``Host`` is answered.
        body_timeout: Seconds a request's body may take to arrive once the
            app reads it, plus one for every 64 KiB received (10 by default);
            a slower body gets ``408`` and its connection is closed.
        max_sessions_per_client: The most sessions one client may hold at
            once, over all transports, queued ones included; a client is the
            token it presents, or else its address. Past it the client gets
            ``CAPACITY_REACHED`` saying so, and other clients are unaffected.
            ``None`` (the default) for no quota: a trainer often runs all its
            sessions from one process with one token.
        step_timeout: Seconds one request (a reset, a step, a tool call) may
            run before the server gives up on it: the session ends (WebSocket
            close 1001 "step timeout"; an HTTP session ends with that reason)
            and frees its slot. A plain (``def``) step cannot be stopped: it
            runs on in its thread until it returns. ``None`` (the default)
            lets a step run as long as its client stays: a step may take
            minutes (an evaluation, a long tool call). A step whose client
            has gone is given up on in any case.
        metrics: Serve ``GET /metrics`` for Prometheus: sessions, steps and
            resets with their latency, errors by code, bytes, per environment
            (see `transports._metrics`). Behind the same token as every route
            but ``/health``. Off by default: counting costs each request a
            few hundred nanoseconds.

    Returns:
        A Starlette app; run it with `transports.runner.serve` (embedded) or
        `transports.runner.run`, or any ASGI server. Its ``state`` holds
        ``sessions`` (the `SessionRegistry`), ``http_polling`` (the
        `transports.http.HTTPPollingEndpoint`), ``websocket`` (the
        ``/ws`` endpoint), ``factory``, ``schemas``,
        ``metadata``, ``metrics`` (the ``ServerMetrics``, or ``None``) and
        ``lifespan_tasks``.

    Raises:
        ValueError: A bad ``factory`` name, ``max_sessions``, an idle timeout,
            ``http_max_body_size``, ``body_timeout`` or auth token.
        ImportError: The named factory cannot be imported.
        TypeError: The factory cannot build environments: not callable, or a
            client or message class (see `openenv.server.check_factory`).
    """
    tokens = auth_tokens_from(auth_token)
    if not body_timeout > 0:
        raise ValueError(f"body_timeout must be positive, not {body_timeout}")
    env_factory = load_factory(factory) if isinstance(factory, str) else factory
    check_factory(env_factory)
    registry = SessionRegistry(
        max_sessions=max_sessions,
        session_idle_timeout=session_idle_timeout,
        transport_idle_timeouts={"http": http_idle_timeout} if http_idle_timeout is not None else None,
        queue_timeout=queue_timeout,
        max_sessions_per_client=max_sessions_per_client,
        step_timeout=step_timeout,
    )
    counted = None
    if metrics:
        from ._metrics import ServerMetrics

        counted = ServerMetrics()
        counted.watch(factory_name(env_factory), registry)
    polling = HTTPPollingEndpoint(
        env_factory,
        registry=registry,
        max_body_size=http_max_body_size,
        error_details=error_details,
        metrics=counted,
    )
    schemas = environment_schemas(env_factory)
    meta = metadata if metadata is not None else environment_metadata(env_factory)

    async def health(request: Request) -> Response:
        return _JSONResponse({"status": "healthy"})

    async def schema(request: Request) -> Response:
        return _JSONResponse(schemas)

    # Every field, null when unknown, as the reference server sends it.
    metadata_fields = msgspec.structs.asdict(meta)

    async def metadata_endpoint(request: Request) -> Response:
        return _JSONResponse(metadata_fields)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with anyio.create_task_group() as task_group:
            for task in app.state.lifespan_tasks:
                task_group.start_soon(task)
            try:
                yield
            finally:
                task_group.cancel_scope.cancel()

    websocket = WebSocketEndpoint(env_factory, registry=registry, error_details=error_details, metrics=counted)
    routes: list[BaseRoute] = [
        # The two transports' hot paths first: the router tries routes in order.
        WebSocketRoute("/ws", websocket, name="ws"),
        *polling.routes(),
        Route("/health", health, methods=["GET"], name="health"),
        Route("/schema", schema, methods=["GET"], name="schema"),
        Route("/metadata", metadata_endpoint, methods=["GET"], name="metadata"),
        *openenv_http_routes(
            env_factory,
            schemas=schemas,
            metadata=meta,
            registry=registry,
            max_body_size=http_max_body_size,
            error_details=error_details,
            metrics=counted,
        ),
    ]
    if counted is not None:
        routes.append(Route("/metrics", counted.endpoint, methods=["GET"], name="metrics"))
    middleware = [
        Middleware(BodyDeadline, timeout=body_timeout),
        Middleware(RequestGuard, auth_tokens=tokens, allowed_origins=allow_origins, allowed_hosts=allowed_hosts),
    ]
    if allow_origins:
        middleware.append(
            Middleware(
                CORSMiddleware,
                # As browsers send them, or the CORS layer would not recognise an origin written with a "/".
                allow_origins=normalized_origins(allow_origins),
                allow_methods=["GET", "POST", "DELETE"],
                allow_headers=[
                    "Authorization",
                    SEQ_HEADER,
                    ACK_HEADER,
                    WAIT_HEADER,
                    IDEMPOTENCY_KEY_HEADER,
                    SESSION_KEY_HEADER,
                ],
                expose_headers=[SEQ_HEADER, RECEIVED_HEADER, ERROR_HEADER, "Location", "Retry-After"],
            )
        )
    # /openapi.json is ours (from the msgspec schemas), not Starlette's.
    app = Starlette(routes=routes, lifespan=lifespan, middleware=middleware)
    app.state.lifespan_tasks = [registry.run_reaper, polling.run]
    app.state.sessions = registry
    app.state.http_polling = polling
    app.state.websocket = websocket
    app.state.factory = env_factory
    app.state.schemas = schemas
    app.state.metadata = meta
    app.state.metrics = counted
    return app
