"""Upstream OpenEnv's ``openenv.core.env_server.interfaces``: the `Environment` an environment package subclasses.

Written to upstream 0.10.0's signatures. The class holds no state its subclasses
must set up: many upstream environments never call ``super().__init__()``, so
`transform` and `rubric` are read with a default of ``None``.
"""

from __future__ import annotations

import inspect
from abc import ABC, abstractmethod
from typing import Any, Generic, Protocol, TypedDict, TypeVar

from openenv.core.env_server.types import Action, EnvironmentMetadata, Observation, State

__all__ = ["Environment", "Message", "ModelTokenizer", "TaskProvider", "Transform"]

ActT = TypeVar("ActT", bound=Action)
ObsT = TypeVar("ObsT", bound=Observation)
StateT = TypeVar("StateT", bound=State)


class Message(TypedDict):
    """One message of a conversation, as chat templates take it."""

    role: str
    content: str


class ModelTokenizer(Protocol):
    """A tokenizer with a chat template (Hugging Face ``transformers``' have these two methods)."""

    def apply_chat_template(
        self,
        conversation: list[Message],
        tokenize: bool = True,
        return_tensors: str | None = None,
        **kwargs: Any,
    ) -> Any:
        """Format a conversation with the template, and tokenize it unless ``tokenize`` is false."""
        ...

    def decode(self, token_ids: Any, skip_special_tokens: bool = False, **kwargs: Any) -> str:
        """The text of some token ids."""
        ...


class TaskProvider(Protocol):
    """The task methods an environment may define; the server then answers the Task API's routes with them."""

    def list_splits(self) -> list[Any]:
        """The splits' descriptors (names, dicts or models)."""
        ...

    def list_tasks(self, split: str) -> list[Any]:
        """The task specs of a split."""
        ...

    def num_tasks(self, split: str) -> int:
        """How many tasks a split holds."""
        ...

    def get_task(self, split: str, index: int) -> Any:
        """One task spec of a split; `IndexError` when there is none at ``index``."""
        ...

    def get_task_range(self, split: str, start: int | None = None, stop: int | None = None) -> list[Any]:
        """The task specs of a split in ``[start, stop)``."""
        ...


class Rubric(Protocol):
    """What the environment asks of a rubric (upstream's ``openenv.core.rubrics.Rubric`` is one)."""

    def __call__(self, action: Any, observation: Any) -> Any:
        """The reward of a step: a number, or a coroutine that gives one."""
        ...

    def reset(self) -> None:
        """Forget the episode so far."""
        ...


class Transform(ABC, Generic[ObsT]):
    """Changes an observation before it leaves the environment (to add a reward, a metric)."""

    @abstractmethod
    def __call__(self, observation: ObsT) -> ObsT:
        """The observation, transformed.

        Args:
            observation: The observation the environment made.
        """


class Environment(ABC, Generic[ActT, ObsT, StateT]):
    """The base class of an environment, as upstream OpenEnv defines it.

    Write `reset`, `step` and the `state` property as plain methods: the server
    runs them on a thread of the session's own. Override `reset_async` or
    `step_async` instead to be awaited on the event loop.

    Args:
        transform: Applied to observations by `_apply_transform`.
        rubric: Computes rewards, by `_apply_rubric`.

    Attributes:
        SUPPORTS_CONCURRENT_SESSIONS: Whether instances keep nothing in common, so
            a server may hold several sessions at once (``create_app``'s
            ``max_concurrent_envs`` above 1 needs it).
        REQUIRES_SINGLE_THREAD_EXECUTOR: Whether every session's calls must run
            on one and the same thread.
        transform: The observation transform, or ``None``.
        rubric: The reward rubric, or ``None``.
    """

    SUPPORTS_CONCURRENT_SESSIONS: bool = False
    REQUIRES_SINGLE_THREAD_EXECUTOR: bool = False

    transform: Transform[ObsT] | None = None
    rubric: Rubric | None = None

    def __init__(self, transform: Transform[ObsT] | None = None, rubric: Rubric | None = None) -> None:
        self.transform = transform
        self.rubric = rubric

    @abstractmethod
    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> ObsT:
        """Start an episode; its first observation."""

    async def reset_async(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> ObsT:
        """`reset`, awaitable: override it to reset on the event loop."""
        return self.reset(seed=seed, episode_id=episode_id, **kwargs)

    @abstractmethod
    def step(self, action: ActT, timeout_s: float | None = None, **kwargs: Any) -> ObsT:
        """Take one action; the observation it leads to."""

    async def step_async(self, action: ActT, timeout_s: float | None = None, **kwargs: Any) -> ObsT:
        """`step`, awaitable: override it to step on the event loop."""
        return self.step(action, timeout_s=timeout_s, **kwargs)

    @property
    @abstractmethod
    def state(self) -> StateT:
        """The environment's state now."""

    def get_metadata(self) -> EnvironmentMetadata:
        """What ``GET /metadata`` says; by default the class's name, and version 1.0.0."""
        name = type(self).__name__
        return EnvironmentMetadata(name=name, description=f"{name} environment", version="1.0.0")

    def _apply_transform(self, observation: ObsT) -> ObsT:
        """The observation through `transform`, if there is one."""
        transform = getattr(self, "transform", None)
        return observation if transform is None else transform(observation)

    def _apply_rubric(self, action: ActT, observation: ObsT) -> float:
        """The `rubric`'s reward for a step (``0.0`` without one)."""
        rubric = getattr(self, "rubric", None)
        return 0.0 if rubric is None else rubric(action, observation)

    async def _apply_rubric_async(self, action: ActT, observation: ObsT) -> float:
        """`_apply_rubric`, awaiting a rubric that answers with a coroutine."""
        rubric = getattr(self, "rubric", None)
        if rubric is None:
            return 0.0
        reward = rubric(action, observation)
        score: float = await reward if inspect.iscoroutine(reward) else reward
        return score

    def _reset_rubric(self) -> None:
        """Clear the `rubric`'s trajectory, if there is one (call it in `reset`)."""
        rubric = getattr(self, "rubric", None)
        if rubric is not None:
            rubric.reset()

    async def _reset_rubric_async(self) -> None:
        """`_reset_rubric`, through the rubric's own ``reset_async`` where it has one."""
        rubric = getattr(self, "rubric", None)
        if rubric is None:
            return
        reset = getattr(rubric, "reset_async", None)
        if reset is None:
            rubric.reset()
            return
        result = reset()
        if inspect.iscoroutine(result):
            await result

    def render_web(self, observation: dict[str, Any]) -> str | None:
        """HTML for upstream's web interface, which openenv does not serve: kept so overrides still resolve."""
        return None

    def web_actions(self, observation: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
        """One-click actions for upstream's web interface, which openenv does not serve."""
        return []

    def close(self) -> None:
        """Free what the environment holds; called once its session ends."""
