"""How the reference's pydantic validates values, for ``tests/core/test_values.py`` (run by its venv's python).

    python reference_values.py < cases.json

Reads a JSON list of ``[type_name, value]`` (``int``, ``float``, ``bool``,
``str``, ``optional_int``) and prints a JSON list of verdicts, one per case:
``{"ok": true, "repr": repr(validated)}`` or ``{"ok": false}``, each value validated
as the field ``v`` of a pydantic model (lax, pydantic's default), from JSON.
"""

from __future__ import annotations

import json
import sys
from typing import Optional

from pydantic import BaseModel, ValidationError


class Int(BaseModel):
    v: int


class Float(BaseModel):
    v: float


class Bool(BaseModel):
    v: bool


class Str(BaseModel):
    v: str


class OptionalInt(BaseModel):
    v: Optional[int]  # noqa: UP045 - the reference's own spelling


MODELS = {"int": Int, "float": Float, "bool": Bool, "str": Str, "optional_int": OptionalInt}


def verdict(type_name: str, value: object) -> dict[str, object]:
    try:
        validated = MODELS[type_name].model_validate_json(json.dumps({"v": value})).v
    except ValidationError:
        return {"ok": False}
    return {"ok": True, "repr": repr(validated)}


if __name__ == "__main__":
    print(json.dumps([verdict(type_name, value) for type_name, value in json.load(sys.stdin)]))
