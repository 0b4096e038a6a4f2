"""Reading the concrete type arguments a subclass gave a generic base class."""

from __future__ import annotations

import typing
from typing import Any, TypeVar

__all__ = ["resolve_type_arguments"]


def resolve_type_arguments(cls: type, base: type, count: int) -> tuple[Any, ...] | None:
    """Find the arguments ``cls`` gave ``base`` (``class E(base[A, O, S])``), through any depth.

    Args:
        cls: The subclass to inspect.
        base: The generic base class.
        count: How many type parameters ``base`` has.

    Returns:
        The arguments, with any still-unbound type variable replaced by ``None``;
        ``None`` if ``cls`` never parametrised ``base``.
    """
    for klass in cls.__mro__:
        for orig in klass.__dict__.get("__orig_bases__", ()):
            if typing.get_origin(orig) is base:
                args = typing.get_args(orig)
                if len(args) == count:
                    return tuple(None if isinstance(arg, TypeVar) else arg for arg in args)
    return None
