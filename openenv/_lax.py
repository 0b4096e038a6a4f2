"""Values as pydantic's lax mode takes them, for the servers of environments that are not strict.

OpenEnv's actions are pydantic models, which by default take ``True`` for an
``int``, ``" 3 "`` and ``"1_000"`` for numbers, ``"yes"`` and ``1.0`` for a
``bool``. msgspec's own lax mode takes fewer (and one pydantic refuses:
``"1e3"`` for an ``int``). So a server decodes strictly first, the fast path
for data that already has its types, and only when that fails converts the
data again with `lax_convert`, which applies pydantic's rules wherever the
type asks for a number, a bool or ``None``, then validates strictly.

The rules, from pydantic 2's conversion table (``tests/core/test_values.py`` checks
them against pydantic itself):

- ``int``: a bool; a float with no fraction (within 64 bits); a string of
  ASCII digits, with an optional sign, single underscores between digits and a
  fraction of zeros (``" +1_000.0 "``), surrounding whitespace stripped.
- ``float``: a bool, an int; a string Python's ``float`` reads once stripped,
  in ASCII (``"1e3"``, ``".5"``, ``"inf"``, ``"1_000.5"``).
- ``bool``: ``0``/``1``, ``0.0``/``1.0``, and ``"0"``, ``"1"``, ``"f"``,
  ``"t"``, ``"n"``, ``"y"``, ``"no"``, ``"on"``, ``"off"``, ``"yes"``,
  ``"true"``, ``"false"`` in any case.
- ``None``: only ``null``; a ``str`` takes only strings.
"""

from __future__ import annotations

import functools
import re
from typing import Any

import msgspec
from msgspec import inspect as mi

__all__ = ["lax_convert"]

_INT_TEXT = re.compile(r"[+-]?[0-9]+(?:_[0-9]+)*(?:\.0+)?")
_TRUE = frozenset({"1", "on", "t", "true", "y", "yes"})
_FALSE = frozenset({"0", "off", "f", "false", "n", "no"})
_INT64 = 2**63
_NO = object()  # a value the rule does not convert: left as it is, for strict validation to refuse


def _to_int(value: Any) -> Any:
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, float):
        if value.is_integer() and -_INT64 <= value < _INT64:
            return int(value)
        return _NO
    if isinstance(value, str):
        text = value.strip()
        if _INT_TEXT.fullmatch(text):
            return int(text.partition(".")[0])
    return _NO


def _to_float(value: Any) -> Any:
    if isinstance(value, (bool, int)):
        return float(value)
    if isinstance(value, str):
        text = value.strip()
        if text.isascii():
            try:
                return float(text)
            except ValueError:
                return _NO
    return _NO


def _to_bool(value: Any) -> Any:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return bool(value) if value in (0, 1) else _NO
    if isinstance(value, str):
        lowered = value.lower()
        if lowered in _TRUE:
            return True
        if lowered in _FALSE:
            return False
    return _NO


_SCALARS: dict[type, tuple[type, Any]] = {
    mi.IntType: (int, _to_int),
    mi.FloatType: (float, _to_float),
    mi.BoolType: (bool, _to_bool),
}


@functools.lru_cache(maxsize=256)
def _info(type_: Any) -> mi.Type:
    return mi.type_info(type_)


def _fits(value: Any, info: mi.Type) -> bool:
    """Whether ``value`` already is of the scalar kind ``info`` names (a union keeps such a value)."""
    if isinstance(info, mi.NoneType):
        return value is None
    if isinstance(info, mi.BoolType):
        return isinstance(value, bool)
    if isinstance(info, mi.IntType):
        return isinstance(value, int) and not isinstance(value, bool)
    if isinstance(info, mi.FloatType):
        return isinstance(value, float) or (isinstance(value, int) and not isinstance(value, bool))
    if isinstance(info, mi.StrType):
        return isinstance(value, str)
    return False


def _normalize(value: Any, info: mi.Type) -> Any:
    """``value`` with pydantic's conversions applied wherever ``info`` asks for a number or a bool."""
    if isinstance(info, mi.Metadata):
        return _normalize(value, info.type)
    scalar = _SCALARS.get(type(info))
    if scalar is not None:
        convert = scalar[1]
        if _fits(value, info):
            return value
        converted = convert(value)
        return value if converted is _NO else converted
    if isinstance(info, mi.UnionType):
        if any(_fits(value, member) for member in info.types):
            return value
        for member in info.types:
            scalar = _SCALARS.get(type(member.type if isinstance(member, mi.Metadata) else member))
            if scalar is not None:
                converted = scalar[1](value)
                if converted is not _NO:
                    return converted
        for member in info.types:  # containers and Structs: the first whose shape the value has
            mapping = isinstance(member, (mi.StructType, mi.DictType, mi.TypedDictType, mi.DataclassType))
            sequence = isinstance(member, (mi.ListType, mi.SetType, mi.FrozenSetType, mi.VarTupleType, mi.TupleType))
            if (mapping and isinstance(value, dict)) or (sequence and isinstance(value, list)):
                return _normalize(value, member)
        return value
    if isinstance(value, dict):
        if isinstance(info, (mi.StructType, mi.TypedDictType, mi.DataclassType)):
            fields = {field.encode_name: field.type for field in info.fields}
            return {key: _normalize(item, fields[key]) if key in fields else item for key, item in value.items()}
        if isinstance(info, mi.DictType):
            return {_normalize(key, info.key_type): _normalize(item, info.value_type) for key, item in value.items()}
        return value
    if isinstance(value, list):
        if isinstance(info, (mi.ListType, mi.SetType, mi.FrozenSetType, mi.VarTupleType)):
            return [_normalize(item, info.item_type) for item in value]
        if isinstance(info, mi.TupleType) and len(value) == len(info.item_types):
            return [_normalize(item, item_type) for item, item_type in zip(value, info.item_types, strict=True)]
    return value


def lax_convert(value: Any, type_: Any) -> Any:
    """Convert decoded data (plain dicts, lists, strings, numbers) into ``type_``, as leniently as pydantic.

    Args:
        value: The data, as a JSON or MessagePack decoder without a type gives it.
        type_: The type to convert into: a Struct, or any type msgspec converts into.

    Returns:
        The value, of ``type_``.

    Raises:
        msgspec.ValidationError: The data does not fit, even so.
    """
    return msgspec.convert(_normalize(value, _info(type_)), type_, strict=True)
