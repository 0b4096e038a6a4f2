"""`ServerConfig`: one typed configuration for every way of serving, checked by msgspec."""

from __future__ import annotations

import re
import typing
from typing import Any

import anyio
import msgspec
import pytest
from starlette.applications import Starlette

import openenv
from openenv.examples.echo import EchoEnvironment
from openenv.server import SERVER_DEFAULTS, ServerConfig, ServerOptions, server_config
from tests.envs import AsyncCounterEnv
from tests.server.test_server_app import RawWebSocket
from transports.http import HTTPPollingEndpoint
from transports.inprocess import InProcessTransport
from transports.server.app import create_app
from transports.server.routes.openenv_http import openenv_http_routes
from transports.server.runner import serve

LIMIT = 10  # seconds: the bound of every wait


def test_the_keyword_options_are_the_configs_fields() -> None:
    assert set(ServerOptions.__annotations__) == set(ServerConfig.__struct_fields__)
    assert set(ServerConfig.__struct_fields__) >= ServerConfig.APP_FIELDS


def test_defaults() -> None:
    assert ServerConfig() == SERVER_DEFAULTS
    assert (SERVER_DEFAULTS.max_sessions, SERVER_DEFAULTS.max_message_size) == (256, 16 * 1024 * 1024)
    assert SERVER_DEFAULTS.log_level is None


def test_options_replace_the_configs_fields_and_are_checked() -> None:
    base = ServerConfig(max_sessions=4, header_timeout=3.0)
    config = server_config(base, {"max_sessions": 8, "auth_token": ["a", "b"], "allow_origins": ["https://x"]})
    assert (config.max_sessions, config.header_timeout) == (8, 3.0)
    assert (config.auth_token, config.allow_origins) == (("a", "b"), ("https://x",))
    assert server_config(None, {"session_idle_timeout": 5}).session_idle_timeout == 5.0  # an int is a float


@pytest.mark.parametrize(
    ("options", "error", "says"),
    [
        ({"max_sesions": 4}, TypeError, "unknown option max_sesions=; the options are: allow_origins, "),
        ({"max_sessions": "4"}, TypeError, "the max_sessions= option takes int | None, not str ('4')"),
        ({"error_details": 1}, TypeError, "the error_details= option takes bool, not int (1)"),
        ({"allow_origins": "https://x"}, TypeError, "the allow_origins= option takes tuple[str, ...], not str"),
        ({"max_sessions": 0}, ValueError, "the max_sessions= option must be int >= 1 (or None), not 0"),
        ({"header_timeout": 0}, ValueError, "the header_timeout= option must be float > 0.0, not 0"),
        ({"shutdown_timeout": -1.0}, ValueError, "the shutdown_timeout= option must be float >= 0.0, not -1.0"),
        ({"server": "gunicorn"}, ValueError, "unknown server 'gunicorn'; use one of 'uvicorn', 'hypercorn', "),
        ({"log_level": "loud"}, ValueError, "unknown log_level 'loud'; use one of 'critical', "),
    ],
)
def test_a_bad_option_is_named(options: dict[str, Any], error: type[Exception], says: str) -> None:
    with pytest.raises(error, match=f"^{re.escape(says)}"):
        server_config(None, options)
    with pytest.raises(error, match=re.escape(says)):
        openenv.serve(EchoEnvironment, **options)  # checked at the call, before any server starts
    with pytest.raises(error, match=re.escape(says)):
        create_app(EchoEnvironment, **options)


def test_a_config_built_wrong_is_caught_where_it_is_used() -> None:
    with pytest.raises(ValueError, match="max_sessions"):
        create_app(EchoEnvironment, config=ServerConfig(max_sessions=0))
    with pytest.raises(TypeError, match="takes a ServerConfig, not dict"):
        create_app(EchoEnvironment, config={"max_sessions": 2})  # type: ignore[arg-type]


