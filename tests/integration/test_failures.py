"""A failed run says why, restarts only when that helps, and a resume only ever loads a
checkpoint its own run wrote (issue 10). Real daemons, real torchrun and gloo ranks, real
unmodified scripts."""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Callable
from pathlib import Path

from gpud.model.run import CauseKind, RunState
from gpud.runs.process import procs
from tests.support.daemons import RunningDaemon, gpuctl
from tests.support.runs import (
    FAST,
    ROOT,
    assert_no_gap,
    force_stop,
    holder_spec,
    kill_rank,
    launch,
    nothing_left,
    status,
    steps_recorded,
    wait_for,
    wait_for_step,
)
from tests.support.waiting import until

EXAMPLES = ROOT / "config" / "examples"
RAISE = (
    "env.GPUD_TEST_RAISE_RANK=1",
    "env.GPUD_TEST_RAISE_AT_STEP=6",
    "env.GPUD_TEST_RAISE_MESSAGE='bad shard 17'",
)


def test_a_rank_that_raises_shows_its_exception_and_rank(daemon: RunningDaemon) -> None:
    args = ["--node", daemon.address, "launch", str(EXAMPLES / "cpu-ddp.yaml"), "--wait"]
    for s in (FAST, *RAISE):
        args += ["--set", s]
    result = gpuctl(*args, timeout=180)
    assert result.returncode == 1, result.stdout + result.stderr
    run_id = result.stdout.split()[1]
    line = "rank 1 on node node0: ValueError: bad shard 17 (user code, step 6 of attempt 1)"
    assert result.stdout.strip().splitlines()[-1] == f"{run_id} failed: {line}"
    text = gpuctl("--node", daemon.address, "status", run_id).stdout
    assert "state     failed for " in text and line in text
    assert "cause     user code [user], from the error file: ValueError: bad shard 17" in text
    assert "          | ValueError: bad shard 17" in text  # the log lines around it
    cause = json.loads(gpuctl("--node", daemon.address, "--json", "status", run_id).stdout)["run"][
        "cause"
    ]
    assert {k: cause[k] for k in ("kind", "summary", "rank", "node_rank", "step", "attempt")} == {
        "kind": "user",
        "summary": "ValueError: bad shard 17",
        "rank": 1,
        "node_rank": 0,
        "step": 6,
        "attempt": 1,
    }
    assert any("raise ValueError(self.raise_message)" in x for x in cause["lines"])
    nothing_left(run_id)


def test_a_user_error_is_not_restarted(daemon: RunningDaemon) -> None:
    run_id = launch(daemon, FAST, *RAISE, "restart.max_attempts=2", "restart.backoff_s=0.2")
    s = wait_for(daemon, run_id, {"failed", "succeeded"}, timeout=120)
    assert s.run.state is RunState.FAILED
    assert (s.run.reason or "").endswith("; not restarted: user is not in restart.on")
    assert (s.run.attempt, s.run.restarts) == (1, 0)
    nothing_left(run_id)


def test_the_same_error_at_the_same_step_stops_the_retries(daemon: RunningDaemon) -> None:
    run_id = launch(
        daemon,
        FAST,
        *RAISE,
        "checkpoint.every_steps=4",
        "restart.max_attempts=5",
        "restart.backoff_s=0.2",
        "restart.on=[user, signal]",
    )
    s = wait_for(daemon, run_id, {"failed", "succeeded"}, timeout=180)
    assert s.run.state is RunState.FAILED, s.run.reason
    # Attempt 2 resumed from step 4's checkpoint and failed at step 7 again: no third.
    assert (s.run.attempt, s.run.restarts) == (2, 1), s.run.reason
    assert (s.run.reason or "").endswith(
        "not restarted: the same error at the same step as attempt 1"
    )
    assert s.attempts[1].resume_from is not None
    nothing_left(run_id)


