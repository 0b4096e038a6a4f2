"""Small environments for the tests: typed, untyped, slow, raising, sync and async."""

from __future__ import annotations

import sys
import threading
from typing import Annotated, Any, ClassVar, Literal

import anyio
import msgspec

from openenv import Action, Observation, State
from openenv.server import Environment


class CountAction(Action):
    by: int = 1
    delay: float = 0.0
    fail: bool = False


class CountObservation(Observation):
    count: int = 0
    note: str = ""


class CountState(State):
    count: int = 0


class AsyncCounterEnv(Environment[CountAction, CountObservation, CountState]):
    """Counts; sleeps ``delay`` seconds on the event loop; raises on ``fail``."""

    closed: ClassVar[list[AsyncCounterEnv]] = []

    def __init__(self) -> None:
        self._state = CountState()

    async def reset(self, episode_id: str | None = None, start: int = 0) -> CountObservation:
        self._state = CountState(episode_id=episode_id, count=start)
        return CountObservation(count=start, reward=0.0)

    async def step(self, action: CountAction) -> CountObservation:
        if action.delay:
            await anyio.sleep(action.delay)
        if action.fail:
            raise RuntimeError("asked to fail")
        self._state.count += action.by
        self._state.step_count += 1
        return CountObservation(count=self._state.count, reward=float(action.by), done=self._state.count >= 10)

    @property
    def state(self) -> CountState:
        return self._state

    async def close(self) -> None:
        AsyncCounterEnv.closed.append(self)


class SyncCounterEnv(Environment[CountAction, CountObservation, CountState]):
    """The same counter with plain methods: they run in a worker thread."""

    threads: ClassVar[set[int]] = set()

    def __init__(self) -> None:
        self._state = CountState()
        self._busy = threading.Lock()

    def reset(self, **kwargs: Any) -> CountObservation:
        self._state = CountState(episode_id=kwargs.get("episode_id"), count=kwargs.get("start", 0))
        return CountObservation(count=self._state.count, note=",".join(sorted(kwargs)))

    def step(self, action: CountAction) -> CountObservation:
        # Proves the session never enters the environment from two threads at once.
        if not self._busy.acquire(blocking=False):
            raise AssertionError("step entered concurrently")
        try:
            SyncCounterEnv.threads.add(threading.get_ident())
            if action.delay:
                threading.Event().wait(action.delay)
            if action.fail:
                raise ValueError("asked to fail")
            self._state.count += action.by
            self._state.step_count += 1
            return CountObservation(count=self._state.count, reward=float(action.by))
        finally:
            self._busy.release()

    @property
    def state(self) -> CountState:
        return self._state


class DictEnv(Environment):  # type: ignore[type-arg]
    """Untyped: takes and gives plain dicts."""

    def __init__(self) -> None:
        self.steps = 0

    async def reset(self, **kwargs: Any) -> dict[str, Any]:
        self.steps = 0
        return {"hello": "world", "kwargs": kwargs, "done": False, "reward": None}

    async def step(self, action: Any) -> dict[str, Any]:
        self.steps += 1
        return {"echo": action, "done": self.steps >= 3, "reward": 1.5}

    @property
    def state(self) -> dict[str, Any]:
        return {"steps": self.steps}


class FrozenObservation(Observation, frozen=True):
    value: int = 0


class FrozenEnv(Environment[CountAction, FrozenObservation, State]):
    async def reset(self, **kwargs: Any) -> FrozenObservation:
        return FrozenObservation(value=1, reward=2.0, done=True)

    async def step(self, action: CountAction) -> FrozenObservation:
        return FrozenObservation(value=action.by)

    @property
    def state(self) -> State:
        return State()


class BadObservationEnv(Environment[CountAction, CountObservation, CountState]):
    """Returns observations the client's types do not accept, or cannot be encoded."""

    async def reset(self, **kwargs: Any) -> Any:
        return {"count": "not a number"}

    async def step(self, action: CountAction) -> Any:
        return {"count": object()}

    @property
    def state(self) -> CountState:
        return CountState()


def failing_factory() -> Environment[Any, Any, Any]:
    raise OSError("no GPU left")


class Unencodable(msgspec.Struct):
    pass


class MessageAction(Action):
    """The reference echo environment's action (see tests/interop/reference_server.py)."""

    message: str


class MessageObservation(Observation):
    echoed_message: str = ""


