"""`AutoAction`: an environment's action class from its name, as upstream's ``openenv.AutoAction`` gives it."""

from __future__ import annotations

from typing import Any

from openenv.auto._discovery import get_discovery, installed_environment

__all__ = ["AutoAction"]


class AutoAction:
    """The action class of an installed environment package, found by the package's name.

    Example:
        ```python
        EchoAction = AutoAction.from_env("echo")
        action = EchoAction(message="hello")
        ```
    """

    def __init__(self) -> None:
        raise TypeError(
            "AutoAction is a factory class, not instantiated: use AutoAction.from_env(name) "
            "or AutoAction.from_hub() instead"
        )

    @classmethod
    def from_env(cls, name: str, skip_install: bool = False) -> type[Any]:
        """The action class (not an instance) of the named environment.

        Args:
            name: The environment (``"echo"``, ``"echo-env"``, ``"echo_env"``) or a Hugging Face
                repository whose package is installed.
            skip_install: Give `GenericAction` (a dict of fields) and look nothing up.

        Raises:
            ValueError: No package has that name.
            ImportError: The package is installed but its client module cannot be imported.
        """
        if skip_install:
            from openenv.core.generic_client import GenericAction

            return GenericAction
        return installed_environment(name, get_discovery()).get_action_class()

    @classmethod
    def from_hub(cls, env_name: str, skip_install: bool = False) -> type[Any]:
        """`from_env` under its older name, as upstream keeps it.

        Args:
            env_name: As `from_env`'s name.
            skip_install: As `from_env`'s.
        """
        return cls.from_env(env_name, skip_install=skip_install)

    @classmethod
    def get_action_info(cls, name: str) -> dict[str, Any]:
        """Where the named package's action class is, under upstream's keys.

        Args:
            name: The environment's name.

        Raises:
            ValueError: No package has that name.
        """
        info = installed_environment(name, get_discovery())
        return {
            "env_key": info.env_key,
            "env_name": info.name,
            "package": info.package_name,
            "action_class": info.action_class_name,
            "observation_class": info.observation_class_name,
            "module": info.client_module_path,
        }

    @classmethod
    def list_actions(cls) -> None:
        """Print the action class of each installed environment package."""
        get_discovery().print_listing("Action Classes", "action classes", lambda info: info.action_class_name)
