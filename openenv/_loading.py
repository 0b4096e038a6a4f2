"""Importing an environment factory from its ``package.module:attribute`` name."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

__all__ = ["load_factory"]


def load_factory(spec: str) -> Callable[[], Any]:
    """Import the object named by ``spec``, in the ``module:attribute`` form uvicorn uses.

    Args:
        spec: ``"package.module:Factory"``; the attribute may be dotted
            (``"package.module:Class.create"``).

    Returns:
        The object, which must be callable with no arguments (usually an
        `Environment` subclass, or a function that builds one).

    Raises:
        ValueError: ``spec`` is not of the ``module:attribute`` form.
        ImportError: The module cannot be imported, or has no such attribute.
        TypeError: The object is not callable.

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
            raise ImportError(f"module {module_name!r} has no attribute {attribute!r}") from None
    if not callable(target):
        raise TypeError(f"{spec!r} is not callable")
    return target  # type: ignore[no-any-return]
