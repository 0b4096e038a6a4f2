"""Echo environment served by a *reference* release (openenv 0.10.0 or openenv-core 0.3.0; create_app + uvicorn).

Run with the reference venv's python (see reference_venv.py), never ours:

    python reference_server.py --port PORT [--host 127.0.0.1] [--max-sessions N]

Readiness: once uvicorn has started, one line ``READY <port>`` is printed to
stdout (flushed); nothing else goes to stdout (uvicorn logs go to stderr).
``--port 0`` is supported: the script binds the socket itself and reports the
ephemeral port on the READY line. ``GET /health`` also works as a probe.

The environment (matches shared/reference/openenv-wire.md):
  action       {message: str}  (+ the base Action's optional ``metadata``;
               extra fields forbidden, as for every reference Action)
  observation  {echoed_message: str} + base fields done/reward/metadata
  reward       float(len(message)); reset gives echoed_message "" and reward 0.0
  state        {episode_id, step_count}
  reset        accepts ``seed`` and ``episode_id`` only (no **kwargs), so the
               reference server drops any other reset keys.
With ``--mcp-echo`` it serves instead an MCP echo environment shaped like
OpenEnv's ``envs/echo_env`` (the reference's ``MCPEnvironment`` over a FastMCP
server with the tools ``echo_message`` and ``echo_with_length``; an empty
observation on reset; action and observation classes ``CallToolAction`` and
``CallToolObservation``). With ``--blob-bytes N`` it serves instead an env whose every step observation
is {data: base64 of N seeded random bytes} (for the large-observation benchmark).
With ``--app package.module:attribute`` it serves that app instead: an environment
package's own ``create_app`` (put its directory on ``PYTHONPATH``). With ``--tasks``
(0.10.0 only) the echo environment also offers tasks through the Task API's methods
(``list_splits``, ``list_tasks``, ...).
Triggers:
  message == "raise"  -> step raises RuntimeError  -> EXECUTION_ERROR frame
  message == "done"   -> observation done=True
  message == "sleep:<seconds>" -> step sleeps that long first (for timeout tests)
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import importlib
import os
import random
import socket
import sys
import threading
import time
import uuid

# The web UI (gradio) must stay off: create_app switches on this variable.
os.environ.pop("ENABLE_WEB_INTERFACE", None)

# Ours and the reference both install `openenv`: this imports the reference's, without its web UI
# (pass --full-import to import that too), and refuses to run on ours.
from reference_import import import_reference_openenv

import_reference_openenv()

import uvicorn  # noqa: E402
from pydantic import Field  # noqa: E402

from openenv.core.env_server.http_server import create_app  # noqa: E402
from openenv.core.env_server.interfaces import Environment  # noqa: E402
from openenv.core.env_server.types import Action, Observation, State  # noqa: E402


class EchoAction(Action):
    message: str = Field(..., description="Message to echo back")


class EchoObservation(Observation):
    echoed_message: str = Field(default="", description="The echoed message")


class EchoEnvironment(Environment):
    SUPPORTS_CONCURRENT_SESSIONS = True  # required by the reference for max_sessions > 1

    def __init__(self) -> None:
        super().__init__()
        self._state = State(episode_id=str(uuid.uuid4()), step_count=0)

    def reset(self, seed: int | None = None, episode_id: str | None = None) -> EchoObservation:
        self._state = State(episode_id=episode_id or str(uuid.uuid4()), step_count=0)
        return EchoObservation(echoed_message="", reward=0.0, done=False)

    def step(self, action: EchoAction, timeout_s: float | None = None, **kwargs) -> EchoObservation:  # type: ignore[override]
        message = action.message
        if message == "raise":
            raise RuntimeError("echo env: step raised on request")
        if message.startswith("sleep:"):
            time.sleep(float(message.split(":", 1)[1]))
        self._state.step_count += 1
        return EchoObservation(echoed_message=message, reward=float(len(message)), done=message == "done")

    @property
    def state(self) -> State:
        return self._state


class AsyncEchoEnvironment(EchoEnvironment):
    """The same logic with ``step_async`` overridden: the reference then awaits it on the loop."""

    async def step_async(self, action: EchoAction, timeout_s: float | None = None, **kwargs) -> EchoObservation:  # type: ignore[override]
        message = action.message
        if message == "raise":
            raise RuntimeError("echo env: step raised on request")
        self._state.step_count += 1
        return EchoObservation(echoed_message=message, reward=float(len(message)), done=message == "done")


class BlobObservation(Observation):
    data: str = Field(default="", description="base64 of the payload bytes")


def blob_environment(size: int) -> type[Environment]:
    """An env answering every step with ``size`` seeded random bytes, base64 in ``data``.

    Base64 because the reference's pydantic observations write ``bytes`` as
    UTF-8 text, which random bytes are not; it is what msgspec writes for bytes.
    """
    payload = base64.b64encode(random.Random(0).randbytes(size)).decode()

    class BlobEnvironment(EchoEnvironment):
        async def step_async(self, action: EchoAction, timeout_s: float | None = None, **kwargs) -> BlobObservation:  # type: ignore[override]
            self._state.step_count += 1
            return BlobObservation(data=payload, reward=1.0, done=False)

    return BlobEnvironment


def mcp_echo_environment() -> type[Environment]:
    """An MCP tool environment built as OpenEnv's echo_env is: FastMCP tools behind ``MCPEnvironment``."""
    from fastmcp import FastMCP

    from openenv.core.env_server.mcp_environment import MCPEnvironment

    class MCPEchoEnvironment(MCPEnvironment):
        SUPPORTS_CONCURRENT_SESSIONS = True

        def __init__(self) -> None:
            server = FastMCP("echo_env")

            @server.tool
            def echo_message(message: str) -> str:
                """Echo back the provided message."""
                return message

            @server.tool
            def echo_with_length(message: str) -> dict:
                """Echo back the message with its length."""
                return {"message": message, "length": len(message)}

            super().__init__(server)
            self._state = State(episode_id=str(uuid.uuid4()), step_count=0)

        def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs) -> Observation:
            self._state = State(episode_id=episode_id or str(uuid.uuid4()), step_count=0)
            return Observation(done=False, reward=0.0, metadata={"status": "ready"})

        def _step_impl(self, action: Action, timeout_s: float | None = None, **kwargs) -> Observation:
            return Observation(done=False, reward=0.0, metadata={"error": f"unknown action {type(action).__name__}"})

        def step(self, action: Action, timeout_s: float | None = None, **kwargs) -> Observation:  # type: ignore[override]
            self._state.step_count += 1
            return super().step(action, timeout_s=timeout_s, **kwargs)

        async def step_async(self, action: Action, timeout_s: float | None = None, **kwargs) -> Observation:  # type: ignore[override]
            self._state.step_count += 1
            return await super().step_async(action, timeout_s=timeout_s, **kwargs)

        @property
        def state(self) -> State:
            return self._state

    return MCPEchoEnvironment


