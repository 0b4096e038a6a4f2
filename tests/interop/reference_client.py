"""Drive a server with a *reference*'s ``GenericEnvClient`` (openenv 0.10.0, or openenv-core 0.3.0).

Run with the reference venv's python (see reference_venv.py), never ours:

    python reference_client.py URL [--sync] [--timeout S] [--ops JSON]

URL is what a user passes as ``base_url`` (http://host:port; the client itself
turns it into ws://host:port/ws). Prints one JSON object per line on stdout:

    {"op": "reset", "args": {...}, "ok": true, "observation": {...}, "reward": 0.0, "done": false}
    {"op": "step", "action": {...}, "ok": true, "observation": {...}, "reward": 5.0, "done": false}
    {"op": "state", "ok": true, "state": {...}}
    {"op": "step", "action": {...}, "ok": false, "error_type": "RuntimeError", "error": "Server error: ..."}
    {"op": "close", "ok": true}

Default ops: reset(seed=42, episode_id="ep-1"), step {"message": "hello"},
state, step {"messag": "typo"} (expected to fail), step {"message": "again"},
state, close. ``--ops`` takes a JSON list replacing that, each item one of
``{"op": "reset", "args": {...}}``, ``{"op": "step", "action": {...}}``,
``{"op": "state"}``, ``{"op": "close"}``; a step with ``"model": true`` sends its
action as a pydantic subclass of the reference's ``Action`` (which the client
sends whole, ``metadata`` included), as a typed OpenEnv client does. A failing op is reported and the
script goes on; exit status is 0 unless the script itself breaks.

``--sync`` uses the reference's ``.sync()`` wrapper (SyncEnvClient) instead of
the native async API; ``--typed`` a typed ``EnvClient`` subclass (pydantic
action and observation, its own three parsers, as OpenEnv's environments'
clients are written) instead of ``GenericEnvClient``; its observations are
reported as their fields, and each result's ``metadata`` where the release has it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any

# Ours and the reference both install `openenv`: this imports the reference's, without its web UI
# (pass --full-import to import that too), and refuses to run on ours.
from reference_import import import_reference_openenv

import_reference_openenv()

from openenv.core import GenericEnvClient  # noqa: E402 - after the reference's openenv

DEFAULT_OPS: list[dict[str, Any]] = [
    {"op": "reset", "args": {"seed": 42, "episode_id": "ep-1"}},
    {"op": "step", "action": {"message": "hello"}},
    {"op": "state"},
    {"op": "step", "action": {"messag": "typo"}},
    {"op": "step", "action": {"message": "again"}},
    {"op": "state"},
    {"op": "close"},
]


def emit(record: dict[str, Any]) -> None:
    print(json.dumps(record, sort_keys=True, default=repr), flush=True)


def result_fields(result: Any) -> dict[str, Any]:
    # StepResult is a dataclass: observation (dict for GenericEnvClient, a pydantic model for a typed
    # client), reward, done, and since 0.10 metadata.
    observation = result.observation
    if hasattr(observation, "model_dump"):
        observation = observation.model_dump(exclude={"reward", "done"})
    fields = {
        "observation": observation,
        "reward": result.reward,
        "done": result.done,
        "result_type": type(result).__name__,
    }
    if hasattr(result, "metadata"):
        fields["metadata"] = result.metadata
    return fields


def typed_client(url: str, timeout: float) -> Any:
    """A typed client of the echo, written as OpenEnv's environments write theirs (pydantic types, three parsers)."""
    from openenv.core.client_types import StepResult
    from openenv.core.env_client import EnvClient
    from openenv.core.env_server.types import Action, Observation, State

    class EchoAction(Action):
        message: str

    class EchoObservation(Observation):
        echoed_message: str = ""

    class EchoEnv(EnvClient[EchoAction, EchoObservation, State]):
        def _step_payload(self, action: EchoAction) -> dict[str, Any]:
            return {"message": action.message}

        def _parse_result(self, payload: dict[str, Any]) -> Any:
            observation = EchoObservation(
                **payload.get("observation", {}), reward=payload.get("reward"), done=payload.get("done", False)
            )
            extra = {"metadata": payload.get("metadata")} if "metadata" in StepResult.__dataclass_fields__ else {}
            return StepResult(observation=observation, reward=payload.get("reward"), done=payload.get("done"), **extra)

        def _parse_state(self, payload: dict[str, Any]) -> Any:
            return State(**payload)

    EchoEnv.action_type = EchoAction
    return EchoEnv(base_url=url, connect_timeout_s=timeout, message_timeout_s=timeout)