def test_create_app_keeps_its_config() -> None:
    app = create_app(AsyncCounterEnv, config=ServerConfig(max_sessions=3), queue_timeout=2.0)
    assert app.state.config == ServerConfig(max_sessions=3, queue_timeout=2.0)
    assert (app.state.sessions.max_sessions, app.state.sessions.queue_timeout) == (3, 2.0)
    assert app.state.http_polling.max_message_size == SERVER_DEFAULTS.max_message_size


@pytest.mark.anyio
async def test_openenv_serve_takes_a_config_and_options() -> None:
    with anyio.fail_after(LIMIT):
        config = ServerConfig(max_sessions=2, max_connections=50)
        async with openenv.serve(AsyncCounterEnv, config=config, max_sessions=3, port=0) as server:
            assert server.app.state.config == msgspec.structs.replace(config, max_sessions=3)


@pytest.mark.anyio
async def test_a_ready_app_is_served_with_its_own_options() -> None:
    with anyio.fail_after(LIMIT):
        app = create_app(AsyncCounterEnv, max_message_size=1000, max_sessions=2)
        # The same value is no conflict; the server's own options are the caller's.
        async with serve(app, max_sessions=2, header_timeout=5.0) as server:
            assert server.app is app
            # The app's message limit bounds WebSocket messages too, not only HTTP bodies.
            async with RawWebSocket.connect(server.ws_url) as ws:
                await ws.send_text('{"type":"step","data":{"pad":"' + "x" * 2000 + '"}}')
                assert (await ws.expect_close()).code in (1009, None)
        with pytest.raises(ValueError, match="max_message_size, max_sessions are set in create_app"):
            async with serve(app, max_sessions=3, max_message_size=2000):
                pass


@pytest.mark.anyio
async def test_an_app_of_ones_own_takes_the_message_limit_only() -> None:
    with anyio.fail_after(LIMIT):
        async with serve(Starlette(), max_message_size=1000):
            pass
        with pytest.raises(ValueError, match="max_sessions are set in create_app"):
            async with serve(Starlette(), max_sessions=3):
                pass


# -- old names -------------------------------------------------------------------


def test_old_option_names_still_work_and_warn() -> None:
    with pytest.warns(DeprecationWarning, match=r"create_app\(http_max_body_size=\) is deprecated"):
        app = create_app(AsyncCounterEnv, http_max_body_size=1000)
    assert app.state.config.max_message_size == app.state.http_polling.max_message_size == 1000
    with pytest.warns(DeprecationWarning, match=r"it is InProcessTransport\(close_timeout=\) now"):
        transport = InProcessTransport(factory=AsyncCounterEnv, close_grace=1.0)
    assert transport.close_timeout == 1.0
    with pytest.warns(DeprecationWarning, match=r"HTTPPollingEndpoint\(max_body_size=\)"):
        endpoint = HTTPPollingEndpoint(AsyncCounterEnv, registry=app.state.sessions, max_body_size=10)
    assert endpoint.max_message_size == 10
    with pytest.warns(DeprecationWarning, match=r"openenv_http_routes\(max_body_size=\)"):
        openenv_http_routes(AsyncCounterEnv, schemas=app.state.schemas, metadata=app.state.describe, max_body_size=10)


def test_the_command_lines_defaults_are_the_configs() -> None:
    from transports.cli._commands import serve as serve_command

    checked = []
    for parameter in serve_command.params:
        name = typing.cast(str, parameter.name)
        flag = getattr(parameter, "is_flag", False) or getattr(parameter, "multiple", False)
        if name in ServerConfig.__struct_fields__ and not flag and name != "log_level":
            assert parameter.default == getattr(SERVER_DEFAULTS, name), name
            checked.append(name)
    assert {"max_sessions", "header_timeout"} <= set(checked)


def test_a_ray_actors_server_options_are_checked_before_any_actor_starts() -> None:
    with pytest.raises(TypeError, match="unknown option max_sesions="):
        openenv.create_transport("ray://tests.envs:AsyncCounterEnv", server_options={"max_sesions": 2})
    with pytest.raises(ValueError, match="header_timeout"):
        openenv.create_transport("ray://tests.envs:AsyncCounterEnv", server_options={"header_timeout": 0})
