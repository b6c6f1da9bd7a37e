"""gpuctl's side of runs under Slurm: submit, find, describe, stop (issue 12).

A Slurm run lives in its run dir on shared storage (`<workdir>/gpud-runs/<run-id>`):
`slurm.json` (what the part runner needs), `job.sh` (the batch script), `jobs.jsonl` (each
job submitted for it), `ends.jsonl` (how each run of a job ended, written by the script),
`metrics.jsonl` (rank 0's metrics, from the trainers library) and the attempts' logs.
gpuctl remembers the run dirs it submitted in `$GPUD_CONFIG_DIR/slurm-runs.json`.

State comes from `squeue` while Slurm remembers the job (`-t all`: MinJobAge after it
ends); once it has forgotten, from `sacct` where accounting is on (`scontrol show config`,
asked once per gpuctl call); and from `ends.jsonl` for how a run ended, when the script
lived to write it (a node failure, an OOM kill of the batch step, a hard kill at the time
limit or a preemption leaves none: then Slurm's word). A run's attempt is the job's first
(`attempt_base`) plus the restarts Slurm counts (`RestartCnt`, sacct's runs of the job),
as the part runner numbers it (`SLURM_RESTART_COUNT`): requeues by the script, by an admin
or by a preemption alike.
"""

from __future__ import annotations

import functools
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpud.model.run import (
    ExitInfo,
    FailureCause,
    NodeRef,
    RunState,
    cause_precedence,
    new_run_id,
)
from gpud.node.paths import atomic_write, config_dir, exclusive
from gpud.wire.run_messages import MetricRow, MetricsReply, RunSummary, metrics_reply
from launch import slurm_states
from launch.slurm_states import JobRun

if TYPE_CHECKING:
    from launch.spec import RunSpec

# What reads a failed run's files (causes, hints: launch.spec, autotune, yaml) and what
# writes a batch script is imported where it is used: `gpuctl ps` imports this module
# and needs neither (issue 22 §4: `gpuctl ps` in under 200 ms).

INDEX = "slurm-runs.json"
#: How much of metrics.jsonl is read for the latest step and values.
METRICS_TAIL_BYTES = 64 * 1024


class SlurmError(RuntimeError):
    """A Slurm command failed or is missing (one line that says what to fix)."""


#: What squeue says of a job slurmctld no longer remembers.
FORGOTTEN = "Invalid job id specified"


def _slurm(*argv: str, timeout: float = 30, env: dict[str, str] | None = None) -> str:
    import subprocess

    try:
        done = subprocess.run(
            list(argv), check=False, capture_output=True, text=True, timeout=timeout,
            env={**os.environ, **env} if env else None,
        )  # fmt: skip
    except FileNotFoundError:
        raise SlurmError(
            f"{argv[0]} is not installed here: run gpuctl on a Slurm login node"
        ) from None
    except subprocess.TimeoutExpired:
        raise SlurmError(f"{argv[0]} did not answer in {timeout:.0f} s") from None
    if done.returncode != 0:
        why = (done.stderr or done.stdout).strip().splitlines()
        raise SlurmError(f"{argv[0]}: {why[-1] if why else f'exit code {done.returncode}'}")
    return done.stdout


def queued(job: str) -> JobRun | None:
    """The job as squeue sees it, None once slurmctld has forgotten it."""
    try:
        out = _slurm("squeue", "-h", "-t", "all", "-j", job, *slurm_states.SQUEUE_FORMAT)
    except SlurmError as exc:
        if FORGOTTEN in str(exc):
            return None
        raise
    return slurm_states.parse_squeue(out)


@functools.cache
def accounting() -> bool:
    """Whether this cluster accounts its jobs (sacct answers); asked once per gpuctl call
    and only when a job is forgotten. A scontrol that fails counts as no accounting."""
    try:
        return slurm_states.accounting_on(_slurm("scontrol", "show", "config"))
    except SlurmError:
        return False


def accounted(job: str, submitted_at: float) -> list[JobRun]:
    """Every run of the job in Slurm's accounting, oldest first."""
    out = _slurm("sacct", "-X", "-D", "-P", "-n", "-j", job, *slurm_states.SACCT_FIELDS,
                 env=slurm_states.SACCT_ENV)  # fmt: skip
    return slurm_states.parse_sacct(out, job, submitted_at)


def _index_path() -> Path:
    return config_dir() / INDEX


