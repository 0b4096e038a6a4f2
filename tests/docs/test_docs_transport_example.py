"""The third-party transport of docs/transports.md, installed through a real ``openenv.transports`` entry point.

The page's Unix-socket module is written to a temporary directory together with
a ``*.dist-info`` whose ``entry_points.txt`` registers it, as ``pip install``
would; the registry must then find the scheme without any run-time registration.
"""

from __future__ import annotations

import re
import socket
import sys
from collections.abc import Iterator
from pathlib import Path

import anyio
import anyio.abc
import pytest

import openenv
from openenv import _registry
from openenv.examples.echo import CallToolAction, EchoEnv, EchoEnvironment

PAGE = Path(__file__).resolve().parents[2] / "docs" / "transports.md"
MODULE = "unix_transport"
LIMIT = 10  # seconds: the bound of every wait here

pytestmark = pytest.mark.skipif(not hasattr(socket, "AF_UNIX"), reason="no Unix domain sockets on this platform")


def example_source() -> str:
    """The python block the page marks ``<!-- docs-test: file=unix_transport.py -->``."""
    text = PAGE.read_text(encoding="utf-8")
    match = re.search(rf"<!-- docs-test: file={MODULE}\.py -->\n```python\n(.*?)^```", text, re.S | re.M)
    assert match is not None, f"{PAGE.name} has no block marked file={MODULE}.py"
    return match.group(1)


@pytest.fixture
def installed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Install the example as a distribution on sys.path, with a fresh view of the registry."""
    (tmp_path / f"{MODULE}.py").write_text(example_source(), encoding="utf-8")
    dist_info = tmp_path / "unix_transport_example-1.0.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text("Metadata-Version: 2.1\nName: unix-transport-example\nVersion: 1.0\n")
    (dist_info / "entry_points.txt").write_text(f"[{openenv.ENTRY_POINT_GROUP}]\nunix = {MODULE}:UnixSocketTransport\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    # Forget the entry points read so far, and any run-time registration of the scheme.
    monkeypatch.setattr(_registry, "_entry_points", None)
    registered = {scheme: factory for scheme, factory in _registry._registered.items() if scheme != "unix"}
    monkeypatch.setattr(_registry, "_registered", registered)
    monkeypatch.delitem(sys.modules, MODULE, raising=False)
    yield tmp_path
    sys.modules.pop(MODULE, None)


def test_the_entry_point_is_discovered(installed: Path) -> None:
    assert "unix" in openenv.registered_schemes()
    transport = openenv.create_transport("unix:///run/echo.sock", connect_timeout=3.0)
    assert type(transport).__name__ == "UnixSocketTransport"
    assert type(transport).__module__ == MODULE
    assert transport.path == "/run/echo.sock"  # type: ignore[attr-defined]
    assert transport.connect_timeout == 3.0  # type: ignore[attr-defined]


def test_without_the_entry_point_the_scheme_is_unknown(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_registry, "_entry_points", None)
    monkeypatch.setattr(_registry, "_registered", {})
    with pytest.raises(openenv.UnsupportedSchemeError, match="unix"):
        openenv.create_transport("unix:///run/echo.sock")


@pytest.mark.anyio
async def test_a_client_steps_over_the_installed_transport(installed: Path) -> None:
    serve_unix = __import__(MODULE).serve_unix
    path = str(installed / "echo.sock")
    with anyio.fail_after(LIMIT):
        async with anyio.create_task_group() as servers:
            await servers.start(serve_unix, EchoEnvironment, path)
            async with EchoEnv(f"unix://{path}") as env:
                assert type(env.transport).__module__ == MODULE
                result = await env.reset(episode_id="ep-1")
                assert result.observation.echoed_message == ""
                result = await env.step(CallToolAction(tool_name="echo_message", arguments={"message": "next door"}))
                assert result.observation.echoed_message == "next door"
                with pytest.raises(openenv.ValidationError):
                    await env.step({"tool": "missing its name"})  # type: ignore[arg-type]
                state = await env.state()
                assert state.episode_id == "ep-1"
                assert state.step_count == 1
            servers.cancel_scope.cancel()


@pytest.mark.anyio
async def test_connecting_to_a_missing_socket_is_a_connect_error(installed: Path) -> None:
    with anyio.fail_after(LIMIT), pytest.raises(openenv.ConnectError):
        async with EchoEnv(f"unix://{installed / 'nobody-listens.sock'}"):
            pass


@pytest.mark.anyio
async def test_a_server_that_goes_away_is_connection_closed(installed: Path) -> None:
    serve_unix = __import__(MODULE).serve_unix
    path = str(installed / "echo.sock")
    server_scope = anyio.CancelScope()

    async def run_server(*, task_status: anyio.abc.TaskStatus[None]) -> None:
        with server_scope:
            await serve_unix(EchoEnvironment, path, task_status=task_status)

    with anyio.fail_after(LIMIT):
        async with anyio.create_task_group() as task_group:
            await task_group.start(run_server)
            async with EchoEnv(f"unix://{path}") as env:
                await env.reset()
                server_scope.cancel()  # the server closes every connection as it stops
                with pytest.raises(openenv.ConnectionClosed):
                    await env.step(CallToolAction(tool_name="echo_message", arguments={"message": "anyone?"}))
