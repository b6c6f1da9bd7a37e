"""What Slurm says about a job, in gpud's words (issue 12): squeue's and sacct's lines
parsed, whether accounting is on, and a Slurm job state as a run state with its reason.

Pure: `launch/gpuctl/slurm_jobs.py` runs the commands and hands their output here.

- `squeue -h -t all -j JOB -O State:|,Reason:|,RestartCnt:` while slurmctld remembers
  the job (MinJobAge after it ends): its state, why it waits, and how many times Slurm
  restarted it (requeues: ours at the time limit, an admin's `scontrol requeue`, a
  preemption with PreemptMode=REQUEUE, a node failure of a requeueable job).
- `sacct -X -D -P -n -j JOB -o JobIDRaw,State,ExitCode,Submit` (with `SLURM_TIME_FORMAT=%s`)
  once slurmctld has forgotten it, where accounting is on: one line per run of the job,
  oldest first, each requeued run ending `REQUEUED` (or `NODE_FAIL`, `PREEMPTED`, ...).
"""

from __future__ import annotations

from dataclasses import dataclass

from gpud.model.run import CauseKind, FailureCause, RunState

#: Slurm job states (squeue's %T, sacct's State) as gpud's run states.
STATES = {
    "PENDING": "queued",
    "REQUEUED": "queued",
    "REQUEUE_HOLD": "queued",
    "REQUEUE_FED": "queued",
    "RESIZING": "queued",
    "CONFIGURING": "starting",
    "RUNNING": "running",
    "COMPLETING": "stopping",
    "STOPPED": "stopping",
    "SIGNALING": "stopping",
    "STAGE_OUT": "stopping",
    "SUSPENDED": "stopping",
    "COMPLETED": "succeeded",
    "FAILED": "failed",
    "NODE_FAIL": "failed",
    "OUT_OF_MEMORY": "failed",
    "BOOT_FAIL": "failed",
    "DEADLINE": "failed",
    "TIMEOUT": "stopped",
    "PREEMPTED": "stopped",
    "CANCELLED": "stopped",
    "REVOKED": "stopped",
    "SPECIAL_EXIT": "failed",
}

#: How a run of a job that the scheduler ended (no end record from the batch script: it
#: was killed with the job) reads in gpuctl, and the cause for those that failed.
ENDED_BY_SLURM = {
    "NODE_FAIL": ("a node of the job failed", CauseKind.NETWORK),
    "OUT_OF_MEMORY": ("out of memory: Slurm killed the job at its memory limit", CauseKind.OOM),
    "BOOT_FAIL": ("Slurm could not boot or launch on its nodes", CauseKind.LAUNCH),
    "DEADLINE": ("it could not start before its deadline", CauseKind.LAUNCH),
    "TIMEOUT": ("killed at the time limit, before the script could stop it", None),
    "PREEMPTED": ("preempted", None),
    "CANCELLED": ("cancelled", None),
    "REVOKED": ("revoked (it ran on another cluster of the federation)", None),
}

#: squeue's and sacct's arguments after the job id, and sacct's environment.
SQUEUE_FORMAT = ("-O", "State:|,Reason:|,RestartCnt:")
SACCT_FIELDS = ("-o", "JobIDRaw,State,ExitCode,Submit")
SACCT_ENV = {"SLURM_TIME_FORMAT": "%s"}  # Submit in epoch seconds, whatever the locale
#: sacct -D also lists older jobs that had the same id (ids are reused after a reset):
#: runs submitted this long before gpuctl's own submission are not ours.
SUBMIT_SLACK_S = 300.0


def state_word(slurm_state: str) -> str:
    """`CANCELLED` for `CANCELLED by 0`, and so on."""
    return slurm_state.split(maxsplit=1)[0] if slurm_state else ""


def run_state(slurm_state: str) -> RunState:
    """gpud's state for a Slurm job state; `CANCELLED by 0` and the like included."""
    return RunState(STATES.get(state_word(slurm_state), "failed"))


