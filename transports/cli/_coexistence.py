"""Living beside upstream OpenEnv: telling, in one line, when its ``openenv`` package is the one Python imports.

openenv is the distribution ``openenv-anyio``; upstream OpenEnv is the
distribution ``openenv`` on PyPI (``openenv-core`` up to 0.3.0). Both install a
package named ``openenv``, so in one environment they clash without pip
noticing (the distributions differ): the one installed last owns the files
they share (``openenv/__init__.py``, the ``openenv`` command), and an editable
install loses to a regular one earlier on ``sys.path``. openenv checks where
it can run:

- `foreign_openenv`: the ``openenv`` Python imports is not this distribution's
  (upstream's, installed over ours or ahead of it on ``sys.path``). The
  ``openenv`` command and ``import transports`` then stop with this one line,
  instead of failing later with ``No module named 'openenv.server'``.
- `shadowed_upstream`: ours is the one imported while upstream's is installed
  elsewhere on ``sys.path`` (an editable install of ours): upstream's
  ``openenv.core`` cannot be imported here. The command says so in one line.
- ``openenv/__init__.py`` (ours) warns once when upstream's files are mixed
  into its own directory (upstream installed, then ours over it): see
  ``openenv._coexistence``.

Nothing here imports ``openenv`` before it must (nor, then, anything of it but
the package itself): it runs when the package may be upstream's.
"""

from __future__ import annotations

import importlib
from importlib import metadata

__all__ = [
    "OUR_DISTRIBUTION",
    "UPSTREAM_DISTRIBUTIONS",
    "foreign_openenv",
    "shadowed_upstream",
    "upstream_installed",
]

OUR_DISTRIBUTION = "openenv-anyio"
"""This project's distribution: what ``pip`` knows it as (its package is ``openenv``)."""

UPSTREAM_DISTRIBUTIONS = ("openenv", "openenv-core")
"""Upstream OpenEnv's distributions, newest first: each installs a package named ``openenv`` too."""

_WHAT_TO_DO = (
    "keep them in separate virtual environments (a project:// URL runs an environment built on upstream's "
    "packages in one of its own, beside openenv-anyio), or uninstall {upstream} and reinstall openenv-anyio "
    "(pip install --force-reinstall -e . in its checkout)"
)


def upstream_installed() -> str | None:
    """Upstream OpenEnv's distribution installed in this environment, if any.

    Returns:
        Its name and version (``"openenv 0.10.0"``), or ``None``.
    """
    for name in UPSTREAM_DISTRIBUTIONS:
        try:
            distribution = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        # Upstream's own files, not an older openenv-anyio that was still called "openenv".
        if any(str(file).startswith("openenv/core/") for file in distribution.files or ()):
            return f"{name} {distribution.version}"
    return None


def foreign_openenv() -> str | None:
    """Say what happened if the ``openenv`` package Python imports is not openenv-anyio's.

    Returns:
        One line saying whose package it is and what to do; ``None`` when it is ours.
    """
    try:
        openenv = importlib.import_module("openenv")
    except ImportError as exc:
        return f"the package openenv cannot be imported ({exc}); reinstall {OUR_DISTRIBUTION}"
    if getattr(openenv, "_DISTRIBUTION", None) == OUR_DISTRIBUTION:
        return None
    upstream = upstream_installed()
    whose = f"upstream OpenEnv's ({upstream})" if upstream else "another distribution's"
    where = getattr(openenv, "__file__", None) or "?"
    return (
        f"the package openenv that Python imports ({where}) is {whose}, not {OUR_DISTRIBUTION}'s: both install a "
        f"package named openenv, and it was installed over ours or comes first on sys.path; "
        + _WHAT_TO_DO.format(upstream=(upstream or "it").split()[0])
    )


def shadowed_upstream() -> str | None:
    """Say so if upstream OpenEnv is installed here while Python imports our ``openenv`` (so not theirs).

    Call it once `foreign_openenv` found the package ours.

    Returns:
        One line saying which upstream distribution cannot be used and what to do; ``None`` without one.
    """
    upstream = upstream_installed()
    if upstream is None:
        return None
    return (
        f"upstream OpenEnv ({upstream}) is installed in this environment too, but Python imports "
        f"{OUR_DISTRIBUTION}'s openenv, so upstream's (openenv.core, its command) cannot be used here; "
        + _WHAT_TO_DO.format(upstream=upstream.split()[0])
    )
