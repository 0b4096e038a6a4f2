"""The server-side base class of an environment."""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Mapping, Sequence
from typing import Any, Generic

import msgspec

from ._generics import bind_type_attributes
from ._types import ActT, ObsT, StateT

__all__ = ["Environment", "EnvironmentMetadata"]


class EnvironmentMetadata(msgspec.Struct, kw_only=True, omit_defaults=True):
    """What ``GET /metadata`` tells about an environment, as OpenEnv's servers do.

    By default built from the environment class (`Environment.metadata`);
    override that classmethod, or pass one to `transports.server.app.create_app`, to
    say more.

    Examples:
        ```python
        import openenv

        metadata = openenv.EnvironmentMetadata(name="Echo", description="Echoes messages back.", version="1.0")
        print(metadata.name, metadata.version)  # Echo 1.0
        ```

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
    each may be a plain method (run on a thread of the session's own, one call
    at a time, so a slow step does not stall the server) or a coroutine (awaited
    directly on the event loop: use it when the work is async or trivial).

    The type parameters tell the server how to decode actions and describe the
    schema; an unparametrised environment takes and gives plain dicts. One
    instance serves one session; the server builds a fresh one per session from
    the factory it was given (usually the class itself), and calls `close` when
    the session ends.

    An exception raised by `reset`, `step` or `state` reaches the client as an
    `openenv.ExecutionError` (its type and message; the traceback is logged on the
    server), and the session goes on. An action that does not fit ``action_type``
    never reaches `step`: the client gets an `openenv.ValidationError`.

    Examples:
        A counter, served in-process (the same class serves over the network
        with ``openenv serve module:CounterEnv``):

        ```python
        from typing import Any

        from openenv import Action, EnvClient, Environment, Observation, State


        class Increment(Action):
            by: int = 1


        class CounterObservation(Observation):
            count: int


        class CounterEnv(Environment[Increment, CounterObservation, State]):
            def __init__(self) -> None:
                self._state = State()
                self._count = 0

            def reset(self, episode_id: str | None = None, **kwargs: Any) -> CounterObservation:
                self._state = State(episode_id=episode_id)
                self._count = 0
                return CounterObservation(count=0)

            def step(self, action: Increment) -> CounterObservation:
                self._state.step_count += 1
                self._count += action.by
                return CounterObservation(count=self._count, reward=float(action.by), done=self._count >= 10)

            @property
            def state(self) -> State:
                return self._state


        class CounterClient(EnvClient[Increment, CounterObservation, State]):
            pass


        async with CounterClient("inproc://", factory=CounterEnv) as env:
            await env.reset()
            result = await env.step(Increment(by=3))
            print(result.observation.count, result.reward, result.done)  # 3 3.0 False
        ```

    Attributes:
        action_type: The type actions are decoded into (``dict`` if unparametrised);
            set from the first type parameter, or in the class body.
        observation_type: The observation type, for ``GET /schema``.
        state_type: The state type, for ``GET /schema``.
        reset_observation_type: What ``reset`` returns, for ``GET /schema``'s
            ``reset_observation``, when it differs from ``observation_type``;
            ``None`` (the default) reads it from ``reset``'s return annotation.
        strict_validation: Validate actions strictly. By default (``False``) a
            number may also arrive as a numeric string and an ``int`` as an
            integral float (``"3"`` and ``3.0`` for ``3``), as OpenEnv's pydantic
            models accept; set it to ``True`` in the class body to refuse them.
        thread_affinity: Whether a session's plain methods all run on one thread
            of the session's own (``True``, the default: thread-local state, such
            as a simulator's context, stays put). Set it to ``False`` in the class
            body when the environment keeps no state of a thread's: a server that
            steps many sessions at once then runs their plain steps one after the
            other on a thread they share, one hand-over for the batch rather than
            one per session. A session's methods still never run on two threads
            at once, and a slow step still holds up no other session.
    """

    action_type: Any = dict
    observation_type: Any = dict
    state_type: Any = dict
    reset_observation_type: Any = None
    strict_validation: bool = False
    thread_affinity: bool = True

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

        Raises:
            NotImplementedError: Not overridden. Whatever an override raises
                reaches the client as an `openenv.ExecutionError`.
        """
        raise NotImplementedError

    def step(self, action: ActT) -> ObsT | Awaitable[ObsT]:
        """Apply one action and return the resulting observation.

        Args:
            action: The action, already decoded and validated into ``action_type``.

        Returns:
            The observation, with ``reward`` and ``done`` set as needed (or an
            awaitable of it, for an async override).

        Raises:
            NotImplementedError: Not overridden. Whatever an override raises
                reaches the client as an `openenv.ExecutionError`.
        """
        raise NotImplementedError

    @property
    def state(self) -> StateT | Awaitable[StateT]:
        """The environment's current state (a property; it may return an awaitable).

        Raises:
            NotImplementedError: Not overridden.
        """
        raise NotImplementedError

    def close(self) -> Awaitable[None] | None:
        """Release what the environment holds; called once, when its session ends.

        Called however the session ends: the client closed it, went away, or
        was idle too long, or the server is stopping. What it raises is logged
        and otherwise ignored. The default does nothing.

        Returns:
            ``None``, or an awaitable, for an async override (``async def close``).
        """
        return None

    def tasks(self) -> Mapping[str, Sequence[Any]] | Awaitable[Mapping[str, Sequence[Any]]]:
        """The tasks the environment offers, by split, for OpenEnv's Task API; none by default.

        Override it to offer tasks: return each split's name (``"train"``,
        ``"validation"``, ``"test"``, or your own) and its task specs, any
        sequence of JSON-able values (a list, a dataset that supports ``len``
        and indexing, ...). The server then answers ``GET /{name}/splits`` and
        ``POST /{name}/tasks``, ``/num_tasks``, ``/task`` and ``/task_range``
        from it (see ``transports.server.routes.task_api``); without an override they
        answer ``501``, as OpenEnv's do. It is called on an environment built
        for the request (and closed after it), so keep it cheap and free of
        side effects; it may be ``async``. To select a task, let ``reset``
        take the split and index (``reset(split="test", index=3)``).

        Examples:
            ```python
            from typing import Any

            import openenv


            class Arithmetic(openenv.Environment[Any, Any, openenv.State]):
                def tasks(self) -> dict[str, list[dict[str, Any]]]:
                    return {"train": [{"question": "1+1", "answer": 2}], "test": [{"question": "2+2", "answer": 4}]}


            print(Arithmetic().tasks()["test"][0])  # {'question': '2+2', 'answer': 4}
            ```

        Returns:
            The task specs of each split, by split name (or an awaitable of it).

        Raises:
            NotImplementedError: Not overridden: the environment offers no tasks.
        """
        raise NotImplementedError

    @classmethod
    def metadata(cls) -> EnvironmentMetadata:
        """Describe the environment for ``GET /metadata``; by default from the class itself.

        Override it to say more (a version, an author, a documentation URL).

        Returns:
            The metadata: the class's name, the first line of its own docstring
            as the description (``"<name> environment"`` without one, as OpenEnv
            says), and the whole docstring as ``readme_content``.
        """
        # The class's own docstring only (not a base class's), dedented.
        doc = inspect.cleandoc(cls.__dict__.get("__doc__") or "")
        return EnvironmentMetadata(
            name=cls.__name__,
            description=doc.splitlines()[0] if doc else f"{cls.__name__} environment",
            readme_content=doc or None,
        )
