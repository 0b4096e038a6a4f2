"""Shared fixtures: every async test runs under asyncio and under trio."""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest

from tests import loopback
from tests.envs import AsyncCounterEnv, SyncCounterEnv
from tests.interop.reference_venv import MARKER_NAME, REFERENCES, venv_dir
from transports.shared._public_io import PUBLIC_IO_ENV, public_io_only


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    """Run each ``@pytest.mark.anyio`` test once per backend."""
    return str(request.param)


@pytest.fixture(autouse=True)
def _forget_what_test_environments_recorded() -> None:
    """Each test starts with empty class-level records of the shared test environments."""
    AsyncCounterEnv.closed.clear()
    SyncCounterEnv.threads.clear()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Run the tests marked ``ray`` in the loopback-only namespace, and only there.

    Outside it they are deselected: `tests.transports.ray.test_ray_loopback` runs them in it.
    Inside it every other test is deselected (they ran outside).
    """
    inside = loopback.inside()
    kept: list[pytest.Item] = []
    dropped: list[pytest.Item] = []
    for item in items:
        (kept if (item.get_closest_marker("ray") is not None) == inside else dropped).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept
    if public_io_only():
        _skip_speed_paths(items)


def _skip_speed_paths(items: list[pytest.Item]) -> None:
    """With the speed paths off, skip the tests of the speed paths themselves, and hypercorn+websockets twice over.

    (hypercorn+websockets is plain hypercorn then, whose own runs stay.)
    """
    off = pytest.mark.skip(reason=f"{PUBLIC_IO_ENV} is set: the speed paths are off")
    same = pytest.mark.skip(reason=f"{PUBLIC_IO_ENV} is set: hypercorn+websockets is plain hypercorn, run already")
    for item in items:
        if item.get_closest_marker("speed_path") is not None:
            item.add_marker(off)
        elif "hypercorn+websockets" in item.name:
            item.add_marker(same)


def pytest_collection_finish(session: pytest.Session) -> None:
    """Say, before any test runs, that the interop tests are about to build the reference environments."""
    if not any(item.get_closest_marker("interop") for item in session.items):
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is None:
        return
    from tests.dropin.test_dipg_safety import OURS_VENV, UPSTREAM_VENV  # two more, for a package from PyPI

    for reference in (*REFERENCES, UPSTREAM_VENV, OURS_VENV):
        path = venv_dir(reference=reference)
        if (path / MARKER_NAME).is_file():
            continue  # built on an earlier run
        reporter.ensure_newline()
        reporter.write_line(
            f"note: the interop tests first build a {reference.size} reference environment "
            f"({reference.label} from PyPI, once) in {path}; "
            "to run without them: pytest -m 'not interop'",
            yellow=True,
        )


@pytest.fixture(scope="session", autouse=True)
def _stop_ray_at_the_end() -> Iterator[None]:
    """Ray starts once, on first use (`tests.serving.start_local_ray`), and stops when the session ends."""
    yield
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        ray.shutdown()