def _index() -> dict[str, str]:
    try:
        data = json.loads(_index_path().read_text())
    except (OSError, ValueError):
        return {}
    return {str(k): str(v) for k, v in data.items()} if isinstance(data, dict) else {}


def _jsonl(path: Path) -> list[dict[str, Any]]:
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return []
    found = []
    for line in lines:
        try:
            item = json.loads(line)
        except ValueError:
            continue  # a line cut by a crash
        if isinstance(item, dict):
            found.append(item)
    return found


def _append(path: Path, item: dict[str, Any]) -> None:
    with open(path, "a") as out:
        out.write(json.dumps(item) + "\n")


@dataclass(frozen=True)
class SlurmStatus:
    """A Slurm run's state as gpuctl shows it."""

    state: RunState
    reason: str
    attempt: int
    cause: FailureCause | None = None


@dataclass
class SlurmRun:
    run_dir: Path
    config: dict[str, Any]

    @property
    def id(self) -> str:
        return str(self.config["run_id"])

    @property
    def name(self) -> str:
        return str(self.config["name"])

    @property
    def jobs(self) -> list[dict[str, Any]]:
        return _jsonl(self.run_dir / "jobs.jsonl")

    @property
    def job(self) -> str | None:
        jobs = self.jobs
        return str(jobs[-1]["job"]) if jobs else None

    def ends(self, job: str) -> list[dict[str, Any]]:
        return [e for e in _jsonl(self.run_dir / "ends.jsonl") if str(e.get("job")) == job]

    def latest_metrics(self) -> tuple[int | None, dict[str, float]]:
        path = self.run_dir / "metrics.jsonl"
        try:
            with open(path, "rb") as f:
                f.seek(0, 2)
                f.seek(max(0, f.tell() - METRICS_TAIL_BYTES))
                tail = f.read().decode(errors="replace").splitlines()
        except OSError:
            return None, {}
        for line in reversed(tail):
            try:
                item = json.loads(line)
                return int(item["step"]), {
                    k: float(v) for k, v in item["values"].items() if isinstance(v, int | float)
                }
            except (ValueError, KeyError, TypeError):
                continue
        return None, {}

    def metrics(self, name: str | None = None, attempt: int | None = None) -> MetricsReply:
        """The history in metrics.jsonl, every attempt (requeues included), as a daemon
        answers `run.metrics`: in attempt and step order, with where each resumed."""
        rows: dict[tuple[int, int], MetricRow] = {}
        for item in _jsonl(self.run_dir / "metrics.jsonl"):
            try:
                values = {str(k): float(v) for k, v in dict(item["values"]).items()}
                row = MetricRow(
                    attempt=int(item["attempt"]), step=int(item["step"]),
                    time=float(item["time"]),
                    values={k: v for k, v in values.items() if name in (None, k)},
                )  # fmt: skip
            except (KeyError, TypeError, ValueError):
                continue
            if attempt is None or row.attempt == attempt:
                rows[(row.attempt, row.step)] = row
        return metrics_reply(self.id, rows)

    def _attempt_dir(self, attempt: int | None) -> Path | None:
        """The attempt's directory (the latest one for None), if any part made it."""
        if attempt is not None:
            path = self.run_dir / f"attempt-{attempt}"
            return path if path.is_dir() else None
        attempts = sorted(
            (p for p in self.run_dir.glob("attempt-*") if p.name[8:].isdigit()),
            key=lambda p: int(p.name[8:]),
        )
        return attempts[-1] if attempts else None

    def unreported(self, attempt: int) -> list[int]:
        """The nodes of the attempt whose part never wrote how it ended (exit.json): it
        was killed with its node, or never started."""
        attempt_dir = self.run_dir / f"attempt-{attempt}"
        nodes = int((self.config["spec"].get("slurm") or {}).get("nodes") or 1)
        return [n for n in range(nodes) if not (attempt_dir / f"node-{n}" / "exit.json").exists()]

    def cause(self, attempt: int | None = None) -> FailureCause | None:
        """Why the attempt (the latest for None) failed, read from its nodes' files as
        gpud reads a part's (error files, torchrun's summary, tracebacks, signals); the
        earliest wins."""
        from gpud.runs.diagnosis.attempt_log import AttemptLog
        from gpud.runs.diagnosis.causes import find_cause
        from gpud.runs.diagnosis.hints import HintFacts, with_hint

        attempt_dir = self._attempt_dir(attempt)
        found = []
        for node_dir in sorted(attempt_dir.glob("node-*")) if attempt_dir else []:
            try:
                ended = json.loads((node_dir / "exit.json").read_text())
                text = AttemptLog.of(node_dir).whole().decode(errors="replace")
                nproc = int(json.loads((node_dir / "part.json").read_text())["nproc"])
            except (OSError, ValueError, KeyError):
                continue
            if not ended.get("exit_code") and not ended.get("signal"):
                continue
            node_rank = int(node_dir.name.removeprefix("node-"))
            exit_info = ExitInfo(exit_code=ended.get("exit_code"), signal=ended.get("signal"))
            found.append(find_cause(node_dir, text, exit_info, node_rank=node_rank, nproc=nproc))
        if not found:
            return None
        python = self.config.get("python")
        facts = HintFacts(python=python if isinstance(python, str) else None)
        return with_hint(min(found, key=cause_precedence), facts)

    def state(self) -> SlurmStatus:
        """The run's state, why, and its attempt: from squeue while Slurm remembers the
        job; then from how its last run ended, by the script's end record, else by
        Slurm's word (squeue's, else sacct's where accounting is on)."""
        jobs = self.jobs
        if not jobs:
            return SlurmStatus(RunState.FAILED, "never submitted", 1)
        job, base = str(jobs[-1]["job"]), int(jobs[-1].get("attempt_base", 1))
        live = queued(job)
        if live is not None and not live.run_state.terminal:
            return SlurmStatus(live.run_state, live.waiting(job), base + live.restarts)
        last, source = live, "squeue"
        if last is None and accounting():
            runs = accounted(job, float(jobs[-1].get("submitted_at") or 0))
            last, source = (runs[-1] if runs else None), "sacct"
        ends = self.ends(job)
        restarts = last.restarts if last is not None else self._restarts_seen(ends, base)
        attempt = base + restarts
        end = next((e for e in reversed(ends) if int(e.get("restart", 0)) == restarts), None)
        if end is not None and not (
            last is not None
            and last.run_state.terminal
            and slurm_states.overrides_end_record(last.state, str(end.get("stopping") or ""))
        ):
            return self._ended(job, end, attempt)
        if last is not None and last.run_state.terminal:
            state, reason, cause = last.ended(job, source)
            if slurm_states.state_word(last.state) == "FAILED" and (found := self.cause(attempt)):
                reason, cause = f"{found.kind.value}: {found.summary}; Slurm job {job}", found
            return SlurmStatus(state, reason, attempt, cause)
        if last is not None:  # accounting has not caught up with the job's end
            return SlurmStatus(last.run_state, f"{last.waiting(job)}, says sacct", attempt)
        how = "sacct has no record of it" if accounting() else "accounting is off"
        why = f"Slurm job {job} is gone, left no end record, and {how}"
        return SlurmStatus(RunState.FAILED, why, attempt)

    def _restarts_seen(self, ends: list[dict[str, Any]], base: int) -> int:
        """Without Slurm's count: the requeues the end records name, and the attempts
        that left a directory (a run killed with its job writes no end record)."""
        seen = [int(e.get("restart", 0)) + bool(e.get("requeued")) for e in ends]
        for attempt_dir in self.run_dir.glob("attempt-*"):
            number = attempt_dir.name.removeprefix("attempt-")
            if number.isdigit() and int(number) >= base:
                seen.append(int(number) - base)
        return max(seen, default=0)

    def _ended(self, job: str, end: dict[str, Any], attempt: int) -> SlurmStatus:
        """How a run of the job ended, by the batch script's own record."""
        code, stopping = int(end.get("code", 1)), str(end.get("stopping") or "")
        if stopping == "stop":
            why = f"stopped (gpuctl stop); Slurm job {job}"
            return SlurmStatus(RunState.STOPPED, why, attempt)
        if stopping == "time_limit":
            why = f"stopped at the time limit; Slurm job {job}"
            return SlurmStatus(RunState.STOPPED, why, attempt)
        if code == 0:
            # srun's 0 is a success only if every node's part says so: srun also exits 0
            # when Slurm kills its step for a node failure.
            failed, lost = self.cause(attempt), self.unreported(attempt)
            if failed is None and not lost:
                return SlurmStatus(RunState.SUCCEEDED, f"Slurm job {job} completed", attempt)
            why = (
                f"{failed.kind.value}: {failed.summary}" if failed
                else f"node {lost[0]} never reported how its part ended"
            )  # fmt: skip
            return SlurmStatus(RunState.FAILED, f"{why}; Slurm job {job}", attempt, failed)
        cause = self.cause(attempt)
        why = f"{cause.kind.value}: {cause.summary}" if cause else f"exit code {code}"
        return SlurmStatus(RunState.FAILED, f"{why}; Slurm job {job}", attempt, cause)

    def part_info(self) -> dict[str, Any]:
        """Node 0's part.json of the latest attempt (processes, GPUs), once it started."""
        attempt_dir = self._attempt_dir(None)
        if attempt_dir is None:
            return {}
        try:
            info = json.loads((attempt_dir / "node-0" / "part.json").read_text())
        except (OSError, ValueError):
            return {}
        return info if isinstance(info, dict) else {}

    def summary(self) -> RunSummary:
        status = self.state()
        last_step, values = self.latest_metrics()
        spec = self.config["spec"]
        part = self.part_info()
        nproc = spec.get("nproc_per_node")
        where = f"slurm:{self.job}"
        return RunSummary(
            id=self.id,
            name=self.name,
            state=status.state,
            state_since=time.time(),
            reason=status.reason,
            attempt=status.attempt,
            cause=status.cause,
            created_at=float(self.config["created_at"]),
            node_rank=0,
            nodes=[
                NodeRef(control=where, name=where)
                for _ in range(int((spec.get("slurm") or {}).get("nodes") or 1))
            ],
            launcher=str(spec.get("launcher", "torchrun")),
            last_step=last_step,
            max_steps=(spec.get("training") or {}).get("max_steps"),
            last_values=values,
            nproc=part.get("nproc") or (nproc if isinstance(nproc, int) else None),
            gpus=[g for g in part.get("gpus") or [] if isinstance(g, int)],
        )


