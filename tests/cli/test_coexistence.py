"""openenv-anyio and upstream OpenEnv (``openenv`` 0.10.0) installed into one environment, either order, for real.

Both install a package named ``openenv``; pip does not see the clash (the
distributions differ). What each order leaves, and what openenv says about it,
in one line and never a traceback (nor ``No module named 'openenv.server'``):

- ours, then upstream over it: ``openenv`` is upstream's command now;
  ``openenv-anyio`` (ours still) says whose package Python imports, and what to do;
- upstream, then ours over it: ours runs, saying in one line that upstream's
  files are mixed in; importing openenv warns the same;
- upstream installed, ours editable: ours loses on ``sys.path``; the command says so.

The environment (upstream's and our dependencies) is made once, in the test
cache; each run reinstalls the two packages themselves, without dependencies.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.interop.reference_venv import OPENENV_0_10, reference_env

pytestmark = pytest.mark.interop

ROOT = Path(__file__).resolve().parents[2]
VENV = Path.home() / ".cache" / "openenv-tests" / f"coexistence-{OPENENV_0_10.version}"
MARKER = VENV / ".dependencies-ok"
UPSTREAM = f"openenv=={OPENENV_0_10.version}"
LIMIT = 1200


def run(*command: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    environment = reference_env({"PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_INPUT": "1"})
    # From the test cache: never from the checkout, whose own openenv would come first on sys.path.
    done = subprocess.run(
        list(command), capture_output=True, text=True, timeout=LIMIT, cwd=VENV.parent, env=environment, check=False
    )
    if check and done.returncode != 0:
        raise AssertionError(f"{command} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    return done


def pip(*arguments: str) -> None:
    run(str(VENV / "bin" / "python"), "-m", "pip", "install", "--quiet", *arguments)


def uninstall_both() -> None:
    run(str(VENV / "bin" / "python"), "-m", "pip", "uninstall", "--yes", "--quiet", "openenv", "openenv-anyio")


def command(name: str, *arguments: str) -> subprocess.CompletedProcess[str]:
    return run(str(VENV / "bin" / name), *arguments, check=False)


def python(code: str) -> subprocess.CompletedProcess[str]:
    return run(str(VENV / "bin" / "python"), "-c", code, check=False)


@pytest.fixture(scope="module")
def venv() -> Path:
    """A venv with both projects' dependencies (made once), and neither project installed."""
    if not MARKER.is_file():
        VENV.parent.mkdir(parents=True, exist_ok=True)
        run(sys.executable, "-m", "venv", "--clear", str(VENV))
        pip(f"{ROOT}[cli]", UPSTREAM)
        MARKER.write_text("ok\n")
    uninstall_both()
    return VENV


def one_line(stream: str) -> str:
    lines = [line for line in stream.splitlines() if line.strip()]
    assert len(lines) == 1, stream
    assert "Traceback" not in stream
    assert "No module named" not in stream
    return lines[0]


def test_upstream_installed_over_ours(venv: Path) -> None:
    pip("--no-deps", str(ROOT))
    pip("--no-deps", "--force-reinstall", UPSTREAM)
    # `openenv` is upstream's command now, as pip installed it last.
    theirs = command("openenv", "--help")
    assert theirs.returncode == 0
    assert "OpenEnv - An e2e framework" in theirs.stdout
    # Ours is still `openenv-anyio`, and says what happened.
    ours = command("openenv-anyio", "--help")
    assert ours.returncode == 1
    line = one_line(ours.stderr)
    assert line.startswith("Error: the package openenv that Python imports (")
    assert "is upstream OpenEnv's (openenv 0.10.0), not openenv-anyio's" in line
    assert "keep them in separate virtual environments" in line
    assert "pip install --force-reinstall -e ." in line
    assert ours.stdout == ""


def test_ours_installed_over_upstream(venv: Path) -> None:
    pip("--no-deps", UPSTREAM)
    pip("--no-deps", "--force-reinstall", str(ROOT))
    ours = command("openenv", "--help")
    assert ours.returncode == 0, ours.stderr
    assert "Serve environments and try them out." in ours.stdout
    line = one_line(ours.stderr)
    assert line.startswith("Warning: openenv 0.10.0 is installed in this environment too, and its files are mixed")
    imported = python(
        "import warnings, json\n"
        "with warnings.catch_warnings(record=True) as caught:\n"
        "    warnings.simplefilter('always')\n"
        "    import openenv\n"
        "print(json.dumps([[type(w.message).__name__, str(w.message)] for w in caught]))\n"
    )
    assert imported.returncode == 0, imported.stderr
    [[kind, message]] = json.loads(imported.stdout)
    assert kind == "MixedInstallWarning"
    assert "pip uninstall openenv and reinstall openenv-anyio" in message


def test_upstream_and_our_editable_install(venv: Path) -> None:
    """The issue's case (``openenv --help`` died with ``No module named 'openenv.server'``): one line, either way."""
    pip("--no-deps", UPSTREAM)
    pip("--no-deps", "--editable", str(ROOT))
    where = python("import openenv; print(openenv.__file__)").stdout.strip()
    ours = command("openenv", "--help")
    if where.startswith(str(ROOT)):  # our checkout comes first on sys.path: upstream's is shadowed
        assert ours.returncode == 0, ours.stderr
        line = one_line(ours.stderr)
        assert line.startswith("Warning: upstream OpenEnv (openenv 0.10.0) is installed in this environment too,")
        assert "so upstream's (openenv.core, its command) cannot be used here" in line
    else:
        assert ours.returncode == 1
        assert "is upstream OpenEnv's (openenv 0.10.0), not openenv-anyio's" in one_line(ours.stderr)
    uninstall_both()
    assert not os.path.exists(VENV / "bin" / "openenv-anyio")
