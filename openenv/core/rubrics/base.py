"""Upstream OpenEnv's ``openenv.core.rubrics.base``: `Rubric`, a reward computed from an action and its observation.

Shaped as a PyTorch module is: a subclass writes `Rubric.forward`; rubrics held in its
attributes become its children (`Rubric.named_rubrics` walks them); hooks run around each
call; `Rubric.last_score` keeps the last reward. ``forward`` may be a coroutine function
(an LLM judge): the call then returns a coroutine, and hooks may be coroutine functions too.
"""

from __future__ import annotations

import inspect
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

__all__ = ["Rubric"]

ForwardHook = Callable[["Rubric", Any, Any, float], Any]
"""Called after each call: ``hook(rubric, action, observation, reward)``."""
PreHook = Callable[["Rubric", Any, Any], Any]
"""Called before each call: ``hook(rubric, action, observation)``."""


async def _awaited(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


class Rubric(ABC):
    """A reward from an action and the observation it led to.

    Attributes:
        last_score: The reward of the last call (``None`` before the first).
    """

    last_score: float | None
    _children: dict[str, Rubric]
    _hooks: list[ForwardHook]
    _pre_hooks: list[PreHook]

    def __init__(self) -> None:
        object.__setattr__(self, "_children", {})
        object.__setattr__(self, "_hooks", [])
        object.__setattr__(self, "_pre_hooks", [])
        object.__setattr__(self, "last_score", None)

    def __setattr__(self, name: str, value: Any) -> None:
        if isinstance(value, Rubric):
            self._children[name] = value
        object.__setattr__(self, name, value)

    @abstractmethod
    def forward(self, action: Any, observation: Any) -> float:
        """The reward (usually between 0 and 1); a subclass writes it."""

    def __call__(self, action: Any, observation: Any) -> Any:
        """The reward, with the hooks run around `forward`: a coroutine when anything on the way is async."""
        if inspect.iscoroutinefunction(self.forward) or any(map(inspect.iscoroutinefunction, self._pre_hooks)):
            return self._call_async(action, observation)
        for pre_hook in self._pre_hooks:
            pre_hook(self, action, observation)
        reward = self.forward(action, observation)
        if inspect.isawaitable(reward) or any(map(inspect.iscoroutinefunction, self._hooks)):
            return self._finish_async(action, observation, reward)
        self.last_score = reward
        for hook in self._hooks:
            hook(self, action, observation, reward)
        return reward

    async def _call_async(self, action: Any, observation: Any) -> float:
        for hook in self._pre_hooks:
            await _awaited(hook(self, action, observation))
        return await self._finish_async(action, observation, self.forward(action, observation))

    async def _finish_async(self, action: Any, observation: Any, reward: float | Awaitable[float]) -> float:
        score: float = await _awaited(reward)
        self.last_score = score
        for hook in self._hooks:
            await _awaited(hook(self, action, observation, score))
        return score

    def register_forward_hook(self, hook: ForwardHook) -> None:
        """Call ``hook(rubric, action, observation, reward)`` after each call."""
        self._hooks.append(hook)

    def register_forward_pre_hook(self, hook: PreHook) -> None:
        """Call ``hook(rubric, action, observation)`` before each call."""
        self._pre_hooks.append(hook)

    def children(self) -> Iterator[Rubric]:
        """The rubrics held in this one's attributes."""
        yield from self._children.values()

    def named_children(self) -> Iterator[tuple[str, Rubric]]:
        """The same, with their attribute names."""
        yield from self._children.items()

    def rubrics(self) -> Iterator[Rubric]:
        """Every rubric below this one, depth first."""
        for child in self._children.values():
            yield child
            yield from child.rubrics()

    def named_rubrics(self, prefix: str = "") -> Iterator[tuple[str, Rubric]]:
        """Every rubric below this one, with its dotted path (``"code.syntax"``)."""
        for name, child in self._children.items():
            path = f"{prefix}.{name}" if prefix else name
            yield path, child
            yield from child.named_rubrics(path)

    def get_rubric(self, path: str) -> Rubric:
        """The rubric at a dotted path below this one.

        Raises:
            KeyError: No rubric is there.
        """
        rubric = self
        for name in path.split("."):
            if name not in rubric._children:
                raise KeyError(f"Rubric path not found: {path}")
            rubric = rubric._children[name]
        return rubric

    def reset(self) -> None:  # noqa: B027 - a rubric without episode state has nothing to forget
        """Forget the episode so far (a new one starts); by default there is nothing to forget."""

    def state_dict(self) -> dict[str, Any]:
        """The rubric's settings, to save (`load_state_dict` restores them); by default none."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:  # noqa: B027 - nothing to restore by default
        """Restore settings `state_dict` gave; by default there are none."""
