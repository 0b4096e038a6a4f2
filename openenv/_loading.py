"""Importing an environment factory from its ``package.module:attribute`` name."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from types import ModuleType
from typing import Any

import msgspec

from ._client import EnvClient, SyncEnvClient
from ._environment import Environment

__all__ = ["check_factory", "load_factory", "served_factory"]


def load_factory(spec: str) -> Callable[[], Any]:
    """Import the object named by ``spec``, in the ``module:attribute`` form uvicorn uses.

    Args:
        spec: ``"package.module:Factory"``; the attribute may be dotted
            (``"package.module:Class.create"``).

    Returns:
        The object, which must be callable with no arguments (usually an
        `Environment` subclass, or a function that builds one), or an ASGI app
        to serve as it is (see `served_factory`).

    Raises:
        ValueError: ``spec`` is not of the ``module:attribute`` form.
        ImportError: The module cannot be imported, or has no such attribute.
        TypeError: The object cannot build environments (see `check_factory`).

    Examples:
        ```python
        from openenv.server import load_factory

        factory = load_factory("openenv.examples.echo:EchoEnvironment")
        print(factory.__name__)  # EchoEnvironment
        ```
    """
    module_name, separator, attribute = spec.partition(":")
    if not separator or not module_name or not attribute:
        raise ValueError(f"{spec!r} is not of the form 'package.module:Factory'")
    module = importlib.import_module(module_name)
    target: Any = module
    for part in attribute.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            defines = _defines(module, module_name, " (it defines {})")
            raise ImportError(f"module {module_name!r} has no attribute {attribute!r}{defines}") from None
    try:
        check_factory(target, name=spec)
    except TypeError as exc:
        raise TypeError(f"{exc}{_defines(module, module_name, ', such as {}')}") from None
    return target  # type: ignore[no-any-return]


def served_factory(target: Any) -> Any:
    """The environment factory an ASGI app built by openenv serves; anything else as it is.

    The app keeps its factory as ``app.state.factory``. So an upstream package's
    ``server/app.py``, whose ``create_app(...)`` (``openenv.core``'s) builds such an app,
    names its environment wherever a factory is taken: ``inproc://my_env.server.app:app``,
    ``ray://my_env.server.app:app``.

    Args:
        target: What `load_factory` gave: a factory, or an app.

    Returns:
        The app's factory, or ``target`` itself.
    """
    if isinstance(target, type):
        return target
    state = getattr(target, "state", None)
    factory = getattr(state, "factory", None) if state is not None else None
    return factory if callable(factory) else target


def check_factory(factory: Any, *, name: str | None = None) -> None:
    """Refuse, before anything is served, what plainly cannot build environments.

    A class must be an `Environment` subclass, or at least have ``reset`` and
    ``step``; a client class (`EnvClient`) or a message class (an `Action`,
    any msgspec Struct) is refused by name, since it is the usual slip. A
    function is accepted: what it builds is known only when it is called.

    Args:
        factory: The would-be environment factory.
        name: How to name it in the message (by default, its qualified name).

    Raises:
        TypeError: It cannot build environments; the message says what to give instead.

    Examples:
        ```python
        from openenv.examples.echo import EchoEnv, EchoEnvironment
        from openenv.server import check_factory

        check_factory(EchoEnvironment)
        try:
            check_factory(EchoEnv)
        except TypeError as exc:
            print(exc)  # EchoEnv is a client class (an EnvClient), not an environment: ...
        ```
    """
    what = name or getattr(factory, "__qualname__", None) or repr(factory)
    if not callable(factory):
        raise TypeError(f"{what} is not callable: give an Environment subclass, or a function that builds one")
    if not isinstance(factory, type) or issubclass(factory, Environment):
        return
    if issubclass(factory, (EnvClient, SyncEnvClient)):
        raise TypeError(
            f"{what} is a client class (an EnvClient), not an environment: serve the environment it talks to"
        )
    if issubclass(factory, msgspec.Struct):
        raise TypeError(
            f"{what} is a message class (an Action, Observation or State), not an environment: "
            "serve the environment that uses it"
        )
    if _written_for_upstream(factory):
        raise TypeError(
            f"{what} is written against upstream OpenEnv's API (openenv.core): it is served with its action and "
            "observation classes, as create_app(...) in its package's server/app.py gives them: serve that app "
            "(my_env.server.app:app)"
        )
    if not all(callable(getattr(factory, method, None)) for method in ("reset", "step")):
        raise TypeError(f"{what} is not an environment (it has no reset and step): serve an Environment subclass")


UPSTREAM_ENVIRONMENT = ("openenv.core.env_server.interfaces", "Environment")
"""Where openenv.core's ``Environment`` (upstream's API) is defined: named, so that this module need not import it."""


def _written_for_upstream(factory: type) -> bool:
    """Whether a class subclasses openenv.core's ``Environment`` (which needs pydantic: not imported here)."""
    return any((base.__module__, base.__qualname__) == UPSTREAM_ENVIRONMENT for base in factory.__mro__)


def _defines(module: ModuleType, module_name: str, template: str) -> str:
    """``template`` filled with the environments the module defines (``module:Env or ...``); ``""`` if none."""
    found = sorted(
        name
        for name, value in vars(module).items()
        if isinstance(value, type)
        and issubclass(value, Environment)
        and value is not Environment
        and value.__module__ == module.__name__
    )
    return template.format(" or ".join(f"{module_name}:{name}" for name in found[:3])) if found else ""
