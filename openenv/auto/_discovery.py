"""The upstream-style environment packages installed beside openenv-anyio, found by distribution name.

Upstream's convention, kept so that its packages are found unchanged: a distribution named
``openenv-<name>`` (``openenv-echo-env``) holds the module ``<name>`` (``echo_env``), whose
``client`` module defines ``<Name>Env``, ``<Name>Action`` and ``<Name>Observation``, unless an
``openenv.yaml`` manifest beside the module names them.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.metadata
import importlib.resources
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec

__all__ = [
    "EnvironmentDiscovery",
    "EnvironmentInfo",
    "get_discovery",
    "installed_environment",
    "is_hub_reference",
    "normalize_env_name",
    "reset_discovery",
    "unknown_environment",
]

logger = logging.getLogger("openenv.auto")

DISTRIBUTION_PREFIX = "openenv-"
NOT_ENVIRONMENTS = frozenset({"openenv-core", "openenv-anyio"})
"""Distributions that match the prefix but hold the framework, not an environment."""


@dataclass
class EnvironmentInfo:
    """One installed environment package, and where its classes are.

    Attributes:
        env_key: The short name (``"echo"``).
        name: The environment's name (``"echo_env"``).
        package_name: Its distribution (``"openenv-echo-env"``).
        version: Its distribution's version.
        description: The manifest's description, or a default.
        client_module_path: The module holding the classes (``"echo_env.client"``).
        client_class_name: The client class (``"EchoEnv"``).
        action_class_name: The action class (``"EchoAction"``).
        observation_class_name: The observation class (``"EchoObservation"``).
        default_image: The Docker image upstream would start (``"echo-env:latest"``).
        spec_version: The manifest's ``spec_version``, if any.
        manifest: The manifest as read, if there is one.
    """

    env_key: str
    name: str
    package_name: str
    version: str
    description: str
    client_module_path: str
    client_class_name: str
    action_class_name: str
    observation_class_name: str
    default_image: str
    spec_version: int | None = None
    manifest: dict[str, Any] | None = field(default=None, compare=False)

    def get_client_class(self) -> type[Any]:
        """Import and return the client class.

        Raises:
            ImportError: The module or the class cannot be imported.
        """
        return self._load(self.client_class_name)

    def get_action_class(self) -> type[Any]:
        """Import and return the action class.

        Raises:
            ImportError: The module or the class cannot be imported.
        """
        return self._load(self.action_class_name)

    def get_observation_class(self) -> type[Any]:
        """Import and return the observation class.

        Raises:
            ImportError: The module or the class cannot be imported.
        """
        return self._load(self.observation_class_name)

    def _load(self, class_name: str) -> type[Any]:
        try:
            module = importlib.import_module(self.client_module_path)
        except ImportError as exc:
            raise ImportError(
                f"cannot import {self.client_module_path} for {class_name} ({exc}): "
                f"reinstall it with: openenv install --force-reinstall {self.package_name}"
            ) from exc
        try:
            loaded: type[Any] = getattr(module, class_name)
        except AttributeError:
            raise ImportError(f"{self.client_module_path} has no class {class_name}") from None
        return loaded


def normalize_env_name(name: str) -> str:
    """An environment's name as the packages spell it: ``"echo"``, ``"echo-env"`` and ``"echo_env"`` are ``"echo_env"``.

    Args:
        name: A name as a user types it.
    """
    base = name.replace("-", "_").removesuffix("_env")
    return f"{base}_env"


def is_hub_reference(name: str) -> bool:
    """Whether a name points at a Hugging Face repository (``"org/echo_env"`` or a huggingface.co URL).

    Args:
        name: A name as a user types it.
    """
    return "/" in name or "huggingface.co" in name


def _class_name(env_name: str, suffix: str) -> str:
    """``("echo_env", "Action")`` → ``"EchoAction"``: upstream's convention for a package's classes."""
    base = env_name.removesuffix("_env")
    return "".join(word.capitalize() for word in base.split("_")) + suffix


def _manifest(module_name: str) -> dict[str, Any] | None:
    """The package's ``openenv.yaml`` beside its module, or None where there is none or it cannot be read."""
    try:
        resource = importlib.resources.files(module_name) / "openenv.yaml"
        if not resource.is_file():
            return None
        decoded = msgspec.yaml.decode(resource.read_bytes())
    except (ModuleNotFoundError, FileNotFoundError, NotADirectoryError):
        return None
    except (msgspec.DecodeError, ImportError, OSError) as exc:
        logger.warning("%s: openenv.yaml was not read (%s)", module_name, exc)
        return None
    return decoded if isinstance(decoded, dict) else None


def _info(package_name: str, version: str) -> EnvironmentInfo:
    """What one installed distribution offers, from its name and its manifest."""
    module_name = package_name.removeprefix(DISTRIBUTION_PREFIX).replace("-", "_").replace(".", "_")
    manifest = _manifest(module_name)
    env_name = str(manifest.get("name", module_name)) if manifest else module_name
    if not env_name.endswith("_env"):
        env_name = f"{env_name}_env"
    # Upstream takes the manifest's class names only when it names both (coding_env's "custom" form).
    named = manifest is not None and "action" in manifest and "observation" in manifest
    description = f"{env_name} environment"
    return EnvironmentInfo(
        env_key=env_name.removesuffix("_env"),
        name=env_name,
        package_name=package_name,
        version=version,
        description=str(manifest.get("description", description)) if manifest else description,
        client_module_path=f"{module_name}.client",
        client_class_name=_class_name(env_name, "Env"),
        action_class_name=str(manifest["action"]) if named and manifest else _class_name(env_name, "Action"),
        observation_class_name=(
            str(manifest["observation"]) if named and manifest else _class_name(env_name, "Observation")
        ),
        default_image=f"{env_name.replace('_', '-')}:latest",
        spec_version=manifest.get("spec_version") if manifest else None,
        manifest=manifest,
    )


