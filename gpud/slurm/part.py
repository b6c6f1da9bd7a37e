"""The part runner: what `srun` starts, one task per node, in a Slurm job's batch script.

    python -m gpud.slurm.part <run-dir>/slurm.json

It places this node's part from Slurm's environment (the node's index in the job, the
job's node count, the first host as the rendezvous host), builds the launcher's command
with the same code a gpud launch uses (`launch.backends.build_command`), and runs it
through the same shim (`gpud.runs.process.shim`): its own process group, the log in the attempt
dir, leftovers ended, `exit.json` written. The processes stay in the job's cgroup, so
Slurm's accounting, limits and cleanup hold.

Attempts: the job's first run is attempt `attempt_base` (1 for a new run, the next number
for `gpuctl resume`), each Slurm requeue adds one (SLURM_RESTART_COUNT), and every attempt
after the first resumes from the newest checkpoint the run wrote.

A stop arrives as SIGTERM to every process of the step (Slurm signals them all): the
trainers checkpoint and exit, and this runner waits for them rather than die first and
let slurmstepd kill the step mid-checkpoint.

Where a gpud daemon runs on the node (its attach socket: `$GPUD_ATTACH`, else
/run/gpud/attach.sock), the runner attaches the part to it (`gpud.attach`): the ranks send
their metrics and heartbeats to it with a token only they know, and the run shows in
gputop with its health like a run gpud launched. Without one the run works the same, and
its metrics go to metrics.jsonl only. Either way node 0's runner applies the spec's
`metrics:` patterns to the output and writes what they find there too (`gpud.patterns.tail`),
so a plain script's metrics show in `gpuctl metrics` and `ps`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import secrets
import signal
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gpud.attach.client import AttachLink, failed_end, socket_path
from gpud.attach.wire import AttachRequest, EndReport
from gpud.model.run import ExitInfo, RunState
from gpud.patterns.tail import MetricsTail
from gpud.runs.diagnosis.attempt_log import AttemptLog
from gpud.runs.diagnosis.hints import HintFacts
from gpud.runs.process import shim
from gpud.runs.state.checkpoints import newest_checkpoint
from launch.backends import Placement, build_command, resolve_hints, resolve_nproc
from launch.scripts import uses_library
from launch.sections import DEFAULT_LOG_MAX_BYTES
from launch.spec import RunSpec, parse_spec

#: What the ranks send with each message on the daemon's shared ingest.
TOKEN_ENV = "GPUD_INGEST_TOKEN"


class SlurmEnvError(RuntimeError):
    """Not inside a Slurm job step (one line that says what is missing)."""


def _need(env: Mapping[str, str], *names: str) -> str:
    for name in names:
        if env.get(name):
            return env[name]
    raise SlurmEnvError(f"{names[0]} is not set: run this under srun, inside a Slurm job")


def visible_gpus(env: Mapping[str, str]) -> int:
    """The GPUs Slurm gave this task (CUDA_VISIBLE_DEVICES), 0 on CPU-only nodes."""
    devices = env.get("CUDA_VISIBLE_DEVICES", "").strip()
    return len([d for d in devices.split(",") if d.strip()]) if devices else 0


def gpu_indices(env: Mapping[str, str]) -> list[int]:
    """The indices of the GPUs Slurm gave this task, for `ps` (UUIDs are left out)."""
    words = env.get("CUDA_VISIBLE_DEVICES", "").split(",")
    return [int(w) for w in (w.strip() for w in words) if w.isdigit()]


def attempt_of(config: Mapping[str, Any], env: Mapping[str, str]) -> int:
    return int(config.get("attempt_base", 1)) + int(env.get("SLURM_RESTART_COUNT") or 0)


def placement(
    spec: RunSpec, config: Mapping[str, Any], env: Mapping[str, str], python: str
) -> Placement:
    run_dir = Path(config["run_dir"])
    attempt = attempt_of(config, env)
    checkpoint_dir = spec.checkpoint.dir or str(run_dir / "checkpoints")
    resume_from = config.get("resume_from") if attempt == config.get("attempt_base", 1) else None
    if attempt > 1 and resume_from is None:
        resume_from, _ = newest_checkpoint(
            spec.resume.pattern, checkpoint_dir, float(config["created_at"])
        )
    gpus = visible_gpus(env)
    node_rank = int(_need(env, "SLURM_NODEID"))
    return Placement(
        run_id=str(config["run_id"]),
        attempt=attempt,
        node_name=env.get("SLURMD_NODENAME") or os.uname().nodename,
        node_rank=node_rank,
        nnodes=int(_need(env, "SLURM_JOB_NUM_NODES", "SLURM_NNODES")),
        nproc_per_node=resolve_nproc(spec, gpus),
        master_addr=_need(env, "GPUD_MASTER_ADDR"),
        master_port=int(_need(env, "GPUD_MASTER_PORT")),
        gpu_count=gpus,
        python=python,
        run_dir=str(run_dir),
        attempt_dir=str(run_dir / f"attempt-{attempt}" / f"node-{node_rank}"),
        checkpoint_dir=checkpoint_dir,
        ingest="",  # no daemon: the trainers write metrics.jsonl in the run dir
        control="",
        resume_from=resume_from,
        hints=resolve_hints(spec.training, None),
    )


def attach(
    config: Mapping[str, Any], spec: RunSpec, place: Placement, env: Mapping[str, str]
) -> tuple[AttachLink | None, str, str]:
    """Attach this part to the node's daemon: (link or None, the token, why not)."""
    token = secrets.token_hex(16)
    request = AttachRequest(
        run_id=place.run_id,
        name=spec.name,
        attempt=place.attempt,
        node_rank=place.node_rank,
        nnodes=place.nnodes,
        nproc=place.nproc_per_node,
        host=place.node_name,
        scheduler="slurm",
        job_id=env.get("SLURM_JOB_ID") or None,
        run_dir=place.run_dir,
        attempt_dir=place.attempt_dir,
        created_at=float(config["created_at"]),
        spec=dict(config["spec"]),
        token=token,
        resume_from=place.resume_from,
    )
    link, why = AttachLink.open(socket_path(env, place.node_name), request)
    return link, token, why


