"""The batch script's signal handling, run for real by bash: gpuctl stop (USR2) and the time
limit (USR1) while the job starts, and while its step runs.

Slurm is the outer edge here: `scontrol`, `srun` and `scancel` are stand-ins on PATH that
log what they were asked (the real cluster's run of this script is
tests/integration/test_slurm_runs.py). The stand-in step traps SIGTERM and takes a
second to end, as the trainers do while they checkpoint.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from launch.slurm import render
from launch.spec import parse_spec

FAKES = {
    # `show hostnames` (slow when asked: the job is still starting); `requeue` is logged.
    "scontrol": """#!/bin/bash
echo "scontrol $*" >> "$FAKE_LOG"
if [ "$1 $2" = "show hostnames" ]; then sleep "${FAKE_START_S:-0}"; echo node1; fi
""",
    "srun": """#!/bin/bash
echo "srun" >> "$FAKE_LOG"
echo $$ > "$FAKE_DIR/step.pid"
trap 'echo "step got TERM" >> "$FAKE_LOG"; sleep 1; exit 143' TERM  # a checkpoint
while :; do sleep 0.1; done
""",
    "scancel": """#!/bin/bash
echo "scancel $*" >> "$FAKE_LOG"
kill -TERM "$(cat "$FAKE_DIR/step.pid")"
""",
}


def start(tmp_path: Path, requeue: bool = False, start_s: float = 0.0) -> subprocess.Popen[str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in FAKES.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    spec = parse_spec(
        {"name": "sig", "script": "train.py", "workdir": str(tmp_path),
         "slurm": {"nodes": 1, "requeue": requeue}}
    )  # fmt: skip
    script = tmp_path / "job.sh"
    script.write_text(render(spec, "sig-abc123", str(run_dir), "/usr/bin/python3"))
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "FAKE_LOG": str(tmp_path / "calls.log"),
        "FAKE_DIR": str(tmp_path),
        "FAKE_START_S": str(start_s),
        "SLURM_JOB_ID": "7",
        "SLURM_JOB_NODELIST": "node1",
    }
    return subprocess.Popen(["bash", str(script)], env=env, text=True)


def calls(tmp_path: Path) -> list[str]:
    log = tmp_path / "calls.log"
    return log.read_text().splitlines() if log.exists() else []


def until(ready: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def end_record(tmp_path: Path) -> dict[str, object]:
    (line,) = (tmp_path / "run" / "ends.jsonl").read_text().splitlines()
    record: dict[str, object] = json.loads(line)
    return record


def test_a_stop_while_the_job_starts_ends_it_stopped_with_no_step(tmp_path: Path) -> None:
    job = start(tmp_path, start_s=2.0)
    until(lambda: any(c.startswith("scontrol show hostnames") for c in calls(tmp_path)))
    job.send_signal(signal.SIGUSR2)  # gpuctl stop, before srun
    assert job.wait(timeout=10) == 0
    assert end_record(tmp_path) == {
        "job": "7", "restart": 0, "code": 0, "stopping": "stop", "requeued": False
    }  # fmt: skip
    assert "srun" not in calls(tmp_path)


@pytest.mark.parametrize("signals", [1, 3])
def test_a_stop_while_the_step_runs_terms_it_once(tmp_path: Path, signals: int) -> None:
    job = start(tmp_path)
    until((tmp_path / "step.pid").exists)
    for _ in range(signals):  # gpuctl stop, run again before the step has ended
        job.send_signal(signal.SIGUSR2)
        time.sleep(0.2)
    assert job.wait(timeout=15) == 143
    assert [c for c in calls(tmp_path) if c.startswith("scancel")] == ["scancel --signal=TERM 7"]
    assert "step got TERM" in calls(tmp_path)
    record = end_record(tmp_path)
    assert (record["code"], record["stopping"]) == (143, "stop")


def test_the_time_limit_while_the_job_starts_requeues_it(tmp_path: Path) -> None:
    job = start(tmp_path, requeue=True, start_s=2.0)
    until(lambda: any(c.startswith("scontrol show hostnames") for c in calls(tmp_path)))
    job.send_signal(signal.SIGUSR1)
    assert job.wait(timeout=10) == 0
    record = end_record(tmp_path)
    assert (record["stopping"], record["requeued"]) == ("time_limit", True)
    assert "scontrol requeue 7" in calls(tmp_path) and "srun" not in calls(tmp_path)
