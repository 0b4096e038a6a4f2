"""Upstream OpenEnv's ``openenv.core.env_server.http_server``: `create_app` serves an upstream-style environment.

The app is openenv's own (``transports.server.app.create_app``, reached through the
``openenv.server`` entry points as `openenv.serve` reaches its server), behind a FastAPI
front that takes a package's own routes (``@app.get(...)``), as upstream's app does: WebSocket,
links, HTTP long-polling, OpenEnv's plain HTTP routes, ``/schema``, ``/metadata`` and
``/health``, bounded as ``docs/reliability.md`` lists. Each session's environment is
wrapped by `openenv.core.env_server._hosting.HostedEnvironment`, which calls it as
upstream's server does. The app runs under ``uvicorn module:app`` as upstream's does,
and under ``openenv serve module:app``.
"""

from __future__ import annotations

import functools
import inspect
import logging
import os
from collections.abc import Callable
from typing import Any

from openenv.core.env_server._hosting import Hosting, hosted_class
from openenv.core.env_server.exceptions import ConcurrencyConfigurationError
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, ConcurrencyConfig, Observation, ServerMode, State
from openenv.server import ServerConfig, build_app

__all__ = ["HTTPEnvServer", "create_app", "create_fastapi_app"]

logger = logging.getLogger("openenv.server")

WEB_INTERFACE_ENV = "ENABLE_WEB_INTERFACE"
"""The environment variable that asks upstream's server for its Gradio interface at ``/web``."""


def _environment_class(factory: Callable[[], Any]) -> type[Any]:
    """The class a factory builds: the factory itself, the function of a ``partial``, or one built to see."""
    inner = factory.func if isinstance(factory, functools.partial) else factory
    if inspect.isclass(inner):
        return inner
    env = factory()
    try:
        return type(env)
    finally:
        env.close()


class HTTPEnvServer:
    """The settings of one served environment, checked as upstream's ``HTTPEnvServer`` checks them.

    `create_app` makes one. Upstream's ``register_routes`` (which adds routes to a
    FastAPI app) is not offered: `asgi_app` is the whole app.

    Args:
        env: Builds one environment per session (the class, usually).
        action_cls: The actions' class.
        observation_cls: The observations' class.
        max_concurrent_envs: The most sessions at once (default 1, as upstream's).
        concurrency_config: The same and an idle timeout; not with ``max_concurrent_envs``.
        env_name: The environment's public name (default: the factory's name).
        state_cls: The state's class.
        reset_observation_cls: What ``reset`` returns, if not ``observation_cls``.

    Attributes:
        action_cls: The actions' class.
        observation_cls: The observations' class.
        reset_observation_cls: What ``reset`` returns.
        state_cls: The state's class.
        env_name: The environment's public name.

    Raises:
        TypeError: ``env`` is not callable (an instance, say).
        ValueError: Both ``max_concurrent_envs`` and ``concurrency_config``.
        ConcurrencyConfigurationError: More than one session of an environment
            that does not set ``SUPPORTS_CONCURRENT_SESSIONS``.
    """

    def __init__(
        self,
        env: Callable[[], Environment[Any, Any, Any]],
        action_cls: type[Action],
        observation_cls: type[Observation],
        max_concurrent_envs: int | None = None,
        concurrency_config: ConcurrencyConfig | None = None,
        env_name: str | None = None,
        state_cls: type[State] = State,
        *,
        reset_observation_cls: type[Observation] | None = None,
    ) -> None:
        if not callable(env):
            raise TypeError(
                f"env must be a callable (class or factory function), got {type(env)}. Pass the environment class "
                "(e.g., MyEnvironment) not an instance (e.g., MyEnvironment())."
            )
        if max_concurrent_envs is not None and concurrency_config is not None:
            raise ValueError(
                "Cannot specify both 'max_concurrent_envs' and 'concurrency_config'. "
                "Please use only one method to configure concurrency."
            )
        if concurrency_config is None:
            concurrency_config = ConcurrencyConfig(max_concurrent_envs=max_concurrent_envs or 1)
        self._factory = env
        self._concurrency_config = concurrency_config
        self.action_cls = action_cls
        self.observation_cls = observation_cls
        self.reset_observation_cls = reset_observation_cls or observation_cls
        self.state_cls = state_cls
        inner = env.func if isinstance(env, functools.partial) else env
        self.env_name = env_name or getattr(inner, "__name__", None) or "environment"
        if self.max_concurrent_envs > 1:
            env_cls = _environment_class(env)
            if not getattr(env_cls, "SUPPORTS_CONCURRENT_SESSIONS", False):
                raise ConcurrencyConfigurationError(env_cls.__name__, self.max_concurrent_envs)

    @property
    def max_concurrent_envs(self) -> int:
        """The most sessions at once."""
        return self._concurrency_config.max_concurrent_envs

    @property
    def concurrency_config(self) -> ConcurrencyConfig:
        """The concurrency settings."""
        return self._concurrency_config

    @property
    def is_concurrency_safe(self) -> bool:
        """Whether the environment class sets ``SUPPORTS_CONCURRENT_SESSIONS``."""
        return bool(getattr(_environment_class(self._factory), "SUPPORTS_CONCURRENT_SESSIONS", False))

    def asgi_app(self, **options: Any) -> Any:
        """Openenv's ASGI app serving this environment.

        Args:
            **options: Fields of `openenv.ServerConfig` (``auth_token``, ...), beside
                the session limit and idle timeout this server sets.

        Returns:
            The app (a Starlette app).
        """
        hosting = Hosting(
            factory=self._factory,
            action_cls=self.action_cls,
            observation_cls=self.observation_cls,
            state_cls=self.state_cls,
            reset_observation_cls=self.reset_observation_cls,
            env_name=self.env_name,
        )
        settings: dict[str, Any] = {"max_sessions": self.max_concurrent_envs}
        if self._concurrency_config.session_timeout is not None:
            settings["session_idle_timeout"] = self._concurrency_config.session_timeout
        config = ServerConfig(**{**settings, **options})
        return build_app(hosted_class(hosting), config=config, caller="openenv.core's create_app", extensible=True)


