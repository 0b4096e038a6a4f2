"""One scripted session of the grid world's clients, printed as JSON: run by upstream's Python and by ours.

    python client_session.py URL {own,generic} {sync,async}

``own`` is the package's client (``grid_env.client.GridEnv``), ``generic`` upstream's
``GenericEnvClient``; each call's result (or error) is one line of the JSON list printed.
Whichever ``openenv`` the Python imports runs it: upstream 0.10.0's in its environment,
openenv-anyio's ``openenv.core`` in ours.
"""

import asyncio
import json
import sys

from grid_env.client import GridEnv
from grid_env.models import GridAction

from openenv.core.generic_client import GenericEnvClient

CALLS = [
    ("reset", {"seed": 5, "episode_id": "s-1", "colour": "blue"}),
    ("step", {"direction": "right"}),
    ("step", {"direction": "up", "steps": 1}),
    ("state", None),
    ("step", {"direction": "north"}),
    ("step", {"direction": "raise"}),
    ("step", {"direction": "down", "metadata": {"note": "kept"}}),
    ("state", None),
]


def describe(value):
    """A result as JSON: its fields (a pydantic model dumped), its class's name."""
    if hasattr(value, "model_dump"):
        return {"class": type(value).__name__, **value.model_dump(mode="json")}
    if hasattr(value, "observation"):
        return {
            "class": type(value).__name__,
            "observation": describe(value.observation),
            "reward": value.reward,
            "done": value.done,
            "metadata": value.metadata,
        }
    return value


def action_of(kind, data):
    """The action a client sends: the package's model (built unchecked when it would refuse it), or the dict."""
    if kind == "generic":
        return data
    try:
        return GridAction(**data)
    except ValueError:  # pydantic's refusal: send it anyway, for the server to refuse
        return GridAction.model_construct(**data)


def run_sync(url, kind):
    client = GridEnv(base_url=url) if kind == "own" else GenericEnvClient(base_url=url)
    lines = []
    with client.sync() as env:
        for call, data in CALLS:
            try:
                if call == "reset":
                    lines.append(describe(env.reset(**data)))
                elif call == "step":
                    lines.append(describe(env.step(action_of(kind, data))))
                else:
                    lines.append(describe(env.state()))
            except Exception as exc:
                lines.append({"error": type(exc).__name__, "message": str(exc)})
    return lines


async def run_async(url, kind):
    client = GridEnv(base_url=url) if kind == "own" else GenericEnvClient(base_url=url)
    lines = []
    async with client as env:
        for call, data in CALLS:
            try:
                if call == "reset":
                    lines.append(describe(await env.reset(**data)))
                elif call == "step":
                    lines.append(describe(await env.step(action_of(kind, data))))
                else:
                    lines.append(describe(await env.state()))
            except Exception as exc:
                lines.append({"error": type(exc).__name__, "message": str(exc)})
    return lines


def main():
    url, kind, how = sys.argv[1:4]
    lines = run_sync(url, kind) if how == "sync" else asyncio.run(run_async(url, kind))
    print(json.dumps(lines))


if __name__ == "__main__":
    main()
