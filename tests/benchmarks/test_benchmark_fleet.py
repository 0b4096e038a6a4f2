"""The fleet part of the benchmark harness: what it counts from /proc, what it records, how it judges the goals.

The harness is not a test and its figures are never asserted; these check its
bookkeeping on figures made up here, and its connection count on real
loopback sockets.
"""

from __future__ import annotations

import gc
import socket
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.benchmarks import _fleet_plot, _fleet_report, fleet_floor
from tests.benchmarks._fleet_record import FleetRecord
from tests.benchmarks._procfs import tcp_connections_to
from tests.benchmarks.fleet import fleet_targets

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


@linux_only
def test_counts_the_connections_this_process_holds_to_a_port() -> None:
    with socket.create_server(("127.0.0.1", 0)) as listener, socket.create_server(("127.0.0.1", 0)) as other:
        port = listener.getsockname()[1]
        clients = [socket.create_connection(("127.0.0.1", port)) for _ in range(3)]
        elsewhere = socket.create_connection(("127.0.0.1", other.getsockname()[1]))
        accepted = [listener.accept()[0] for _ in clients]  # their remote port is the clients', not the listener's
        try:
            assert tcp_connections_to(port) == 3
            clients.pop().close()
            assert tcp_connections_to(port) == 2
        finally:
            for sock in [*clients, elsewhere, *accepted]:
                sock.close()


def test_a_record_without_sessions_open_has_no_memory_per_session() -> None:
    record = FleetRecord(4, server_pid=None, port=None)
    record.server_kib_idle, record.server_kib_open = 1000, 1400
    assert record.document()["server_kib_per_session"] is None
    record.opened = 2  # two of four opened: the growth is theirs
    document = record.document(mode="clients")
    assert document["server_kib_per_session"] == 200
    assert document["mode"] == "clients"
    assert document["steps_per_second"] is None  # never started


def test_a_record_counts_an_error_once_and_keeps_distinct_examples() -> None:
    record = FleetRecord(2)
    for _ in range(3):
        record.error(TimeoutError("no connection within 60 s"))
    record.error(ConnectionError("refused"))
    assert record.errors == 4
    assert record.error_examples == ["TimeoutError: no connection within 60 s", "ConnectionError: refused"]


def test_fleet_targets_have_distinct_keys_and_labels_and_the_reference_comes_first() -> None:
    targets = fleet_targets()
    assert len({target.key for target in targets}) == len(targets)
    assert len({target.label for target in targets}) == len(targets)
    assert targets[0].transport == "reference"


def _row(target: str, sessions: int, **figures: Any) -> dict[str, Any]:
    row = {"target": target, "label": target, "transport": "ws", "mode": "pool", "share": True, "env": "async",
           "sessions": sessions, "available": None, "error": None, "runs": [{}], "steps_per_second": None,
           "p99_ms": None, "errors": 0, "error_examples": [], "opened": sessions, "connections": 1, "open_s": 0.1,
           "server_kib_per_session": 5.0, "client_cpu_us_per_step": 10.0, "server_cpu_us_per_step": 10.0}  # fmt: skip
    row.update(figures)
    return row


def _goals(rows: list[dict[str, Any]], **extra: Any) -> dict[str, _fleet_report.Goal]:
    results = {"meta": {}, "fleet": {"rows": rows, "runs": 1, "seconds": 1, "big_seconds": 1}, **extra}
    return {goal.text: goal for goal in _fleet_report.goals(results)}


def test_goals_are_met_or_not_on_the_figures_of_the_run_and_not_measured_without_them() -> None:
    goals = _goals([
        _row("ws-pool-shared-async", 1024, steps_per_second=120_000),
        _row("reference-async", 1024, steps_per_second=30_000),
        _row("ws-pool-shared-plain", 1024, steps_per_second=20_000),
    ])  # fmt: skip
    by_start = {text.split(": ")[0]: goal for text, goal in goals.items()}
    assert by_start["EnvPool of 1,024 sessions, async echo, one server"].met is True
    assert by_start["EnvPool of 1,024 sessions, async echo"].met is False  # 4x, not 5x
    assert "**4.00x**" in by_start["EnvPool of 1,024 sessions, async echo"].measured
    assert by_start["Plain `def step` echo, EnvPool of 1,024"].met is False
    assert by_start["EnvPool of 1,024 sessions over inproc://"].met is None  # no such row in this run
    assert "not measured" in by_start["EnvPool of 1,024 sessions over inproc://"].measured


def test_a_goal_on_a_row_that_failed_or_cannot_run_yet_says_why() -> None:
    goals = _goals([
        _row("ws-clients-shared-async", 256, runs=[], error="client failed: boom"),
        _row("reference-async", 256, steps_per_second=10_000),
        _row("poll-clients-shared-async", 256, available="not available: http+poll has no shared link yet"),
        _row("poll-clients-own-async", 256, steps_per_second=12_000),
    ])  # fmt: skip
    clients = next(goal for text, goal in goals.items() if text.startswith("256 independent clients"))
    assert (clients.met, clients.measured) == (None, "failed: client failed: boom")
    poll = next(goal for text, goal in goals.items() if text.startswith("http+poll"))
    assert poll.met is True  # measured on a connection per session, and said so
    assert poll.measured.startswith("not available: http+poll has no shared link yet; with a connection per session")


