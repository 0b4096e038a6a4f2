"""The server-side base class of an environment."""

from __future__ import annotations

import inspect
from collections.abc import Awaitable
from typing import Any, Generic

import msgspec

from ._generics import bind_type_attributes
from ._types import ActT, ObsT, StateT

__all__ = ["Environment", "EnvironmentMetadata"]


class EnvironmentMetadata(msgspec.Struct, kw_only=True, omit_defaults=True):
    """What ``GET /metadata`` tells about an environment, as OpenEnv's servers do.

    Attributes:
        name: The environment's name.
        description: One line on what it is.
        readme_content: A longer description, in Markdown.
        version: The environment's version.
        author: Who wrote it.
        documentation_url: Where its documentation lives.
    """

    name: str
    description: str = ""
    readme_content: str | None = None
    version: str | None = None
    author: str | None = None
    documentation_url: str | None = None


class Environment(Generic[ActT, ObsT, StateT]):
    """Base class of an environment served to clients.

    Subclass it with concrete types and write ``reset``, ``step`` and ``state``;
    each may be a plain method (run in a worker thread, never two at once for one
    session, so a slow step does not stall the server) or a coroutine (awaited
    directly on the event loop: use it when the work is async or trivial).

    The type parameters tell the server how to decode actions and describe the
    schema; an unparametrised environment takes and gives plain dicts. One
    instance serves one session; the server builds a fresh one per session from
    the factory it was given (usually the class itself).

    Example:
        ```python
        class CounterEnv(Environment[Increment, CounterObservation, State]):
            def __init__(self) -> None:
                self._state = State()

            def reset(self, **kwargs: Any) -> CounterObservation:
                self._state = State(episode_id=kwargs.get("episode_id"))
                return CounterObservation(count=0)

            def step(self, action: Increment) -> CounterObservation:
                self._state.step_count += 1
                return CounterObservation(count=self._state.step_count * action.by)

            @property
            def state(self) -> State:
                return self._state
        ```
    """

    action_type: Any = dict
    observation_type: Any = dict
    state_type: Any = dict

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        bind_type_attributes(cls, Environment)

    def reset(self, *args: Any, **kwargs: Any) -> ObsT | Awaitable[ObsT]:
        """Start a new episode and return its first observation.

        Args:
            *args: Unused: the server passes keywords only. (Declared so that an
                override may name the keywords it takes.)
            **kwargs: What the client passed to ``reset`` (``seed``, ``episode_id``,
                ...). The server passes only the keywords this method accepts,
                unless it takes ``**kwargs``.

        Returns:
            The first observation (or an awaitable of it, for an async override).
        """
        raise NotImplementedError

    def step(self, action: ActT) -> ObsT | Awaitable[ObsT]:
        """Apply one action and return the resulting observation.

        Args:
            action: The action, already decoded and validated into ``action_type``.

        Returns:
            The observation, with ``reward`` and ``done`` set as needed (or an
            awaitable of it, for an async override).
        """
        raise NotImplementedError

    @property
    def state(self) -> StateT | Awaitable[StateT]:
        """The environment's current state (a property; it may return an awaitable)."""
        raise NotImplementedError

    def close(self) -> Awaitable[None] | None:
        """Release what the environment holds; called once, when its session ends."""
        return None

    @classmethod
    def metadata(cls) -> EnvironmentMetadata:
        """Describe the environment for ``GET /metadata``; by default from the class itself."""
        # The class's own docstring only (not a base class's), dedented.
        doc = inspect.cleandoc(cls.__dict__.get("__doc__") or "")
        return EnvironmentMetadata(
            name=cls.__name__,
            description=doc.splitlines()[0] if doc else "",
            readme_content=doc or None,
        )
