"""The grid world's apps, as an environment package's ``server/app.py`` makes them: ``create_app`` at import."""

import os

from grid_env.models import GridAction, GridObservation, GridState
from grid_env.server.environment import AsyncGridEnvironment, GridEnvironment
from openenv.core.env_server.http_server import create_app

MAX_CONCURRENT_ENVS = int(os.environ.get("MAX_CONCURRENT_ENVS", "8"))

app = create_app(
    GridEnvironment,
    GridAction,
    GridObservation,
    env_name="grid_env",
    max_concurrent_envs=MAX_CONCURRENT_ENVS,
    state_cls=GridState,
)
async_app = create_app(
    AsyncGridEnvironment,
    GridAction,
    GridObservation,
    env_name="grid_env",
    max_concurrent_envs=MAX_CONCURRENT_ENVS,
    state_cls=GridState,
)
single_app = create_app(GridEnvironment, GridAction, GridObservation, env_name="grid_env", state_cls=GridState)
"""One session at a time: upstream's default."""


@app.get("/config")
def config():
    """A route of the package's own, as packages add them to the app ``create_app`` gave."""
    return {"max_concurrent_envs": MAX_CONCURRENT_ENVS, "env": "grid_env"}
