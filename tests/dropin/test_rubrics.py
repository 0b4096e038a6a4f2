"""``openenv.core.rubrics``: rewards from rubrics, as upstream's RFC 004 defines them, in an environment's step."""

from __future__ import annotations

from typing import Any

import pytest

from openenv.core.env_server import Action, Environment, Observation, State
from openenv.core.rubrics import ExponentialDiscountingTrajectoryRubric, Rubric, TrajectoryRubric


class Won(ExponentialDiscountingTrajectoryRubric):
    def score_trajectory(self, trajectory: list[tuple[Any, Any]]) -> float:
        return 1.0 if trajectory[-1][1].reward == "win" else 0.0


class Step(Observation):
    reward: Any = None


class Length(Rubric):
    def forward(self, action: Any, observation: Any) -> float:
        return float(len(action))


class Both(Rubric):
    def __init__(self) -> None:
        super().__init__()
        self.length = Length()
        self.inner = Pair()

    def forward(self, action: Any, observation: Any) -> float:
        return self.length(action, observation) + self.inner(action, observation)


class Pair(Rubric):
    def __init__(self) -> None:
        super().__init__()
        self.length = Length()

    def forward(self, action: Any, observation: Any) -> float:
        return 2 * self.length(action, observation)


class Judge(Rubric):
    async def forward(self, action: Any, observation: Any) -> float:
        return 0.5


def test_a_trajectory_is_scored_when_it_ends_and_discounted_backwards() -> None:
    rubric = Won(gamma=0.5, intermediate_reward=0.1)
    assert rubric(None, Step(done=False)) == 0.1
    assert rubric(None, Step(done=False)) == 0.1
    assert rubric(None, Step(done=True, reward="win")) == 1.0
    assert rubric.compute_step_rewards() == [0.25, 0.5, 1.0]
    assert len(rubric.trajectory) == 3
    assert rubric.last_score == 1.0
    rubric.reset()
    assert rubric.trajectory == []
    assert rubric.compute_step_rewards() == []
    assert rubric.state_dict() == {"intermediate_reward": 0.1, "gamma": 0.5}
    rubric.load_state_dict({"gamma": 0.9})
    assert rubric.gamma == 0.9
    with pytest.raises(ValueError, match=r"gamma must be in \[0, 1\]"):
        Won(gamma=1.5)
    assert issubclass(Won, TrajectoryRubric)


def test_children_are_found_by_path_and_hooks_run_around_each_call() -> None:
    rubric = Both()
    assert [name for name, _ in rubric.named_rubrics()] == ["length", "inner", "inner.length"]
    assert rubric.get_rubric("inner.length") is rubric.inner.length
    with pytest.raises(KeyError, match=r"Rubric path not found: inner\.width"):
        rubric.get_rubric("inner.width")
    seen: list[Any] = []
    rubric.register_forward_pre_hook(lambda r, a, o: seen.append(("before", a)))
    rubric.register_forward_hook(lambda r, a, o, reward: seen.append(("after", reward)))
    assert rubric("abc", None) == 9.0
    assert seen == [("before", "abc"), ("after", 9.0)]
    assert (rubric.last_score, rubric.inner.last_score, rubric.length.last_score) == (9.0, 6.0, 3.0)


@pytest.mark.anyio
async def test_an_async_rubric_gives_a_coroutine_and_an_async_environment_awaits_it() -> None:
    class Scored(Environment[Action, Observation, State]):
        def __init__(self) -> None:
            super().__init__(rubric=Judge())

        def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> Observation:
            self._reset_rubric()
            return Observation()

        def step(self, action: Action, timeout_s: float | None = None, **kwargs: Any) -> Observation:
            raise NotImplementedError

        async def step_async(self, action: Action, timeout_s: float | None = None, **kwargs: Any) -> Observation:
            observation = Observation()
            observation.reward = await self._apply_rubric_async(action, observation)
            return observation

        @property
        def state(self) -> State:
            return State()

    env = Scored()
    env.reset()
    assert (await env.step_async(Action())).reward == 0.5
    assert env.rubric is not None
    assert env.rubric.last_score == 0.5


def test_an_environment_without_a_rubric_or_its_init_rewards_nothing() -> None:
    class Plain(Environment[Action, Observation, State]):
        def __init__(self) -> None:  # no super().__init__(), as 11 of upstream's environments
            pass

        def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> Observation:
            self._reset_rubric()
            return self._apply_transform(Observation())

        def step(self, action: Action, timeout_s: float | None = None, **kwargs: Any) -> Observation:
            return Observation(reward=self._apply_rubric(action, Observation()))

        @property
        def state(self) -> State:
            return State()

    env = Plain()
    assert env.reset() == Observation()
    assert env.step(Action()).reward == 0.0
