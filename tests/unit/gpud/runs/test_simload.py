"""Runs as load on simulated GPUs (gpud.runs.placement.simload), with real processes."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator

import psutil
import pytest

from gpud.runs.placement.simload import SimulatedLoads

BUSY = "import time\nend = time.time() + 60\nwhile time.time() < end: pass\n"


@pytest.fixture
def rank() -> Iterator[subprocess.Popen[bytes]]:
    """A busy process with a rank's environment, a child of this one (its 'shim')."""
    env = {**os.environ, "LOCAL_RANK": "1", "CUDA_VISIBLE_DEVICES": "2,3"}
    proc = subprocess.Popen([sys.executable, "-c", BUSY], env=env)
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


def test_a_rank_found_for_the_first_time_already_shows_its_load(
    rank: subprocess.Popen[bytes],
) -> None:
    # It has used CPU since it started: that is its load, not the 0 of no baseline.
    process = psutil.Process(rank.pid)
    deadline = time.monotonic() + 10
    while process.cpu_times().user < 0.2:
        assert time.monotonic() < deadline, "the busy loop never ran"
        time.sleep(0.05)
    loads = SimulatedLoads(lambda: [os.getpid()], gpu_count=4)()
    age = time.time() - process.create_time()
    [load] = loads[3]  # entry LOCAL_RANK of its CUDA_VISIBLE_DEVICES
    assert load.pid == rank.pid
    # At least its 0.2 s of CPU over its age when the sample was taken (a loaded machine
    # gives a busy loop less than a core: the figure itself is the machine's to say).
    assert load.busy_pct >= 0.9 * 100 * 0.2 / age > 0, (load, age)
    assert load.used_memory_bytes > 0


def test_an_ended_rank_leaves_its_gpu(rank: subprocess.Popen[bytes]) -> None:
    sample = SimulatedLoads(lambda: [os.getpid()], gpu_count=4)
    assert [load.pid for load in sample()[3]] == [rank.pid]
    rank.kill()
    rank.wait()
    assert 3 not in sample()
