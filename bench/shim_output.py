"""What the shim's output pump costs a run that prints a lot, side by side.

Since issue 26 §4 the launcher writes into a pipe that the shim copies to the attempt's log
(`gpud.runs.process.shim.OutputPump`), so that a full disk stops neither: before, the launcher
wrote straight to the log file. This prints the same output both ways and compares the
printer's wall time and the shim's CPU (the copy), for lines of a typical length and for
long ones:

- straight: the printer's stdout is the log file (what the shim did before);
- pumped: `gpud.runs.process.shim.run` as gpud starts it, the printer's stdout a pipe, the log
  bounded at the default 100 MB.

Then the pump alone, in this process (its CPU is this process's: nothing else runs here),
as MB of output copied per CPU second: unbounded, and bounded (issue 22 §1: the default
100 MB, and 1 MB, which starts a new segment every 250 kB); with `--baseline FILE`, the
pump of another shim.py side by side (e.g. `git show REV:gpud/runs/process/shim.py > FILE`).

    .venv/bin/python bench/shim_output.py [--mb 200] [--baseline FILE]

Figures are printed, never asserted.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType
from typing import Any

from gpud.runs.process import shim

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
    log = attempt / "out.log"
    spec = shim.write_spec(attempt, {}, argv, dict(os.environ), str(work), log, 100_000_000)
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


def pump_alone(
    module: ModuleType, work: Path, total: int, width: int, max_bytes: int | None
) -> tuple[float, float]:
    """The pump of `module` in a thread here, a printer feeding its pipe: (wall, CPU)."""
    case = work / f"alone-{module.__name__}-{max_bytes}"
    case.mkdir()
    log_path = case / "output.log"
    read_end, write_end = os.pipe()
    printing = subprocess.Popen(printer(total, width), stdout=write_end)
    os.close(write_end)
    log = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    bound: dict[str, Any] = {"max_bytes": max_bytes} if max_bytes else {}
    cpu, started = time.process_time(), time.perf_counter()
    pump = module.OutputPump(read_end, log, str(log_path), None, **bound).start()
    printing.wait()
    pump.join(120)
    took, cpu = time.perf_counter() - started, time.process_time() - cpu
    os.close(read_end)
    os.close(log)
    for path in case.iterdir():
        path.unlink()
    case.rmdir()
    return took, cpu


def load(path: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location("shim_baseline", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=200, help="output per case, in MB")
    parser.add_argument("--baseline", help="another shim.py whose pump to measure too")
    parser.add_argument("--rounds", type=int, default=5, help="rounds of the pump alone")
    parser.add_argument("--pump-only", action="store_true", help="only the pump alone")
    args = parser.parse_args()
    total = args.mb << 20
    print(f"{args.mb} MB of output per case; on {os.cpu_count()} CPU(s)")
    if not args.pump_only:
        print("best of 3:")
        print(f"{'line':>8}  {'straight':>10}  {'pumped':>10}  {'ratio':>6}  {'copy CPU':>9}")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for width in () if args.pump_only else (100, 4096):
            plain = min(straight(work, total, width) for _ in range(3))
            runs = [pumped(work, total, width) for _ in range(3)]
            pump = min(took for took, _ in runs)
            alone = min(printer_cpu(work, total, width) for _ in range(3))
            copy = min(cpu for _, cpu in runs) - alone
            print(
                f"{width:>6} B  {plain:>9.2f}s  {pump:>9.2f}s  {pump / plain:>5.2f}×"
                f"  {copy:>8.2f}s  ({total / 1e6 / max(copy, 1e-9):,.0f} MB/s of copy)"
            )
        cases: list[tuple[str, ModuleType, int | None]] = []
        if args.baseline:
            cases.append(("baseline", load(args.baseline), None))
        cases += [("unbounded", shim, None), ("100 MB", shim, 100_000_000)]
        cases.append(("1 MB", shim, 1_000_000))
        rounds = args.rounds
        print(f"\nthe pump alone: MB of output per CPU second of the pump (best of {rounds},")
        print("the cases taking turns, so that the machine's noise hits each alike)")
        print(f"{'line':>8}  " + "  ".join(f"{name:>16}" for name, _, _ in cases))
        for width in (100, 4096):
            best = [float("inf")] * len(cases)
            for _ in range(rounds):
                for i, (_, module, bound) in enumerate(cases):
                    best[i] = min(best[i], pump_alone(module, work, total, width, bound)[1])
            cells = [f"{total / 1e6 / max(cpu, 1e-9):>11,.0f} MB/s" for cpu in best]
            print(f"{width:>6} B  " + "  ".join(f"{cell:>16}" for cell in cells))


if __name__ == "__main__":
    main()
