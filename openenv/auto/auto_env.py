"""`AutoEnv`: an environment's own client from its name, as upstream's ``openenv.AutoEnv`` gives it."""

from __future__ import annotations

from typing import Any

from openenv.auto._discovery import get_discovery, installed_environment, is_hub_reference

__all__ = ["AutoEnv"]


def space_url(repo_id: str) -> str:
    """Where a Hugging Face Space serves: ``"org/echo_env"`` → ``"https://org-echo-env.hf.space"``.

    Args:
        repo_id: ``org/name``, or a huggingface.co URL of it.
    """
    path = repo_id.split("huggingface.co/", 1)[-1].removeprefix("spaces/").strip("/")
    return f"https://{path.replace('/', '-').replace('_', '-').lower()}.hf.space"


class AutoEnv:
    """The client of an installed environment package, found by the package's name.

    A factory, as upstream's: its class methods give a client (`from_env`), a client class
    (`get_env_class`) or what is known of a package (`get_env_info`). The packages are those
    installed as ``openenv-<name>`` (``openenv install openenv-echo-env``).

    Example:
        ```python
        env = AutoEnv.from_env("echo", base_url="http://127.0.0.1:8000")
        with env.sync() as client:
            client.reset()
        ```
    """

    def __init__(self) -> None:
        raise TypeError(
            "AutoEnv is a factory class, not instantiated: use AutoEnv.from_env(name, base_url=...) "
            "or AutoEnv.from_hub() instead"
        )

    @classmethod
    def from_env(
        cls,
        name: str,
        base_url: str | None = None,
        docker_image: str | None = None,
        container_provider: Any = None,
        wait_timeout: float = 30.0,
        env_vars: dict[str, str] | None = None,
        trust_remote_code: bool = False,
        skip_install: bool = False,
        **kwargs: Any,
    ) -> Any:
        """A client of the named environment, not yet connected.

        Args:
            name: The environment (``"echo"``, ``"echo-env"``, ``"echo_env"``) or a Hugging Face
                repository (``"org/echo_env"``) whose package is installed.
            base_url: The server to connect to. Required: openenv-anyio does not start
                containers yet.
            docker_image: The image upstream would start where no base_url is given.
            container_provider: Upstream's container provider; not taken yet.
            wait_timeout: Upstream's container start timeout; unused without containers.
            env_vars: Upstream's container settings; unused without containers.
            trust_remote_code: Upstream's consent to install from the Hub; unused, as nothing is
                installed here.
            skip_install: Drive the server with `GenericEnvClient` rather than the package's own client
                (no package needed); a Hub repository's Space is then the server.
            **kwargs: Passed to the client class (``connect_timeout_s``, ``message_timeout_s``, ...).

        Raises:
            ValueError: No package has that name, or no server was given.
            ImportError: The package is installed but its client cannot be imported.
        """
        del wait_timeout, env_vars, trust_remote_code  # upstream's container and install settings
        if container_provider is not None:
            raise TypeError(
                "openenv-anyio's AutoEnv takes no container_provider yet: start the server yourself and pass base_url"
            )
        if skip_install:
            from openenv.core.generic_client import GenericEnvClient

            if base_url is None and is_hub_reference(name):
                base_url = space_url(name)
            if base_url is None:
                raise ValueError(
                    f"AutoEnv.from_env({name!r}, skip_install=True) needs base_url: openenv-anyio does not "
                    "start containers yet"
                )
            return GenericEnvClient(base_url=base_url, **kwargs)
        info = installed_environment(name, get_discovery())
        client_class = info.get_client_class()
        if base_url is None and is_hub_reference(name):
            base_url = space_url(name)
        if base_url is None:
            image = docker_image or info.default_image
            raise ValueError(
                f"AutoEnv.from_env({name!r}) without base_url would start the image {image}, and openenv-anyio "
                f"does not start containers yet: serve it with `openenv serve {info.name}.server.app:app` "
                "and pass base_url='http://127.0.0.1:8000'"
            )
        return client_class(base_url=base_url, provider=None, **kwargs)

    from_hub = from_env  # upstream keeps the older name beside it, with the same parameters

    @classmethod
    def get_env_class(cls, name: str) -> type[Any]:
        """The client class of the named package, to build yourself.

        Args:
            name: The environment's name.

        Raises:
            ValueError: No package has that name.
        """
        return installed_environment(name, get_discovery()).get_client_class()

    @classmethod
    def get_env_info(cls, name: str) -> dict[str, Any]:
        """What is known of the named package, under upstream's keys.

        Args:
            name: The environment's name.

        Raises:
            ValueError: No package has that name.
        """
        info = installed_environment(name, get_discovery())
        return {
            "env_key": info.env_key,
            "name": info.name,
            "package": info.package_name,
            "version": info.version,
            "description": info.description,
            "env_class": info.client_class_name,
            "action_class": info.action_class_name,
            "observation_class": info.observation_class_name,
            "module": info.client_module_path,
            "default_image": info.default_image,
            "spec_version": info.spec_version,
        }

    @classmethod
    def list_environments(cls) -> None:
        """Print the installed environment packages."""
        get_discovery().list_environments()
