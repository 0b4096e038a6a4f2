"""Reading the concrete type arguments a subclass gave a generic base class."""

from __future__ import annotations

import typing
from typing import Any, TypeVar

__all__ = ["TYPE_ATTRIBUTES", "bind_alias_type_attributes", "bind_type_attributes", "resolve_type_arguments"]

TYPE_ATTRIBUTES = ("action_type", "observation_type", "state_type")
"""The class attributes an ``[ActT, ObsT, StateT]`` generic keeps its types in."""


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


def bind_type_attributes(cls: type, base: type) -> None:
    """Set ``cls``'s `TYPE_ATTRIBUTES` from the arguments it gave ``base[ActT, ObsT, StateT]``.

    An attribute written in the subclass body wins over its type argument; an
    argument left as a type variable leaves the inherited attribute alone.

    Args:
        cls: The subclass being created (called from its ``__init_subclass__``).
        base: The generic base class: `EnvClient` or `Environment`.
    """
    args = resolve_type_arguments(cls, base, len(TYPE_ATTRIBUTES))
    if args is None:
        return
    for name, arg in zip(TYPE_ATTRIBUTES, args, strict=True):
        if arg is not None and name not in cls.__dict__:
            setattr(cls, name, arg)


def bind_alias_type_attributes(instance: object) -> None:
    """Set ``instance``'s `TYPE_ATTRIBUTES` from the alias it was made from (``EnvClient[A, O, S](url)``).

    Calling a subscripted generic records the alias on the new instance as
    ``__orig_class__``, but only after ``__init__`` has returned, so this runs
    later (when the client connects). Types given to ``__init__`` win.

    Args:
        instance: The instance, made by calling ``Base[A, O, S]`` or ``Base``.
    """
    alias = instance.__dict__.get("__orig_class__")
    if alias is None:
        return
    args = typing.get_args(alias)
    if len(args) != len(TYPE_ATTRIBUTES):
        return
    for name, arg in zip(TYPE_ATTRIBUTES, args, strict=True):
        if not isinstance(arg, TypeVar) and name not in instance.__dict__:
            setattr(instance, name, arg)
