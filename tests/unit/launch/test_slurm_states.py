"""What Slurm says about a job, in gpud's words: squeue's and sacct's lines as Slurm 22.05
prints them, whether accounting is on, and how a run Slurm ended reads."""

from __future__ import annotations

from gpud.model.run import CauseKind, RunState
from launch.slurm_states import (
    JobRun,
    accounting_on,
    cancel_to_stop,
    overrides_end_record,
    parse_sacct,
    parse_squeue,
)


def test_squeue_gives_the_state_the_reason_and_slurms_restarts() -> None:
    run = parse_squeue("PENDING|BeginTime|1\n")
    assert run == JobRun("PENDING", "BeginTime", 1)
    assert run.run_state is RunState.QUEUED
    assert run.waiting("12") == "Slurm job 12: PENDING (BeginTime), requeued"
    assert parse_squeue("RUNNING|None|0\n") == JobRun("RUNNING", "", 0)
    assert parse_squeue("") is None


def test_sacct_lists_each_run_of_the_job_and_leaves_out_an_older_job_with_its_id() -> None:
    submitted_at = 1_800_000_000.0
    text = (
        "7|COMPLETED|0:0|1700000000\n"  # job 7 of before a reset: not ours
        "7|NODE_FAIL|0:0|1800000001\n"
        "7|CANCELLED by 0|0:15|1800000100\n"
        "8|COMPLETED|0:0|1800000002\n"
    )
    runs = parse_sacct(text, "7", submitted_at)
    assert [(r.state, r.restarts, r.exit_code) for r in runs] == [
        ("NODE_FAIL", 0, "0:0"),
        ("CANCELLED by 0", 1, "0:15"),
    ]


def test_accounting_is_on_only_with_a_storage_other_than_none() -> None:
    assert accounting_on("ClusterName = c\nAccountingStorageType   = accounting_storage/slurmdbd\n")
    assert not accounting_on("AccountingStorageType   = accounting_storage/none\n")
    assert not accounting_on("AccountingStorageType = (null)\n")
    assert not accounting_on("")


def test_a_run_slurm_ended_reads_in_slurms_words_with_a_cause_for_a_failure() -> None:
    state, reason, cause = JobRun("NODE_FAIL").ended("5", "sacct")
    assert (state, reason) == (RunState.FAILED, "a node of the job failed (NODE_FAIL); Slurm job 5")
    assert cause is not None and (cause.kind, cause.source) == (CauseKind.NETWORK, "sacct")
    state, reason, cause = JobRun("CANCELLED by 0").ended("5", "squeue")
    assert (state, reason, cause) == (
        RunState.STOPPED,
        "cancelled (CANCELLED by 0); Slurm job 5",
        None,
    )
    state, reason, cause = JobRun("FAILED", exit_code="3:0").ended("5", "sacct")
    assert (state, reason) == (RunState.FAILED, "exit code 3 (FAILED); Slurm job 5")


def test_slurms_word_beats_the_scripts_end_record_only_where_slurm_ended_the_run() -> None:
    assert overrides_end_record("NODE_FAIL", "")  # srun exits 0 on a node failure
    assert overrides_end_record("CANCELLED by 0", "")
    assert not overrides_end_record("TIMEOUT", "time_limit")  # the script was stopping it
    assert not overrides_end_record("COMPLETED", "")
    assert not overrides_end_record("FAILED", "")  # the script's exit code made it so


def test_stop_cancels_a_job_that_waits_or_is_configured() -> None:
    assert cancel_to_stop(RunState.QUEUED) and cancel_to_stop(RunState.STARTING)
    assert not cancel_to_stop(RunState.RUNNING)
