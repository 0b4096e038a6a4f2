"""What an environment factory tells about itself without a server: its JSON Schemas and its metadata.

Pure msgspec, so a client-side tool (`openenv bench`) can describe an in-process
environment without importing the ASGI app; the app answers ``GET /schema`` and
``GET /metadata`` with these.
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable
from typing import Any

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


def environment_schemas(factory: Callable[[], Any]) -> dict[str, dict[str, Any]]:
    """The JSON Schemas ``GET /schema`` answers with, for an environment factory.

    Args:
        factory: An `openenv.Environment` subclass, or a function (annotated with
            the class it returns, ideally; otherwise the schemas allow anything).

    Returns:
        ``{"action": ..., "observation": ..., "state": ...}``, each the JSON
        Schema of the type itself, its own definition at the top (as OpenEnv's
        pydantic schemas are). The observation's schema names every field,
        ``done``, ``reward`` and ``metadata`` included, although on the wire
        ``done`` and ``reward`` travel beside the others (see
        `openenv._codec.lift_observation_fields`). A tool environment's action
        schema lists its tools' names.
    """
    cls = _environment_class(factory)
    action_type = getattr(cls, "action_type", dict)
    observation_type = getattr(cls, "observation_type", dict)
    state_type = getattr(cls, "state_type", dict)
    return {
        "action": _action_schema(cls, action_type),
        "observation": _inlined_schema(observation_type),
        "state": _inlined_schema(state_type),
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
