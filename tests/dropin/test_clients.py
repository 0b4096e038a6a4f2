"""An environment package's own client (upstream's ``EnvClient`` hooks) on openenv: async, sync, and both refused.

``test_against_upstream.py`` runs the same client on upstream's ``openenv`` too, against both servers.
"""

from __future__ import annotations

import gc
import importlib
import socket
import weakref
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import anyio.to_thread
import pytest
from grid_env.client import GridEnv
from grid_env.models import GridAction, GridObservation, GridState
from grid_env.server import app as grid_apps

import openenv
from openenv.core import GenericAction, GenericEnvClient, StepResult
from tests.helpers import loop_calls
from transports.shared._public_io import public_io_only

pytestmark = pytest.mark.anyio

LIMIT = 30


@asynccontextmanager
async def grid_server() -> AsyncIterator[Any]:
    async with openenv.serve(importlib.reload(grid_apps).app) as server:
        yield server


@pytest.mark.parametrize("scheme", ["http", "ws", "http+poll"])
async def test_the_packages_client_in_async_code(scheme: str) -> None:
    with anyio.fail_after(LIMIT):
        async with grid_server() as server, GridEnv(base_url=f"{scheme}://{server.host}:{server.port}") as env:
            first = await env.reset(seed=5)
            assert isinstance(first, StepResult)
            assert first.observation == GridObservation(
                position=[0, 0], message="find [1, 1]", reward=0, metadata={"seed": 5}
            )
            moved = await env.step(GridAction(direction="up"))
            assert (moved.observation.position, moved.reward, moved.done, moved.metadata) == ([0, 1], -0.1, False, None)
            state = await env.state()
            assert isinstance(state, GridState)
            assert (state.step_count, state.position, state.goal) == (1, [0, 1], [1, 1])


async def test_the_packages_client_in_plain_code() -> None:
    def walk(url: str) -> tuple[StepResult[GridObservation], GridState]:
        env = GridEnv(base_url=url)
        try:
            env.reset()  # plain code: the result itself, no await
            result = env.step(GridAction(direction="right", steps=2))
            return result, env.state()
        finally:
            env.close()

    with anyio.fail_after(LIMIT):
        async with grid_server() as server:
            result, state = await anyio.to_thread.run_sync(walk, server.url)
    assert (result.observation.position, result.reward) == ([2, 0], -0.1)
    assert state.step_count == 1


async def test_plain_code_s_requests_are_made_in_the_calling_thread() -> None:
    # After the first call (which connects, through the loop thread), on the connection lent to plain code.
    def walk(url: str) -> list[int]:
        with GridEnv(base_url=url).sync() as env, GenericEnvClient(base_url=url) as generic:
            env.reset()
            generic.reset()
            with loop_calls() as finished:
                for _ in range(3):
                    env.step(GridAction(direction="up"))
                with pytest.raises(RuntimeError, match="EXECUTION_ERROR") as caught:
                    generic.step({"direction": "raise"})  # plain code too: the client outside its sync view
                assert isinstance(caught.value.__cause__, openenv.ExecutionError)
                assert generic.step({"direction": "left"}).observation["position"] == [-1, 0]
                position = env.state().position
            assert (finished == []) is not public_io_only()  # OPENENV_PUBLIC_IO=1 turns the lane off
            native = env.async_client._connection.native
            assert native is not None
            assert native.transport.lent is not public_io_only()
            return position

    with anyio.fail_after(LIMIT):
        async with grid_server() as server:
            assert await anyio.to_thread.run_sync(walk, server.url) == [0, 3]


async def test_a_sync_view_and_new_sessions() -> None:
    def two_sessions(url: str) -> list[list[int]]:
        with GridEnv(base_url=url).sync() as env:
            env.reset()
            env.step(GridAction(direction="up"))
            other = env.new_session()
            other.reset()
            other.step(GridAction(direction="down", steps=3))
            return [env.state().position, other.state().position]

    with anyio.fail_after(LIMIT):
        async with grid_server() as server:
            positions = await anyio.to_thread.run_sync(two_sessions, server.url)
    assert positions == [[0, 1], [0, -3]]


async def test_new_session_in_async_code_is_closed_with_its_parent() -> None:
    with anyio.fail_after(LIMIT):
        async with grid_server() as server:
            async with GridEnv(base_url=server.url) as env:
                other = await env.new_session()
                assert isinstance(other, GridEnv)
                await other.reset()
                assert (await other.step(GridAction(direction="left"))).observation.position == [-1, 0]
            assert other._connection.native is None  # closed with its parent
            assert env._connection.native is None