def test_an_error_that_moves_on_is_retried(daemon: RunningDaemon) -> None:
    """Only attempt 1 raises: the restart gets past it and the run succeeds."""
    run_id = launch(
        daemon,
        FAST,
        *RAISE,
        "env.GPUD_TEST_ONLY_ATTEMPTS='1'",
        "training.max_steps=30",
        "restart.max_attempts=1",
        "restart.backoff_s=0.2",
        "restart.on=[user]",
    )
    s = wait_for(daemon, run_id, {"failed", "succeeded"}, timeout=180)
    assert s.run.state is RunState.SUCCEEDED, s.run.reason
    assert s.run.restarts == 1 and s.run.cause is not None and s.run.cause.attempt == 1


def test_a_hang_is_stopped_and_restarted_from_the_checkpoint_with_no_metric_gap(
    daemon: RunningDaemon,
) -> None:
    total = 80
    run_id = launch(
        daemon,
        FAST,
        f"training.max_steps={total}",
        "checkpoint.every_steps=10",
        "env.GPUD_TEST_HANG_RANK=1",
        "env.GPUD_TEST_HANG_AT_STEP=34",
        "env.GPUD_TEST_ONLY_ATTEMPTS=1",
        "restart.max_attempts=1",
        "restart.backoff_s=0.5",
        # long enough that a paced step held up by a busy machine (a checkpoint's fsync
        # behind another test's pip install) is not taken for a hang
        "restart.hang_timeout_s=15",
    )
    s = wait_for(daemon, run_id, {"succeeded", "failed"}, timeout=240)
    assert s.run.state is RunState.SUCCEEDED, s.run.reason
    assert (s.run.attempt, s.run.restarts) == (2, 1)
    cause = s.run.cause
    assert cause is not None and (cause.kind, cause.rank, cause.attempt) == (CauseKind.HANG, 1, 1)
    assert (
        cause.summary.startswith("stalled for ") and "(restart.hang_timeout_s 15)" in cause.summary
    )
    assert any(e.kind == "hang" for e in s.events)
    assert s.attempts[1].resume_from is not None and s.attempts[1].resume_step == 29
    # Both ranks dumped their flight recorder before the gang was stopped, and torch's
    # analyzer (over gloo) found the collective rank 1 never entered.
    first = Path(s.attempts[0].attempt_dir)
    assert sorted(p.name for p in first.glob("nccl_trace_rank_*")) == [
        "nccl_trace_rank_0",
        "nccl_trace_rank_1",
    ]
    assert cause.flight_recorder, "no findings"
    for finding in cause.flight_recorder:  # one per gradient bucket rank 1 never reduced
        assert re.fullmatch(
            r"collective #\d+ \(all_reduce\) never entered by rank 1 at .*/ddp\.py:\d+",
            finding,
        ), cause.flight_recorder
    text = gpuctl("--node", daemon.address, "status", run_id).stdout
    assert f"flight    {cause.flight_recorder[0]}" in text
    assert_no_gap(steps_recorded(daemon, run_id), total)
    nothing_left(run_id)


# --------------------------------------------------------------------------- a lone process


def single(daemon: RunningDaemon, out: Path, *sets: str) -> str:
    return launch(
        daemon,
        f"args=['--max_iters=100000', '--out_dir={out}', '--n_embd=64', '--n_layer=2',"
        " '--eval_interval=1000']",
        f"checkpoint.dir={out}",
        *sets,
        config=EXAMPLES / "single-process.yaml",
    )


def process_env(run_id: str) -> dict[str, str]:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        for proc in procs.tagged(run_id):
            if "plain_train.py" in " ".join(proc.cmdline()):
                return proc.environ()
        time.sleep(0.2)
    raise AssertionError(f"the process of {run_id} never showed up")


def logs_once_they_show(daemon: RunningDaemon, run_id: str, needle: str) -> str:
    """The latest attempt's log, once `needle` is in it (a new attempt starts empty)."""
    deadline = time.monotonic() + 60
    text = ""
    while time.monotonic() < deadline:
        text = gpuctl("--node", daemon.address, "logs", run_id).stdout
        if needle in text:
            return text
        time.sleep(0.3)
    raise AssertionError(f"{needle!r} never showed in the log of {run_id}:\n{text}")