def new_client(url: str, timeout: float, typed: bool) -> Any:
    if typed:
        return typed_client(url, timeout)
    return GenericEnvClient(base_url=url, connect_timeout_s=timeout, message_timeout_s=timeout)


def action_of(op: dict[str, Any], client: Any = None) -> Any:
    """The step's action: the dict itself, a pydantic ``Action`` built from it, or the typed client's action."""
    action_type = getattr(client, "action_type", None)
    if action_type is not None:
        return action_type.model_construct(**op["action"])  # unvalidated: the server judges it, as for a dict
    if not op.get("model"):
        return op["action"]
    from pydantic import create_model

    from openenv.core.env_server.types import Action

    fields: dict[str, Any] = {name: (type(value), ...) for name, value in op["action"].items()}
    return create_model("ScriptAction", __base__=Action, **fields)(**op["action"])


def state_fields(state: Any) -> Any:
    return state.model_dump() if hasattr(state, "model_dump") else state


def describe(op: dict[str, Any]) -> dict[str, Any]:
    rec = {"op": op["op"]}
    if op["op"] == "reset":
        rec["args"] = op.get("args", {})
    elif op["op"] == "step":
        rec["action"] = op["action"]
    return rec


async def run_async(url: str, ops: list[dict[str, Any]], timeout: float, typed: bool = False) -> None:
    client = new_client(url, timeout, typed)
    emit({"op": "init", "ok": True, "ws_url": client._ws_url, "client": type(client).__name__})
    closed = False
    try:
        for op in ops:
            rec = describe(op)
            try:
                kind = op["op"]
                if kind == "reset":
                    rec.update(result_fields(await client.reset(**op.get("args", {}))))
                elif kind == "step":
                    rec.update(result_fields(await client.step(action_of(op, client))))
                elif kind == "state":
                    rec["state"] = state_fields(await client.state())
                elif kind == "close":
                    await client.close()
                    closed = True
                else:
                    raise ValueError(f"unknown op {kind!r}")
                rec["ok"] = True
            except Exception as exc:  # the reference raises bare RuntimeError for error frames
                rec.update(ok=False, error_type=type(exc).__name__, error=str(exc))
            emit(rec)
    finally:
        if not closed:
            await asyncio.wait_for(client.close(), timeout)


def run_sync(url: str, ops: list[dict[str, Any]], timeout: float, typed: bool = False) -> None:
    client = new_client(url, timeout, typed).sync()
    emit({"op": "init", "ok": True, "ws_url": client.async_client._ws_url, "client": type(client).__name__})
    closed = False
    try:
        for op in ops:
            rec = describe(op)
            try:
                kind = op["op"]
                if kind == "reset":
                    rec.update(result_fields(client.reset(**op.get("args", {}))))
                elif kind == "step":
                    rec.update(result_fields(client.step(action_of(op, client.async_client))))
                elif kind == "state":
                    rec["state"] = state_fields(client.state())
                elif kind == "close":
                    client.close()
                    closed = True
                else:
                    raise ValueError(f"unknown op {kind!r}")
                rec["ok"] = True
            except Exception as exc:
                rec.update(ok=False, error_type=type(exc).__name__, error=str(exc))
            emit(rec)
    finally:
        if not closed:
            client.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("url", help="server base URL, e.g. http://127.0.0.1:8000")
    p.add_argument("--sync", action="store_true", help="use the SyncEnvClient wrapper")
    p.add_argument("--timeout", type=float, default=10.0, help="connect and per-message timeout (s)")
    p.add_argument("--ops", default=None, help="JSON list of ops (see module doc) instead of the default sequence")
    p.add_argument("--typed", action="store_true", help="a typed EnvClient subclass instead of GenericEnvClient")
    args = p.parse_args(argv)
    ops = json.loads(args.ops) if args.ops else DEFAULT_OPS
    if args.sync:
        run_sync(args.url, ops, args.timeout, args.typed)
    else:
        asyncio.run(run_async(args.url, ops, args.timeout, args.typed))
    return 0


if __name__ == "__main__":
    sys.exit(main())
