"""``openenv install``: an environment package that requires upstream's ``openenv``, installed without it."""

from __future__ import annotations

import base64
import hashlib
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path

import pytest

from transports.cli._install import requirements_without_upstream

PROBE = "openenv_install_probe"
REQUIRES = [
    "openenv[core]>=0.2.2",
    "openenv-core>=0.2.0",
    "anyio>=4",
    'msgspec; python_version >= "3.8"',
    'pytest>=1; extra == "dev"',
    'no-such-package-anywhere; extra == "gpu"',
]


def test_upstream_is_left_out_and_extras_kept_only_when_asked() -> None:
    assert requirements_without_upstream(REQUIRES) == ["anyio>=4", 'msgspec; python_version >= "3.8"']
    assert requirements_without_upstream(REQUIRES, ["dev"]) == [
        "anyio>=4",
        'msgspec; python_version >= "3.8"',
        "pytest>=1",
    ]
    assert requirements_without_upstream(["OpenEnv_Core>=0.3", "openenv.core"]) == []


def _wheel(folder: Path) -> Path:
    """A wheel of a package that requires upstream's openenv, as environment packages do: built by hand."""
    info = f"{PROBE}-1.0.dist-info"
    files = {
        f"{PROBE}/__init__.py": b'"""A probe."""\n',
        f"{info}/METADATA": "\n".join(
            ["Metadata-Version: 2.1", f"Name: {PROBE}", "Version: 1.0", *(f"Requires-Dist: {r}" for r in REQUIRES)]
        ).encode()
        + b"\n",
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: hand\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for name, content in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(content).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(content)}")
    files[f"{info}/RECORD"] = ("\n".join([*record, f"{info}/RECORD,,"]) + "\n").encode()
    path = folder / f"{PROBE}-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as archive:
        for name, content in files.items():
            archive.writestr(name, content)
    return path


@pytest.fixture
def probe_wheel(tmp_path: Path) -> Iterator[Path]:
    yield _wheel(tmp_path)
    subprocess.run([sys.executable, "-m", "pip", "uninstall", "-y", "-q", PROBE], check=False, capture_output=True)


def test_the_package_and_its_requirements_are_installed_and_upstream_is_not(probe_wheel: Path) -> None:
    # Offline, as every test here: pip alone would look for upstream's openenv on an index, and fail.
    plain = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-index", str(probe_wheel)], capture_output=True, text=True
    )
    assert plain.returncode != 0
    assert "openenv" in plain.stderr
    done = subprocess.run(
        [sys.executable, "-m", "transports.cli", "install", str(probe_wheel), "--no-index", "-q"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        f"openenv: installed {PROBE} and its 2 requirements, upstream's openenv left out"
    )
    assert metadata.version(PROBE) == "1.0"
    for upstream in ("openenv", "openenv-core"):
        with pytest.raises(metadata.PackageNotFoundError):
            metadata.version(upstream)


def test_a_pip_failure_is_one_line(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "transports.cli", "install", str(tmp_path / "nothing-here"), "--no-index", "-q"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1].startswith("Error: pip failed installing")
