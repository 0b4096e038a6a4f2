"""An environment package written for upstream OpenEnv, served by openenv: its ``create_app``, every transport.

``test_against_upstream.py`` compares the same replies with upstream 0.10.0's own server's.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable
from types import ModuleType
from typing import Any

import anyio
import httpx
import pytest
from grid_env.models import GridAction, GridObservation, GridState
from grid_env.server import app as grid_apps
from grid_env.server.environment import GridEnvironment

import openenv
from openenv.core.env_server import ConcurrencyConfigurationError, EnvironmentMetadata, State, create_app
from tests.dropin.sessions import walk_the_grid

pytestmark = pytest.mark.anyio

LIMIT = 30


@pytest.fixture
def apps() -> ModuleType:
    """The package's ``server/app.py``, imported afresh: an app serves one server's lifetime."""
    return importlib.reload(grid_apps)


def app_of(apps: ModuleType, which: str) -> Callable[..., Any]:
    return apps.app if which == "plain" else apps.async_app  # type: ignore[no-any-return]


def url_of(server: Any, scheme: str) -> str:
    return f"{scheme}://{server.host}:{server.port}"


@pytest.mark.parametrize("which", ["plain", "async"])
@pytest.mark.parametrize("scheme", ["ws", "http+poll"])
async def test_reset_step_and_state_as_upstream_shapes_them(which: str, scheme: str, apps: ModuleType) -> None:
    with anyio.fail_after(LIMIT):
        async with openenv.serve(app_of(apps, which)) as server, openenv.EnvClient(url_of(server, scheme)) as env:
            # ``reset`` takes seed and episode_id only: the other keyword is dropped, as upstream drops it.
            first = await env.reset(seed=5, episode_id="e-1", colour="blue")
            assert first.observation == {"metadata": {"seed": 5}, "position": [0, 0], "message": "find [1, 1]"}
            assert (first.reward, first.done) == (0, False)
            moved = await env.step({"direction": "right"})
            assert moved.observation == {"metadata": {}, "position": [1, 0], "message": "keep looking"}
            assert (moved.reward, moved.done) == (-0.1, False)
            found = await env.step({"direction": "up", "steps": 1})
            assert found.observation["message"] == "found it"
            assert (found.reward, found.done) == (1.0, True)
            assert found.observation["metadata"] == {"step": 2}
            state = await env.state()
            assert state == {"episode_id": "e-1", "step_count": 2, "goal": [1, 1], "position": [1, 1]}


@pytest.mark.parametrize("which", ["plain", "async"])
async def test_an_action_that_does_not_validate_gets_upstreams_errors_and_the_session_goes_on(
    which: str, apps: ModuleType
) -> None:
    with anyio.fail_after(LIMIT):
        async with openenv.serve(app_of(apps, which)) as server, openenv.EnvClient(server.url) as env:
            await env.reset()
            with pytest.raises(openenv.ValidationError) as caught:
                await env.step({"direction": "north", "steps": 9, "colour": "blue"})
            assert caught.value.code == "VALIDATION_ERROR"
            assert str(caught.value.message) == "Invalid message"
            found = {(error["type"], tuple(error["loc"])) for error in caught.value.errors}
            assert found == {
                ("literal_error", ("direction",)),
                ("less_than_equal", ("steps",)),
                ("extra_forbidden", ("colour",)),
            }
            assert all("msg" in error and "input" in error for error in caught.value.errors)
            moved = await env.step({"direction": "left"})
            assert moved.observation["position"] == [-1, 0]


@pytest.mark.parametrize("which", ["plain", "async"])
async def test_an_environment_that_raises_harms_no_session(which: str, apps: ModuleType) -> None:
    with anyio.fail_after(LIMIT):
        async with (
            openenv.serve(app_of(apps, which)) as server,
            openenv.EnvClient(server.url) as env,
            openenv.EnvClient(server.url) as other,
        ):
            await env.reset()
            await other.reset()
            with pytest.raises(openenv.ExecutionError, match="the grid was asked to fail"):
                await env.step({"direction": "raise"})
            assert (await env.step({"direction": "down"})).observation["position"] == [0, -1]
            assert (await other.step({"direction": "up"})).observation["position"] == [0, 1]


async def test_one_session_at_a_time_by_default_as_upstream(apps: ModuleType) -> None:
    with anyio.fail_after(LIMIT):
        async with openenv.serve(apps.single_app) as server, openenv.EnvClient(server.url) as env:
            await env.reset()
            with pytest.raises(openenv.CapacityReachedError):
                async with openenv.EnvClient(server.url, share=False) as second:
                    await second.reset()
            assert (await env.step({"direction": "up"})).observation["position"] == [0, 1]


async def test_schema_and_metadata_are_the_pydantic_classes(apps: ModuleType) -> None:
    with anyio.fail_after(LIMIT):
        async with openenv.serve(apps.app) as server, httpx.AsyncClient(base_url=server.url) as http:
            schemas = (await http.get("/schema")).json()
            assert schemas == {
                "action": GridAction.model_json_schema(),
                "observation": GridObservation.model_json_schema(),
                "state": GridState.model_json_schema(),
                "reset_observation": GridObservation.model_json_schema(),
            }
            assert (await http.get("/metadata")).json() == {
                "name": "GridEnvironment",
                "description": "GridEnvironment environment",
                "readme_content": None,
                "version": "1.0.0",
                "author": None,
                "documentation_url": None,
            }
            assert (await http.get("/health")).json() == {"status": "healthy"}
            # The package's own route, added with FastAPI's decorator to the app create_app gave.
            assert (await http.get("/config")).json() == {"max_concurrent_envs": 8, "env": "grid_env"}
            assert (await http.get("/nowhere")).status_code == 404


async def test_an_environment_pool_steps_unchanged_upstream_environments_over_one_link(apps: ModuleType) -> None:
    with anyio.fail_after(LIMIT):
        async with (
            openenv.serve(apps.app) as server,
            openenv.EnvPool(server.url, size=8) as pool,
        ):
            await pool.reset()
            results = await pool.step([{"direction": "right", "steps": index % 3 + 1} for index in range(8)])
            assert [result.observation["position"] for result in results] == [[index % 3 + 1, 0] for index in range(8)]


@pytest.mark.parametrize("which", ["app", "async_app"])
async def test_in_process_the_packages_app_names_the_environment(which: str) -> None:
    with anyio.fail_after(LIMIT):
        async with openenv.EnvClient(f"inproc://grid_env.server.app:{which}") as env:
            await walk_the_grid(env)
            assert await env.state() == {"episode_id": "e-1", "step_count": 1, "goal": [1, 1], "position": [0, 1]}


async def test_an_upstream_environment_class_alone_is_refused_with_what_to_serve() -> None:
    with anyio.fail_after(LIMIT):
        with pytest.raises(openenv.ConnectError, match=r"written against upstream OpenEnv's API .*server\.app:app"):
            async with openenv.EnvClient("inproc://grid_env.server.environment:GridEnvironment"):
                pass


def test_more_sessions_of_an_environment_that_does_not_support_them_are_refused() -> None:
    class Lonely(GridEnvironment):
        SUPPORTS_CONCURRENT_SESSIONS = False

    with pytest.raises(ConcurrencyConfigurationError, match="Lonely"):
        create_app(Lonely, GridAction, GridObservation, max_concurrent_envs=2)


def test_create_app_refuses_what_upstreams_refuses() -> None:
    with pytest.raises(TypeError, match="not an instance"):
        create_app(GridEnvironment(), GridAction, GridObservation)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="Cannot specify both"):
        create_app(GridEnvironment, GridAction, GridObservation, max_concurrent_envs=2, concurrency_config=object())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="Invalid mode"):
        create_app(GridEnvironment, GridAction, GridObservation, mode="staging")


def test_the_web_interface_is_not_served_and_says_so(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("ENABLE_WEB_INTERFACE", "true")
    with caplog.at_level(logging.WARNING, logger="openenv.server"):
        create_app(GridEnvironment, GridAction, GridObservation, state_cls=State)
    (record,) = [record for record in caplog.records if "ENABLE_WEB_INTERFACE" in record.getMessage()]
    assert "does not serve upstream's web interface" in record.getMessage()


async def test_an_environments_own_metadata_is_read_once() -> None:
    built: list[int] = []

    class Described(GridEnvironment):
        def __init__(self) -> None:
            built.append(1)
            super().__init__()

        def get_metadata(self) -> EnvironmentMetadata:
            return EnvironmentMetadata(name="grid", description="A grid world.", author="openenv")

    def make() -> Described:  # a factory function, as packages write them: only building one tells its metadata
        return Described()

    for factory in (Described, make):
        built.clear()
        app = create_app(factory, GridAction, GridObservation)
        assert built == []  # none at import: a package's set-up (a dataset to load, say) waits until it is served
        with anyio.fail_after(LIMIT):
            async with openenv.serve(app) as server, httpx.AsyncClient(base_url=server.url) as http:
                assert (await http.get("/openapi.json")).json()["info"]["title"] == "grid: OpenEnv Environment HTTP API"
                for _ in range(2):
                    answer = (await http.get("/metadata")).json()
                    assert (answer["name"], answer["description"]) == ("grid", "A grid world.")
                    assert answer["author"] == "openenv"
        assert len(built) == 1  # for its metadata, once