def test_errors_at_4096_sessions_fail_the_goal_and_are_shown() -> None:
    goals = _goals([
        _row("ws-pool-shared-async", 4096, errors=0),
        _row("ws-clients-shared-async", 4096, errors=12, opened=4090, mode="clients"),
    ])  # fmt: skip
    goal = next(goal for text, goal in goals.items() if text.startswith("4,096 sessions"))
    assert goal.met is False
    assert "12 (independent clients, 4,090 of 4,096 opened)" in goal.measured


def test_one_session_is_judged_against_the_page_before_within_the_noise() -> None:
    before = {"commit": "abc", "date": "then", "medians": {"ws-asyncio": 10_000, "ref-async": 5_000}}
    echo = [{"key": "ws-asyncio", "median": 9_500}, {"key": "ref-async", "median": 5_000}]  # 1.90x vs 2.00x
    results = {"meta": {}, "echo": echo, "fleet": {"rows": [], "before": before}}
    goal = next(goal for goal in _fleet_report.goals(results) if goal.text.startswith("One session alone, async"))
    assert goal.met is True
    echo[0]["median"] = 8_000  # 1.60x: more than 10 % slower
    goal = next(goal for goal in _fleet_report.goals(results) if goal.text.startswith("One session alone, async"))
    assert goal.met is False


def test_the_floors_stand_beside_their_goals_marked_as_floors() -> None:
    floors = {"sessions": 1024, "threads": 50_000.4, "session_threads": 35_000, "loop": 700_000}
    lines = _fleet_report.goals_section({"meta": {}, "fleet": {"rows": [], "floors": floors}})
    affinity = next(line for line in lines if line.startswith("| ... the floor with thread affinity"))
    measured = "50,000 steps/s (bare threads), 35,000 steps/s (openenv's hand-over, `CallBatch`)"
    assert affinity.endswith(f"| {measured} | floor |")
    loop = next(line for line in lines if line.startswith("| ... the loop issue 21 names"))
    assert "| 700,000 steps/s (no session, no client) | floor |" in loop
    missing = _fleet_report.goals_section({"meta": {}, "fleet": {"rows": [], "floors": {"error": "boom"}}})
    assert any("| failed: boom | floor |" in line for line in missing)


def test_the_floors_measure_for_real_at_a_small_size() -> None:
    measured = {name: floor(4, 0.01) for name, floor in fleet_floor.FLOORS.items()}
    assert set(measured) == {"threads", "session_threads", "loop"}
    assert all(rate > 0 for rate in measured.values())


def test_the_fleet_section_shows_each_count_and_lists_what_cannot_run_yet() -> None:
    rows = [
        _row("reference-async", 64, steps_per_second=1_000, transport="reference", label="reference clients"),
        _row("ws-pool-shared-async", 64, steps_per_second=3_000, label="EnvPool over ws"),
        _row("poll-pool-shared-async", 64, available="not available: http+poll has no shared link yet",
             label="EnvPool over http+poll"),
    ]  # fmt: skip
    lines = _fleet_report.fleet_section({"fleet": {"rows": rows, "runs": 1, "seconds": 1, "big_seconds": 1}})
    assert "### 64 sessions" in lines
    assert "- EnvPool over http+poll: http+poll has no shared link yet" in lines
    assert next(line for line in lines if line.startswith("| EnvPool over ws |")).split(" | ")[2] == "**3.00x**"


def test_the_fleet_plot_draws_the_rows_measured(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    rows = [
        _row("reference-async", 64, steps_per_second=1_000, transport="reference"),
        _row("reference-async", 1024, steps_per_second=500, transport="reference"),
        _row("ws-pool-shared-async", 64, steps_per_second=3_000),
        _row("poll-pool-shared-async", 64, available="not available: http+poll has no shared link yet"),
    ]  # fmt: skip  (no plain echo row: its panel stays empty, without a legend)
    _fleet_plot.plot({"meta": {"quick": True}, "fleet": {"rows": rows}}, tmp_path / "img" / "fleet.png")
    assert (tmp_path / "img" / "fleet.png").read_bytes().startswith(b"\x89PNG")


@pytest.mark.anyio
@pytest.mark.parametrize("recv", [False, True], ids=["step", "send-recv"])
async def test_the_pool_modes_of_the_fleet_client_step(recv: bool) -> None:
    """Each pool mode steps a few in-process sessions without an error (its figures are not judged)."""
    from tests.benchmarks.fleet import FACTORIES
    from tests.benchmarks.fleet_client import run_pool

    record = FleetRecord(4)
    with anyio.fail_after(30):
        await run_pool(f"inproc://{FACTORIES['async']}", record, 0.0, {}, recv=recv)  # one round
    assert record.errors == 0, record.error_examples
    assert record.steps > 0


@pytest.mark.anyio
async def test_the_fleet_client_freezes_the_heap_before_the_timed_part_when_asked() -> None:
    """``--gc-freeze``: the objects alive once the pool has stepped move to the permanent generation."""
    from tests.benchmarks.fleet import FACTORIES
    from tests.benchmarks.fleet_client import run_pool

    gc.unfreeze()
    record = FleetRecord(4)
    try:
        with anyio.fail_after(30):
            await run_pool(f"inproc://{FACTORIES['async']}", record, 0.0, {}, recv=False, gc_freeze=True)
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()  # the suite's other tests run with the collector as usual
    assert record.errors == 0, record.error_examples
