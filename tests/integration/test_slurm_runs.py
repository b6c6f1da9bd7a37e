"""`gpuctl launch --slurm` on a real local Slurm (issue 12): the CPU DDP example across two
slurmd nodes, in `gpuctl ps` with its step and loss; stop with a checkpoint and resume;
the time-limit signal, checkpoint and requeue; a requeue by an admin; a failing script's
cause and a known one's hint; a job that waits with Slurm's reason, one Slurm is still
configuring. No gpud daemon runs: state comes from Slurm and the run's files."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.daemons import RunningDaemon, complete, gpuctl
from tests.support.runs import CPU_DDP, FAST, force_stop, launch
from tests.support.slurm import LocalSlurm
from tests.support.slurm_runs import job_output, ps, run_dir, submit, wait_until, write_spec

pytestmark = pytest.mark.slow


def test_a_slurm_run_shows_in_ps_stops_with_a_checkpoint_and_resumes_from_it(
    cluster: LocalSlurm, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_id, job = submit(write_spec(tmp_path, "ddp-on-slurm", steps=100_000))
    row = wait_until(run_id, lambda r: r["state"] == "running" and (r["last_step"] or 0) >= 60)
    assert 0 < row["last_values"]["loss"] < 10 and row["attempt"] == 1
    assert row["nodes"][0]["name"] == f"slurm:{job}" and len(row["nodes"]) == 2
    text = gpuctl("ps")
    assert f"slurm:{job}+1" in text.stdout and "running" in text.stdout
    # The shim's spec holds the ranks' environment (secrets too): its owner's alone.
    specs = sorted(run_dir(tmp_path, run_id).glob("attempt-1/node-*/shim.json"))
    assert [f.stat().st_mode & 0o777 for f in specs] == [0o600, 0o600]
    stopped = gpuctl("stop", run_id)
    assert stopped.returncode == 0 and "stopped (gpuctl stop)" in stopped.stdout, stopped.stderr
    row = ps(run_id)
    assert row["state"] == "stopped"
    last = row["last_step"]
    checkpoints = sorted((run_dir(tmp_path, run_id) / "checkpoints").glob("step_*.pt"))
    assert checkpoints and checkpoints[-1].name == f"step_{last:08d}.pt"  # the stop's own
    # --from a relative path, as for a gpud run: made absolute where gpuctl runs.
    monkeypatch.chdir(checkpoints[-1].parent)
    resumed = gpuctl("resume", run_id, "--from", checkpoints[-1].name)
    assert resumed.returncode == 0 and "as attempt 2" in resumed.stdout, resumed.stderr
    wait_until(run_id, lambda r: r["attempt"] == 2 and (r["last_step"] or 0) > last + 20)
    log = gpuctl("logs", run_id).stdout
    assert f"resumed from {checkpoints[-1]} at step {last + 1}" in log
    forced = gpuctl("stop", run_id, "--force")
    assert forced.returncode == 0 and ps(run_id)["state"] == "stopped"


def test_the_time_limit_checkpoints_requeues_and_the_run_finishes_without_a_hole(
    cluster: LocalSlurm, tmp_path: Path
) -> None:
    # Longer than the first run can be: Slurm sends the signal 40 s before the 1-minute
    # limit, give or take its ~30 s timer, and kills the job at the limit at the latest.
    # A step takes at least 100 ms (the spec's --step-ms): 700 steps need 70 s at least.
    steps = 700
    spec = write_spec(tmp_path, "timed", steps=steps, time="1", signal_before_s=40, requeue=True)
    run_id, job = submit(spec)
    ends = run_dir(tmp_path, run_id) / "ends.jsonl"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not ends.exists():
        time.sleep(0.1)
    (end,) = [json.loads(line) for line in ends.read_text().splitlines()]
    assert (end["stopping"], end["requeued"]) == ("time_limit", True)
    # The batch shell writes its record, then requeues the job.
    row = wait_until(run_id, lambda r: r["attempt"] == 2, timeout=30)
    assert row["state"] in {"queued", "starting", "running"}, row
    # Slurm holds a requeued job for 2 minutes and would signal it again 20 s in: give the
    # second run time to finish, now.
    cluster.release_requeued(job, TimeLimit="10")
    row = wait_until(run_id, lambda r: r["state"] in {"succeeded", "failed"}, timeout=300)
    assert row["state"] == "succeeded" and row["last_step"] == steps - 1, (
        row["reason"],
        row["last_step"],
        job_output(tmp_path, run_id),
    )
    history = [json.loads(line) for line in (run_dir(tmp_path, run_id) / "metrics.jsonl")
               .read_text().splitlines()]  # fmt: skip
    assert {m["step"] for m in history} == set(range(steps)), "a hole in the metrics"
    assert {m["attempt"] for m in history} == {1, 2}
    assert "at step" in gpuctl("logs", run_id).stdout  # attempt 2 resumed
    # gpuctl metrics: the whole history, the resume point marked, as for a gpud run.
    metrics = gpuctl("--json", "metrics", run_id, "--name", "loss")
    assert metrics.returncode == 0, metrics.stderr
    reply = json.loads(metrics.stdout)
    assert [r["step"] for r in reply["rows"]] == list(range(steps))
    second = min(m["step"] for m in history if m["attempt"] == 2)
    assert reply["resumed_at"] == [second] and second > 0


def test_an_admins_requeue_is_the_next_attempt_and_it_resumes_from_the_newest_checkpoint(
    cluster: LocalSlurm, tmp_path: Path
) -> None:
    steps = 150
    run_id, job = submit(write_spec(tmp_path, "requeued", steps=steps, requeue=True))
    wait_until(run_id, lambda r: r["state"] == "running" and (r["last_step"] or 0) >= 60)
    # Slurm kills the job (the batch shell too: no end record) and queues it again.
    cluster.run("scontrol", "requeue", job)
    row = wait_until(run_id, lambda r: r["state"] == "queued")
    assert row["attempt"] == 2, row
    assert row["reason"] == f"Slurm job {job}: PENDING (BeginTime), requeued", row["reason"]
    status = gpuctl("status", run_id)
    assert f"{run_id} (requeued): queued, attempt 2" in status.stdout, status.stdout
    files = run_dir(tmp_path, run_id)
    assert not (files / "ends.jsonl").exists()
    newest = sorted((files / "checkpoints").glob("step_*.pt"))[-1]
    cluster.release_requeued(job)  # rather than after Slurm's 2-minute hold
    row = wait_until(run_id, lambda r: r["state"] in {"succeeded", "failed"}, timeout=300)
    assert (row["state"], row["attempt"], row["last_step"]) == ("succeeded", 2, steps - 1), row
    (end,) = [json.loads(line) for line in (files / "ends.jsonl").read_text().splitlines()]
    assert (end["restart"], end["code"]) == (1, 0)
    resumed_at = int(newest.stem.removeprefix("step_")) + 1
    assert f"resumed from {newest} at step {resumed_at}" in gpuctl("logs", run_id).stdout
    reply = json.loads(gpuctl("--json", "metrics", run_id, "--name", "loss").stdout)
    assert [r["step"] for r in reply["rows"]] == list(range(steps)), "a hole in the metrics"
    assert reply["resumed_at"] == [resumed_at]


def test_stop_cancels_a_job_slurm_is_still_configuring(cluster: LocalSlurm, tmp_path: Path) -> None:
    cluster.hold_in_prolog(True)  # slurmctld's prolog: the job stays CONFIGURING
    run_id, job = submit(write_spec(tmp_path, "configuring", steps=10))
    row = wait_until(run_id, lambda r: r["state"] == "starting")
    assert row["reason"] == f"Slurm job {job}: CONFIGURING", row["reason"]
    stopped = gpuctl("stop", run_id)
    assert stopped.returncode == 0, stopped.stderr
    assert stopped.stdout.strip().startswith(f"{run_id} stopped: cancelled (CANCELLED")
    cluster.hold_in_prolog(False)
    assert not list(run_dir(tmp_path, run_id).glob("attempt-*")), "a part started"
    # A Slurm run's id and name complete at the prompt, as a gpud run's do.
    offered = complete("gpuctl resume ")
    assert set(offered.stdout.splitlines()) == {f"plain,{run_id}", "plain,configuring"}


def test_a_failing_script_fails_with_its_cause(cluster: LocalSlurm, tmp_path: Path) -> None:
    script = tmp_path / "bad.py"
    script.write_text("raise ValueError('bad shard 17')\n")
    spec = tmp_path / "bad.yaml"
    spec.write_text(
        f"name: bad\nlauncher: torchrun\nnproc_per_node: 1\nworkdir: {tmp_path}\n"
        f"script: {script}\nslurm: {{nodes: 1}}\n"
    )
    run_id, _ = submit(spec)
    row = wait_until(run_id, lambda r: r["state"] in {"succeeded", "failed"})
    assert row["state"] == "failed"
    assert "ValueError: bad shard 17" in row["reason"], row["reason"]


def test_a_known_failure_under_slurm_has_its_hint(cluster: LocalSlurm, tmp_path: Path) -> None:
    """Issue 24 §2: the hint names the interpreter the Slurm job ran the script with."""
    script = tmp_path / "needs.py"
    script.write_text("import gpud_hint_no_such_module\n")
    spec = tmp_path / "needs.yaml"
    spec.write_text(
        f"name: needs\nlauncher: python\nworkdir: {tmp_path}\nscript: {script}\n"
        "slurm: {nodes: 1}\n"
    )
    run_id, _ = submit(spec)
    row = wait_until(run_id, lambda r: r["state"] in {"succeeded", "failed"})
    assert row["state"] == "failed", row
    assert row["cause"]["hint"].startswith(
        f"{sys.executable} has no module 'gpud_hint_no_such_module'"
    ), row["cause"]
    text = gpuctl("status", run_id).stdout
    assert f"  hint:    {row['cause']['hint']}" in text.splitlines(), text


def test_a_job_that_must_wait_is_queued_with_slurms_reason(
    cluster: LocalSlurm, tmp_path: Path
) -> None:
    hold = cluster.run("sbatch", "--parsable", "--nodes=2", "--gpus-per-node=4",
                       "--output=/dev/null", "--wrap=sleep 120").strip()  # fmt: skip
    run_id, _ = submit(write_spec(tmp_path, "waits", steps=10, gpus_per_node=1))
    # sbatch answers before slurmctld's scheduler has looked at the job: until its first
    # pass the job is PENDING with no reason, so wait for the reason, then check it is one
    # that says why it waits
    row = wait_until(run_id, lambda r: r["state"] == "queued" and "PENDING (" in r["reason"])
    assert "PENDING (Resources)" in row["reason"] or "PENDING (Priority)" in row["reason"]
    assert "queued" in gpuctl("ps", "--active").stdout
    # Stopped while it still waits: with the hold cancelled first, Slurm could start the
    # job and its 10 steps end before the stop (a CI-like run saw it succeed).
    stopped = gpuctl("stop", run_id)
    assert stopped.returncode == 0, stopped.stderr
    assert ps(run_id)["state"] == "stopped"
    cluster.run("scancel", hold)


def test_without_slurm_commands_launch_says_so_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no sbatch anywhere
    spec = write_spec(tmp_path, "nowhere", steps=10)
    done = subprocess.run(
        [sys.executable, "-m", "launch.gpuctl", "launch", str(spec)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 1
    assert done.stderr.strip() == (
        "gpuctl: error: sbatch is not installed here: run gpuctl on a Slurm login node"
    )


def test_a_gpud_launch_onto_a_slurm_compute_node_is_refused_unless_allowed(
    cluster: LocalSlurm, daemon: RunningDaemon
) -> None:
    refused = gpuctl("--node", daemon.address, "launch", str(CPU_DDP), "--set", FAST)
    assert refused.returncode == 2, refused.stdout
    (line,) = refused.stderr.strip().splitlines()
    assert "is a Slurm compute node (slurmd runs here)" in line
    assert "allow_outside_scheduler: true" in line
    allowed = launch(daemon, FAST, "allow_outside_scheduler=true")
    force_stop(daemon, allowed)
