"""The test suite says, before it starts, that the interop tests build a large reference environment."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _collect(tmp_path: Path, *options: str) -> str:
    environment = {
        **os.environ,
        "OPENENV_REFERENCE_VENV": str(tmp_path / "not-built-yet"),
        "OPENENV_REFERENCE_VENV_0_10": str(tmp_path / "not-built-either"),
    }
    command = [sys.executable, "-m", "pytest", "--collect-only", "-q", "tests/interop/test_interop.py", *options]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=ROOT, env=environment)
    assert result.returncode in (0, 5), result.stdout + result.stderr  # 5: every test deselected
    return result.stdout


@pytest.mark.parametrize(("options", "noted"), [((), True), (("-m", "not interop"), False)])
def test_the_first_run_says_it_builds_the_reference_environment(
    tmp_path: Path, options: tuple[str, ...], noted: bool
) -> None:
    output = _collect(tmp_path, *options)
    notes = [
        f"note: the interop tests first build a ~474 MB reference environment (openenv-core 0.3.0 from PyPI, once)"
        f" in {tmp_path / 'not-built-yet'}",
        f"note: the interop tests first build a ~478 MB reference environment (openenv 0.10.0 from PyPI, once)"
        f" in {tmp_path / 'not-built-either'}",
    ]
    for note in notes:
        assert (note in output) is noted, output
    if noted:
        assert "pytest -m 'not interop'" in output
