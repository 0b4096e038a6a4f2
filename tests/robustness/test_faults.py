"""Faults over the whole stack: a dying server, garbage on the wire; the caller gets a typed error promptly."""

from __future__ import annotations

import os
import subprocess
import sys
import traceback
from pathlib import Path

import anyio
import pytest

import openenv
from openenv import EnvClient, State
from tests.envs import AsyncMessageEchoEnv, MessageAction, MessageObservation
from tests.helpers import free_port, wait_for_port, wait_until

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parents[2]
LIMIT = 30


class MessageEnv(EnvClient[MessageAction, MessageObservation, State]):
    pass


@pytest.mark.parametrize("scheme", ["ws", "http+poll"])
async def test_a_server_that_dies_mid_step_is_a_prompt_connection_error(scheme: str) -> None:
    port = free_port()
    command = [sys.executable, "-m", "transports.cli", "serve", "tests.envs:AnnouncingEchoEnv", "--port", str(port)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    process = await anyio.open_process(command, cwd=ROOT, env=env, stderr=subprocess.DEVNULL)
    try:
        with anyio.fail_after(LIMIT):
            await wait_for_port(port)
        async with MessageEnv(f"{scheme}://127.0.0.1:{port}") as client:
            with anyio.fail_after(LIMIT):
                assert (await client.step(MessageAction(message="alive"))).reward == 5.0

            async def kill_mid_step() -> None:
                assert process.stdout is not None
                seen = b""
                while seen.count(b"stepping\n") < 2:  # the first was the step above
                    seen += await process.stdout.receive()
                process.kill()

            async with anyio.create_task_group() as tg:
                tg.start_soon(kill_mid_step)
                # A step that would take a minute: the dead server must end it at once.
                with anyio.fail_after(10), pytest.raises(openenv.ConnectionClosed):
                    await client.step(MessageAction(message="sleep:60"))
            with pytest.raises(openenv.ConnectionClosed):
                await client.state()
    finally:
        if process.returncode is None:
            process.kill()
        with anyio.fail_after(10):
            await process.aclose()


async def test_garbage_bytes_leave_the_server_and_its_sessions_unharmed() -> None:
    with anyio.fail_after(LIMIT):
        async with openenv.serve(AsyncMessageEchoEnv, port=0) as server, MessageEnv(server.url) as client:
            await client.reset(episode_id="kept")
            for garbage in (b"\x00\xff" * 512, b"GET /ws HTTP/1.1\r\nUpgrade: websocket\r\n\r\n\x81\xff" + b"x" * 64):
                stream = await anyio.connect_tcp(server.host, server.port)
                async with stream:
                    await stream.send(garbage)
                    with anyio.move_on_after(2):
                        try:
                            while await stream.receive():
                                pass
                        except (anyio.EndOfStream, anyio.BrokenResourceError):
                            pass
            assert (await client.step(MessageAction(message="still"))).observation.echoed_message == "still"
            assert await client.state() == State(episode_id="kept", step_count=1)
            registry = server.app.state.sessions
            assert registry.active == 1


async def test_an_oversize_frame_ends_only_its_own_session() -> None:
    with anyio.fail_after(LIMIT):
        async with (
            openenv.serve(AsyncMessageEchoEnv, port=0, max_message_size=64 * 1024) as server,
            MessageEnv(server.url) as bystander,
        ):
            await bystander.reset(episode_id="bystander")
            # hypercorn tells the app of its own 1009 close as of a drop (1006), so the
            # sender's resumable session waits out its grace period: make it short.
            server.app.state.websocket.resume_timeout = 0.5
            async with MessageEnv(server.url) as sender:
                await sender.reset()
                # Small enough for our client (100 MiB), too big for this server.
                with pytest.raises(openenv.ConnectionClosed, match="1009"):
                    await sender.step(MessageAction(message="x" * 100_000))
                with pytest.raises(openenv.ConnectionClosed):
                    await sender.state()
            assert (await bystander.step(MessageAction(message="ok"))).reward == 2.0
            registry = server.app.state.sessions
            await wait_until(lambda: registry.active == 1)  # the oversize session's slot is released


async def test_a_reply_over_the_clients_limit_is_a_typed_error() -> None:
    with anyio.fail_after(LIMIT):
        async with (
            openenv.serve(AsyncMessageEchoEnv, port=0) as server,
            MessageEnv(server.url, max_message_size=1024) as client,
        ):
            await client.reset()
            with pytest.raises(openenv.TransportError):
                await client.step(MessageAction(message="y" * 4096))


@pytest.mark.parametrize(("scheme", "options"), [("ws", {}), ("http+poll", {"retries": 0})])
async def test_a_refused_connection_is_one_short_chain(scheme: str, options: dict[str, int]) -> None:
    """The I/O libraries' frames are left out: the cause is the system's error, told in the message too."""
    with anyio.fail_after(LIMIT), pytest.raises(openenv.ConnectError) as info:
        async with MessageEnv(f"{scheme}://127.0.0.1:{free_port()}", **options):
            pass
    cause = info.value.__cause__
    assert isinstance(cause, ConnectionRefusedError)
    assert (cause.__traceback__, cause.__cause__, cause.__context__) == (None, None, None)
    assert str(cause) in str(info.value)
    printed = "".join(traceback.format_exception(info.value))
    cause_part, _, error_part = printed.partition("The above exception was the direct cause")
    assert cause_part.strip() == f"{type(cause).__name__}: {cause}"  # no frames: the libraries' internals
    assert "The above exception" not in error_part
