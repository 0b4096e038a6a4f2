"""Upstream OpenEnv's ``openenv.core.env_server.exceptions``: what its server raises, by name."""

from __future__ import annotations

__all__ = [
    "ConcurrencyConfigurationError",
    "EnvironmentFactoryError",
    "OpenEnvError",
    "SessionCapacityError",
    "SessionCreationError",
    "SessionNotFoundError",
]


class OpenEnvError(Exception):
    """The base of the errors of upstream's environment server (not `openenv.OpenEnvError`, the client's)."""


class ConcurrencyConfigurationError(OpenEnvError):
    """``create_app`` was asked for more than one session of an environment that does not support it.

    Args:
        environment_name: The environment class's name.
        max_concurrent_envs: The number of sessions asked for.
        message: The message, instead of the default one.
    """

    def __init__(self, environment_name: str, max_concurrent_envs: int, message: str | None = None) -> None:
        self.environment_name = environment_name
        self.max_concurrent_envs = max_concurrent_envs
        super().__init__(
            message
            or (
                f"Environment '{environment_name}' is not marked as SUPPORTS_CONCURRENT_SESSIONS. "
                f"Cannot run with max_concurrent_envs={max_concurrent_envs}. Either set max_concurrent_envs=1 "
                "or ensure the environment properly isolates session state and set "
                "SUPPORTS_CONCURRENT_SESSIONS=True."
            )
        )


class SessionCapacityError(OpenEnvError):
    """Every session slot is taken.

    Args:
        active_sessions: The sessions open.
        max_sessions: The most the server holds.
        message: The message, instead of the default one.
    """

    def __init__(self, active_sessions: int, max_sessions: int, message: str | None = None) -> None:
        self.active_sessions = active_sessions
        self.max_sessions = max_sessions
        super().__init__(
            message
            or f"Server at capacity: {active_sessions}/{max_sessions} sessions active. Cannot accept new connections."
        )


class SessionNotFoundError(OpenEnvError):
    """No session has this id.

    Args:
        session_id: The id asked for.
        message: The message, instead of the default one.
    """

    def __init__(self, session_id: str, message: str | None = None) -> None:
        self.session_id = session_id
        super().__init__(message or f"Session '{session_id}' not found.")


class SessionCreationError(OpenEnvError):
    """A session could not be made.

    Args:
        reason: Why.
        message: The message, instead of the default one.
    """

    def __init__(self, reason: str, message: str | None = None) -> None:
        self.reason = reason
        super().__init__(message or f"Failed to create session: {reason}")


class EnvironmentFactoryError(OpenEnvError):
    """The environment factory raised.

    Args:
        factory_name: The factory's name.
        message: The message, instead of the default one.
    """

    def __init__(self, factory_name: str, message: str | None = None) -> None:
        self.factory_name = factory_name
        super().__init__(message or f"Environment factory '{factory_name}' failed to create instance.")
