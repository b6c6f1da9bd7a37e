"""`gpud attach -- COMMAND`: run a command gpud did not launch, reporting to this node's daemon.

For a training command started by something else — a Kubernetes pod (PyTorchJob, JobSet),
a hand-typed torchrun on a box where gpud runs — this plays the part runner's role that
`gpud.slurm.part` plays in a Slurm job: it attaches this node's part to the daemon
(`gpud.attach.client`), gives the command the shared ingest and its token (so the trainers
library reports there), runs it with its output passed through (and kept in the attempt
dir for the failure cause), forwards SIGTERM and SIGINT to it, and reports how it ended.
Without a daemon the command runs all the same, and says so in one line.

Where it sits comes from the environment (`trainers.placement`: torchrun's, the training
operator's, JobSet's); the run id from `--run-id` or `GPUD_RUN_ID` (every node of a run
must use the same), the attempt from `GPUD_ATTEMPT` or JobSet's restart count.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpud.attach.client import AttachLink, failed_end, socket_path
from gpud.attach.wire import AttachRequest, EndReport, Scheduler
from gpud.model.run import ExitInfo, RunState, new_run_id
from gpud.patterns.engine import PatternError, compile_pattern
from gpud.patterns.tail import MetricsTail
from gpud.runs.process.shim import PUMP_JOIN_S, OutputPump
from trainers.placement import placement_from

TOKEN_ENV = "GPUD_INGEST_TOKEN"
#: The last bytes of the output kept for the failure cause (the attempt dir's log keeps all).
TAIL_BYTES = 64 * 1024
LAUNCHERS = {
    "torchrun": "torchrun",
    "torch.distributed.run": "torchrun",
    "deepspeed": "deepspeed",
    "accelerate": "accelerate",
}


class AttachUsageError(ValueError):
    """The command line or the environment cannot describe a part (one line)."""


@dataclass(frozen=True)
class PartInfo:
    run_id: str
    name: str
    attempt: int
    node_rank: int
    nnodes: int
    nproc: int
    node: str
    scheduler: Scheduler
    pod_uid: str | None
    run_dir: Path
    #: The spec's `metrics:` patterns (--metrics), applied by node 0's runner.
    patterns: tuple[str, ...] = ()

    @property
    def attempt_dir(self) -> Path:
        return self.run_dir / f"attempt-{self.attempt}" / f"node-{self.node_rank}"


def _int(env: Mapping[str, str], key: str) -> int | None:
    value = env.get(key, "").strip()
    return int(value) if value.isdigit() else None


def part_info(
    command: Sequence[str],
    env: Mapping[str, str],
    *,
    run_id: str | None = None,
    name: str | None = None,
    run_dir: str | None = None,
    nproc: int | None = None,
    patterns: Sequence[str] = (),
) -> PartInfo:
    if not command:
        raise AttachUsageError("no command: gpud attach [OPTIONS] -- COMMAND [ARGS...]")
    for pattern in patterns:
        try:
            names = compile_pattern(pattern).names
        except PatternError as exc:
            raise AttachUsageError(f"--metrics {pattern!r}: {exc}") from None
        if not set(names) - {"step"}:
            raise AttachUsageError(f"--metrics {pattern!r}: needs a named group for a metric")
    place = placement_from(env)
    script = next((Path(w).stem for w in command if w.endswith(".py")), None)
    name = name or env.get("GPUD_RUN_NAME") or script or Path(command[0]).name or "run"
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.\-]{0,100}", name):
        raise AttachUsageError(f"--name {name!r}: letters, digits, '.', '_' and '-' only")
    run_id = run_id or env.get("GPUD_RUN_ID") or new_run_id(name)
    restarts = _int(env, "JOBSET_RESTART_ATTEMPT")
    attempt = _int(env, "GPUD_ATTEMPT") or (restarts + 1 if restarts is not None else 1)
    pod_uid = env.get("POD_UID") or None
    scheduler: Scheduler = "kubernetes" if "KUBERNETES_SERVICE_HOST" in env else "manual"
    base = run_dir or env.get("GPUD_RUN_DIR") or str(Path.cwd() / "gpud-runs" / run_id)
    return PartInfo(
        run_id=run_id,
        name=name,
        attempt=max(1, attempt),
        node_rank=place.node_rank,
        nnodes=max(place.nnodes or 1, place.node_rank + 1),
        nproc=nproc or _int(env, "PET_NPROC_PER_NODE") or 1,
        node=place.node,
        scheduler=scheduler,
        pod_uid=pod_uid if scheduler == "kubernetes" else None,
        run_dir=Path(base).absolute(),
        patterns=tuple(patterns),
    )


def describe(command: Sequence[str], info: PartInfo) -> dict[str, Any]:
    """A run spec that says what runs (gpud never launches it from this)."""
    words = [Path(command[0]).name, *command[1:3]]
    launcher = next((LAUNCHERS[w] for w in words if w in LAUNCHERS), "python")
    spec: dict[str, Any] = {
        "name": info.name,
        "launcher": launcher,
        "script": command[0],
        "args": list(command[1:]),
    }
    if launcher != "python":
        spec["nproc_per_node"] = info.nproc
    if info.patterns:
        spec["metrics"] = [{"pattern": p} for p in info.patterns]
    return spec


def request_for(command: Sequence[str], info: PartInfo, token: str) -> AttachRequest:
    return AttachRequest(
        run_id=info.run_id,
        name=info.name,
        attempt=info.attempt,
        node_rank=info.node_rank,
        nnodes=info.nnodes,
        nproc=info.nproc,
        host=info.node,
        scheduler=info.scheduler,
        pod_uid=info.pod_uid,
        run_dir=str(info.run_dir),
        attempt_dir=str(info.attempt_dir),
        created_at=time.time(),
        spec=describe(command, info),
        token=token,
    )


def child_env(
    env: Mapping[str, str], info: PartInfo, ingest: str | None, token: str
) -> dict[str, str]:
    out = dict(env)
    out.update(
        GPUD_RUN_ID=info.run_id,
        GPUD_RUN_DIR=str(info.run_dir),
        GPUD_ATTEMPT=str(info.attempt),
        GPUD_NODE=info.node,
        GPUD_ERROR_DIR=str(info.attempt_dir / "errors"),
    )
    # The run's checkpoints with the run, as a gpud launch keeps them (unless told).
    out.setdefault("GPUD_CHECKPOINT_DIR", str(info.run_dir / "checkpoints"))
    if ingest:
        out.update(GPUD_INGEST=ingest, **{TOKEN_ENV: token})
    else:
        out.pop("GPUD_INGEST", None)
    return out


def _echo(tail: bytearray) -> Callable[[bytes], None]:
    """The command's output to ours (kubectl logs, a terminal), its end kept for the cause;
    the shim's pump writes it to the attempt's log, a full disk or not."""
    out = sys.stdout.buffer

    def echo(chunk: bytes) -> None:
        with contextlib.suppress(OSError):
            out.write(chunk)
            out.flush()
        tail.extend(chunk)
        del tail[:-TAIL_BYTES]

    return echo


def end_report(info: PartInfo, code: int, stopping: bool, tail: str) -> EndReport:
    sig = -code if code < 0 else None
    exit_code = code if code >= 0 else None
    if stopping:
        why = "stopped (SIGTERM to gpud attach: its pod or job is being stopped)"
        return EndReport(state=RunState.STOPPED, reason=why, exit_code=exit_code, signal=sig)
    if code == 0:
        return EndReport(state=RunState.SUCCEEDED, reason="exit 0", exit_code=0)
    return failed_end(
        info.attempt_dir, tail, ExitInfo(exit_code=exit_code, signal=sig),
        node_rank=info.node_rank, nproc=info.nproc,
    )  # fmt: skip


def run(
    command: Sequence[str], info: PartInfo, env: Mapping[str, str], socket_file: Path | None
) -> int:
    """Run the command as this node's part; returns its exit status (128+N for signal N)."""
    token = secrets.token_hex(16)
    info.attempt_dir.mkdir(parents=True, exist_ok=True)
    link, why = AttachLink.open(socket_file, request_for(command, info, token))
    ingest = link.reply.ingest if link is not None and link.reply is not None else None
    if link is not None and link.reply is not None and link.reply.attempt:
        info = dataclasses.replace(info, attempt=link.reply.attempt)  # a rerun: the next one
        info.attempt_dir.mkdir(parents=True, exist_ok=True)
    if link is not None and link.reply is not None:
        print(f"[gpud] {info.run_id}: reporting to gpud on {link.reply.node}", file=sys.stderr)
        link.start()
    else:
        print(f"[gpud] {info.run_id}: {why}; metrics go to metrics.jsonl only", file=sys.stderr)
    stopping: list[int] = []
    try:
        child = subprocess.Popen(
            list(command),
            env=child_env(env, info, ingest, token),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
    except OSError as exc:
        if link is not None:
            link.end(EndReport(state=RunState.FAILED, reason=f"cannot start: {exc}"))
        raise AttachUsageError(f"cannot run {command[0]}: {exc.strerror or exc}") from None

    def forward(signum: int, frame: object) -> None:
        stopping.append(signum)
        with contextlib.suppress(ProcessLookupError):
            child.send_signal(signum)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, forward)
    tail = bytearray()
    assert child.stdout is not None
    log_path = info.attempt_dir / "output.log"
    metrics = (
        MetricsTail.start(log_path, info.run_dir / "metrics.jsonl", info.run_id, info.attempt,
                          list(info.patterns), auto=not info.patterns)
        if info.node_rank == 0
        else None
    )  # fmt: skip
    log = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    pump = OutputPump(child.stdout.fileno(), log, str(log_path), _echo(tail)).start()
    code = child.wait()
    pump.join(PUMP_JOIN_S)
    if not pump.thread.is_alive():
        os.close(log)
    if metrics is not None:
        metrics.close()
    if link is not None:
        link.end(end_report(info, code, bool(stopping), tail.decode(errors="replace")))
    return code if code >= 0 else 128 - code


def main(
    command: Sequence[str],
    *,
    run_id: str | None,
    name: str | None,
    run_dir: str | None,
    nproc: int | None,
    socket_file: str | None,
    patterns: Sequence[str] = (),
) -> int:
    env = os.environ
    info = part_info(
        command, env, run_id=run_id, name=name, run_dir=run_dir, nproc=nproc, patterns=patterns
    )
    where = Path(socket_file) if socket_file else socket_path(env, info.node)
    return run(command, info, env, where)