def end_report(place: Placement, ended: Mapping[str, Any], stopping: bool) -> EndReport:
    """How the part ended, for the daemon: as gpud judges a part it started."""
    code, sig = ended.get("exit_code"), ended.get("signal")
    if stopping:
        why = "stopped by Slurm (SIGTERM: gpuctl stop, the time limit or a preemption)"
        return EndReport(state=RunState.STOPPED, reason=why, exit_code=code, signal=sig)
    if code == 0:
        return EndReport(state=RunState.SUCCEEDED, reason="exit 0", exit_code=0)
    attempt_dir = Path(place.attempt_dir)
    try:
        log_text = AttemptLog.of(attempt_dir).tail_text(65536)
    except OSError:
        log_text = ""
    return failed_end(
        attempt_dir, log_text, ExitInfo(exit_code=code, signal=sig),
        node_rank=place.node_rank, nproc=place.nproc_per_node,
        facts=HintFacts(python=place.python, master_port=place.master_port),
    )  # fmt: skip


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m gpud.slurm.part <run-dir>/slurm.json", file=sys.stderr)
        return 2
    # A stop is SIGTERM to every process of the step: the trainers act on theirs; this
    # runner outlives them, so that the step ends when they have.
    stopping: list[int] = []
    signal.signal(signal.SIGTERM, lambda signum, frame: stopping.append(signum))
    try:
        config = json.loads(Path(argv[0]).read_text())
        spec = parse_spec(config["spec"])
        place = placement(spec, config, os.environ, config.get("python") or sys.executable)
    except (OSError, ValueError, KeyError, SlurmEnvError) as exc:
        print(f"gpud.slurm.part: error: {exc}", file=sys.stderr)
        return 2
    link, token, why = attach(config, spec, place, os.environ)
    if link is not None and link.reply is not None and link.reply.ingest:
        place = dataclasses.replace(place, ingest=link.reply.ingest)
    command = build_command(spec, place)
    attempt_dir = Path(place.attempt_dir)
    environ = command.environ(os.environ)
    if link is not None:
        environ[TOKEN_ENV] = token
    spec_path = shim.write_spec(
        attempt_dir, command.files, command.argv, environ, command.cwd,
        attempt_dir / "output.log", spec.logs.max_bytes or DEFAULT_LOG_MAX_BYTES,
    )  # fmt: skip
    (attempt_dir / "part.json").write_text(
        json.dumps(
            {"node_rank": place.node_rank, "node": place.node_name,
             "nproc": place.nproc_per_node, "gpus": gpu_indices(os.environ)}
        )
    )  # fmt: skip
    print(
        f"[gpud] {place.run_id} attempt {place.attempt}: node {place.node_rank}/{place.nnodes}"
        f" ({place.node_name}), {place.nproc_per_node} process(es), rendezvous"
        f" {place.master_addr}:{place.master_port}"
        + (f", resuming from {place.resume_from}" if place.resume_from else ""),
        flush=True,
    )
    if link is not None and link.reply is not None:
        print(f"[gpud] reporting to gpud on {link.reply.node} ({link.path})", flush=True)
        link.start()
    else:
        print(f"[gpud] {why}; metrics go to metrics.jsonl only", flush=True)
    # The spec's patterns over rank 0's output, daemon or not (a plain script's metrics).
    metrics = (
        MetricsTail.start(attempt_dir / "output.log", Path(place.run_dir) / "metrics.jsonl",
                          place.run_id, place.attempt, spec.metric_patterns,
                          auto=spec.auto_metrics and not uses_library(spec))
        if place.node_rank == 0
        else None
    )  # fmt: skip
    shim.run(spec_path)
    if metrics is not None:
        metrics.close()
    ended = json.loads((attempt_dir / "exit.json").read_text())
    if link is not None:
        link.end(end_report(place, ended, bool(stopping)))
    code = ended.get("exit_code")
    return int(code) if code is not None else 128 + int(ended.get("signal") or 9)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