def known_runs() -> list[SlurmRun]:
    found = []
    for run_dir in _index().values():
        try:
            config = json.loads((Path(run_dir) / "slurm.json").read_text())
        except (OSError, ValueError):
            continue  # removed by hand
        found.append(SlurmRun(Path(run_dir), config))
    return found


def find(ref: str) -> SlurmRun | None:
    """The Slurm run `ref` names: its id, else the newest of that name."""
    runs = known_runs()
    exact = [r for r in runs if r.id == ref]
    if exact:
        return exact[0]
    named = [r for r in runs if r.name == ref]
    return max(named, key=lambda r: float(r.config["created_at"])) if named else None


def submit(run: SlurmRun, attempt_base: int, resume_from: str | None = None) -> str:
    """sbatch the run's script; returns the job id."""
    run.config["attempt_base"] = attempt_base
    run.config["resume_from"] = resume_from
    atomic_write(run.run_dir / "slurm.json", json.dumps(run.config).encode(), mode=0o644)
    out = _slurm("sbatch", "--parsable", str(run.run_dir / "job.sh"))
    job = out.strip().split(";")[0]
    if not job.isdigit():
        raise SlurmError(f"sbatch answered {out.strip()!r}, not a job id")
    _append(run.run_dir / "jobs.jsonl",
            {"job": job, "attempt_base": attempt_base, "submitted_at": time.time(),
             "resume_from": resume_from})  # fmt: skip
    return job


def create(spec: RunSpec, python: str) -> SlurmRun:
    """A new run dir with its config and batch script, remembered in the index."""
    from launch import slurm

    run_id = new_run_id(spec.name)
    run_dir = Path(slurm.run_dir_for(spec, run_id))
    script = slurm.render(spec, run_id, str(run_dir), python)
    run_dir.mkdir(parents=True, exist_ok=False)
    config = {
        "run_id": run_id,
        "name": spec.name,
        "spec": spec.model_dump(mode="json"),
        "created_at": time.time(),
        "run_dir": str(run_dir),
        "python": python,
    }
    (run_dir / "job.sh").write_text(script)
    index = _index_path()
    with exclusive(index):
        entries = _index()
        entries[run_id] = str(run_dir)
        atomic_write(index, json.dumps(entries, indent=1).encode())
    return SlurmRun(run_dir, config)


def stop(run: SlurmRun, cancel: bool) -> str:
    """Ask the job to stop with a checkpoint (USR2 to its batch shell), or cancel it."""
    job = run.job
    if job is None:
        raise SlurmError(f"run {run.id} has no Slurm job")
    if cancel:
        _slurm("scancel", job)
    else:
        _slurm("scancel", "--batch", "--signal=USR2", job)
    return job
