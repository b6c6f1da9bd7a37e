"""A whole `gpuctl ps` against a daemon with a long history, before and after (issue 22 §4:
"the time of `gpuctl ps` with 10,000 runs in history ... under 200 ms").

Writes `--history` finished runs through the store (bench/retention_gc.py's `fill`),
starts a real `gpud serve` on them, and times whole `gpuctl --node ADDR ps` processes
(Python's start-up and imports included, as a user waits for them), alternating this
tree's gpuctl with gpuctl of `--before` (a git revision, exported to a temporary dir), so
machine noise hits both alike. Prints the medians of `--rounds` each, their ratio, an
interpreter that imports nothing (the floor), the rows `ps` printed, and this tree's
slowest imports (`python -X importtime`, medians over the rounds).

    .venv/bin/python bench/gpuctl_startup.py [--history 10000] [--rounds 10] [--before main]
        [--state DIR]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from collections import defaultdict
from io import BytesIO
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.retention_gc import fill  # noqa: E402
from tests.support.daemons import start_daemon  # noqa: E402

#: Seconds a daemon is left after start-up before `ps` is timed (its first measure of the
#: state dir walks every run dir).
SETTLE_S = 5.0


def export(revision: str, into: Path) -> Path:
    """The packages gpuctl imports, as they were at `revision`."""
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", revision, "gpud", "launch"],
        capture_output=True,
        check=True,
    ).stdout
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    return into


class Took(NamedTuple):
    wall_s: float
    cpu_s: float  # user + system: what a busy machine's other work does not inflate much
    stdout: str
    stderr: str


def whole(cwd: Path, *args: str) -> Took:
    """One Python process run from `cwd` (whose gpud and launch it imports), timed."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, *args],
        check=False,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
    )
    took = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    assert done.returncode == 0, done.stderr
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    return Took(took, cpu, done.stdout, done.stderr)


def imports(stderr: str) -> dict[str, tuple[int, int, int]]:
    """`-X importtime`'s lines: module → (self µs, cumulative µs, depth)."""
    found = {}
    for line in stderr.splitlines():
        if not line.startswith("import time:") or "imported package" in line:
            continue
        own, cumulative, name = line.removeprefix("import time:").split("|")
        depth = (len(name) - len(name.lstrip())) // 2
        found[name.strip()] = (int(own), int(cumulative), depth)
    return found


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--history", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--before", default="main", help="a git revision to compare with")
    parser.add_argument("--state", type=Path, help="a state dir to reuse (made if missing)")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="gpud-bench-gpuctl-"))
    # A reused state dir authorized the client key of the config dir beside it.
    os.environ["GPUD_CONFIG_DIR"] = str((args.state.parent if args.state else tmp) / "config")
    # Bytecode is cached (in a dir of its own), as an installed gpuctl's is: with
    # PYTHONDONTWRITEBYTECODE (set on some machines) every module is compiled every time.
    os.environ["PYTHONPYCACHEPREFIX"] = str(tmp / "pycache")
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    state = args.state or tmp / "state"
    if not (state / "gpud.db").exists():
        started = time.perf_counter()
        fill(state, args.history, 20)
        print(f"wrote {args.history} finished runs in {time.perf_counter() - started:.1f}s")
    before = export(args.before, tmp / "before")
    daemon = start_daemon(tmp, state_dir=state, simulate_gpus=2, interval=1.0,
                          extra=("--retention-max-runs", "0", "--retention-interval-minutes",
                                 "0"))  # fmt: skip
    try:
        time.sleep(SETTLE_S)
        ps = ("-m", "launch.gpuctl", "--node", daemon.address, "ps")
        for cwd in (before, ROOT):
            whole(cwd, *ps)  # writes the bytecode cache
        times: dict[str, list[Took]] = {"before": [], "after": [], "floor": []}
        breakdown: dict[str, list[tuple[int, int, int]]] = defaultdict(list)
        for _ in range(args.rounds):
            times["before"].append(whole(before, *ps))
            times["after"].append(whole(ROOT, *ps))
            times["floor"].append(whole(ROOT, "-c", "pass"))
            traced = whole(ROOT, "-X", "importtime", *ps)
            for name, row in imports(traced.stderr).items():
                breakdown[name].append(row)
    finally:
        daemon.stop()
    wall = {k: statistics.median(t.wall_s for t in v) * 1000 for k, v in times.items()}
    cpu = {k: statistics.median(t.cpu_s for t in v) * 1000 for k, v in times.items()}
    print(
        f"{args.history} runs in history, medians of {args.rounds} whole `gpuctl ps`"
        f" processes (alternated), wall | CPU (user+sys):\n"
        f"  before ({args.before}) {wall['before']:5.0f} ms | {cpu['before']:4.0f} ms\n"
        f"  after             {wall['after']:5.0f} ms | {cpu['after']:4.0f} ms\n"
        f"  ratio after/before {wall['after'] / wall['before']:5.2f}    |"
        f" {cpu['after'] / cpu['before']:4.2f}\n"
        f"  `python -c pass`  {wall['floor']:5.0f} ms | {cpu['floor']:4.0f} ms"
    )
    rows = {k: len(v[-1].stdout.splitlines()) - 1 for k, v in times.items() if k != "floor"}
    print(f"rows printed: before {rows['before']}, after {rows['after']}")
    cumulative = {
        name: (statistics.median(r[1] for r in rs) / 1000, rs[0][2])
        for name, rs in breakdown.items()
    }
    own = {name: statistics.median(r[0] for r in rs) / 1000 for name, rs in breakdown.items()}
    print(f"imports, after: {sum(own.values()):.1f} ms in all (medians); the costliest:")
    top = sorted(cumulative.items(), key=lambda item: -item[1][0])[:25]
    for name, (ms, depth) in top:
        print(f"  {ms:6.1f} ms cumulative {own[name]:5.1f} ms own  {'  ' * depth}{name}")


if __name__ == "__main__":
    main()