class EnvironmentDiscovery:
    """Finds the installed ``openenv-*`` environment packages, once per instance until `clear_cache`.

    Args:
        path: The folders to look in for installed distributions; ``sys.path`` by default.
    """

    def __init__(self, path: list[str] | None = None) -> None:
        self._path = path
        self._found: dict[str, EnvironmentInfo] | None = None

    def discover(self, use_cache: bool = True) -> dict[str, EnvironmentInfo]:
        """Every installed environment package, by its key (``"echo"``).

        Args:
            use_cache: Reuse what an earlier call found; False looks again (after an install).
        """
        if self._found is None or not use_cache:
            importlib.invalidate_caches()
            found: dict[str, EnvironmentInfo] = {}
            distributions = (
                importlib.metadata.distributions()
                if self._path is None
                else importlib.metadata.distributions(path=self._path)
            )
            for distribution in distributions:
                package_name = distribution.metadata["Name"] or ""
                if not package_name.startswith(DISTRIBUTION_PREFIX) or package_name in NOT_ENVIRONMENTS:
                    continue
                info = _info(package_name, distribution.version)
                found.setdefault(info.env_key, info)
            self._found = found
        return dict(self._found)

    def get_environment(self, env_key: str) -> EnvironmentInfo | None:
        """The package of one key (``"echo"``), or None.

        Args:
            env_key: The short name.
        """
        return self.discover().get(env_key)

    def get_environment_by_name(self, name: str) -> EnvironmentInfo | None:
        """The package of a name however spelled (``"echo"``, ``"echo-env"``, ``"echo_env"``), or None.

        Args:
            name: The name.
        """
        return self.get_environment(normalize_env_name(name).removesuffix("_env"))

    def list_environments(self) -> None:
        """Print the installed environment packages, one line each."""
        self.print_listing("OpenEnv Environments", "environments", lambda info: f"{info.description} (v{info.version})")

    def print_listing(self, title: str, noun: str, describe: Callable[[EnvironmentInfo], str]) -> None:
        """Print the installed environment packages as upstream's listings do, each described by ``describe``.

        Args:
            title: What is listed (``"OpenEnv Environments"``).
            noun: What the total counts (``"environments"``).
            describe: One package's line.
        """
        environments = self.discover()
        print(f"Available {title}:")
        print("-" * 70)
        if not environments:
            print("  No OpenEnv environments found.")
            print("  Install one with: openenv install openenv-<name>")
        for key in sorted(environments):
            info = environments[key]
            print(f"  {key:<15}: {describe(info)}")
            print(f"                   Package: {info.package_name}")
        print("-" * 70)
        print(f"Total: {len(environments)} {noun}")

    def clear_cache(self) -> None:
        """Forget what was found: the next call looks again."""
        self._found = None


_discovery: EnvironmentDiscovery | None = None


def get_discovery() -> EnvironmentDiscovery:
    """The process's shared `EnvironmentDiscovery`."""
    global _discovery
    if _discovery is None:
        _discovery = EnvironmentDiscovery()
    return _discovery


def reset_discovery() -> None:
    """Drop the shared `EnvironmentDiscovery`: the next lookup finds the packages again."""
    global _discovery
    _discovery = None


def unknown_environment(name: str, discovery: EnvironmentDiscovery) -> ValueError:
    """The error for a name no installed package has: what is installed, and the nearest names.

    Args:
        name: The name asked for.
        discovery: Where the installed packages were found.
    """
    available = sorted(discovery.discover())
    if not available:
        return ValueError(
            f"No OpenEnv environments found, so none is named {name!r}: "
            "install one with: openenv install openenv-<name>"
        )
    near = difflib.get_close_matches(normalize_env_name(name).removesuffix("_env"), available, n=3, cutoff=0.6)
    hint = f" Did you mean: {', '.join(near)}?" if near else ""
    return ValueError(f"Unknown environment {name!r}.{hint} Available environments: {', '.join(available)}")


def installed_environment(name: str, discovery: EnvironmentDiscovery) -> EnvironmentInfo:
    """The installed package of a name, or of a Hub repository's name.

    Args:
        name: The name as a user types it, or ``org/name``.
        discovery: Where the installed packages are found.

    Raises:
        ValueError: No installed package has that name.
    """
    local_name = name.rstrip("/").rsplit("/", 1)[-1] if is_hub_reference(name) else name
    info = discovery.get_environment_by_name(local_name)
    if info is not None:
        return info
    if is_hub_reference(name):
        # Upstream pip-installs the repository here, after a prompt; openenv-anyio runs no code
        # from the Hub that the user did not install.
        raise ValueError(
            f"the environment package of {name!r} is not installed: install it with "
            f"`openenv install git+https://huggingface.co/spaces/{name.split('huggingface.co/', 1)[-1].strip('/')}`, "
            "or pass skip_install=True to drive its Space with GenericEnvClient"
        )
    raise unknown_environment(name, discovery)


# Upstream's names for two of these: its own tests import them.
_normalize_env_name = normalize_env_name
_is_hub_url = is_hub_reference
