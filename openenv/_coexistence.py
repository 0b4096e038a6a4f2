"""Living beside upstream OpenEnv: a warning when its files are mixed into this ``openenv`` package.

openenv is the distribution ``openenv-anyio``; upstream OpenEnv is ``openenv``
on PyPI (``openenv-core`` up to 0.3.0), and both install a package named
``openenv``. pip does not see the clash (the distributions differ): installed
one over the other, they share one directory, and the last owns the files they
both have. When this package's ``__init__`` runs and finds upstream's files in
``openenv/core`` (its web interface, which openenv-anyio's drop-in ``openenv.core``
does not have), it warns once, in one line, with what to do. (When
upstream's ``__init__`` is the one that runs, this code does not: then
``transports`` and the ``openenv`` command say so, see ``transports.cli._coexistence``.)
"""

from __future__ import annotations

import warnings
from importlib import metadata
from pathlib import Path

__all__ = ["DISTRIBUTION", "MixedInstallWarning", "warn_if_mixed"]

DISTRIBUTION = "openenv-anyio"
"""This project's distribution (its package is ``openenv``)."""

_UPSTREAM_DISTRIBUTIONS = ("openenv", "openenv-core")


class MixedInstallWarning(RuntimeWarning):
    """Upstream OpenEnv's files are mixed into this ``openenv`` package (see `warn_if_mixed`)."""


def upstream_installed() -> str | None:
    """Upstream OpenEnv's distribution and version (``"openenv 0.10.0"``), if its metadata is installed here."""
    # `transports.cli._coexistence.upstream_installed` is this look again, on purpose: it runs when the
    # ``openenv`` Python imports may be upstream's, so it cannot import this module.
    for name in _UPSTREAM_DISTRIBUTIONS:
        try:
            distribution = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        # Upstream's own files, not an older openenv-anyio that was still called "openenv".
        if any(str(file).startswith("openenv/core/") for file in distribution.files or ()):
            return f"{name} {distribution.version}"
    return None


def warn_if_mixed(package_dir: Path) -> None:
    """Warn, in one line, if upstream's files sit in this package's directory (a cheap look: one ``stat``).

    Args:
        package_dir: The directory of this ``openenv`` package.
    """
    # openenv-anyio has an ``openenv/core`` of its own (the drop-in layer) but never upstream's web interface.
    if not (package_dir / "core" / "env_server" / "gradio_ui.py").is_file():
        return
    upstream = upstream_installed() or "upstream OpenEnv"
    warnings.warn(
        f"{upstream} is installed in this environment too, and its files are mixed into this openenv package "
        f"({DISTRIBUTION}'s, installed last), so upstream's own code may fail here: keep them in separate "
        f"virtual environments (a project:// URL runs an environment built on upstream's packages beside "
        f"{DISTRIBUTION}), or pip uninstall {upstream.split()[0]} and reinstall {DISTRIBUTION}",
        MixedInstallWarning,
        stacklevel=3,
    )
