"""The ASGI app that serves one environment over every server-side transport.

`create_app` builds a Starlette app with:

- ``/ws``: the WebSocket endpoint (`transports.websocket._server.WebSocketEndpoint`);
- ``/poll/sessions``…: the HTTP long-polling endpoint (`transports.http.HTTPPollingEndpoint`);
- ``/poll/links``…: its links, many sessions over one client's requests (`transports.http.HTTPLinkEndpoint`);
- ``GET /health`` → ``{"status": "healthy"}``;
- ``GET /schema`` → ``{"action", "observation", "state", "reset_observation"}`` JSON Schemas;
- ``GET /metadata`` → the environment's `openenv.EnvironmentMetadata`;
- ``GET /metrics`` → Prometheus' metrics, with ``metrics=True`` (see `transports.server._metrics`);
- OpenEnv's stateless HTTP routes (`transports.server.routes.openenv_http`), with the MCP
  sessions of ``POST /mcp`` (`transports.server.routes._mcp_sessions`), and its Task API
  (`transports.server.routes.task_api`).

Its lifespan runs the idle-session reaper and the host tasks of the HTTP sessions and links.
Everything a further transport's routes need is kept on ``app.state``:
``app.state.sessions`` (the one `SessionRegistry`, shared by every transport, so
``max_sessions`` counts all sessions), ``app.state.factory``,
``app.state.schemas`` and ``app.state.describe`` (a `Description`: call it for the
metadata, which is read at first use). A transport that adds routes
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
from typing import TYPE_CHECKING, Any, Unpack

import anyio
import msgspec
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route, WebSocketRoute

from openenv import Clock, EnvironmentMetadata
from openenv.server import (
    AppFunction,
    ServerConfig,
    ServerOptions,
    check_factory,
    environment_metadata,
    environment_schemas,
    factory_name,
    load_factory,
    served_factory,
    server_config,
)
from transports.admission._guard import RequestGuard, auth_tokens_from, normalized_origins
from transports.admission._sessions import MONOTONIC_CLOCK, SessionRegistry
from transports.http._link_server import HTTPLinkEndpoint
from transports.http._protocol import (
    ACK_HEADER,
    ERROR_HEADER,
    IDEMPOTENCY_KEY_HEADER,
    LINK_KEY_HEADER,
    RECEIVED_HEADER,
    SEQ_HEADER,
    SESSION_KEY_HEADER,
    WAIT_HEADER,
)
from transports.http._server import HTTPPollingEndpoint
from transports.server._body_deadline import BodyDeadline
from transports.server._description import Description
from transports.server._json_response import JSONResponse
from transports.server.routes._mcp_sessions import MCPSessions
from transports.server.routes.openenv_http import openenv_http_routes
from transports.server.routes.task_api import task_api_routes
from transports.shared._deprecated import renamed_option
from transports.websocket._server import WebSocketEndpoint

__all__ = [
    "create_app",
    "environment_metadata",
    "environment_schemas",
    "mount_routes",
]


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
        from transports.server.app import create_app, mount_routes


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
    config: ServerConfig | None = None,
    metadata: EnvironmentMetadata | None = None,
    clock: Clock | None = None,
    http_max_body_size: int | None = None,
    **options: Unpack[ServerOptions],
) -> Starlette:
    """Build the ASGI app that serves an environment.

    One app speaks every server-side transport: WebSocket at ``/ws``, HTTP
    long-polling under ``/poll/sessions``; plus ``/health``, ``/schema`` and
    ``/metadata``. Serve it with `transports.server.runner.serve` or
    `transports.server.runner.run` (which serve it with its options), or with any ASGI
    server (``uvicorn module:app``).

    Examples:
        ```python
        from openenv.examples.echo import EchoEnv, EchoEnvironment
        from transports.server.app import create_app
        from transports.server.runner import serve

        app = create_app(EchoEnvironment, max_sessions=4, session_idle_timeout=300.0)
        async with serve(app) as server:
            async with EchoEnv(server.url) as env:
                await env.reset()
            print(sorted(app.state.schemas))  # ['action', 'observation', 'reset_observation', 'state']
        ```

    Args:
        factory: Builds one environment per session: an `openenv.Environment`
            subclass, a function, or its ``"package.module:Factory"`` name.
        config: The server's options (`openenv.ServerConfig`); the app reads
            its own (``max_sessions``, ``session_idle_timeout``,
            ``http_idle_timeout``, ``queue_timeout``, ``max_message_size``,
            ``auth_token``, ``allow_origins``, ``error_details``, ``metrics``,
            ``max_sessions_per_client``, ``step_timeout``, ``body_timeout``,
            ``allowed_hosts``) and keeps the whole as ``app.state.config``, for
            the server that runs it. Its ``session_idle_timeout`` counts only
            while a session has no request in hand and no connection open to
            its client: a WebSocket session lasts as long as its connection
            (whose death keepalives find), an MCP session made over
            ``POST /mcp`` while a WebSocket is attached.
        metadata: What ``GET /metadata`` answers; by default taken from the
            factory (see `environment_metadata`).
        clock: Where the app times its sessions' idleness and requests, the
            wait for a slot, HTTP long-polling's waits, a WebSocket link's wait
            for its client to come back, request bodies' deadlines and the
            shutdown's grace (`openenv.Clock`): by default the monotonic time;
            a test's clock, advanced by hand, makes minutes pass at once.
        http_max_body_size: Deprecated: ``max_message_size`` is the one limit
            of a request's size, over WebSocket and HTTP alike.
        **options: Fields of `openenv.ServerConfig` by name, replacing
            ``config``'s.

    Returns:
        A Starlette app; run it with `transports.server.runner.serve` (embedded) or
        `transports.server.runner.run`, or any ASGI server. Its ``state`` holds
        ``config`` (the checked `openenv.ServerConfig`), ``sessions`` (the
        `SessionRegistry`), ``http_polling`` (the
        `transports.http.HTTPPollingEndpoint`), ``http_links`` (its links,
        `transports.http.HTTPLinkEndpoint`), ``websocket`` (the
        ``/ws`` endpoint), ``mcp_sessions`` (the sessions made over ``POST
        /mcp``: OpenEnv 0.10's MCP production mode), ``factory``, ``schemas``,
        ``metadata``, ``metrics`` (the ``ServerMetrics``, or ``None``) and
        ``lifespan_tasks``.

    Raises:
        TypeError: An unknown option, or one of the wrong type; or the factory
            cannot build environments: not callable, or a client or message
            class (see `openenv.server.check_factory`).
        ValueError: A bad ``factory`` name, an option out of its range, or a
            bad auth token.
        ImportError: The named factory cannot be imported.
    """
    if http_max_body_size is not None:
        options["max_message_size"] = renamed_option(
            "create_app", "http_max_body_size", "max_message_size", http_max_body_size
        )
    config = server_config(config, options)
    tokens = auth_tokens_from(config.auth_token)
    env_factory = served_factory(load_factory(factory)) if isinstance(factory, str) else factory
    check_factory(env_factory)
    registry = SessionRegistry(
        max_sessions=config.max_sessions,
        session_idle_timeout=config.session_idle_timeout,
        transport_idle_timeouts={"http": config.http_idle_timeout} if config.http_idle_timeout is not None else None,
        queue_timeout=config.queue_timeout,
        clock=clock if clock is not None else MONOTONIC_CLOCK,
        max_sessions_per_client=config.max_sessions_per_client,
        step_timeout=config.step_timeout,
    )
    counted = None
    if config.metrics:
        from transports.server._metrics import ServerMetrics

        counted = ServerMetrics()
        counted.watch(factory_name(env_factory), registry)
    polling = HTTPPollingEndpoint(
        env_factory,
        registry=registry,
        max_message_size=config.max_message_size,
        error_details=config.error_details,
        metrics=counted,
    )
    links = HTTPLinkEndpoint(
        env_factory,
        registry=registry,
        max_message_size=config.max_message_size,
        error_details=config.error_details,
        metrics=counted,
    )
    schemas = environment_schemas(env_factory)
    describe = Description(env_factory, metadata)

    async def health(request: Request) -> Response:
        return JSONResponse({"status": "healthy"})

    async def schema(request: Request) -> Response:
        return JSONResponse(schemas)

    async def metadata_endpoint(request: Request) -> Response:
        # Every field, null when unknown, as the reference server sends it.
        return JSONResponse(msgspec.structs.asdict(await describe.read()))

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        registry.reopen()  # an app may be served again once a server that ran it has stopped
        async with anyio.create_task_group() as task_group:
            for task in app.state.lifespan_tasks:
                task_group.start_soon(task)
            try:
                yield
            finally:
                task_group.cancel_scope.cancel()

    mcp_sessions = MCPSessions(env_factory, registry=registry, error_details=config.error_details, metrics=counted)
    websocket = WebSocketEndpoint(
        env_factory,
        registry=registry,
        error_details=config.error_details,
        metrics=counted,
        max_message_size=config.max_message_size,
        resume_timeout=config.resume_timeout,
        attach=mcp_sessions.attach,
    )
    routes: list[BaseRoute] = [
        # The two transports' hot paths first: the router tries routes in order.
        WebSocketRoute("/ws", websocket, name="ws"),
        *polling.routes(),
        *links.routes(),
        Route("/health", health, methods=["GET"], name="health"),
        Route("/schema", schema, methods=["GET"], name="schema"),
        Route("/metadata", metadata_endpoint, methods=["GET"], name="metadata"),
        *openenv_http_routes(
            env_factory,
            schemas=schemas,
            metadata=describe,
            registry=registry,
            max_message_size=config.max_message_size,
            error_details=config.error_details,
            mcp_sessions=mcp_sessions,
            metrics=counted,
        ),
        # Last: its /{env_name}/... paths would take any other two-part path.
        *task_api_routes(
            env_factory,
            # An environment class may name itself there (openenv.core's: upstream's create_app(env_name=)).
            name=getattr(env_factory, "task_api_name", None) or describe().name,
            registry=registry,
            error_details=config.error_details,
        ),
    ]
    if counted is not None:
        routes.append(Route("/metrics", counted.endpoint, methods=["GET"], name="metrics"))
    middleware = [
        Middleware(BodyDeadline, timeout=config.body_timeout, clock=registry.clock),
        Middleware(
            RequestGuard, auth_tokens=tokens, allowed_origins=config.allow_origins, allowed_hosts=config.allowed_hosts
        ),
    ]
    if config.allow_origins:
        middleware.append(
            Middleware(
                CORSMiddleware,
                # As browsers send them, or the CORS layer would not recognise an origin written with a "/".
                allow_origins=normalized_origins(config.allow_origins),
                allow_methods=["GET", "POST", "DELETE"],
                allow_headers=[
                    "Authorization",
                    SEQ_HEADER,
                    ACK_HEADER,
                    WAIT_HEADER,
                    IDEMPOTENCY_KEY_HEADER,
                    SESSION_KEY_HEADER,
                    LINK_KEY_HEADER,
                ],
                expose_headers=[SEQ_HEADER, RECEIVED_HEADER, ERROR_HEADER, "Location", "Retry-After"],
            )
        )
    # /openapi.json is ours (from the msgspec schemas), not Starlette's.
    app = Starlette(routes=routes, lifespan=lifespan, middleware=middleware)
    app.state.config = config
    app.state.lifespan_tasks = [registry.run_reaper, polling.run, links.run, mcp_sessions.run]
    app.state.sessions = registry
    app.state.http_polling = polling
    app.state.http_links = links
    app.state.websocket = websocket
    app.state.mcp_sessions = mcp_sessions
    app.state.factory = env_factory
    app.state.schemas = schemas
    app.state.describe = describe
    app.state.metrics = counted
    return app


if TYPE_CHECKING:  # openenv.server.build_app hands its factory and config here: mypy checks the signatures agree
    _builds_openenv_apps: AppFunction = create_app
