"""Upstream OpenEnv's ``openenv.core.env_server.web_interface``, without the interface: its metadata helper.

openenv-anyio does not serve upstream's Gradio interface at ``/web``
(``ENABLE_WEB_INTERFACE`` gets one line saying so, from `http_server.create_app`).
`load_environment_metadata` is here because environment packages call it for their metadata.
"""

from __future__ import annotations

import functools
import inspect
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import EnvironmentMetadata

__all__ = ["README_PATH_ENV", "load_environment_metadata"]

README_PATH_ENV = "ENV_README_PATH"
"""The environment variable naming the README file `load_environment_metadata` reads first."""


def _readme(env_name: str | None) -> str | None:
    """The environment's README: ``$ENV_README_PATH``, ``envs/<name>/README.md``, or where images copy it."""
    candidates = [Path(path) for path in [os.environ.get(README_PATH_ENV)] if path]
    if env_name:
        candidates.append(Path("envs") / env_name / "README.md")
    candidates += [Path("/app/env/README.md"), Path("/app/README.md")]
    for candidate in candidates:
        try:
            return candidate.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
    return None


def load_environment_metadata(
    env: Environment[Any, Any, Any] | Callable[..., Any], env_name: str | None = None
) -> EnvironmentMetadata:
    """An environment's metadata: an instance's own, else a factory's name with the README found for it.

    Args:
        env: An environment (its ``get_metadata()`` answers), or a factory (a class, a
            function, a ``functools.partial``), which is not called.
        env_name: The environment's name, for the README's path and the metadata's name.

    Returns:
        The metadata.
    """
    if isinstance(env, Environment):
        return env.get_metadata()
    factory = env.func if isinstance(env, functools.partial) else env
    named = factory.__name__ if inspect.isclass(factory) else env_name or getattr(factory, "__name__", None)
    class_name = str(named or "environment")
    return EnvironmentMetadata(
        name=env_name or class_name,
        description=f"{class_name} environment",
        version="1.0.0",
        readme_content=_readme(env_name),
    )
