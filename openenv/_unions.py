"""Decoding into a union of several Struct types: the one the data fits.

msgspec decodes a union of Structs only when they are tagged; OpenEnv's types
are not (echo_env answers a reset, a ``list_tools`` and a ``call_tool`` with
three untagged observation shapes). A `StructUnionDecoder` picks the member the
object fits: the first, in the order given, that has a field for every key of
the object and validates; failing that, the first that validates at all.
"""

from __future__ import annotations

import types
import typing
from typing import Any, Union

import msgspec

from ._lax import lax_convert

__all__ = ["StructUnionDecoder", "struct_union_members"]


def struct_union_members(type_: Any) -> tuple[type[msgspec.Struct], ...] | None:
    """The members of a union of two or more Struct types (``A | B``), in order.

    Args:
        type_: Any type.

    Returns:
        The Struct types, or ``None`` if ``type_`` is not such a union (a
        single Struct, a union with a non-Struct member, anything else).
    """
    if typing.get_origin(type_) not in (Union, types.UnionType):
        return None
    members = typing.get_args(type_)
    if len(members) < 2 or not all(isinstance(m, type) and issubclass(m, msgspec.Struct) for m in members):
        return None
    return members


class StructUnionDecoder:
    """Decodes an encoded object into the member of a union of Structs it fits.

    Built once (it holds one msgspec decoder per member) and reused.

    Args:
        members: The Struct types, in order of preference.
        encoding: ``"json"`` or ``"msgpack"``: how the objects are encoded.
        strict: ``False``: an object no member takes as it is gets pydantic's
            lax conversions (see `openenv._lax`), member by member in order.
    """

    def __init__(self, members: tuple[type[msgspec.Struct], ...], *, encoding: str, strict: bool = True) -> None:
        module: Any = msgspec.msgpack if encoding == "msgpack" else msgspec.json
        self._keys = module.Decoder(dict[str, msgspec.Raw]).decode
        # Members that refuse unknown fields (actions) never take an object that is not
        # theirs: the first to validate is the one, and the keys need no reading.
        self._exact = all(member.__struct_config__.forbid_unknown_fields for member in members)
        self._members = [
            (frozenset(field.encode_name for field in msgspec.structs.fields(member)), module.Decoder(member).decode)
            for member in members
        ]
        self._lax_types = () if strict else members
        self._any = module.Decoder().decode

    def decode(self, data: bytes | msgspec.Raw) -> Any:
        """Decode ``data`` into the member it fits best.

        Args:
            data: One encoded object.

        Returns:
            An instance of one of the members.

        Raises:
            msgspec.ValidationError: It fits none: the error of the member it
                came closest to (the first whose fields cover its keys, else the
                one covering most of them).
            msgspec.DecodeError: It is not an encoded object at all.
        """
        try:
            return self._decode_strictly(data)
        except msgspec.ValidationError as exc:
            if not self._lax_types:
                raise
            value = self._any(data)
            for member in self._lax_types:
                try:
                    return lax_convert(value, member)
                except msgspec.ValidationError:
                    pass
            raise exc from None

    def _decode_strictly(self, data: bytes | msgspec.Raw) -> Any:
        if self._exact:
            return self._first_that_validates(data)
        keys = self._keys(data).keys()
        first_error: msgspec.ValidationError | None = None
        later: list[tuple[int, Any]] = []
        for names, decode in self._members:
            if keys <= names:
                try:
                    return decode(data)
                except msgspec.ValidationError as exc:
                    first_error = first_error or exc
            else:
                later.append((len(keys & names), decode))
        later.sort(key=lambda item: -item[0])  # stable: the order given breaks ties
        for _, decode in later:
            try:
                return decode(data)
            except msgspec.ValidationError as exc:
                first_error = first_error or exc
        assert first_error is not None
        raise first_error

    def _first_that_validates(self, data: bytes | msgspec.Raw) -> Any:
        first_error: msgspec.ValidationError | None = None
        for _, decode in self._members:
            try:
                return decode(data)
            except msgspec.ValidationError as exc:
                first_error = first_error or exc
        assert first_error is not None
        raise first_error
