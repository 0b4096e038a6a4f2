"""``project://``: a real upstream-style environment project, built on openenv 0.10.0 from PyPI, started and stopped.

The project (``tests/interop/echo_project``) is copied to a folder of the test
cache named by its content, so that its environment, made once (about two
minutes: openenv 0.10.0 and its dependencies, from PyPI), is reused by later runs.
"""

from __future__ import annotations

import hashlib
import shutil
import socket
from pathlib import Path
from typing import Any

import anyio
import pytest

import openenv
from openenv import EnvClient, EnvPool, State
from tests.envs import MessageAction, MessageObservation
from transports.project import ProjectTransport, _launcher
from transports.shared._public_io import public_io_only

LIMIT = 60
INSTALL_LIMIT = 1200  # the first run installs openenv 0.10.0 and its dependencies
SOURCE = Path(__file__).resolve().parents[2] / "interop" / "echo_project"
CACHE = Path.home() / ".cache" / "openenv-tests"


class ProjectEcho(EnvClient[MessageAction, MessageObservation, State]):
    pass


@pytest.fixture(scope="module")
def echo_project() -> Path:
    """The echo project, copied where its path (part of its environment's name) stays the same run to run."""
    digest = hashlib.sha256()
    for file in sorted(SOURCE.rglob("*")):
        if file.is_file() and "__pycache__" not in file.parts:
            digest.update(str(file.relative_to(SOURCE)).encode() + file.read_bytes())
    target = CACHE / f"echo-project-{digest.hexdigest()[:12]}"
    if not target.is_dir():
        shutil.copytree(SOURCE, target, ignore=shutil.ignore_patterns("__pycache__"))
    return target


def url_of(project: Path) -> str:
    return f"project://{project}"


def options() -> dict[str, Any]:
    return {"cache_dir": CACHE / "projects", "install_timeout": INSTALL_LIMIT}


def refused(url: str) -> bool:
    host, port = url.removeprefix("http://").split(":")
    with socket.socket() as probe:
        return probe.connect_ex((host, int(port))) != 0


def test_a_directory_that_is_not_a_project_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"not an OpenEnv environment project: it has no pyproject\.toml"):
        openenv.create_transport(url_of(tmp_path))
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    with pytest.raises(ValueError, match=r"it has no server/app\.py"):
        openenv.create_transport(url_of(tmp_path))
    with pytest.raises(ValueError, match="is not a directory"):
        openenv.create_transport(url_of(tmp_path / "missing"))
    with pytest.raises(ValueError, match="is not a project:///path/to/project URL"):
        ProjectTransport("project://")


def test_the_app_comes_from_openenv_yaml(tmp_path: Path) -> None:
    assert _launcher._app_of(tmp_path) == "server.app:app"
    (tmp_path / "openenv.yaml").write_text("spec_version: 1\nname: x\napp: 'my_server.main:application'  # here\n")
    assert _launcher._app_of(tmp_path) == "my_server.main:application"


def test_the_environment_is_named_by_what_its_install_depends_on(echo_project: Path, tmp_path: Path) -> None:
    copy = tmp_path / "echo_project"
    shutil.copytree(echo_project, copy)
    key = _launcher.environment_key(copy, "python3")
    assert key == _launcher.environment_key(copy, "python3")
    assert key != _launcher.environment_key(copy, "python3.12")
    assert key != _launcher.environment_key(echo_project, "python3")  # another checkout
    (copy / "uv.lock").write_text("version = 1\n")
    assert _launcher.environment_key(copy, "python3") != key


@pytest.mark.interop
@pytest.mark.anyio
async def test_a_project_is_installed_started_shared_and_stopped(echo_project: Path) -> None:
    url = url_of(echo_project)
    with anyio.fail_after(INSTALL_LIMIT + LIMIT):
        async with ProjectEcho(url, **options()) as env:
            transport = env.transport
            assert isinstance(transport, ProjectTransport)
            server = transport.server_url
            assert server is not None
            reset = await env.reset(episode_id="launched")
            result = await env.step(MessageAction(message="hello"))
            assert (result.observation.echoed_message, result.reward) == ("hello", 5.0)
            # Served by upstream's own server (openenv 0.10.0), metadata and all.
            assert result.metadata == {"length": 5, "pid": reset.metadata["pid"]}
            assert await env.state() == State(episode_id="launched", step_count=1)
            # A second client of the project shares the server.
            async with ProjectEcho(url, **options()) as other:
                assert isinstance(other.transport, ProjectTransport)
                assert other.transport.server_url == server
                assert (await other.reset()).metadata["pid"] == reset.metadata["pid"]
            assert not refused(server)  # still in use
        assert refused(server)  # the last session stopped it


