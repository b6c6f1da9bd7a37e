"""A Slurm run whose job Slurm has forgotten (issue 12), on a real local Slurm that forgets
an ended job within seconds (MinJobAge=2): with accounting (a real slurmdbd on MariaDB),
gpuctl asks `sacct` how each run of the job ended; without it, `sacct` is never run and
the run's end records are all there is. Runs are killed by a real node failure
(`scontrol update State=DOWN`): srun exits 0 when Slurm kills its step so, and the batch
shell, killed with the job a moment later, may or may not live to record that 0; either
way the run failed. A batch shell killed outright (SIGKILL) leaves no end record."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from tests.support.daemons import gpuctl
from tests.support.slurm import LocalSlurm
from tests.support.slurm_runs import ps, run_dir, submit, wait_until, with_slurm, write_spec

pytestmark = pytest.mark.slow


def remembered(cluster: LocalSlurm, job: str) -> str:
    """The job's state as squeue knows it, ended ones included; "" once forgotten."""
    return cluster.run("squeue", "-h", "-t", "all", "-j", job, "-o", "%T", check=False).strip()


def wait_forgotten(cluster: LocalSlurm, job: str, timeout: float = 120) -> None:
    """Until squeue no longer knows the job (slurmctld purges on its own timer)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and remembered(cluster, job):
        time.sleep(1.0)
    assert not remembered(cluster, job), f"Slurm still remembers job {job}"


def fail_node(cluster: LocalSlurm, node: str) -> None:
    cluster.run("scontrol", "update", f"NodeName={node}", "State=DOWN", "Reason=gpud-test")


def status_json(run_id: str) -> dict[str, object]:
    done = gpuctl("--json", "status", run_id)
    assert done.returncode == 0, done.stderr
    run: dict[str, object] = json.loads(done.stdout)["run"]
    return run


@with_slurm(accounting=True, min_job_age_s=2)
def test_with_accounting_a_forgotten_jobs_node_failure_and_requeue_come_from_sacct(
    cluster: LocalSlurm, tmp_path: Path
) -> None:
    on_n1 = {"nodes": 1, "extra": ["--nodelist=n1"]}
    failed_id, failed_job = submit(write_spec(tmp_path, "node-lost", steps=100_000, **on_n1))
    requeued_id, requeued_job = submit(
        write_spec(tmp_path, "requeued", steps=100_000, requeue=True, **on_n1)
    )
    for run_id in (failed_id, requeued_id):
        wait_until(run_id, lambda r: r["state"] == "running" and (r["last_step"] or 0) > 0)
    fail_node(cluster, "n1")
    # Without requeue: NODE_FAIL, a failure with its cause (from squeue, or already from
    # sacct: slurmctld forgets within seconds here), even where the batch shell lived to
    # record srun's exit code 0.
    row = wait_until(failed_id, lambda r: r["state"] == "failed")
    node_failed = f"a node of the job failed (NODE_FAIL); Slurm job {failed_job}"
    assert row["reason"] == node_failed and row["cause"]["kind"] == "network", row
    # With requeue: Slurm queues it again on its own, as the run's next attempt (its
    # node is down, so it waits).
    row = wait_until(requeued_id, lambda r: r["state"] == "queued")
    assert row["attempt"] == 2 and row["reason"].endswith(", requeued"), row
    stopped = gpuctl("stop", requeued_id)  # queued: cancelled
    assert stopped.returncode == 0, stopped.stderr
    wait_forgotten(cluster, failed_job)
    wait_forgotten(cluster, requeued_job)
    # Slurm has forgotten both jobs: sacct knows how they ended and how often they ran.
    run = status_json(failed_id)
    assert (run["state"], run["reason"], run["attempt"]) == ("failed", node_failed, 1)
    assert run["cause"] == {
        **run["cause"],  # type: ignore[dict-item]
        "kind": "network",
        "summary": "a node of the job failed (NODE_FAIL)",
        "source": "sacct",
    }
    row = ps(requeued_id)
    assert (row["state"], row["attempt"]) == ("stopped", 2), row
    assert row["reason"] == f"cancelled (CANCELLED by 0); Slurm job {requeued_job}", row
    text = gpuctl("status", failed_id).stdout
    assert f"{failed_id} (node-lost): failed, attempt 1" in text, text


@with_slurm(min_job_age_s=2)
def test_without_accounting_sacct_is_never_run_and_the_end_records_are_the_truth(
    cluster: LocalSlurm, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Any sacct gpuctl ran would be this one: it leaves a mark and fails loudly.
    fake = tmp_path / "bin"
    fake.mkdir()
    mark = tmp_path / "sacct-was-run"
    (fake / "sacct").write_text(f"#!/bin/sh\ntouch {mark}\necho 'sacct: error: RUN' >&2\nexit 1\n")
    (fake / "sacct").chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}:{os.environ['PATH']}")
    on = {n: {"nodes": 1, "extra": [f"--nodelist={n}"]} for n in ("n1", "n2")}
    done_id, done_job = submit(write_spec(tmp_path, "done", steps=20, **on["n2"]))
    lost_id, lost_job = submit(write_spec(tmp_path, "lost", steps=100_000, **on["n1"]))
    killed_id, killed_job = submit(write_spec(tmp_path, "killed", steps=100_000, **on["n2"]))
    wait_until(done_id, lambda r: r["state"] == "succeeded")
    for run_id in (lost_id, killed_id):
        wait_until(run_id, lambda r: r["state"] == "running" and (r["last_step"] or 0) > 0)
    fail_node(cluster, "n1")
    cluster.run("scancel", "--batch", "--signal=KILL", killed_job)  # no end record
    for run_id in (lost_id, killed_id):
        wait_until(run_id, lambda r: r["state"] == "failed")
    for job in (done_job, lost_job, killed_job):
        wait_forgotten(cluster, job)
    assert not (run_dir(tmp_path, killed_id) / "ends.jsonl").exists()
    listed = gpuctl("--json", "ps")
    assert listed.returncode == 0 and listed.stderr == "", listed.stderr
    rows = {r["id"]: r for r in json.loads(listed.stdout)["runs"]}
    # The end record the script wrote tells how a run ended, Slurm or no Slurm.
    assert (rows[done_id]["state"], rows[done_id]["reason"]) == (
        "succeeded",
        f"Slurm job {done_job} completed",
    )
    # The node failure: srun's 0, if recorded, is no success (the part says otherwise).
    assert (rows[lost_id]["state"], rows[lost_id]["attempt"]) == ("failed", 1), rows[lost_id]
    # A run killed with its batch shell left no record, and nothing else remembers it.
    assert (rows[killed_id]["state"], rows[killed_id]["attempt"]) == ("failed", 1)
    assert rows[killed_id]["reason"] == (
        f"Slurm job {killed_job} is gone, left no end record, and accounting is off"
    )
    assert not mark.exists(), "gpuctl ran sacct on a cluster without accounting"
