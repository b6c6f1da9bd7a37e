"""`--cpu-report FILE`: the CPU each test cost, its processes' included (issue 31).

The suite is CPU-bound on two cores, so a test's wall time says little about what it costs
the tests beside it. Each worker adds, per test, the CPU seconds of its own process and of
every process the test started and reaped (a daemon reaps its shims, a shim its launcher,
torchrun its ranks: `RUSAGE_CHILDREN` counts them all once waited for) as one JSON line:

    {"test": "tests/faults/test_elastic.py::test_...", "wall": 48.1, "cpu": 61.3}

`python -m tests.support.cpu_report FILE` sums it by file and lists the costliest tests.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest


def cpu_seconds() -> float:
    """This process's CPU seconds and those of the children it reaped (theirs included)."""
    me = resource.getrusage(resource.RUSAGE_SELF)
    them = resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + them.ru_utime + them.ru_stime


class CpuReport:
    def __init__(self, path: Path) -> None:
        self.path = path

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item) -> Iterator[None]:
        cpu, wall = cpu_seconds(), time.monotonic()
        yield
        line = {
            "test": item.nodeid.split("@")[0],
            "wall": round(time.monotonic() - wall, 2),
            "cpu": round(cpu_seconds() - cpu, 2),
        }
        with open(self.path, "a") as out:  # one short write per line: workers interleave whole
            out.write(json.dumps(line) + "\n")


def summary(path: Path, top: int = 40) -> str:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    by_file: Counter[str] = Counter()
    for row in rows:
        by_file[row["test"].split("::")[0]] += row["cpu"]
    total = sum(r["cpu"] for r in rows)
    out = [f"{len(rows)} tests, {total / 60:.1f} min of CPU", "", "by file:"]
    out += [f"{cpu:8.1f} s  {name}" for name, cpu in by_file.most_common(top)]
    out += ["", "by test:"]
    costly = sorted(rows, key=lambda r: -r["cpu"])[:top]
    out += [f"{r['cpu']:8.1f} s cpu {r['wall']:7.1f} s wall  {r['test']}" for r in costly]
    return "\n".join(out)


if __name__ == "__main__":
    if len(sys.argv) != 2 or not os.path.exists(sys.argv[1]):
        print("usage: python -m tests.support.cpu_report FILE", file=sys.stderr)
        sys.exit(2)
    print(summary(Path(sys.argv[1])))