def _mode(mode: ServerMode | str | None) -> ServerMode:
    """The server mode asked for, else ``OPENENV_MODE``'s, else simulation."""
    chosen = mode if mode is not None else os.environ.get("OPENENV_MODE", ServerMode.SIMULATION.value)
    try:
        return ServerMode(chosen.lower() if isinstance(chosen, str) else chosen)
    except ValueError:
        raise ValueError(f"Invalid mode: {chosen!r}. Must be one of: {[m.value for m in ServerMode]}") from None


def create_app(
    env: Callable[[], Environment[Any, Any, Any]],
    action_cls: type[Action],
    observation_cls: type[Observation],
    env_name: str | None = None,
    max_concurrent_envs: int | None = None,
    concurrency_config: ConcurrencyConfig | None = None,
    gradio_builder: Callable[..., Any] | None = None,
    custom_tab_name: str = "Custom",
    custom_tab_primary: bool = False,
    show_default_tab: bool = True,
    title_override: str | None = None,
    state_cls: type[State] = State,
    *,
    mode: ServerMode | str | None = None,
    reset_observation_cls: type[Observation] | None = None,
) -> Any:
    """The ASGI app that serves an upstream-style environment, with upstream 0.10's signature.

    Examples:
        An environment package's ``server/app.py``, unchanged:

        ```python
        from openenv.core.env_server.http_server import create_app

        from my_env.models import MyAction, MyObservation
        from my_env.server.environment import MyEnvironment

        app = create_app(MyEnvironment, MyAction, MyObservation, env_name="my_env")
        # uvicorn my_env.server.app:app, or openenv serve my_env.server.app:app
        ```

    Args:
        env: Builds one environment per session: its class, usually.
        action_cls: The actions' class: each step's data is validated into it.
        observation_cls: The observations' class (published at ``/schema``).
        env_name: The environment's public name.
        max_concurrent_envs: The most sessions at once (default 1, as upstream's:
            more needs ``SUPPORTS_CONCURRENT_SESSIONS`` on the class).
        concurrency_config: The same with an idle timeout; not with ``max_concurrent_envs``.
        gradio_builder: For upstream's web interface, which is not served.
        custom_tab_name: For upstream's web interface, which is not served.
        custom_tab_primary: For upstream's web interface, which is not served.
        show_default_tab: For upstream's web interface, which is not served.
        title_override: For upstream's web interface, which is not served.
        state_cls: The state's class (published at ``/schema``).
        mode: ``"simulation"`` or ``"production"`` (default: ``OPENENV_MODE``, else
            simulation). Both serve the same routes here; see the migration guide.
        reset_observation_cls: What ``reset`` returns, if not ``observation_cls``.

    Returns:
        openenv's ASGI app (a Starlette app).

    Raises:
        TypeError: ``env`` is not callable.
        ValueError: Both ``max_concurrent_envs`` and ``concurrency_config``, or an unknown mode.
        ConcurrencyConfigurationError: More than one session of an environment
            that does not set ``SUPPORTS_CONCURRENT_SESSIONS``.
        ImportError: The server extra is not installed.
    """
    if os.environ.get(WEB_INTERFACE_ENV, "false").lower() in ("true", "1", "yes"):
        logger.warning(
            "%s is set, but openenv-anyio does not serve upstream's web interface at /web: "
            "the environment is served without it (see docs/migrating.md)",
            WEB_INTERFACE_ENV,
        )
    return create_fastapi_app(
        env,
        action_cls,
        observation_cls,
        max_concurrent_envs,
        concurrency_config,
        env_name,
        state_cls,
        mode=mode,
        reset_observation_cls=reset_observation_cls,
    )


def create_fastapi_app(
    env: Callable[[], Environment[Any, Any, Any]],
    action_cls: type[Action],
    observation_cls: type[Observation],
    max_concurrent_envs: int | None = None,
    concurrency_config: ConcurrencyConfig | None = None,
    env_name: str | None = None,
    state_cls: type[State] = State,
    *,
    mode: ServerMode | str | None = None,
    reset_observation_cls: type[Observation] | None = None,
) -> Any:
    """`create_app` without the web interface's options, as upstream names it (the app is not FastAPI's here).

    Args:
        env: Builds one environment per session.
        action_cls: The actions' class.
        observation_cls: The observations' class.
        max_concurrent_envs: The most sessions at once.
        concurrency_config: The same with an idle timeout.
        env_name: The environment's public name.
        state_cls: The state's class.
        mode: ``"simulation"`` or ``"production"``.
        reset_observation_cls: What ``reset`` returns, if not ``observation_cls``.

    Returns:
        openenv's ASGI app.
    """
    _mode(mode)
    server = HTTPEnvServer(
        env,
        action_cls,
        observation_cls,
        max_concurrent_envs,
        concurrency_config,
        env_name,
        state_cls,
        reset_observation_cls=reset_observation_cls,
    )
    return server.asgi_app()
