"""``openenv install``: an environment package written for upstream OpenEnv, installed without upstream's ``openenv``.

Upstream's environment packages require ``openenv[core]`` (or ``openenv-core``), which pip
would fetch from PyPI, over openenv-anyio's own ``openenv`` package. This installs such a
package in two pip runs: the package alone (``--no-deps``), whose report names its
requirements; then those requirements, upstream's left out (openenv-anyio's
``openenv.core`` stands in for them). Any other pip option is passed to both runs.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["UPSTREAM_NAMES", "PipFailed", "install", "requirements_without_upstream"]

UPSTREAM_NAMES = frozenset({"openenv", "openenv-core"})
"""Upstream OpenEnv's distributions (normalized names): never installed by `install`."""

_NAME = re.compile(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)")
_EXTRA = re.compile(r"""extra\s*==\s*["']([^"']+)["']""")


class PipFailed(Exception):
    """A pip run failed; its output went to the terminal already.

    Args:
        step: What pip was asked to do.
        status: Its exit status.
    """

    def __init__(self, step: str, status: int) -> None:
        super().__init__(f"pip failed {step} (exit status {status}); its output is above")
        self.status = status


def _normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def requirements_without_upstream(requires: Sequence[str], extras: Sequence[str] = ()) -> list[str]:
    """A package's requirements as pip takes them on its command line, upstream OpenEnv's left out.

    Args:
        requires: Its ``Requires-Dist`` entries (``"numpy>=1.24"``, ``"pytest; extra == 'dev'"``).
        extras: The extras asked for: a requirement of one of them is kept (without its marker).

    Returns:
        The requirements to install.
    """
    wanted = {_normalized(extra) for extra in extras}
    kept = []
    for requirement in requires:
        spec, _, marker = requirement.partition(";")
        found = _NAME.match(spec)
        if found is None or _normalized(found.group(1)) in UPSTREAM_NAMES:
            continue
        extra = _EXTRA.search(marker)
        if extra is None:
            kept.append(requirement.strip())
        elif _normalized(extra.group(1)) in wanted:
            kept.append(spec.strip())  # its extra is asked for: the rest of its marker is not evaluated
    return kept


def _pip(arguments: Sequence[str], step: str) -> None:
    status = subprocess.run([sys.executable, "-m", "pip", *arguments], check=False).returncode
    if status != 0:
        raise PipFailed(step, status)


def install(target: str, pip_options: Sequence[str] = ()) -> tuple[str, list[str]]:
    """Install an environment package and its requirements, but never upstream's ``openenv``.

    Args:
        target: What pip installs: a path, a wheel, a name on an index (``name[extra]`` too).
        pip_options: More pip options (``--index-url``, ``--no-index``, ...), for both runs.

    Returns:
        The package's name, and the requirements installed beside it.

    Raises:
        PipFailed: A pip run failed.
    """
    with tempfile.TemporaryDirectory() as folder:
        report = Path(folder) / "report.json"
        # Reinstalled even when it is there already: pip reports only what it installs.
        first = ["install", "--no-deps", "--force-reinstall", "--report", str(report), *pip_options, target]
        _pip(first, f"installing {target}")
        entries: list[dict[str, Any]] = json.loads(report.read_text()).get("install", [])
    if not entries:  # pip reported nothing installed (a pip that ignores --force-reinstall for it)
        return target, []
    entry = next((item for item in entries if item.get("requested")), entries[0])
    metadata = entry.get("metadata", {})
    requirements = requirements_without_upstream(metadata.get("requires_dist", []), entry.get("requested_extras", []))
    if requirements:
        _pip(["install", *pip_options, *requirements], f"installing the requirements of {metadata.get('name')}")
    return str(metadata.get("name", target)), requirements
