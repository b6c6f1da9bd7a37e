"""The local Slurm the cluster tests stand on (issue 12): two slurmd nodes on loopback run
one task each of a two-node job, and a job that cannot start yet waits with Slurm's
reason."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from tests.support.daemons import gpuctl
from tests.support.slurm import LocalSlurm

pytestmark = pytest.mark.slow


def wait_gone(cluster: LocalSlurm, job: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and cluster.state_of(job)[0]:
        time.sleep(0.2)
    assert not cluster.state_of(job)[0], cluster.state_of(job)


def test_a_two_node_job_runs_one_task_per_node(slurm: LocalSlurm, tmp_path: Path) -> None:
    out = tmp_path / "job.out"
    script = tmp_path / "job.sh"
    script.write_text(
        "#!/bin/bash\n"
        "#SBATCH --nodes=2 --ntasks-per-node=1 --gpus-per-node=2\n"
        f"#SBATCH --output={out}\n"
        'echo "first $(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -1)"\n'
        "srun --ntasks-per-node=1 bash -c 'echo task $SLURM_PROCID on $SLURMD_NODENAME'\n"
    )
    job = slurm.run("sbatch", "--parsable", str(script)).strip()
    assert job.isdigit()
    wait_gone(slurm, job)
    lines = out.read_text().splitlines()
    assert lines[0] == "first n1"
    assert sorted(lines[1:]) == ["task 0 on n1", "task 1 on n2"]


def test_a_job_that_cannot_start_waits_with_slurms_reason(
    slurm: LocalSlurm, tmp_path: Path
) -> None:
    hold = slurm.run("sbatch", "--parsable", "--nodes=2", "--gpus-per-node=4",
                     "--output=/dev/null", "--wrap=sleep 60").strip()  # fmt: skip
    waiting = slurm.run("sbatch", "--parsable", "--nodes=1", "--gpus-per-node=1",
                        "--output=/dev/null", "--wrap=true").strip()  # fmt: skip
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and slurm.state_of(hold)[0] != "RUNNING":
        time.sleep(0.2)
    assert slurm.state_of(hold)[0] == "RUNNING"
    # Until the scheduler's first pass over it, a job pends with no reason ("None").
    state, reason = slurm.state_of(waiting)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and (state, reason) == ("PENDING", "None"):
        time.sleep(0.2)
        state, reason = slurm.state_of(waiting)
    assert state == "PENDING" and reason in {"Resources", "Priority"}, (state, reason)
    slurm.run("scancel", hold)
    wait_gone(slurm, waiting)


def test_sbatch_accepts_the_script_gpuctl_renders(slurm: LocalSlurm, tmp_path: Path) -> None:
    spec = tmp_path / "run.yaml"
    spec.write_text(
        "name: on-slurm\nscript: train.py\ngpus: 2\n"
        "slurm: {nodes: 2, time: '00:10:00', requeue: true, signal_before_s: 30}\n"
    )
    rendered = gpuctl("launch", str(spec), "--dry-run")  # a slurm: section means --slurm
    assert rendered.returncode == 0, rendered.stderr
    script = tmp_path / "job.sh"
    script.write_text(rendered.stdout)
    checked = subprocess.run(
        ["sbatch", "--test-only", str(script)], capture_output=True, text=True,
        env={**os.environ, **slurm.env}, timeout=30,
    )  # fmt: skip
    # sbatch --test-only validates every directive and says when the job would start.
    assert checked.returncode == 0, checked.stderr
    assert "to start at" in checked.stderr and "n[1-2]" in checked.stderr
