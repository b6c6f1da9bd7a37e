"""`--cpu-report FILE`: the CPU each test cost, its processes' included (issue 31).

The suite is CPU-bound on two cores, so a test's wall time says little about what it costs
the tests beside it. Each test's reports carry the CPU seconds of its worker and of every
process the test started and reaped (a daemon reaps its shims, a shim its launcher,
torchrun its ranks: `RUSAGE_CHILDREN` counts them all once waited for); this writes them,
a test a line:

    {"test": "tests/faults/test_elastic.py::test_...", "wall": 48.1, "cpu": 61.3}

`python -m tests.support.cpu_report FILE` sums it by file and lists the costliest tests.
"""

from __future__ import annotations

import json
import os
import resource
import sys
from collections import Counter
from pathlib import Path

import pytest


def cpu_seconds() -> float:
    """This process's CPU seconds and those of the children it reaped (theirs included)."""
    me = resource.getrusage(resource.RUSAGE_SELF)
    them = resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + them.ru_utime + them.ru_stime


#: The user property a test report's CPU seconds go in (tests.support.plan.CpuMeter).
CPU_PROPERTY = "cpu_s"


def bare(nodeid: str) -> str:
    """The test's own id, without xdist's `@group` suffix."""
    at = nodeid.rfind("@")
    return nodeid[:at] if at > nodeid.rfind("]") else nodeid


def report_cpu(report: pytest.TestReport) -> float:
    """The CPU seconds `CpuMeter` put on a report (0 where it put none)."""
    return sum(v for k, v in report.user_properties if k == CPU_PROPERTY and isinstance(v, float))


class CpuReport:
    """Sums each test's phases as their reports reach this process (the controller, under
    xdist) and writes one line per test once its teardown is reported."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._wall: dict[str, float] = {}
        self._cpu: dict[str, float] = {}

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        test = bare(report.nodeid)
        self._wall[test] = self._wall.get(test, 0.0) + report.duration
        self._cpu[test] = self._cpu.get(test, 0.0) + report_cpu(report)
        if report.when != "teardown":
            return
        line = {
            "test": test,
            "wall": round(self._wall.pop(test), 2),
            "cpu": round(self._cpu.pop(test), 2),
        }
        with open(self.path, "a") as out:
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
