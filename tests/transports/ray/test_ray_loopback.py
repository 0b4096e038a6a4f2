"""The tests marked ``ray`` (ray:// on a real local Ray), run in a loopback-only network namespace.

Ray's processes would otherwise talk over this machine's network address, and
tests keep to loopback: `tests.loopback` gives them a network whose only
interface is ``lo``. One pytest run there executes every test marked ``ray``
(the contract, pool, bench and tools suites over ray://, `tests.transports.ray.test_ray` and
its three-node cluster) on one shared local Ray; this test passes when it does.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys

import pytest

from tests import loopback
from tests.serving import ROOT

LIMIT = 1800  # seconds: the run takes a few minutes on a loaded machine; this bounds it
SHOWN = 12_000  # characters of the inner run's output shown when it fails


def test_the_ray_tests_pass_in_a_loopback_only_network() -> None:
    command = loopback.command(sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-ra", "tests")
    process = subprocess.Popen(
        command,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # so that a timeout stops the whole run, Ray's processes included
    )
    try:
        output, _ = process.communicate(timeout=LIMIT)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
        pytest.fail(f"the Ray tests did not finish within {LIMIT} s; their output ends:\n{output[-SHOWN:]}")
    if process.returncode == loopback.UNAVAILABLE:
        pytest.skip(f"the ray:// tests need a loopback-only network namespace: {output.strip()}")
    assert process.returncode == 0, f"the Ray tests failed in the loopback-only namespace:\n{output[-SHOWN:]}"
    passed = re.search(r"(\d+) passed", output)
    assert passed is not None, output[-SHOWN:]
    assert int(passed.group(1)) > 0
