"""What launching through gpud costs: time to the first training step, side by side.

In one run, alternating so that machine noise hits both alike, it measures:

- `gpuctl launch` of a 2-process gloo run → the first optimizer step (on a warm daemon);
- a bare `torchrun --nproc-per-node=2` of the same script → its first step.

Both clocks start when the command is started and stop at the `FIRST_STEP` line the
script prints with its own timestamp. It prints the medians, their ratio and the time
gpud adds. Targets (issue 3): ratio at most 1.10, and under 300 ms added.

    .venv/bin/python bench/launch_overhead.py [--rounds 7]
"""

from __future__ import annotations

import argparse
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


def through_gpud(daemon: RunningDaemon, spec: Path, rounds_done: int) -> float:
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
    import json

    run_id = json.loads(out.stdout)["run"]["id"]
    log = daemon.state_dir / "runs" / run_id / "attempt-1" / "output.log"
    deadline = time.time() + 120
    while time.time() < deadline:
        if log.exists() and (stamp := first_step_time(log.read_text())) is not None:
            return stamp - start
        time.sleep(0.01)
    raise AssertionError(f"no first step in {log}")


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
            bare, gpud = [], []
            for i in range(args.rounds):
                bare.append(bare_torchrun())
                gpud.append(through_gpud(daemon, spec, i))
        finally:
            daemon.stop()
    b, g = statistics.median(bare), statistics.median(gpud)
    print(f"machine: {platform.node()}, {os.cpu_count()} cores, Python {platform.python_version()}")
    print(f"time to first training step, 2 processes on gloo, median of {args.rounds}:")
    print(f"  bare torchrun      {b * 1000:7.0f} ms")
    print(f"  gpuctl launch      {g * 1000:7.0f} ms")
    print(f"  ratio              {g / b:7.2f}    (target <= 1.10)")
    print(f"  added by gpud      {(g - b) * 1000:7.0f} ms  (target < 300 ms)")


if __name__ == "__main__":
    main()