def test_a_single_python_process_is_not_told_it_is_one_rank_of_many(
    daemon: RunningDaemon, tmp_path: Path
) -> None:
    run_id = single(daemon, tmp_path / "out")
    env = process_env(run_id)
    assert not {"RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"} & set(env)
    wait_for_step(daemon, run_id, 20)  # it trains: it did not wait for peers
    # Its lines carry no rank prefix: they are all rank 0's.
    own = gpuctl("--node", daemon.address, "logs", run_id, "--rank", "0", "--tail", "2")
    assert own.stdout.count("iter ") == 2, own.stdout
    none = gpuctl("--node", daemon.address, "logs", run_id, "--rank", "1")
    assert none.stdout == "", none.stdout
    force_stop(daemon, run_id)
    asked = single(daemon, tmp_path / "out2", "distributed_env=true")
    env = process_env(asked)
    assert (env["RANK"], env["WORLD_SIZE"], env["LOCAL_RANK"]) == ("0", "1", "0")
    force_stop(daemon, asked)


def test_a_checkpoint_older_than_the_run_is_never_resumed_from(
    daemon: RunningDaemon, tmp_path: Path
) -> None:
    out = tmp_path / "shared-out"
    out.mkdir()
    older = out / "ckpt.pt"
    earlier = single(daemon, out)  # an earlier run leaves its ckpt.pt in the shared out_dir
    wait_for_step(daemon, earlier, 30)
    assert gpuctl("--node", daemon.address, "stop", earlier, timeout=60).returncode == 0
    assert older.exists()
    os.utime(older, (time.time() - 60, time.time() - 60))
    run_id = single(daemon, out)
    wait_for_step(daemon, run_id, 3)
    force_stop(daemon, run_id)  # SIGKILL: stopped before its first save
    result = gpuctl("--node", daemon.address, "resume", run_id)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == (
        f"resumed {run_id} as attempt 2 from scratch: no checkpoint of this run; passed over"
        f" 1 older match(es) of {out}/ckpt.pt written before the run was created"
    )
    assert status(daemon, run_id).attempts[-1].resume_from is None
    logs = logs_once_they_show(daemon, run_id, "iter 0:")  # it started over at iter 0
    assert "resuming from" not in logs  # no --init_from=resume
    force_stop(daemon, run_id)
    # --from names one explicitly, whoever wrote it.
    result = gpuctl("--node", daemon.address, "resume", run_id, "--from", str(older))
    assert result.returncode == 0, result.stderr
    assert (
        result.stdout.strip() == f"resumed {run_id} as attempt 3 from {older}; chosen with --from"
    )
    assert status(daemon, run_id).attempts[-1].resume_from == str(older)
    logs_once_they_show(daemon, run_id, f"resuming from {older} at iter")
    force_stop(daemon, run_id)


def test_require_checkpoint_refuses_a_resume_without_one(
    daemon: RunningDaemon, tmp_path: Path
) -> None:
    run_id = single(daemon, tmp_path / "out", "resume.require_checkpoint=true")
    wait_for_step(daemon, run_id, 3)
    force_stop(daemon, run_id)
    result = gpuctl("--node", daemon.address, "resume", run_id)
    assert result.returncode == 1, result.stdout
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "resume.require_checkpoint" in lines[0], result.stderr
    assert f"gpuctl resume {run_id} --from PATH" in lines[0]
    assert status(daemon, run_id).run.state is RunState.STOPPED  # nothing started
    bad = gpuctl("--node", daemon.address, "resume", run_id, "--from", str(tmp_path / "nope"))
    assert bad.returncode != 0 and "no such file" in bad.stderr, bad.stderr


