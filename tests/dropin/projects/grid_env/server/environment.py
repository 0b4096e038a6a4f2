"""The grid world's environments, as upstream's ``envs/`` write them: a plain one and an async one."""

import uuid

from grid_env.models import GridAction, GridObservation, GridState
from openenv.core.env_server.interfaces import Environment

MOVES = {"up": (0, 1), "down": (0, -1), "left": (-1, 0), "right": (1, 0)}


class GridEnvironment(Environment):
    """Walk to the goal: reward 1 there (and the episode ends), -0.1 a step elsewhere."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self):  # no super().__init__(), as 11 of upstream's environments
        self._state = GridState(episode_id=str(uuid.uuid4()), step_count=0)

    def reset(self, seed=None, episode_id=None):  # no **kwargs: other reset keywords are dropped
        goal = [2, 2] if seed is None else [seed % 4, (seed // 4) % 4]
        self._state = GridState(episode_id=episode_id or str(uuid.uuid4()), step_count=0, goal=goal)
        return GridObservation(position=[0, 0], message=f"find {goal}", reward=0, metadata={"seed": seed})

    def step(self, action: GridAction) -> GridObservation:  # no timeout_s
        return self._move(action)

    def _move(self, action: GridAction) -> GridObservation:
        if action.direction == "raise":
            raise ValueError("the grid was asked to fail")
        dx, dy = MOVES[action.direction]
        x, y = self._state.position
        position = [x + dx * action.steps, y + dy * action.steps]
        self._state.position = position
        self._state.step_count += 1
        done = position == self._state.goal
        return GridObservation(
            position=position,
            message="found it" if done else "keep looking",
            done=done,
            reward=1.0 if done else -0.1,
            metadata={"step": self._state.step_count} if done else {},
        )

    @property
    def state(self) -> GridState:
        return self._state

    # Upstream's TaskProvider methods: the Task API's routes answer with them.
    def list_splits(self):
        return ["train", {"name": "eval", "type": "test"}]

    def list_tasks(self, split):
        return [{"goal": [index, index]} for index in range(3 if split == "train" else 1)]

    def num_tasks(self, split):
        return len(self.list_tasks(split))

    def get_task(self, split, index):
        return self.list_tasks(split)[index]

    def get_task_range(self, split, start=None, stop=None):
        return self.list_tasks(split)[start:stop]


class AsyncGridEnvironment(GridEnvironment):
    """The same walk, its reset and step awaited on the event loop (``reset_async``, ``step_async``)."""

    async def reset_async(self, seed=None, episode_id=None, **kwargs):
        return self.reset(seed=seed, episode_id=episode_id)

    async def step_async(self, action, timeout_s=None, **kwargs):
        return self._move(action)
