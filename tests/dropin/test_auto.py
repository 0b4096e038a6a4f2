"""Upstream's ``openenv.AutoEnv`` and ``AutoAction``: installed environment packages found by name, on openenv.

The packages are installed for real, as far as ``importlib.metadata`` can tell: a
``openenv_<name>-<version>.dist-info`` folder on ``sys.path``, which is what pip leaves.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Iterator
from pathlib import Path

import anyio
import anyio.to_thread
import pytest
from grid_env.client import GridEnv
from grid_env.models import GridAction, GridObservation
from grid_env.server import app as grid_apps

import openenv
from openenv.auto import AutoAction, AutoEnv
from openenv.auto._discovery import EnvironmentDiscovery, normalize_env_name, reset_discovery, unknown_environment
from openenv.core import GenericAction, GenericEnvClient

LIMIT = 30


def _install(site: Path, distribution: str, version: str = "0.1.0") -> None:
    """What pip leaves of a distribution for ``importlib.metadata``: its dist-info folder."""
    info = site / f"{distribution.replace('-', '_')}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {distribution}\nVersion: {version}\n")


@pytest.fixture
def installed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """grid_env installed as ``openenv-grid-env``; the discovery starts afresh and ends so."""
    _install(tmp_path, "openenv-grid-env", "1.2.0")
    monkeypatch.syspath_prepend(str(tmp_path))
    reset_discovery()
    yield tmp_path
    reset_discovery()


def test_names_as_upstream_normalises_them() -> None:
    assert {normalize_env_name(name) for name in ("grid", "grid-env", "grid_env", "grid-env")} == {"grid_env"}
    assert normalize_env_name("snake-game") == "snake_game_env"


@pytest.mark.usefixtures("installed")
def test_a_package_is_found_with_its_manifest_and_classes() -> None:
    info = AutoEnv.get_env_info("grid-env")
    assert info == {
        "env_key": "grid",
        "name": "grid_env",
        "package": "openenv-grid-env",
        "version": "1.2.0",
        "description": "A grid to walk on, in upstream's style (openenv-anyio's tests)",
        "env_class": "GridEnv",
        "action_class": "GridAction",
        "observation_class": "GridObservation",
        "module": "grid_env.client",
        "default_image": "grid-env:latest",
        "spec_version": 1,
    }
    assert AutoEnv.get_env_class("grid") is GridEnv
    assert AutoAction.from_env("grid_env") is GridAction
    assert AutoAction.from_hub("grid", skip_install=True) is GenericAction
    assert AutoAction.get_action_info("grid")["action_class"] == "GridAction"


def test_the_framework_and_upstreams_core_are_no_environments(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for distribution in ("openenv-core", "openenv-anyio", "openenv-blocks-env"):
        _install(tmp_path, distribution)
    monkeypatch.syspath_prepend(str(tmp_path))
    found = EnvironmentDiscovery().discover()
    assert "core" not in found
    assert "anyio" not in found
    # No module: found by name all the same, and its classes named by convention; importing them says what failed.
    blocks = found["blocks"]
    assert (blocks.client_class_name, blocks.action_class_name) == ("BlocksEnv", "BlocksAction")
    with pytest.raises(ImportError, match="openenv install --force-reinstall openenv-blocks-env"):
        blocks.get_client_class()


@pytest.mark.usefixtures("installed")
def test_mistakes_get_one_line_saying_what_to_do() -> None:
    unknown = r"Unknown environment 'gird'\. Did you mean: grid\? Available environments: .*grid"
    with pytest.raises(ValueError, match=unknown):
        AutoEnv.from_env("gird", base_url="http://127.0.0.1:9")
    with pytest.raises(ValueError, match=re.escape("openenv serve grid_env.server.app:app")):
        AutoEnv.from_env("grid")
    with pytest.raises(
        ValueError, match=re.escape("openenv install git+https://huggingface.co/spaces/someone/other_env")
    ):
        AutoEnv.from_env("someone/other_env")
    with pytest.raises(TypeError, match="container_provider"):
        AutoEnv.from_env("grid", container_provider=object())
    with pytest.raises(TypeError, match="factory"):
        AutoEnv()
    with pytest.raises(TypeError, match="factory"):
        AutoAction()


def test_nothing_installed_says_how_to_install(tmp_path: Path) -> None:
    discovery = EnvironmentDiscovery(path=[str(tmp_path)])
    assert discovery.discover() == {}
    assert "openenv install openenv-<name>" in str(unknown_environment("grid", discovery))


@pytest.mark.usefixtures("installed")
def test_a_hub_name_of_an_installed_package_and_the_space_it_would_drive() -> None:
    client = AutoEnv.from_env("someone/grid_env", base_url="http://127.0.0.1:9")
    assert isinstance(client, GridEnv)
    generic = AutoEnv.from_env("someone/grid_env", skip_install=True)
    assert isinstance(generic, GenericEnvClient)
    assert generic.base_url == "https://someone-grid-env.hf.space"


@pytest.mark.usefixtures("installed")
def test_list_environments_prints_each_package(capsys: pytest.CaptureFixture[str]) -> None:
    AutoEnv.list_environments()
    AutoAction.list_actions()
    printed = capsys.readouterr().out
    assert "grid           : A grid to walk on" in printed
    assert "grid           : GridAction" in printed
    assert "Package: openenv-grid-env" in printed


@pytest.mark.anyio
@pytest.mark.usefixtures("installed")
async def test_from_env_gives_the_packages_own_client_which_runs_on_openenv() -> None:
    def walk(url: str) -> tuple[GridObservation, GridObservation]:
        with AutoEnv.from_env("grid", base_url=url).sync() as env:
            first = env.reset(seed=3).observation
            action = AutoAction.from_env("grid")(direction="up")
            return first, env.step(action).observation

    with anyio.fail_after(LIMIT):
        async with openenv.serve(importlib.reload(grid_apps).app) as server:
            async with AutoEnv.from_env("grid-env", base_url=server.url) as env:
                assert isinstance(env, GridEnv)
                assert (await env.reset(seed=3)).observation.metadata == {"seed": 3}
            async with AutoEnv.from_env("grid", base_url=server.url, skip_install=True) as generic:
                assert (await generic.step({"direction": "right"})).observation["position"] == [1, 0]
            first, moved = await anyio.to_thread.run_sync(walk, server.url)
    assert (first.position, moved.position) == ([0, 0], [0, 1])


def test_openenv_offers_them_as_upstreams_openenv_does() -> None:
    assert (openenv.AutoEnv, openenv.AutoAction) == (AutoEnv, AutoAction)
    with pytest.raises(AttributeError, match="no attribute 'AutoModel'"):
        openenv.AutoModel  # noqa: B018
