"""``openenv demo``: the echo environment over every transport available, checked and shown.

For each transport it resets, steps, resets and steps again (``reset_async`` /
``step_async``), reads the state and calls the MCP tools through the async
client, then resets, steps and reads the state through the blocking
``.sync()`` facade; each part prints what came back and whether it held.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from functools import partial
from typing import Any

import click

import openenv

__all__ = ["DEMO_FACTORY", "run_demo"]

DEMO_FACTORY = "openenv.examples.echo:EchoEnvironment"
"""The environment the demo serves."""


class _DemoFailure(Exception):
    """One check of the demo did not hold."""


def _transport_unavailable(scheme: str, module: str, name: str) -> str | None:
    """Why a transport cannot be demonstrated, or ``None`` if it can."""
    if scheme not in openenv.registered_schemes():
        return f"the {scheme}:// scheme is not registered"
    try:
        getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        return f"{module} has no {name} ({exc})"
    return None


def _websocket_unavailable() -> str | None:
    """Why the WebSocket transport cannot be demonstrated, or ``None`` if it can."""
    return _transport_unavailable("ws", "transports.websocket", "WebSocketTransport")


def _polling_unavailable() -> str | None:
    """Why the HTTP long-polling transport cannot be demonstrated, or ``None`` if it can."""
    return _transport_unavailable("http+poll", "transports.http", "HTTPPollingTransport")


def _server_unavailable() -> str | None:
    """Why no server can run for the demo (its extra is not installed), or ``None`` if one can."""
    for module in ("starlette", "uvicorn", "hypercorn"):
        if importlib.util.find_spec(module) is None:
            return f"no server: {module} is not installed (pip install 'openenv-anyio[server]')"
    return None


def _describe(result: Any) -> str:
    observation = result.observation
    reward = "None" if result.reward is None else f"{result.reward:g}"
    return (
        f"echoed_message={observation.echoed_message!r} result={observation.result!r} "
        f"reward={reward} done={result.done!r}"
    )


def _observed(result: Any, name: str) -> Any:
    """A field of a result's observation (the echo client's type is a union: not every member has it)."""
    return getattr(result.observation, name, None)


def _check(condition: bool, what: str) -> None:
    if not condition:
        raise _DemoFailure(what)


async def _exercise_async(url: str) -> list[str]:
    """Run the demo's calls through the async client; returns the lines to print."""
    from openenv.examples.echo import CallToolAction, EchoEnv

    lines = []
    async with EchoEnv(url, timeout=10.0) as env:
        result = await env.reset()
        lines.append(f"reset()                  -> {_describe(result)}")
        _check(_observed(result, "echoed_message") == "" and not result.done, "reset() gave a fresh episode")
        action = CallToolAction(tool_name="echo_message", arguments={"message": "Hello, openenv!"})
        result = await env.step(action)
        lines.append(f"step(echo_message)       -> {_describe(result)}")
        _check(_observed(result, "echoed_message") == "Hello, openenv!", "step() echoed the message")
        result = await env.reset_async(episode_id="demo-episode")
        lines.append(f"reset_async(episode_id)  -> {_describe(result)}")
        action = CallToolAction(tool_name="echo_with_length", arguments={"message": "async"})
        result = await env.step_async(action)
        lines.append(f"step_async(with_length)  -> {_describe(result)}")
        _check(_observed(result, "result") == {"message": "async", "length": 5}, "step_async() measured the message")
        state = await env.state()
        lines.append(f"state()                  -> episode_id={state.episode_id!r} step_count={state.step_count}")
        _check(state.episode_id == "demo-episode" and state.step_count == 1, "state() followed the episode")
        tools = [tool.name for tool in await env.list_tools()]
        lines.append(f"list_tools()             -> {tools}")
        echoed = await env.call_tool("echo_message", message="tool")
        lines.append(f"call_tool(echo_message)  -> {echoed!r}")
        _check(tools == ["echo_message", "echo_with_length"] and echoed == "tool", "the MCP tools answered")
    return lines


def _exercise_sync(url: str, backend: str) -> list[str]:
    """Run the demo's calls through the blocking facade (``.sync()``)."""
    from openenv.examples.echo import CallToolAction, EchoEnv

    lines = []
    with EchoEnv(url, timeout=10.0).sync(backend=backend) as env:
        result = env.reset(episode_id="sync-episode")
        lines.append(f"reset(episode_id)        -> {_describe(result)}")
        result = env.step(CallToolAction(tool_name="echo_message", arguments={"message": "Hello, sync!"}))
        lines.append(f"step(echo_message)       -> {_describe(result)}")
        _check(_observed(result, "echoed_message") == "Hello, sync!", "step() echoed the message")
        state = env.state()
        lines.append(f"state()                  -> episode_id={state.episode_id!r} step_count={state.step_count}")
        _check(state.episode_id == "sync-episode" and state.step_count == 1, "state() followed the episode")
    return lines


def _report(label: str, run_demo: Callable[[], list[str]]) -> bool:
    """Run one demo part and print what it got; returns whether it passed."""
    click.echo(f"  {label}")
    try:
        lines = run_demo()
    except _DemoFailure as exc:
        click.secho(f"    FAILED: expected that {exc}", fg="red")
        return False
    except Exception as exc:
        click.secho(f"    FAILED: {type(exc).__name__}: {exc}", fg="red")
        return False
    for line in lines:
        click.echo(f"    {line}")
    click.secho("    ok", fg="green")
    return True


@contextmanager
def _demo_urls(portal: Any) -> Iterator[list[tuple[str, str | None, str]]]:
    """Yield ``(label, url or None, why skipped)`` for each transport, serving what needs a server."""
    with ExitStack() as stack:
        urls: list[tuple[str, str | None, str]] = [("in-process", f"inproc://{DEMO_FACTORY}", "")]
        # One server serves both: /ws, and /poll/sessions for HTTP long-polling.
        no_server = _server_unavailable()
        networked = [
            ("WebSocket", "ws", no_server or _websocket_unavailable()),
            ("HTTP long-polling", "http+poll", no_server or _polling_unavailable()),
        ]
        base_url = None
        if any(reason is None for _, _, reason in networked):
            from openenv.examples.echo import EchoEnvironment
            from transports.server.runner import serve

            running = stack.enter_context(portal.wrap_async_context_manager(serve(EchoEnvironment, port=0)))
            base_url = running.url
        for label, scheme, reason in networked:
            if reason is None and base_url is not None:
                urls.append((label, base_url.replace("http://", f"{scheme}://", 1), ""))
            else:
                urls.append((label, None, reason or "no server"))
        yield urls


def run_demo(backends: Sequence[str]) -> bool:
    """Run the demo on each of ``backends`` (``"asyncio"``, ``"trio"``), printing as it goes.

    Args:
        backends: The event loops to run it on, in order; the blocking facade
            runs on the first only.

    Returns:
        Whether every part passed.
    """
    from anyio.from_thread import start_blocking_portal

    passed = True
    for index, name in enumerate(backends):
        click.secho(f"== {name} ==", bold=True)
        with start_blocking_portal(name) as portal, _demo_urls(portal) as urls:
            for label, url, reason in urls:
                if url is None:
                    click.echo(f"  {label}: skipped ({reason})")
                    continue
                passed &= _report(f"{label} {url}", partial(portal.call, _exercise_async, url))
                if index == 0:
                    passed &= _report(f"{label} {url}, blocking (.sync())", partial(_exercise_sync, url, name))
    return passed