class MessageEchoEnv(Environment[MessageAction, MessageObservation, State]):
    """A twin of the reference server's echo environment, for interop tests: same frames, same triggers."""

    def __init__(self) -> None:
        self._state = State()

    def reset(self, seed: int | None = None, episode_id: str | None = None) -> MessageObservation:
        self._state = State(episode_id=episode_id or "generated", step_count=0)
        return MessageObservation(echoed_message="", reward=0.0, done=False)

    def step(self, action: MessageAction) -> MessageObservation:
        message = action.message
        if message == "raise":
            raise RuntimeError("echo env: step raised on request")
        if message.startswith("sleep:"):
            threading.Event().wait(float(message.split(":", 1)[1]))
        self._state.step_count += 1
        return MessageObservation(echoed_message=message, reward=float(len(message)), done=message == "done")

    @property
    def state(self) -> State:
        return self._state


TASKS: dict[str, list[dict[str, Any]]] = {
    "train": [{"question": "1+1", "answer": 2}, {"question": "2+3", "answer": 5}, {"question": "4+4", "answer": 8}],
    "test": [{"question": "9+1", "answer": 10}],
    "dev": [],
}
"""The tasks of `TaskEchoEnv`: the same specs as the reference server's ``--tasks`` environment."""


class TaskEchoEnv(MessageEchoEnv):
    """The echo environment, offering `TASKS` for OpenEnv's Task API the openenv way (`Environment.tasks`)."""

    def tasks(self) -> dict[str, list[dict[str, Any]]]:
        return TASKS


class AsyncMessageEchoEnv(MessageEchoEnv):
    """The same echo logic, as coroutines: awaited on the event loop, no worker thread."""

    async def reset(self, seed: int | None = None, episode_id: str | None = None) -> MessageObservation:  # type: ignore[override]
        return MessageEchoEnv.reset(self, seed, episode_id)

    async def step(self, action: MessageAction) -> MessageObservation:  # type: ignore[override]
        if action.message.startswith("sleep:"):
            await anyio.sleep(float(action.message.split(":", 1)[1]))
            action = MessageAction(message="slept")
        return MessageEchoEnv.step(self, action)


class AnnouncingEchoEnv(AsyncMessageEchoEnv):
    """The async echo environment; writes ``stepping`` to stdout as each step starts (served in a subprocess)."""

    async def step(self, action: MessageAction) -> MessageObservation:  # type: ignore[override]
        sys.stdout.write("stepping\n")
        sys.stdout.flush()
        return await super().step(action)


class BenchTarget(msgspec.Struct):
    x: int
    y: int = 0


class BenchRichAction(Action):
    """An action whose schema has the shapes `openenv bench` must fill in: $ref, enum, arrays, bounds, unions."""

    kind: Literal["move", "look"]
    target: BenchTarget
    path: Annotated[list[BenchTarget], msgspec.Meta(min_length=2)]
    speed: Annotated[float, msgspec.Meta(gt=0, le=10)]
    count: Annotated[int, msgspec.Meta(ge=3)]
    label: str | None
    pair: tuple[str, int]
    name: Annotated[str, msgspec.Meta(min_length=3)]


class BenchRichEnv(Environment[BenchRichAction, Observation, State]):
    """Takes a `BenchRichAction`; its server-side validation is what the bench's generated action must pass."""

    async def reset(self, **kwargs: Any) -> Observation:
        return Observation(reward=0.0)

    async def step(self, action: BenchRichAction) -> Observation:
        return Observation(reward=float(len(action.path)))

    @property
    def state(self) -> State:
        return State()


class EveryThirdStepFailsEnv(Environment):  # type: ignore[type-arg]
    """Untyped; its every third step raises (an ``EXECUTION_ERROR``), the others succeed."""

    def __init__(self) -> None:
        self.steps = 0

    async def reset(self, **kwargs: Any) -> dict[str, Any]:
        return {"done": False}

    async def step(self, action: Any) -> dict[str, Any]:
        self.steps += 1
        if self.steps % 3 == 0:
            raise RuntimeError(f"step {self.steps} fails, as every third does")
        return {"steps": self.steps, "done": False}

    @property
    def state(self) -> dict[str, Any]:
        return {"steps": self.steps}


class EveryStepFailsEnv(EveryThirdStepFailsEnv):
    """Untyped; every step raises (an ``EXECUTION_ERROR``)."""

    async def step(self, action: Any) -> dict[str, Any]:
        raise RuntimeError("this environment refuses every action")


class OncePerEpisodeEnv(Environment[CountAction, CountObservation, CountState]):
    """Like a board game's square: a step is legal once per episode, then raises until the next reset."""

    def __init__(self) -> None:
        self._state = CountState()

    async def reset(self, **kwargs: Any) -> CountObservation:
        self._state = CountState()
        return CountObservation(reward=0.0)

    async def step(self, action: CountAction) -> CountObservation:
        if self._state.step_count:
            raise ValueError("that square is taken")
        self._state.step_count += 1
        return CountObservation(count=1, reward=1.0)

    @property
    def state(self) -> CountState:
        return self._state