@pytest.mark.interop
@pytest.mark.anyio
async def test_a_pool_shares_one_server_stopped_when_the_pool_closes(echo_project: Path) -> None:
    with anyio.fail_after(INSTALL_LIMIT + LIMIT):
        async with EnvPool(url_of(echo_project), size=4, client=ProjectEcho, **options()) as pool:
            results = await pool.reset()
            assert len({result.metadata["pid"] for result in results}) == 1
            stepped = await pool.step([MessageAction(message=str(index)) for index in range(4)])
            assert [result.observation.echoed_message for result in stepped] == ["0", "1", "2", "3"]
            launches = _launcher.launcher(CACHE / "projects")._launches
            [launch] = launches.values()
            server = launch.url
            assert server is not None
        assert not launches
        assert refused(server)


@pytest.mark.interop
@pytest.mark.anyio
async def test_a_project_that_fails_to_start_is_a_connect_error(
    echo_project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ECHO_PROJECT_FAIL", "1")
    with anyio.fail_after(INSTALL_LIMIT + LIMIT):
        with pytest.raises(openenv.ConnectError, match="server exited with 1") as caught:
            async with ProjectEcho(url_of(echo_project), **options()):
                pass
    assert "echo project: failing on request" in str(caught.value)
    assert not _launcher.launcher(CACHE / "projects")._launches
    monkeypatch.delenv("ECHO_PROJECT_FAIL")
    # The next attempt starts afresh.
    with anyio.fail_after(LIMIT):
        async with ProjectEcho(url_of(echo_project), **options()) as env:
            assert (await env.step(MessageAction(message="ok"))).reward == 2.0


@pytest.mark.interop
def test_the_sync_client_stops_the_server_when_it_closes(echo_project: Path) -> None:
    with ProjectEcho(url_of(echo_project), **options()).sync() as env:
        transport = env.client.transport
        assert isinstance(transport, ProjectTransport)
        server = transport.server_url
        assert env.step(MessageAction(message="sync")).observation.echoed_message == "sync"
        assert transport.lent is not public_io_only()  # its steps are made in this thread, on the server's connection
    assert server is not None
    assert refused(server)


WHO_SERVES = """
import importlib.metadata as metadata
import openenv
try:
    metadata.version("openenv")
    print("upstream's openenv is installed")
except metadata.PackageNotFoundError:
    print("openenv-anyio", metadata.version("openenv-anyio"), openenv.__file__)
"""


def test_a_project_is_served_by_upstream_or_by_openenv_anyio(echo_project: Path) -> None:
    with pytest.raises(ValueError, match="server='docker': a project is served by 'upstream' or 'openenv-anyio'"):
        ProjectTransport(url_of(echo_project), server="docker")
    assert ProjectTransport(url_of(echo_project)).server == "upstream"
    # Each server has an environment of its own.
    assert _launcher.environment_key(echo_project, "python3", "openenv-anyio") != _launcher.environment_key(
        echo_project, "python3"
    )


@pytest.mark.interop
@pytest.mark.anyio
async def test_the_unchanged_project_served_by_openenv_anyio_beside_upstreams(echo_project: Path) -> None:
    url = url_of(echo_project)
    with anyio.fail_after(2 * INSTALL_LIMIT + LIMIT):
        async with ProjectEcho(url, server="openenv-anyio", **options()) as env:
            transport = env.transport
            assert isinstance(transport, ProjectTransport)
            assert transport.server == "openenv-anyio"
            reset = await env.reset(episode_id="ours")
            result = await env.step(MessageAction(message="hello"))
            assert (result.observation.echoed_message, result.reward) == ("hello", 5.0)
            assert result.metadata == {"length": 5, "pid": reset.metadata["pid"]}
            assert await env.state() == State(episode_id="ours", step_count=1)
            # Upstream's server of the same project runs beside it, in its own environment and process.
            async with ProjectEcho(url, **options()) as theirs:
                assert isinstance(theirs.transport, ProjectTransport)
                assert theirs.transport.server_url != transport.server_url
                assert (await theirs.reset()).metadata["pid"] != reset.metadata["pid"]
            server = transport.server_url
            assert server is not None
        assert refused(server)
        python = await _launcher.launcher(CACHE / "projects").environment(echo_project, "openenv-anyio")
        served_by = await anyio.run_process([str(python), "-c", WHO_SERVES], cwd=echo_project)
    assert served_by.stdout.decode().split()[:2] == ["openenv-anyio", openenv.__version__]
    assert served_by.stdout.decode().split()[2] == openenv.__file__
