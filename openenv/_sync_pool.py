"""`SyncEnvPool`: the blocking facade of an `EnvPool`, on anyio's blocking portal."""

from __future__ import annotations

from collections.abc import Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any, Generic

from ._client import USE_CLIENT_DEFAULT, _UseClientDefault
from ._pool import EnvPool
from ._sync import _call, _Holder
from ._types import ActT, ObsT, StateT, StepResult

if TYPE_CHECKING:
    from typing import Self

__all__ = ["SyncEnvPool"]


class SyncEnvPool(Generic[ActT, ObsT, StateT]):
    """The same pool, blocking: for training loops without async.

    Get one from `EnvPool.sync`. It runs the pool on an event loop in a
    background thread (the one `openenv.SyncEnvClient` shares), so it behaves
    exactly as the async pool does and raises the same exceptions. As with
    `openenv.SyncEnvClient`, Ctrl-C interrupts any call at once, and a pool never
    closed is closed when it is collected or at exit, with a `ResourceWarning`.
    Every method raises `ClientStateError` when called inside a running event
    loop: there, await the `EnvPool` itself.

    Examples:
        ```python
        from openenv import EnvPool
        from openenv.examples.echo import EchoEnv

        pool = EnvPool("ws://127.0.0.1:8000", size=3, client=EchoEnv).sync(backend="trio").connect()
        try:
            results = pool.reset()
            print(len(results), pool.size)  # 3 3
        finally:
            pool.close()
        ```

    Args:
        pool: The async pool to drive; it must not be open yet.
        backend: The event loop to run it on: ``"asyncio"`` (the default) or ``"trio"``.

    Attributes:
        pool: The async pool this facade drives.
        backend: The event loop it runs on.
    """

    def __init__(self, pool: EnvPool[ActT, ObsT, StateT], *, backend: str = "asyncio") -> None:
        self.pool = pool
        self.backend = backend
        self._holder = _Holder("SyncEnvPool", "open")

    def __repr__(self) -> str:
        return f"<SyncEnvPool of {self.pool!r}>"

    @property
    def size(self) -> int:
        """The number of sessions."""
        return self.pool.size

    def __enter__(self) -> Self:
        """Open the pool (see `connect`); the end of the ``with`` block closes it.

        Returns:
            This facade.

        Raises:
            ConnectError: A session could not connect.
            ClientStateError: Already open or closed, or called inside an event loop.
        """
        return self.connect()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc_value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def connect(self) -> Self:
        """Open every session of the pool (see `EnvPool`); pair with `close` (or use ``with``).

        Returns:
            This facade.

        Raises:
            ConnectError: A session could not connect to any server.
            CapacityReachedError: Every server stayed at capacity.
            ClientStateError: Already open or closed, or called inside an event loop.
        """
        # Held open by one task of the loop thread, entered and left there, as the pool's task group needs.
        self._holder.open(self, self.pool, self.backend)
        return self

    def close(self) -> None:
        """Close every session and release the event-loop thread. Idempotent.

        Raises:
            ClientStateError: Called inside an event loop.
        """
        self._holder.close()

    def reset(
        self, *, timeout: float | _UseClientDefault | None = USE_CLIENT_DEFAULT, **kwargs: Any
    ) -> list[StepResult[ObsT]]:
        """Reset every session, blocking; see `EnvPool.reset`.

        Args:
            timeout: Seconds each session waits for its reply (``None``: no limit).
            **kwargs: Passed to every environment's ``reset``; a list gives one value per session.

        Returns:
            One result per session, in order.

        Raises:
            EnvPoolError: Sessions failed; its ``errors`` holds each one's exception.
            ValueError: A list argument does not hold one value per session.
            ClientStateError: Not open, or called inside an event loop.
        """
        portal = self._holder.portal("reset")
        return _call(portal, lambda: self.pool.reset(timeout=timeout, **kwargs))

    def step(
        self, actions: Sequence[ActT], *, timeout: float | _UseClientDefault | None = USE_CLIENT_DEFAULT
    ) -> list[StepResult[ObsT]]:
        """Step every session, blocking; see `EnvPool.step`.

        Args:
            actions: One action per session, in the pool's order.
            timeout: Seconds each session waits for its reply (``None``: no limit).

        Returns:
            One result per session, in order.

        Raises:
            EnvPoolError: Sessions failed; its ``errors`` holds each one's exception.
            TypeError: One action instead of a list of them.
            ValueError: Not one action per session.
            ClientStateError: Not open, or called inside an event loop.
        """
        portal = self._holder.portal("step")
        return _call(portal, lambda: self.pool.step(actions, timeout=timeout))

    def state(self, *, timeout: float | _UseClientDefault | None = USE_CLIENT_DEFAULT) -> list[StateT]:
        """Ask every session for its state, blocking; see `EnvPool.state`.

        Args:
            timeout: Seconds each session waits for its reply (``None``: no limit).

        Returns:
            One state per session, in order.

        Raises:
            EnvPoolError: Sessions failed; its ``errors`` holds each one's exception.
            ClientStateError: Not open, or called inside an event loop.
        """
        portal = self._holder.portal("state")
        return _call(portal, lambda: self.pool.state(timeout=timeout))