# The tasks of --tasks (0.10.0's Task API): the same specs as tests.envs.TASKS.
TASKS = {
    "train": [{"question": "1+1", "answer": 2}, {"question": "2+3", "answer": 5}, {"question": "4+4", "answer": 8}],
    "test": [{"question": "9+1", "answer": 10}],
    "dev": [],
}


class TaskEchoEnvironment(EchoEnvironment):
    """The echo environment offering tasks through 0.10.0's TaskProvider methods (async ones among them)."""

    def list_splits(self) -> list[str]:
        return list(TASKS)

    async def list_tasks(self, split: str) -> list[dict]:
        return TASKS[split]

    def num_tasks(self, split: str) -> int:
        return len(TASKS[split])

    def get_task(self, split: str, index: int) -> dict:
        if not 0 <= index < len(TASKS[split]):
            raise IndexError(index)
        return TASKS[split][index]

    def get_task_range(self, split: str, start: int | None = None, stop: int | None = None) -> list[dict]:
        return TASKS[split][start:stop]


def build_app(
    max_sessions: int, async_step: bool = False, blob_bytes: int = 0, mcp_echo: bool = False, tasks: bool = False
):
    if mcp_echo:
        from openenv.core.env_server.mcp_types import CallToolAction, CallToolObservation

        return create_app(
            mcp_echo_environment(),
            CallToolAction,
            CallToolObservation,
            env_name="echo_env",
            max_concurrent_envs=max_sessions,
        )
    if blob_bytes:
        env, observation = blob_environment(blob_bytes), BlobObservation
    elif tasks:
        env, observation = TaskEchoEnvironment, EchoObservation
    else:
        env, observation = (AsyncEchoEnvironment if async_step else EchoEnvironment), EchoObservation
    return create_app(
        env,
        EchoAction,
        observation,
        env_name="echo_env",
        max_concurrent_envs=max_sessions,
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True, help="0 = ephemeral, reported on the READY line")
    p.add_argument("--max-sessions", type=int, default=4, help="max concurrent WebSocket sessions (default 4)")
    p.add_argument("--log-level", default="warning")
    p.add_argument("--ws", default="auto", help="uvicorn ws implementation (default auto = websockets-sansio)")
    p.add_argument("--stdin-watchdog", action="store_true", help="exit when stdin reaches EOF (parent died)")
    p.add_argument("--async-step", action="store_true", help="serve the env variant that overrides step_async")
    p.add_argument("--blob-bytes", type=int, default=0, help="serve the env whose observations carry N bytes")
    p.add_argument("--mcp-echo", action="store_true", help="serve an MCP echo env built as OpenEnv's echo_env")
    p.add_argument("--tasks", action="store_true", help="serve the echo env offering tasks (0.10.0's Task API)")
    p.add_argument("--max-lifetime", type=float, default=0.0, help="exit after this many seconds (0 = never)")
    p.add_argument("--app", help="serve this app instead, 'package.module:attribute' (an environment package's)")
    args = p.parse_args(argv)

    if args.app:
        module, _, attribute = args.app.partition(":")
        app = getattr(importlib.import_module(module), attribute)
    else:
        app = build_app(
            args.max_sessions,
            async_step=args.async_step,
            blob_bytes=args.blob_bytes,
            mcp_echo=args.mcp_echo,
            tasks=args.tasks,
        )

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((args.host, args.port))
    port = sock.getsockname()[1]

    config = uvicorn.Config(
        app,
        log_level=args.log_level,
        ws=args.ws,
        timeout_graceful_shutdown=2,
        lifespan="on",
    )
    server = uvicorn.Server(config)

    def request_exit(reason: str) -> None:
        server.should_exit = True  # first: stderr may be a broken pipe by now
        with contextlib.suppress(Exception):
            print(f"reference_server: exiting ({reason})", file=sys.stderr, flush=True)

    if args.stdin_watchdog:

        def watch_stdin() -> None:
            try:
                while sys.stdin.buffer.read(4096):
                    pass
            except Exception:
                pass
            request_exit("stdin closed")

        threading.Thread(target=watch_stdin, name="stdin-watchdog", daemon=True).start()

    if args.max_lifetime > 0:
        timer = threading.Timer(args.max_lifetime, request_exit, args=("max lifetime reached",))
        timer.daemon = True
        timer.start()

    async def serve() -> None:
        task = asyncio.create_task(server.serve(sockets=[sock]))
        while not server.started:
            if task.done():
                await task  # re-raise startup failure
                return
            await asyncio.sleep(0.02)
        print(f"READY {port}", flush=True)
        await task

    asyncio.run(serve())
    return 0


if __name__ == "__main__":
    sys.exit(main())
