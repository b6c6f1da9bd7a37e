"""A run under Slurm: the batch script `gpuctl launch --slurm` submits (issue 12).

The scheduler owns the allocation, its cgroups and its cleanup; the script only starts the
run's part on every node, one srun task per node, and turns Slurm's signals into gpud's
stop-with-checkpoint:

- the time limit: `--signal=B:USR1@<signal_before_s>` reaches the batch shell, which sends
  the steps SIGTERM (the trainers library checkpoints and exits on it) and, with
  `requeue: true`, requeues the job once they have ended; the next run of the job resumes
  from that checkpoint;
- `gpuctl stop`: USR2 to the batch shell, the same stop without the requeue;
- `gpuctl stop --force`: `scancel`.

Rendezvous is on the first host of the allocation (`scontrol show hostnames`, at its
NodeAddr), on a port
derived from the job id, with the job id as the rendezvous id. Every value that reaches the
script is validated by the spec (names, Slurm words) and shell-quoted here.
"""

from __future__ import annotations

import shlex
from pathlib import Path

from launch.sections import SlurmSettings
from launch.spec import RunSpec

#: The part runner each srun task starts (`python -m PART_RUNNER <run-dir>/slurm.json`).
PART_RUNNER = "gpud.slurm.part"
#: MASTER_PORT = PORT_BASE + job id % PORT_SPAN: two jobs on one first host rarely clash.
PORT_BASE = 20000
PORT_SPAN = 20000


def run_dir_for(spec: RunSpec, run_id: str) -> str:
    """Where a Slurm run keeps its files: under its workdir, which every node must see."""
    return str(Path(spec.workdir or ".").resolve() / "gpud-runs" / run_id)


class SlurmScriptError(ValueError):
    """The spec cannot be rendered as a batch script (one line that says what to fix)."""


def gpus_per_node(spec: RunSpec, slurm: SlurmSettings) -> int | None:
    if slurm.gpus_per_node is not None:
        return slurm.gpus_per_node
    return spec.gpus if isinstance(spec.gpus, int) else None


def directives(spec: RunSpec, slurm: SlurmSettings, run_dir: str) -> list[str]:
    """The #SBATCH lines, in sbatch's own flag syntax."""
    flags = [f"--job-name={spec.name}", f"--nodes={slurm.nodes}", "--ntasks-per-node=1"]
    gpus = gpus_per_node(spec, slurm)
    if gpus:
        flags.append(f"--gpus-per-node={gpus}")
    for name, value in (
        ("cpus-per-task", slurm.cpus_per_task),
        ("partition", slurm.partition),
        ("account", slurm.account),
        ("qos", slurm.qos),
        ("time", slurm.time),
        ("mem", slurm.mem),
        ("constraint", slurm.constraint),
    ):
        if value is not None:
            flags.append(f"--{name}={value}")
    if slurm.exclusive:
        flags.append("--exclusive")
    flags += [
        f"--signal=B:USR1@{slurm.signal_before_s}",
        "--requeue" if slurm.requeue else "--no-requeue",
        "--open-mode=append",  # a requeued job appends to the same output
        f"--output={run_dir}/slurm-%j.out",
        *slurm.extra,
    ]
    return [f"#SBATCH {flag}" for flag in flags]


def render(spec: RunSpec, run_id: str, run_dir: str, python: str) -> str:
    """The batch script for `spec` as run `run_id`, whose files live in `run_dir` (on
    storage every node of the allocation sees)."""
    slurm = spec.slurm or SlurmSettings()
    for what, value in (("the run dir", run_dir), ("the interpreter", python)):
        if not value.startswith("/") or any(c.isspace() for c in value):
            raise SlurmScriptError(f"{what} must be an absolute path without spaces: {value!r}")
    q = shlex.quote
    part = f"{q(python)} -m {PART_RUNNER} {q(run_dir + '/slurm.json')}"
    requeue = "true" if slurm.requeue else "false"
    lines = [
        "#!/bin/bash",
        f"# gpud run {run_id} ({spec.name}), rendered by `gpuctl launch --slurm`.",
        *directives(spec, slurm, run_dir),
        "set -u",
        'stopping=""',
        "# The time limit is near (USR1) or gpuctl stop (USR2): the step gets SIGTERM once,",
        "# and the trainers checkpoint and exit. Trapped first: a stop may come while the",
        "# job starts, and an untrapped USR2 would kill this shell with nothing written.",
        "trap 'stopping=time_limit' USR1",
        "trap 'stopping=stop' USR2",
        f"export GPUD_RUN_ID={q(run_id)} GPUD_RUN_DIR={q(run_dir)}",
        'first=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
        "# The node's address as Slurm knows it (NodeAddr), else its name.",
        'addr=$(scontrol show node "$first" 2>/dev/null'
        ' | sed -n "s/^ *NodeAddr=\\([^ ]*\\).*/\\1/p")',
        'export GPUD_MASTER_ADDR="${addr:-$first}"',
        f"export GPUD_MASTER_PORT=$(( {PORT_BASE} + SLURM_JOB_ID % {PORT_SPAN} ))",
        'export GPUD_RDZV_ID="$SLURM_JOB_ID"',
        "code=0  # stopped before it started: nothing ran, nothing failed",
        'if [ -z "$stopping" ]; then',
        f"  srun --ntasks-per-node=1 --kill-on-bad-exit=1 {part} &",
        '  step=$! started=$SECONDS asked=""',
        "  # Pass a stop on once, to a step old enough to exist (a TERM to a step srun has",
        "  # not registered yet is lost; a second one would cut torchrun's grace short).",
        '  while kill -0 "$step" 2>/dev/null; do',
        '    if [ -n "$stopping" ] && [ -z "$asked" ] && [ $((SECONDS - started)) -ge 3 ]; then',
        '      asked=1; scancel --signal=TERM "$SLURM_JOB_ID"',
        "    fi",
        "    sleep 1 & wait $!  # returns early when a trapped signal arrives",
        "  done",
        '  wait "$step"; code=$?',
        "fi",
        "requeue=false",
        f'if [ "$stopping" = time_limit ] && {requeue}; then requeue=true; fi',
        "# How this run of the job ended, for gpuctl (squeue forgets, sacct may be off).",
        'printf \'{"job": "%s", "restart": %s, "code": %s, "stopping": "%s",'
        ' "requeued": %s}\\n\' \\',
        '    "$SLURM_JOB_ID" "${SLURM_RESTART_COUNT:-0}" "$code" "$stopping" "$requeue" \\',
        '    >> "$GPUD_RUN_DIR/ends.jsonl"',
        '"$requeue" && scontrol requeue "$SLURM_JOB_ID"',
        'exit "$code"',
    ]
    return "\n".join(lines) + "\n"
