"""Upstream OpenEnv's ``openenv.core.containers.runtime``: the provider interfaces environment clients name.

Clients import `ContainerProvider` to type their ``from_docker_image``; the interfaces
are here, with upstream's signatures. Upstream's providers themselves (a local Docker
daemon, Kubernetes, ``uv``) are not offered yet: start the server and give clients its URL.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from types import TracebackType
from typing import Any, Self

__all__ = ["ContainerProvider", "RuntimeProvider"]


class ContainerProvider(ABC):
    """Runs one environment server in a container, and says where it listens."""

    @abstractmethod
    def start_container(
        self, image: str, port: int | None = None, env_vars: dict[str, str] | None = None, **kwargs: Any
    ) -> str:
        """Start a container from ``image``; the base URL of its server (``http://127.0.0.1:8000``).

        Args:
            image: The image (or another source the provider knows).
            port: The port to publish (``None``: the provider picks one).
            env_vars: Environment variables for the container.
            **kwargs: The provider's own options.
        """

    @abstractmethod
    def stop_container(self) -> None:
        """Stop and remove the container `start_container` started."""

    @abstractmethod
    def wait_for_ready(self, base_url: str, timeout_s: float = 30.0) -> None:
        """Return once the server at ``base_url`` answers; `TimeoutError` after ``timeout_s``."""

    def close(self) -> None:  # noqa: B027 - upstream's: a provider overrides it only when it holds more
        """Release what the provider holds beside its container (an SDK's client, say); by default nothing."""

    def __enter__(self) -> Self:
        """The provider itself; leaving the block calls `close`."""
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.close()


class RuntimeProvider(ABC):
    """Runs one environment server outside a container (upstream's ``uv run``), and says where it listens."""

    @abstractmethod
    def start(self, port: int | None = None, env_vars: dict[str, str] | None = None, **kwargs: Any) -> str:
        """Start the server; its base URL.

        Args:
            port: The port to listen on (``None``: the provider picks one).
            env_vars: Environment variables for the server.
            **kwargs: The provider's own options.
        """

    @abstractmethod
    def stop(self) -> None:
        """Stop the server."""

    @abstractmethod
    def wait_for_ready(self, timeout_s: float = 30.0) -> None:
        """Return once the server answers; `TimeoutError` after ``timeout_s``."""

    def __enter__(self) -> Self:
        """Start the server; leaving the block stops it."""
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.stop()
