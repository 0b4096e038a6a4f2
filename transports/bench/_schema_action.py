"""From an action's JSON Schema to a minimal action that fits it.

The benchmark needs one valid action when the user gives none. The instance is
the smallest that fits: only required properties, each taking the first of its
``const``, ``default``, first ``enum`` value, first ``examples`` value, or a
placeholder of its type (``""``, ``0``, ``False``, ``None``, ``[]``, ``{}``),
with length, size and range bounds met. ``$ref`` (pointers into the same
document: ``#/$defs/...``, ``#/definitions/...``), ``allOf`` (merged), ``anyOf``
and ``oneOf`` (the first branch) are followed. This covers the schemas msgspec
and pydantic generate; ``pattern`` and ``not`` are not solved.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping
from typing import Any

__all__ = ["SchemaActionError", "minimal_action", "minimal_instance"]

# Deeper than this, a schema is taken to require itself (an unsatisfiable recursion).
_MAX_DEPTH = 64

# Placeholders for the string formats msgspec and pydantic emit.
_FORMAT_PLACEHOLDERS = {
    "date-time": "1970-01-01T00:00:00Z",
    "date": "1970-01-01",
    "time": "00:00:00",
    "duration": "PT0S",
    "uuid": "00000000-0000-0000-0000-000000000000",
    "email": "user@example.com",
    "uri": "http://example.com",
    "hostname": "example.com",
    "ipv4": "127.0.0.1",
    "ipv6": "::1",
}

_PLACEHOLDERS: dict[str, Any] = {"null": None, "boolean": False, "object": {}, "array": []}


class SchemaActionError(ValueError):
    """No instance can be built from the schema (a foreign ``$ref``, ``false``, a recursion...)."""


def minimal_instance(schema: Any) -> Any:
    """Build the smallest JSON value that fits a JSON Schema.

    Args:
        schema: A JSON Schema (a dict, or ``True``), with any ``$defs`` it refers to.

    Returns:
        A JSON-compatible value (dicts, lists, strings, numbers, booleans, ``None``).

    Raises:
        SchemaActionError: The schema cannot be instantiated.
    """
    return _instance(schema, schema, 0)


def minimal_action(schema: Any) -> dict[str, Any]:
    """Build the smallest action (a JSON object) that fits an action's JSON Schema.

    Args:
        schema: The ``action`` entry of a server's ``GET /schema`` answer.

    Returns:
        The action's fields, as a dict (``{}`` for a schema that allows anything).

    Raises:
        SchemaActionError: The schema cannot be instantiated, or describes no object.
    """
    instance = minimal_instance(schema)
    if instance is None:  # Unconstrained (or nullable): an empty object fits the wire.
        return {}
    if not isinstance(instance, dict):
        raise SchemaActionError(f"the action schema describes a {type(instance).__name__}, not an object")
    return instance


def _resolve(reference: str, root: Any) -> Any:
    """Follow a JSON pointer within the same document (``#/$defs/Name``)."""
    if not reference.startswith("#"):
        raise SchemaActionError(f"cannot follow the reference {reference!r}: only '#/...' references are supported")
    target = root
    for part in reference[1:].split("/")[1:] if reference != "#" else []:
        key = part.replace("~1", "/").replace("~0", "~")
        if isinstance(target, Mapping) and key in target:
            target = target[key]
        elif isinstance(target, list) and key.isdigit() and int(key) < len(target):
            target = target[int(key)]
        else:
            raise SchemaActionError(f"the reference {reference!r} points nowhere")
    return target


def _merge_all_of(schema: Mapping[str, Any], root: Any) -> dict[str, Any]:
    """Merge ``allOf`` branches into one schema: properties and required lists join, the rest comes first-found."""
    merged: dict[str, Any] = {key: value for key, value in schema.items() if key != "allOf"}
    for branch in schema["allOf"]:
        while isinstance(branch, Mapping) and "$ref" in branch:
            branch = {**_resolve(branch["$ref"], root), **{k: v for k, v in branch.items() if k != "$ref"}}
        if not isinstance(branch, Mapping):
            continue
        if "allOf" in branch:
            branch = _merge_all_of(branch, root)
        for key, value in branch.items():
            if key == "properties":
                merged["properties"] = {**value, **merged.get("properties", {})}
            elif key == "required":
                merged["required"] = [*merged.get("required", []), *value]
            else:
                merged.setdefault(key, value)
    return merged


def _instance(schema: Any, root: Any, depth: int) -> Any:
    if depth > _MAX_DEPTH:
        raise SchemaActionError("the schema requires itself without end (a recursive required property)")
    if schema is True or schema == {}:
        return None
    if schema is False:
        raise SchemaActionError("the schema 'false' admits no value")
    if not isinstance(schema, Mapping):
        raise SchemaActionError(f"not a JSON Schema: {schema!r}")
    # A value the schema names outright comes first.
    if "const" in schema:
        return copy.deepcopy(schema["const"])
    if "default" in schema:
        return copy.deepcopy(schema["default"])
    if schema.get("enum"):
        return copy.deepcopy(schema["enum"][0])
    if isinstance(schema.get("examples"), list) and schema["examples"]:
        return copy.deepcopy(schema["examples"][0])
    if "$ref" in schema:
        target = _resolve(schema["$ref"], root)
        siblings = {key: value for key, value in schema.items() if key != "$ref"}
        return _instance(
            {**target, **siblings} if siblings and isinstance(target, Mapping) else target, root, depth + 1
        )
    if "allOf" in schema:
        return _instance(_merge_all_of(schema, root), root, depth + 1)
    for keyword in ("anyOf", "oneOf"):
        if schema.get(keyword):
            return _instance(schema[keyword][0], root, depth + 1)
    return _typed_instance(schema, root, depth)


def _schema_type(schema: Mapping[str, Any]) -> str | None:
    declared = schema.get("type")
    if isinstance(declared, list):
        declared = declared[0] if declared else None
    if declared is not None:
        return str(declared)
    # No type: guess it from the keywords that only make sense for one.
    if "properties" in schema or "required" in schema or "additionalProperties" in schema:
        return "object"
    if "items" in schema or "prefixItems" in schema:
        return "array"
    return None


def _typed_instance(schema: Mapping[str, Any], root: Any, depth: int) -> Any:
    kind = _schema_type(schema)
    if kind == "object":
        return _object(schema, root, depth)
    if kind == "array":
        return _array(schema, root, depth)
    if kind == "string":
        return _string(schema)
    if kind in ("integer", "number"):
        return _number(schema, integer=kind == "integer")
    return copy.copy(_PLACEHOLDERS.get(kind or "null"))


def _object(schema: Mapping[str, Any], root: Any, depth: int) -> dict[str, Any]:
    properties = schema.get("properties") or {}
    extra = schema.get("additionalProperties", True)
    instance: dict[str, Any] = {}
    for name in schema.get("required", []):
        if name in instance:
            continue
        subschema = properties.get(name, extra if isinstance(extra, Mapping) else True)
        instance[name] = _instance(subschema, root, depth + 1)
    return instance


def _array(schema: Mapping[str, Any], root: Any, depth: int) -> list[Any]:
    prefix = schema.get("prefixItems")
    items = schema.get("items", True)
    if prefix is None and isinstance(items, list):  # draft 4-7 tuples
        prefix, items = items, schema.get("additionalItems", True)
    prefix = prefix or []
    # A tuple gets every position (decoders such as msgspec's insist on them all).
    length = max(len(prefix), int(schema.get("minItems", 0)))
    instance = [_instance(subschema, root, depth + 1) for subschema in prefix]
    while len(instance) < length:
        instance.append(_instance(items, root, depth + 1))
    return instance


def _string(schema: Mapping[str, Any]) -> str:
    placeholder = _FORMAT_PLACEHOLDERS.get(str(schema.get("format", "")), "")
    if schema.get("contentEncoding") == "base64":
        placeholder = ""
    min_length = int(schema.get("minLength", 0))
    if len(placeholder) < min_length:
        placeholder = placeholder + "x" * (min_length - len(placeholder))
    max_length = schema.get("maxLength")
    if max_length is not None and len(placeholder) > int(max_length):
        placeholder = "x" * max(min_length, 0)
    return placeholder


def _number(schema: Mapping[str, Any], *, integer: bool) -> float | int:
    """Zero if the bounds allow it, else the value nearest zero within them (a multiple of ``multipleOf``)."""
    low, low_open = _bound(schema, "minimum", "exclusiveMinimum")
    high, high_open = _bound(schema, "maximum", "exclusiveMaximum")
    value: float = 0
    if low is not None and (low > 0 or (low_open and low == 0)):
        if not low_open:
            value = math.ceil(low) if integer else low
        elif integer:
            value = math.floor(low) + 1
        else:
            value = (low + high) / 2 if high is not None else low + 1
    elif high is not None and (high < 0 or (high_open and high == 0)):
        if not high_open:
            value = math.floor(high) if integer else high
        elif integer:
            value = math.ceil(high) - 1
        else:
            value = (low + high) / 2 if low is not None else high - 1
    step = schema.get("multipleOf")
    if step and value:
        value = math.ceil(value / step) * step if value > 0 else math.floor(value / step) * step
    return int(value) if integer else float(value)


def _bound(schema: Mapping[str, Any], inclusive: str, exclusive: str) -> tuple[float | None, bool]:
    """A bound and whether it is open; handles draft 4's boolean ``exclusiveMinimum``."""
    open_bound = schema.get(exclusive)
    if isinstance(open_bound, bool):
        return schema.get(inclusive), open_bound
    if open_bound is not None:
        return float(open_bound), True
    closed = schema.get(inclusive)
    return (float(closed) if closed is not None else None), False
