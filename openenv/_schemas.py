"""What an environment factory tells about itself without a server: its JSON Schemas and its metadata.

Pure msgspec, so a client-side tool (`openenv bench`) can describe an in-process
environment without importing the ASGI app; the app answers ``GET /schema`` and
``GET /metadata`` with these.
"""

from __future__ import annotations

import collections.abc
import inspect
import typing
from collections.abc import Awaitable, Callable
from typing import Any, cast

import msgspec

from ._environment import Environment, EnvironmentMetadata
from ._session import factory_name
from ._tools import MCPEnvironment
from ._unions import struct_union_members

__all__ = ["environment_metadata", "environment_schemas"]


def _environment_class(factory: Callable[[], Any]) -> type[Any] | None:
    """The environment class a factory builds, if it can be known without calling it."""
    if isinstance(factory, type):
        return factory
    try:  # A function annotated with the class it returns.
        returns = typing.get_type_hints(factory).get("return")
    except Exception:
        return None
    return returns if isinstance(returns, type) else None


def _any_schema(type_: Any) -> dict[str, Any]:
    """The schema hook for types msgspec cannot describe: anything goes."""
    return {}


def _schema(type_: Any) -> dict[str, Any]:
    # msgspec describes no untagged union of Structs; openenv decodes one into the member the data fits.
    members = struct_union_members(type_)
    try:
        if members is None:
            return msgspec.json.schema(type_, schema_hook=_any_schema)
        refs, components = msgspec.json.schema_components(members, schema_hook=_any_schema)
    except (TypeError, ValueError):
        return {}
    return {"anyOf": list(refs), "$defs": components}


def _inlined_schema(type_: Any) -> dict[str, Any]:
    """A type's JSON Schema with its own definition at the top (as pydantic's are); others under ``$defs``."""
    schema = _schema(type_)
    ref = schema.get("$ref")
    if not isinstance(ref, str):
        return schema
    defs = dict(schema.get("$defs", {}))
    name = ref.rsplit("/", 1)[-1]
    top = dict(defs.get(name, {}))
    if not any(ref in repr(value) for value in defs.values()):
        defs.pop(name, None)  # Nothing else refers to it.
    if defs:
        top["$defs"] = defs
    return top


def _action_schema(cls: Any, action_type: Any) -> dict[str, Any]:
    """The action's schema; a tool environment's names its tools, so clients (and `openenv bench`) can pick one."""
    schema = _inlined_schema(action_type)
    tools = getattr(cls, "tools", None)
    if isinstance(cls, type) and issubclass(cls, MCPEnvironment) and tools:
        call = schema.get("$defs", {}).get("CallToolAction")
        if call is not None:
            call["properties"]["tool_name"]["enum"] = list(tools)
    return schema


def _reset_observation_type(cls: Any, observation_type: Any) -> Any:
    """What ``reset`` returns: ``reset_observation_type``, else ``reset``'s return hint, else ``observation_type``."""
    declared = getattr(cls, "reset_observation_type", None)
    if declared is not None:
        return declared
    reset = getattr(cls, "reset", None)
    if reset is None or reset is Environment.reset:
        return observation_type
    try:
        returns = typing.get_type_hints(reset).get("return")
    except Exception:  # a hint that names what the module cannot resolve: no harm, just no schema of its own
        return observation_type
    if typing.get_origin(returns) in (Awaitable, collections.abc.Awaitable, collections.abc.Coroutine):
        return observation_type
    if (isinstance(returns, type) and issubclass(returns, msgspec.Struct)) or struct_union_members(returns):
        return returns
    return observation_type


def environment_schemas(factory: Callable[[], Any]) -> dict[str, dict[str, Any]]:
    """The JSON Schemas ``GET /schema`` answers with, for an environment factory.

    Args:
        factory: An `openenv.Environment` subclass, or a function (annotated with
            the class it returns, ideally; otherwise the schemas allow anything).

    Returns:
        ``{"action": ..., "observation": ..., "state": ..., "reset_observation":
        ...}``, each the JSON Schema of the type itself, its own definition at
        the top (as OpenEnv's pydantic schemas are). ``reset_observation`` is
        what ``reset`` returns, as OpenEnv 0.10 adds it: the environment's
        ``reset_observation_type`` if it sets one, else the return type its
        ``reset`` is annotated with (a Struct, or a union of them), else the
        observation type. The observation's schema names every field,
        ``done``, ``reward`` and ``metadata`` included, although on the wire
        ``done`` and ``reward`` travel beside the others (see
        `openenv._codec.lift_observation_fields`). A tool environment's action
        schema lists its tools' names. A class with a ``json_schemas``
        classmethod gives its own.
    """
    cls = _environment_class(factory)
    own = getattr(cls, "json_schemas", None)
    if callable(own):  # a class that describes itself (openenv.core's, whose types are pydantic models)
        return cast(dict[str, dict[str, Any]], own())
    action_type = getattr(cls, "action_type", dict)
    observation_type = getattr(cls, "observation_type", dict)
    state_type = getattr(cls, "state_type", dict)
    return {
        "action": _action_schema(cls, action_type),
        "observation": _inlined_schema(observation_type),
        "state": _inlined_schema(state_type),
        "reset_observation": _inlined_schema(_reset_observation_type(cls, observation_type)),
    }


def environment_metadata(factory: Callable[[], Any]) -> EnvironmentMetadata:
    """What ``GET /metadata`` tells about an environment factory.

    Args:
        factory: An `openenv.Environment` subclass (its ``metadata()`` classmethod
            answers) or any other callable (described by its name and docstring).

    Returns:
        The metadata.
    """
    cls = _environment_class(factory)
    if cls is not None and issubclass(cls, Environment):
        return cls.metadata()
    doc = inspect.getdoc(factory) or ""
    name = getattr(factory, "__name__", None) or factory_name(factory)
    return EnvironmentMetadata(
        name=name,
        description=doc.splitlines()[0] if doc else f"{name} environment",
        readme_content=doc or None,
    )
