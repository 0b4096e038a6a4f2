"""The API reference documents ``reset_async`` and ``step_async`` as the methods they are (docs extra only)."""

from __future__ import annotations

from pathlib import Path

import pytest

griffe = pytest.importorskip("griffe")

ROOT = Path(__file__).resolve().parents[2]


def test_method_aliases_get_the_signature_of_their_target_and_their_own_docstring() -> None:
    extensions = griffe.load_extensions(f"{ROOT / 'docs/_griffe/method_aliases.py'}:MethodAliases")
    module = griffe.load("openenv._client", search_paths=[str(ROOT)], extensions=extensions)
    client = module["EnvClient"]
    for alias, target in (("reset_async", "reset"), ("step_async", "step")):
        documented = client.members[alias]
        assert documented.is_function
        assert "async" in documented.labels
        assert [p.name for p in documented.parameters] == [p.name for p in client.members[target].parameters]
        assert documented.docstring.value.startswith(f"The same coroutine function as `{target}`")