def test_an_xid_on_the_runs_gpu_just_before_it_failed_makes_it_a_hardware_failure(
    daemons: Callable[..., RunningDaemon], tmp_path: Path
) -> None:
    xids = tmp_path / "xids"
    daemon = daemons(extra=("--simulate-xid-file", str(xids)))
    other = launch(daemon, "gpus=[0, 1]", config=holder_spec(tmp_path))  # no torch in it
    run_id = launch(daemon, FAST, "training.max_steps=100000", "gpus=[2, 3]")
    wait_for_step(daemon, run_id, 3)
    # XID 43 (the GPU stopped processing) does not quarantine (79 would: gpud.heal stops
    # the run itself then, tests/integration/test_quarantine.py); it is what the ranks'
    # failure a moment later is blamed on.
    xids.write_text("3:43\n")
    deadline = time.monotonic() + 10
    while xids.read_text() and time.monotonic() < deadline:
        time.sleep(0.1)
    with daemon.client() as client:  # the XID is in the node's snapshot
        until("XID 43 on GPU 3", lambda: [r for r in client.node_hw().gpus[3].xid.recent
                                          if r.code == 43])  # fmt: skip
    kill_rank(run_id, 1)  # what a rank on a lost GPU does: it dies
    s = wait_for(daemon, run_id, {"failed"}, timeout=60)
    cause = s.run.cause
    assert cause is not None and cause.kind is CauseKind.HARDWARE, cause
    assert cause.summary.startswith(
        "XID 43 on GPU 3 (GPU stopped processing (a context was reset)), "
    )
    assert cause.lines[0] == "the ranks saw: killed by SIGKILL"
    assert "(hardware, step " in (s.run.reason or "")
    # The run on GPUs 0-1 saw nothing of it and trains on.
    assert status(daemon, other).run.state is RunState.RUNNING
    force_stop(daemon, other)
    nothing_left(run_id)


def test_resume_args_without_a_checkpoint_dir_is_said_at_launch_and_on_resume(
    daemon: RunningDaemon, tmp_path: Path
) -> None:
    """Issue 24 §3: nanoGPT saves into its out_dir; without checkpoint.dir gpud looks in its
    own run dir, finds nothing, and each resume starts from scratch. Said in one line at
    launch (and --dry-run), and again by the resume."""
    out = tmp_path / "out"
    args = [
        "--node", daemon.address, "launch", str(EXAMPLES / "single-process.yaml"),
        "--set", f"args=['--max_iters=100000', '--out_dir={out}', '--n_embd=64', '--n_layer=2',"
        " '--eval_interval=1000']",
        "--set", "checkpoint.dir=null",
    ]  # fmt: skip
    runs = daemon.state_dir / "runs"
    said = (
        "gpuctl: warning: resume.args is set but checkpoint.dir is not: gpud will look in"
        f" {runs}/{{}}/checkpoints; set checkpoint.dir to where the script writes its checkpoints"
    )
    dry = gpuctl(*args, "--dry-run")
    assert dry.returncode == 0, dry.stderr
    planned = re.search(r"GPUD_CHECKPOINT_DIR=(\S+)/checkpoints", dry.stdout)
    assert planned is not None, dry.stdout
    assert dry.stderr.splitlines() == [said.format(Path(planned[1]).name)], dry.stderr
    result = gpuctl(*args)
    assert result.returncode == 0, result.stderr
    run_id = result.stdout.split()[1]
    assert result.stderr.splitlines() == [said.format(run_id)], result.stderr
    wait_for_step(daemon, run_id, 3)
    assert gpuctl("--node", daemon.address, "stop", run_id, timeout=60).returncode == 0
    assert (out / "ckpt.pt").exists()  # it saved, where gpud does not look
    resumed = gpuctl("--node", daemon.address, "resume", run_id)
    assert resumed.returncode == 0, resumed.stderr
    assert resumed.stdout.strip() == (
        f"resumed {run_id} as attempt 2 from scratch: no checkpoint of this run; resume.args is"
        f" set but checkpoint.dir is not: gpud looked in {runs}/{run_id}/checkpoints; set"
        " checkpoint.dir to where the script writes its checkpoints"
    )
    force_stop(daemon, run_id)
    # With checkpoint.dir set there is nothing to say.
    quiet = gpuctl(*args[:-2], "--set", f"checkpoint.dir={out}", "--dry-run")
    assert quiet.returncode == 0 and quiet.stderr == "", quiet.stderr
