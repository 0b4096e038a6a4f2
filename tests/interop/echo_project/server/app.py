"""An echo environment as upstream OpenEnv 0.10 writes one (its create_app, its pydantic types).

Run by openenv's launcher in the project's own environment, never with openenv's
packages. ``ECHO_PROJECT_FAIL`` makes it fail at import (the launcher's error path).
"""

import os
import uuid

from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State

if os.environ.get("ECHO_PROJECT_FAIL"):
    raise RuntimeError("echo project: failing on request")


class EchoAction(Action):
    message: str


class EchoObservation(Observation):
    echoed_message: str = ""


class EchoEnvironment(Environment):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        super().__init__()
        self._state = State(episode_id=str(uuid.uuid4()), step_count=0)

    def reset(self, seed=None, episode_id=None, **kwargs) -> EchoObservation:
        self._state = State(episode_id=episode_id or str(uuid.uuid4()), step_count=0)
        return EchoObservation(echoed_message="", reward=0.0, metadata={"pid": os.getpid()})

    def step(self, action: EchoAction, timeout_s=None, **kwargs) -> EchoObservation:
        self._state.step_count += 1
        return EchoObservation(
            echoed_message=action.message,
            reward=float(len(action.message)),
            metadata={"length": len(action.message), "pid": os.getpid()},
        )

    @property
    def state(self) -> State:
        return self._state


app = create_app(EchoEnvironment, EchoAction, EchoObservation, env_name="echo_project", max_concurrent_envs=16)
