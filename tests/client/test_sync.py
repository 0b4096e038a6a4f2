"""The blocking facade, on both backends, and its refusal inside an event loop."""

from __future__ import annotations

import threading
from typing import Any

import anyio
import pytest

import openenv
from openenv.examples.echo import CallToolAction, EchoEnv, EchoObservation, EchoState

URL = "inproc://openenv.examples.echo:EchoEnvironment"


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_sync_facade(backend: str) -> None:
    with EchoEnv(URL).sync(backend=backend) as env:
        result = env.reset(episode_id="ep-s")
        assert isinstance(result.observation, EchoObservation)
        result = env.step(CallToolAction(tool_name="echo_message", arguments={"message": "sync"}))
        assert result.observation.echoed_message == "sync"
        state = env.state()
        assert state == EchoState(episode_id="ep-s", step_count=1)


def test_sync_timeout_and_errors() -> None:
    with EchoEnv(URL).sync() as env:
        with pytest.raises(openenv.ValidationError):
            env.step({"tool_name": 3})
        assert env.reset(timeout=5).observation.echoed_message == ""


def test_sync_connect_and_close_without_a_block() -> None:
    env = EchoEnv(URL).sync()
    with pytest.raises(openenv.ClientStateError, match="not connected"):
        env.reset()
    env.connect()
    with pytest.raises(openenv.ClientStateError, match="already connected"):
        env.connect()
    assert env.step(CallToolAction(tool_name="echo_message", arguments={"message": "x"})).reward == pytest.approx(0.1)
    env.close()
    env.close()
    with pytest.raises(openenv.ClientStateError):
        env.state()


def test_sync_clients_in_many_threads() -> None:
    counts: list[int] = []

    def worker() -> None:
        with EchoEnv(URL).sync() as env:
            for _ in range(5):
                env.step(CallToolAction(tool_name="echo_message", arguments={"message": "t"}))
            counts.append(env.state().step_count)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert counts == [5, 5, 5, 5]


@pytest.mark.anyio
async def test_sync_facade_refuses_to_block_an_event_loop() -> None:
    env = EchoEnv(URL).sync()
    with pytest.raises(openenv.ClientStateError, match="event loop"):
        env.connect()
    with pytest.raises(openenv.ClientStateError, match="event loop"):
        env.reset()
    with anyio.fail_after(5):
        # From a worker thread, where no loop runs, it works.
        def use() -> float | None:
            with EchoEnv(URL).sync() as inner:
                return inner.reset().reward

        assert await anyio.to_thread.run_sync(use) == 0.0


def test_sync_tools() -> None:
    with EchoEnv(URL).sync() as env:
        assert [tool.name for tool in env.list_tools()] == ["echo_message", "echo_with_length"]
        assert env.call_tool("echo_with_length", message="abc") == {"message": "abc", "length": 3}
        with pytest.raises(openenv.ToolCallError):
            env.call_tool("nope")
        assert env.mcp("tools/call", {"name": "echo_message", "arguments": {"message": "m"}})["data"] == "m"


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_a_facade_collected_while_open_is_closed_with_a_resource_warning(backend: str) -> None:
    env = EchoEnv(URL).sync(backend=backend).connect()
    client = env.client
    env.reset()
    with pytest.warns(ResourceWarning, match=r"unclosed <SyncEnvClient of <EchoEnv inproc://"):
        del env  # the last reference: collected at once
    assert not client.is_connected


def test_a_failed_connect_releases_the_event_loop_thread() -> None:
    env = openenv.EnvClient("inproc://no_such_module_here:Factory").sync()
    with pytest.raises(openenv.ConnectError):
        env.connect()
    with EchoEnv(URL).sync() as working:  # the shared loop thread is still usable
        assert working.reset().reward == 0.0


class HelpfulEcho(EchoEnv):
    """A typed client with helpers of its own, as OpenEnv's envs' clients have."""

    greeting = "hello"

    async def echo_twice(self, message: str, *, suffix: str = "") -> list[Any]:
        return [await self.call_tool("echo_message", message=message + suffix) for _ in range(2)]

    def plain(self) -> str:
        return self.greeting


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_the_sync_facade_runs_a_subclass_s_own_coroutine_methods(backend: str) -> None:
    with HelpfulEcho(URL).sync(backend=backend) as env:
        assert env.echo_twice("hi", suffix="!") == ["hi!", "hi!"]
        assert env.echo_twice.__name__ == "echo_twice"
        assert (env.plain(), env.greeting, env.mode) == ("hello", "hello", "simulation")
        with pytest.raises(AttributeError):
            env.no_such_helper  # noqa: B018
