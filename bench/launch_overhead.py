"""What launching through gpud costs: time to the first training step, side by side.

In one run, alternating so that machine noise hits both alike, it measures:

- `gpuctl launch` of a 2-process gloo run → the first optimizer step (on a warm daemon);
- a bare `torchrun --nproc-per-node=2` of the same script → its first step.

Both clocks start when the command is started and stop at the `FIRST_STEP` line the
script prints with its own timestamp. It prints the medians, their ratio, the median of
the paired differences (the time gpud adds), and where gpud's share goes: the gpuctl
process until node 0 has the request, the daemon until the shim runs, and the shim until
the launcher runs. Targets (issue 3): ratio at most 1.10, and under 300 ms added.

    .venv/bin/python bench/launch_overhead.py [--rounds 7]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.support.daemons import RunningDaemon, start_daemon  # noqa: E402
from tests.support.runs import status as runs_status  # noqa: E402

SCRIPT = ROOT / "bench" / "first_step.py"


def first_step_time(text: str) -> float | None:
    for line in text.splitlines():
        _, _, rest = line.rpartition("FIRST_STEP ")
        if rest and line.endswith(rest):
            try:
                return float(rest.split()[0])
            except ValueError:
                continue
    return None


def bare_torchrun() -> float:
    start = time.time()
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc-per-node=2",
            "--master-port=29400",
            str(SCRIPT),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    stamp = first_step_time(out.stdout)
    assert stamp is not None, out.stdout + out.stderr
    return stamp - start


def through_gpud(
    daemon: RunningDaemon, spec: Path, rounds_done: int
) -> tuple[float, dict[str, float]]:
    """Seconds to the first step, and the parts of gpud's share (seconds)."""
    start = time.time()
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "launch.gpuctl",
            "--node",
            daemon.address,
            "--json",
            "launch",
            str(spec),
            "--name",
            f"bench-{rounds_done}",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        cwd=ROOT,
    )
    run_id = json.loads(out.stdout)["run"]["id"]
    attempt = daemon.state_dir / "runs" / run_id / "attempt-1"
    log = attempt / "output.log"
    deadline = time.time() + 120
    while time.time() < deadline:
        if log.exists() and (stamp := first_step_time(log.read_text())) is not None:
            break
        time.sleep(0.01)
    else:
        raise AssertionError(f"no first step in {log}")
    status = runs_status(daemon, run_id)
    created = status.run.created_at
    spawned = status.attempts[0].started_at or created
    launcher = json.loads((attempt / "launcher.json").read_text())["started_at"]
    parts = {
        "gpuctl until node 0 has the request": created - start,
        "daemon until the shim runs": spawned - created,
        "shim until the launcher runs": launcher - spawned,
    }
    return stamp - start, parts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="gpud-bench-") as tmp:
        os.environ["GPUD_CONFIG_DIR"] = str(Path(tmp) / "config")
        spec = Path(tmp) / "first-step.yaml"
        spec.write_text(
            f"name: first-step\nlauncher: torchrun\nnproc_per_node: 2\nbackend: gloo\n"
            f"workdir: {ROOT}\nscript: {SCRIPT}\nnccl:\n  flight_recorder: false\n"
        )
        daemon = start_daemon(Path(tmp), node="bench", simulate_gpus=1, interval=1.0)
        try:
            bare_torchrun()  # warm caches (imports, page cache) for both
            through_gpud(daemon, spec, -1)
            bare, gpud, diffs = [], [], []
            parts: dict[str, list[float]] = {}
            for i in range(args.rounds):
                b = bare_torchrun()
                g, share = through_gpud(daemon, spec, i)
                bare.append(b)
                gpud.append(g)
                diffs.append(g - b)
                for name, seconds in share.items():
                    parts.setdefault(name, []).append(seconds)
        finally:
            daemon.stop()
    b, g = statistics.median(bare), statistics.median(gpud)
    q = statistics.quantiles(diffs, n=4)
    print(f"machine: {platform.node()}, {os.cpu_count()} cores, Python {platform.python_version()}")
    print(f"time to first training step, 2 processes on gloo, median of {args.rounds} pairs:")
    print(f"  bare torchrun      {b * 1000:7.0f} ms")
    print(f"  gpuctl launch      {g * 1000:7.0f} ms")
    print(f"  ratio              {g / b:7.2f}    (target <= 1.10)")
    print(
        f"  added by gpud      {statistics.median(diffs) * 1000:7.0f} ms  (median of paired "
        f"differences; quartiles {q[0] * 1000:.0f}..{q[2] * 1000:.0f} ms; target < 300 ms)"
    )
    print("  where gpud's share goes (medians):")
    for name, values in parts.items():
        print(f"    {name:<38} {statistics.median(values) * 1000:5.0f} ms")


if __name__ == "__main__":
    main()