@dataclass(frozen=True)
class JobRun:
    """One run of a Slurm job: the latest from squeue, each of them from sacct."""

    state: str  # Slurm's own words: `PENDING`, `CANCELLED by 0`
    reason: str = ""  # why it waits (`Resources`, `BeginTime`); "" for none
    restarts: int = 0  # runs of the job before this one
    exit_code: str = ""  # sacct's `code:signal`

    @property
    def run_state(self) -> RunState:
        return run_state(self.state)

    def waiting(self, job: str) -> str:
        """`Slurm job 12: PENDING (BeginTime), requeued` for a job that has not ended."""
        why = f"Slurm job {job}: {self.state}"
        if self.reason:
            why += f" ({self.reason})"
        return why + (", requeued" if self.restarts else "")

    def ended(self, job: str, source: str) -> tuple[RunState, str, FailureCause | None]:
        """How a run that Slurm ended (the batch script left no end record) reads: the
        state, the reason, and for a failure its cause, read from `source` (squeue or
        sacct)."""
        word = state_word(self.state)
        what, kind = ENDED_BY_SLURM.get(word, ("", None))
        state = self.run_state
        if word == "COMPLETED":
            return state, f"Slurm job {job} completed", None
        if not what:
            code = self.exit_code.partition(":")[0]
            what = f"exit code {code}" if code not in ("", "0") else "it ended"
            kind = CauseKind.UNKNOWN
        reason = f"{what} ({self.state}); Slurm job {job}"
        if state is not RunState.FAILED:
            return state, reason, None
        cause = FailureCause(kind=kind or CauseKind.UNKNOWN, summary=f"{what} ({word})",
                             source=source)  # fmt: skip
        return state, reason, cause


def parse_squeue(text: str) -> JobRun | None:
    """squeue's line for one job (SQUEUE_FORMAT), or None when it printed none."""
    for line in text.splitlines():
        fields = [f.strip() for f in line.split("|")]
        if len(fields) >= 3 and fields[0]:
            reason = "" if fields[1] in ("", "None") else fields[1]
            return JobRun(fields[0], reason, int(fields[2]) if fields[2].isdigit() else 0)
    return None


def parse_sacct(text: str, job: str, submitted_at: float) -> list[JobRun]:
    """sacct -D's runs of `job` (SACCT_FIELDS, `-P -n`), oldest first, numbered as Slurm
    counts restarts; lines of another job with the same id (older) are left out."""
    runs: list[JobRun] = []
    for line in text.splitlines():
        fields = line.split("|")
        if len(fields) < 4 or fields[0].strip() != job:
            continue
        try:
            submitted = float(fields[3])
        except ValueError:
            submitted = submitted_at  # `Unknown`: not old
        if submitted < submitted_at - SUBMIT_SLACK_S:
            continue
        runs.append(JobRun(fields[1].strip(), restarts=len(runs), exit_code=fields[2].strip()))
    return runs


def accounting_on(config: str) -> bool:
    """Whether `scontrol show config` says jobs are accounted: AccountingStorageType is
    set and not accounting_storage/none."""
    for line in config.splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "AccountingStorageType":
            return value.strip() not in ("", "(null)", "accounting_storage/none")
    return False


def overrides_end_record(slurm_state: str, stopping: str) -> bool:
    """Whether Slurm's word on how a run of the job ended beats the script's end record:
    so where the scheduler ended it (ENDED_BY_SLURM: a node failure, a preemption, ...)
    and the script was not stopping it itself (gpuctl stop, the time limit). The record
    sees only srun's exit code, and srun exits 0 when Slurm kills its step for a node
    failure; the batch shell may live long enough to write that down."""
    return not stopping and state_word(slurm_state) in ENDED_BY_SLURM


def cancel_to_stop(state: RunState) -> bool:
    """Whether `gpuctl stop` cancels the job rather than ask its batch shell for a
    checkpoint: so while it waits (nothing to checkpoint) and while Slurm configures it
    (its nodes boot, a prolog runs: the batch shell that would take the signal may not
    exist yet, and nothing has trained)."""
    return state in (RunState.QUEUED, RunState.STARTING)
