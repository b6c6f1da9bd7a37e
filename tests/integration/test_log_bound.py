"""Bounded run logs (issue 22 §1): a run that prints far past `logs.max_bytes` keeps its
head and its tail on disk, under the bound; `gpuctl logs` shows both with one mark that
says how many lines were dropped; `gpuctl logs -f` follows across the rotations; the
failure's cause still comes from the last traceback; late printed metrics still count.
A real daemon, real shims, a real script."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.daemons import RunningDaemon, gpuctl
from tests.support.runs import launch, script_spec, status, steps_recorded, wait_for

pytestmark = pytest.mark.slow

#: 62-byte numbered lines: once the test says so (a file), slowly for 2 s (a follower
#: keeps up), then 1.9 MB at once.
PRINTER = """
import os, sys, time
out = sys.stdout
n = 0
def burst(count):
    global n
    for _ in range(count):
        out.write(f"line {n:07d} {'x' * 48}\\n")
        n += 1
    out.flush()
print("first line of the run", flush=True)
deadline = time.monotonic() + 30
while sys.argv[3] and not os.path.exists(sys.argv[3]) and time.monotonic() < deadline:
    time.sleep(0.02)
for i in range(40):
    burst(300)
    print(f"step {i} loss {1.0 / (i + 1):.4f}", flush=True)
    time.sleep(0.05)
burst(int(sys.argv[1]))
print("step 999 loss 0.0001", flush=True)
if sys.argv[2] == "raise":
    raise ValueError("late failure after 2.6 MB")
"""
PATTERN = r"step (?P<step>\d+) loss (?P<loss>[\d.]+)"
MARK = re.compile(
    r"^\[gpud\] ---- ([\d,]+) line\(s\) \(([\d.]+ [kM]B)\) dropped here, printed between"
    r" \d\d:\d\d:\d\d and \d\d:\d\d:\d\d \(logs.max_bytes 200 kB\) ----$"
)


def spec(tmp_path: Path, name: str, burst: int, end: str, bound: str | None, go: str = "") -> Path:
    path = script_spec(tmp_path, PRINTER, name=name, args=(str(burst), end, go))
    text = path.read_text() + f"metrics:\n  - pattern: '{PATTERN}'\n"
    if bound is not None:
        text += f"logs:\n  max_bytes: {bound}\n"
    path.write_text(text)
    return path


def log_files(attempt_dir: str) -> dict[str, int]:
    return {p.name: p.stat().st_size for p in Path(attempt_dir).glob("output.log*")}


def printed(burst: int) -> list[str]:
    """Every line PRINTER prints on stdout, in order."""
    lines, n = ["first line of the run"], 0
    for i in range(40):
        lines += [f"line {k:07d} {'x' * 48}" for k in range(n, n + 300)]
        lines.append(f"step {i} loss {1.0 / (i + 1):.4f}")
        n += 300
    lines += [f"line {k:07d} {'x' * 48}" for k in range(n, n + burst)]
    return [*lines, "step 999 loss 0.0001"]


def is_mark(line: str) -> bool:
    return line.startswith("[gpud] ---- ")


def test_a_run_printing_far_past_its_bound_keeps_head_mark_and_tail(
    daemons: Callable[..., RunningDaemon], tmp_path: Path
) -> None:
    daemon = daemons(extra=("--logs-max-bytes", "100kB"))
    go = tmp_path / "go"
    bounded = launch(daemon, config=spec(tmp_path, "loud", 30_000, "raise", "200kB", str(go)))
    # No logs.max_bytes in the spec: the daemon's --logs-max-bytes holds.
    by_default = launch(daemon, config=spec(tmp_path, "quiet", 10_000, "exit", None))
    wait_for(daemon, bounded, {"running", "failed"}, timeout=30)
    follower = subprocess.Popen(
        [sys.executable, "-m", "launch.gpuctl", "--node", daemon.address, "logs", "-f", bounded],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert follower.stdout is not None
    first = follower.stdout.readline()  # the follower reads; now the run prints on
    go.touch()
    ended = wait_for(daemon, bounded, {"failed", "succeeded"}, timeout=60)
    followed, errors = follower.communicate(timeout=30)
    followed = first + followed
    assert follower.returncode == 0, errors

    # On disk: the head, three segments of the tail and the index, under the bound.
    attempt_dir = ended.attempts[-1].attempt_dir
    files = log_files(attempt_dir)
    index = json.loads(Path(attempt_dir, "output.log.index").read_text())
    assert index["max_bytes"] == 200_000
    assert sum(size for name, size in files.items() if name != "output.log.index") <= 200_000
    assert len(files) == 5, files

    # gpuctl logs: the head, one mark with the dropped count, the tail to the traceback.
    shown = gpuctl("--node", daemon.address, "logs", bounded).stdout.splitlines()
    everything = printed(30_000)
    (mark,) = [i for i, line in enumerate(shown) if is_mark(line)]
    found = MARK.match(shown[mark])
    assert found, shown[mark]
    assert shown[:mark] == everything[:mark]  # the head, from the first line on
    traceback = shown.index("Traceback (most recent call last):")
    tail = shown[mark + 1 : traceback]
    assert tail == everything[-len(tail) :]  # the tail, to the last line printed
    dropped = len(everything) - len(tail) - mark
    assert found.group(1) == f"{dropped:,}" and dropped > 30_000
    assert shown[-1] == "ValueError: late failure after 2.6 MB"

    # The cause is the last traceback's, read from the tail.
    assert ended.run.cause is not None
    assert ended.run.cause.summary == "ValueError: late failure after 2.6 MB"
    reason = gpuctl("--node", daemon.address, "status", bounded).stdout
    assert "ValueError: late failure after 2.6 MB" in reason

    # -f followed from the head into the tail, across rotations, in order, to the end.
    lines = followed.splitlines()
    kept = lines[: lines.index("Traceback (most recent call last):")]
    assert any(map(is_mark, kept)) and kept[-1] == everything[-1]
    place = {line: i for i, line in enumerate(everything)}
    where = [place[line] for line in kept if not is_mark(line)]
    assert where == sorted(set(where))  # in order, none twice
    # ...and it read lines of segments that were rotated out before the run ended.
    assert len(set(kept) - set(shown)) > 1000
    assert lines[-1] == "ValueError: late failure after 2.6 MB"

    # Metrics printed before the drop and after it were extracted.
    steps = steps_recorded(daemon, bounded)
    assert steps[0] == 0 and steps[-1] == 999

    # The run without logs.max_bytes got the daemon's bound.
    quiet = wait_for(daemon, by_default, {"failed", "succeeded"}, timeout=60)
    assert quiet.run.state.value == "succeeded"
    files = log_files(quiet.attempts[-1].attempt_dir)
    assert sum(size for name, size in files.items() if name != "output.log.index") <= 100_000
    assert status(daemon, by_default).run.state.value == "succeeded"