async def test_errors_are_upstreams_runtime_errors_and_the_session_goes_on() -> None:
    with anyio.fail_after(LIMIT):
        async with grid_server() as server, GenericEnvClient(base_url=server.url) as env:
            await env.reset()
            with pytest.raises(
                RuntimeError, match=r"Server error: Invalid message \(code: VALIDATION_ERROR\)"
            ) as caught:
                await env.step(GenericAction(direction="north"))
            assert isinstance(caught.value.__cause__, openenv.ValidationError)
            with pytest.raises(RuntimeError, match="EXECUTION_ERROR"):
                await env.step({"direction": "raise"})
            assert (await env.step({"direction": "up"})).observation["position"] == [0, 1]


async def test_a_client_keeps_to_the_way_it_was_first_used() -> None:
    with anyio.fail_after(LIMIT):
        async with grid_server() as server:
            env = GenericEnvClient(base_url=server.url)
            await env.connect()
            with pytest.raises(RuntimeError, match="already being used in async mode"):
                await anyio.to_thread.run_sync(env.sync().reset)
            await env.close()


def test_what_the_client_refuses_at_once() -> None:
    with pytest.raises(ValueError, match="either base_url or provider"):
        GenericEnvClient()
    with pytest.raises(TypeError, match="no provider yet"):
        GenericEnvClient(provider=object())
    with pytest.raises(ValueError, match="Invalid mode"):
        GenericEnvClient(base_url="http://127.0.0.1:1", mode="staging")
    env = GenericEnvClient(base_url="http://127.0.0.1:1/")
    assert env.base_url == "http://127.0.0.1:1"
    with pytest.raises(AttributeError, match="Cannot modify mode"):
        env._mode = "production"  # upstream's guard, which upstream's own tests poke


async def test_a_test_may_fake_the_server_by_patching_send_and_receive(monkeypatch: pytest.MonkeyPatch) -> None:
    """Upstream's own tests fake a server so: every call goes through ``_send_and_receive``, as upstream's does."""
    sent: list[dict[str, Any]] = []

    async def fake(message: dict[str, Any]) -> dict[str, Any]:
        sent.append(message)
        if message["type"] == "state":
            return {"type": "state", "data": {"episode_id": "x", "step_count": 1, "goal": [0, 0], "position": [0, 1]}}
        return {"type": "observation", "data": {"observation": {"position": [0, 1]}, "reward": 1.0, "done": True}}

    env = GridEnv(base_url="http://127.0.0.1:1")  # nothing listens: the fake answers
    monkeypatch.setattr(env, "_send_and_receive", fake)
    with anyio.fail_after(LIMIT):
        result = await env.step(GridAction(direction="up"))
        state = await env.state()
    assert (result.observation.position, result.reward, result.done) == ([0, 1], 1.0, True)
    assert state.position == [0, 1]
    assert [message["type"] for message in sent] == ["step", "state"]
    assert sent[0]["data"] == {"metadata": {}, "direction": "up", "steps": 1}


async def test_a_server_that_is_not_there_is_upstreams_connection_error() -> None:
    with socket.socket() as bound:  # bound, never listening: a connection to it is refused at once
        bound.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{bound.getsockname()[1]}"

        def plain() -> BaseException:
            client = GenericEnvClient(base_url=url, connect_timeout_s=5)
            try:
                with pytest.raises(ConnectionError) as raised:
                    client.reset()
            finally:
                client.close()
            return raised.value

        with anyio.fail_after(LIMIT):
            with pytest.raises(ConnectionError, match=f"Failed to connect to {url}") as raised:
                async with GenericEnvClient(base_url=url, connect_timeout_s=5):
                    pass
            from_plain_code = await anyio.to_thread.run_sync(plain)
    for error in (raised.value, from_plain_code):
        assert isinstance(error.__cause__, openenv.ConnectError)


async def test_a_client_dropped_unclosed_in_plain_code_is_closed_and_freed() -> None:
    def forget(held: list[GridEnv]) -> None:
        held.clear()
        gc.collect()

    def drop(url: str) -> weakref.ref[GridEnv]:
        held = [GridEnv(base_url=url)]
        held[0].reset()
        gone = weakref.ref(held[0])
        with pytest.warns(ResourceWarning, match="unclosed"):  # closed as an unclosed file is
            forget(held)
        return gone

    with anyio.fail_after(LIMIT):
        async with grid_server() as server:
            gone = await anyio.to_thread.run_sync(drop, server.url)
    assert gone() is None
