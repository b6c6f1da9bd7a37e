"""What the shim's output pump costs a run that prints a lot, side by side.

Since issue 26 §4 the launcher writes into a pipe that the shim copies to the attempt's log
(`gpud.runs.shim.OutputPump`), so that a full disk stops neither: before, the launcher
wrote straight to the log file. This prints the same output both ways and compares the
printer's wall time and the shim's CPU (the copy), for lines of a typical length and for
long ones:

- straight: the printer's stdout is the log file (what the shim did before);
- pumped: `gpud.runs.shim.run` as gpud starts it, the printer's stdout a pipe.

    .venv/bin/python bench/shim_output.py [--mb 200]

Figures are printed, never asserted.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from gpud.runs import shim

PRINTER = """
import sys
line = ("x" * (int(sys.argv[2]) - 1) + "\\n").encode()
out = sys.stdout.buffer
for _ in range(int(sys.argv[1]) // len(line)):
    out.write(line)
out.flush()
"""


def printer(total: int, width: int) -> list[str]:
    return [sys.executable, "-c", PRINTER, str(total), str(width)]


def straight(work: Path, total: int, width: int) -> float:
    started = time.perf_counter()
    with open(work / "straight.log", "ab") as out:
        subprocess.run(printer(total, width), stdout=out, check=True)
    return time.perf_counter() - started


def pumped(work: Path, total: int, width: int) -> tuple[float, float]:
    """The shim in a process of its own, as gpud starts it: its own CPU is the copy's."""
    attempt = work / f"attempt-{width}"
    argv = printer(total, width)
    spec = shim.write_spec(attempt, {}, argv, dict(os.environ), str(work), attempt / "out.log")
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    subprocess.run([sys.executable, "-S", shim.__file__, str(spec)], check=True)
    took = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    # The shim and, reaped by it, the printer: main() takes the printer's own CPU off.
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return took, cpu


def printer_cpu(work: Path, total: int, width: int) -> float:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    with open(work / "alone.log", "ab") as out:
        subprocess.run(printer(total, width), stdout=out, check=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=200, help="output per case, in MB")
    args = parser.parse_args()
    total = args.mb << 20
    print(f"{args.mb} MB of output per case; best of 3; on {os.cpu_count()} CPU(s)")
    print(f"{'line':>8}  {'straight':>10}  {'pumped':>10}  {'ratio':>6}  {'copy CPU':>9}")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for width in (100, 4096):
            plain = min(straight(work, total, width) for _ in range(3))
            runs = [pumped(work, total, width) for _ in range(3)]
            pump = min(took for took, _ in runs)
            alone = min(printer_cpu(work, total, width) for _ in range(3))
            copy = min(cpu for _, cpu in runs) - alone
            print(
                f"{width:>6} B  {plain:>9.2f}s  {pump:>9.2f}s  {pump / plain:>5.2f}×"
                f"  {copy:>8.2f}s  ({total / 1e6 / max(copy, 1e-9):,.0f} MB/s of copy)"
            )


if __name__ == "__main__":
    main()
