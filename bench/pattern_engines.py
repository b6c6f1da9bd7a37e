"""What a metric pattern costs per line on each engine gpud could have used, side by side.

Issue 24 §1 asked to choose between a linear-time engine and Python's `re` out of the
daemon's process with a time budget per line, measured. In one run:

- Python `re` in process (what gpud used): typical lines, and one catastrophic line
  (`^(?P<loss>(a+)+)$` on n `a`s and a `b`) at growing n — doubling with each `a`;
- RE2 through its `re`-compatible wrapper (`re2.compile(...).search`);
- RE2 through its own object on the line's bytes (`gpud.patterns`, what gpud uses);
- Python `re` in a worker process, lines sent in batches over a pipe and the findings sent
  back (the out-of-process design), and what a catastrophic line costs it: the budget,
  then a new worker (its start-up measured), for every such line;
- the worst pattern found for RE2 (`[ab]{1,1000}[ab]{1,1000}c`) on 16 kB (what a pattern
  sees of a line) — why gpud also times each pattern and matches beside its loop.

    .venv/bin/python bench/pattern_engines.py [--lines 20000]

Figures are printed, never asserted.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from collections.abc import Callable

import re2

from gpud.patterns.engine import compile_pattern

TYPICAL = r"iter (?P<step>\d+): loss (?P<loss>[\d.]+)"
CATASTROPHIC = r"^(?P<loss>(a+)+)$"
WORST_RE2 = r"(?P<tokens>[ab]{1,1000}[ab]{1,1000}c)"

WORKER = r"""
import json, re, sys
pattern = re.compile(sys.argv[1])
for batch in sys.stdin:
    out = []
    for line in json.loads(batch):
        m = pattern.search(line)
        out.append(m.groupdict() if m else None)
    sys.stdout.write(json.dumps(out) + "\n")
    sys.stdout.flush()
"""


def lines_of(count: int) -> list[str]:
    """Half metric lines (nanoGPT's), half other output."""
    return [
        f"iter {i}: loss {3.0 - i / count:.4f}, time 41.20ms, mfu 12.34%"
        if i % 2
        else f"step {i} | tokens/s 123456 | grad norm 1.234 | lr 3.0e-04 | data 0.2ms"
        for i in range(count)
    ]


def per_line_us(fn: Callable[[str], object], lines: list[str], rounds: int = 3) -> float:
    best = float("inf")
    for _ in range(rounds):
        began = time.perf_counter()
        for line in lines:
            fn(line)
        best = min(best, time.perf_counter() - began)
    return best / len(lines) * 1e6


def out_of_process_us(lines: list[str], batch: int = 1000) -> tuple[float, float]:
    """(µs per line through a worker, ms to start a worker)."""
    began = time.perf_counter()
    worker = subprocess.Popen(
        [sys.executable, "-c", WORKER, TYPICAL], stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert worker.stdin is not None and worker.stdout is not None
    worker.stdin.write(json.dumps(["warm"]) + "\n")
    worker.stdin.flush()
    worker.stdout.readline()
    start_ms = (time.perf_counter() - began) * 1000
    began = time.perf_counter()
    for i in range(0, len(lines), batch):
        worker.stdin.write(json.dumps(lines[i : i + batch]) + "\n")
        worker.stdin.flush()
        json.loads(worker.stdout.readline())
    took = time.perf_counter() - began
    worker.stdin.close()
    worker.wait()
    return took / len(lines) * 1e6, start_ms


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=20_000)
    args = parser.parse_args()
    lines = lines_of(args.lines)

    python_re = re.compile(TYPICAL)
    options = re2.Options()
    options.log_errors = False
    wrapped = re2.compile(TYPICAL, options)
    native = compile_pattern(TYPICAL)
    costs = {
        "Python re, in process (before)": per_line_us(python_re.search, lines),
        "RE2, its re-compatible wrapper": per_line_us(wrapped.search, lines),
        "RE2, its own object on bytes (gpud)": per_line_us(native.search, lines),
    }
    costs["Python re, worker process, batches of 1000"], start_ms = out_of_process_us(lines)
    base = costs["Python re, in process (before)"]
    print(f"per line, typical output ({args.lines} lines, half of them metric lines):")
    for name, us in costs.items():
        print(f"  {name:<44} {us:7.2f} µs   {us / base:5.1f}× Python re")

    print(f"\none catastrophic line, {CATASTROPHIC}:")
    catastrophic = re.compile(CATASTROPHIC)
    slow = compile_pattern(CATASTROPHIC)
    for n in (18, 20, 22, 24):
        line = "a" * n + "b"
        began = time.perf_counter()
        catastrophic.search(line)
        took_re = time.perf_counter() - began
        took_re2 = per_line_us(slow.search, [line] * 1000)
        print(f"  n={n}: Python re {took_re * 1000:9.1f} ms   RE2 {took_re2:5.2f} µs")
    print("  (Python re doubles with each 'a': n=35, the issue's line, is ~2^11 × n=24)")
    print(f"  out of process, each such line: the budget, then a new worker ({start_ms:.0f} ms)")

    worst = compile_pattern(WORST_RE2)
    line16 = ("ab" * 8192).encode()
    began = time.perf_counter()
    worst.search_bytes(line16)
    took_ms = (time.perf_counter() - began) * 1000
    print(f"\nworst RE2 pattern found, {WORST_RE2} on 16 kB: {took_ms:.0f} ms (then disabled)")


if __name__ == "__main__":
    main()
