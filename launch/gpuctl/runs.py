"""`gpuctl ps | status | stop | resume | logs`: runs after they are launched."""

from __future__ import annotations

import os
import sys
import time

import click

from gpud.model.run import (
    AttemptRecord,
    FailureCause,
    RunState,
    gpus_by_node_text,
    gpus_text,
    steps_text,
)
from gpud.wire.client import Client, ClientError, known_targets
from gpud.wire.protocol import RUN_LIST, RUN_LOGS, RUN_RESUME, RUN_STOP
from gpud.wire.run_messages import (
    ListRequest,
    LogChunk,
    LogsRequest,
    ResumeRequest,
    RunList,
    RunSummary,
    StopRequest,
)
from launch.gpuctl import slurm_jobs, slurm_verbs
from launch.gpuctl.completion import run_argument
from launch.gpuctl.context import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    START_TIMEOUT_S,
    Ctl,
    exit_code_for,
    fail,
    json_option,
    report_errors,
    worst_exit_code,
)
from launch.gpuctl.follow import follow, outcome_line, progress_line
from launch.gpuctl.output import emit_json, human_duration, table
from launch.gpuctl.runref import FoundRun, find_run

#: Log lines of a failure's cause that `gpuctl status` shows.
CAUSE_LINES = 8


def _age(since: float) -> str:
    return human_duration(max(0.0, time.time() - since))


def _shape(run: RunSummary) -> str:
    """`2x4`: nodes × processes per node; an elastic run on fewer nodes than it was
    launched on says so: `2/3x4`."""
    procs = "?" if run.nproc is None else str(run.nproc)
    return f"{nodes_text(run)}x{procs}"


def nodes_text(run: RunSummary) -> str:
    """How many nodes the current attempt uses: `3`, or `2/3` for an elastic run short of
    the nodes it was launched on."""
    planned = run.planned_nodes or len(run.nodes)
    now = len(run.members) if run.members is not None else planned
    return f"{now}/{planned}" if now != planned else str(now)


def _where(run: RunSummary) -> str:
    """Node 0 (the coordinator) by name, and how many other nodes: `gpu1+3`."""
    first = run.nodes[0] if run.nodes else None
    name = (first.name or first.control.removeprefix("tcp://")) if first else "?"
    return name + (f"+{len(run.nodes) - 1}" if len(run.nodes) > 1 else "")


def _any_node_known() -> bool:
    try:
        return bool(known_targets())
    except ClientError:
        return False


#: Runs `gpuctl ps` lists from each node by default: the newest (a node may keep 10,000).
PS_LIMIT = 200
#: The most a node lists in one request (`ListRequest.limit`).
PS_MOST = 1000


@click.command("ps")
@click.option("--active", is_flag=True, help="Only runs that have not ended.")
@click.option(
    "--limit",
    type=click.IntRange(1, PS_MOST),
    default=PS_LIMIT,
    show_default=True,
    help="The newest runs listed from each node; a line on stderr says how many older"
    " ones were left out.",
)
@json_option
@click.pass_obj
def ps_command(ctl: Ctl, active: bool, limit: int) -> None:
    """Runs across the nodes and Slurm (newest first), one row per run; NODE is where it
    runs (`slurm:JOB` for a run under Slurm)."""
    on_slurm = [] if ctl.nodes else slurm_verbs.summaries(active)
    results = []
    if not (on_slurm and not _any_node_known()):
        results = ctl.on_every_node(
            lambda client: client.call(RUN_LIST, ListRequest(active_only=active, limit=limit))
        )
    merged: dict[str, RunSummary] = {r.id: r for r in on_slurm}
    slurm_ids = set(merged)
    gpus: dict[str, dict[int, list[int]]] = {}  # run → node rank → GPUs held there
    for r in on_slurm:
        if r.gpus:
            gpus[r.id] = {0: r.gpus}  # node 0's, as Slurm gave them
    for result in results:
        if isinstance(result.value, RunList):
            for run in result.value.runs:
                if run.id in slurm_ids:
                    # Slurm says where the job is; the daemon it reports to, how far.
                    merged[run.id] = slurm_verbs.with_progress(merged[run.id], run)
                elif run.id not in merged or run.node_rank == 0:
                    merged[run.id] = run  # node 0's record speaks for the whole gang
                if run.gpus:
                    gpus.setdefault(run.id, {})[run.node_rank] = run.gpus
    runs = sorted(merged.values(), key=lambda r: r.created_at, reverse=True)
    older = {
        result.address: result.value.total - len(result.value.runs)
        for result in results
        if isinstance(result.value, RunList)
        and result.value.total is not None
        and result.value.total > len(result.value.runs)
    }
    if ctl.json:
        emit_json({"runs": runs, "older": older})
    else:
        rows = [
            [
                r.id,
                r.name,
                r.state_label,
                _shape(r),
                gpus_by_node_text(gpus.get(r.id, {})),
                steps_text(r.steps_done, r.max_steps),
                "-" if "loss" not in r.last_values else f"{r.last_values['loss']:.4f}",
                str(r.attempt),
                _age(r.created_at),
                _where(r),
                (r.reason or "")[:60],
            ]
            for r in runs
        ]
        click.echo(
            table(
                [
                    "RUN",
                    "NAME",
                    "STATE",
                    "NODES",
                    "GPUS",
                    "STEP",
                    "LOSS",
                    "ATTEMPT",
                    "AGE",
                    "NODE",
                    "REASON",
                ],
                rows,
            )
        )
        for address, count in older.items():
            more = (
                f"gpuctl ps --limit {PS_MOST} lists up to {PS_MOST:,}"
                if limit < PS_MOST
                else "`gpuctl status RUN` shows any of them"
            )
            runs_word = "run" if count == 1 else "runs"
            click.echo(f"… {count:,} older {runs_word} on {address} not listed: {more}", err=True)
    report_errors(results)
    sys.exit(worst_exit_code(results))


def _attempt_shape(r: RunSummary) -> str:
    """`, on 2/3 nodes (0, 1), world 2` for an elastic run."""
    if not r.elastic:
        return ""
    members = r.members if r.members is not None else list(range(r.planned_nodes or 1))
    world = f", world {r.world_size}" if r.world_size else ""
    return f", on {nodes_text(r)} nodes ({', '.join(map(str, members))}){world}"


@click.command("status")
@run_argument
@json_option
@click.pass_obj
def status_command(ctl: Ctl, run: str) -> None:
    """One run in detail: state and why, every node's part, attempts, recent events."""
    if (on_slurm := slurm_jobs.find(run)) is not None:
        slurm_verbs.status(ctl, on_slurm)
        return
    found = find_run(ctl, run)
    status = found.status
    if ctl.json:
        emit_json(status)
        return
    r = status.run
    lines = [
        f"run       {r.id} ({r.name}), {r.launcher}",
        f"state     {r.state_label} for {_age(r.state_since)}"
        + (f": {r.reason}" if r.reason else ""),
        f"progress  {progress_line(r)}",
        f"attempt   {r.attempt} (restarts {r.restarts})" + _attempt_shape(r),
    ]
    if status.flops is not None:
        lines += [
            f"flops     {status.flops.flops_line}",
            f"mfu       {status.flops.mfu_line}",
        ]
    if status.goodput is not None:
        lines.append(f"goodput   {status.goodput.line()}")
    if r.last_checkpoint:
        lines.append(f"checkpoint {r.last_checkpoint.path} (step {r.last_checkpoint.step})")
    if r.cause is not None:
        lines += _cause_lines(r.cause)
    lines += [
        "",
        table(
            ["NODE", "ADDRESS", "STATE", "GPUS", "REASON"],
            [
                [
                    str(p.node_rank),
                    p.node.control.removeprefix("tcp://"),
                    "left out" if p.left_out else p.state.value if p.state else "?",
                    gpus_text(p.gpus),
                    p.left_out or p.error or p.reason or "",
                ]
                for p in status.parts
            ],
        ),
    ]
    if status.attempts:
        lines += [
            "",
            table(
                ["ATTEMPT", "STATE", "WORLD", "PORT", "GPUS", "EXIT", "STARTED", "REASON"],
                [
                    [
                        str(a.attempt),
                        a.state.value,
                        "-" if a.world_size is None else str(a.world_size),
                        str(a.master_port),
                        gpus_text(a.gpus),
                        _exit_text(a.exit.exit_code, a.exit.signal) if a.exit else "-",
                        _start_text(a),
                        a.reason or "",
                    ]
                    for a in status.attempts
                ],
            ),
        ]
    if status.events:
        lines += ["", "recent events:"]
        lines += [
            f"  {time.strftime('%H:%M:%S', time.localtime(e.time))} {e.node:<10} "
            f"{e.kind:<12} {e.message}"
            for e in status.events[-15:]
        ]
    click.echo("\n".join(lines))


def _cause_lines(cause: FailureCause) -> list[str]:
    """The latest failure: its class, where it was read, the log lines around it, and for
    a known failure what to do about it."""
    kind = cause.kind.label
    if kind != cause.kind.value:
        kind += f" [{cause.kind.value}]"  # the name restart.on knows it by
    source = f", from the {cause.source}" if cause.source else ""
    out = [f"cause     {kind}{source}: {cause.summary}"]
    out += [f"          | {line}" for line in cause.lines[-CAUSE_LINES:]]
    out += [f"flight    {finding}" for finding in cause.flight_recorder]
    if cause.hint:
        out.append(f"hint      {cause.hint}")  # what to do about it: known failures only
    return out


def _start_text(attempt: AttemptRecord) -> str:
    """What an attempt started from, short: `step 40`, the checkpoint's name, `scratch`."""
    if attempt.resume_from is None:
        return "scratch"
    if attempt.resume_step is not None:
        return f"step {attempt.resume_step}"
    return os.path.basename(attempt.resume_from.rstrip("/")) or attempt.resume_from


def _exit_text(code: int | None, signal: int | None) -> str:
    if signal:
        return f"signal {signal}"
    return "-" if code is None else str(code)


@click.command("stop")
@run_argument
@click.option("--force", is_flag=True, help="No checkpoint handshake, no grace: SIGKILL now.")
@click.option("--no-wait", is_flag=True, help="Return once the stop is requested.")
@json_option
@click.pass_obj
def stop_command(ctl: Ctl, run: str, force: bool, no_wait: bool) -> None:
    """Stop a run: ask its trainers to checkpoint and exit, then signal what is left."""
    if (on_slurm := slurm_jobs.find(run)) is not None:
        slurm_verbs.stop(ctl, on_slurm, force, no_wait)
        return
    found = find_run(ctl, run)
    if found.status.run.state.terminal:
        _finish(ctl, found, f"{found.id} already {found.status.run.state.value}")
        return
    errors = ask_to_stop(ctl, found, StopRequest(run=found.id, force=force))
    if errors and len(errors) == len(found.nodes):
        fail(str(errors[0]), exit_code_for(errors[0]))
    if no_wait:
        _finish(ctl, found, f"stopping {found.id}")
        return
    follow(ctl, found, quiet=True)
    state = found.status.run.state
    _finish(ctl, found, outcome_line(found.status.run))
    sys.exit(EXIT_OK if state is RunState.STOPPED else EXIT_FAILED)


def ask_to_stop(ctl: Ctl, found: FoundRun, request: StopRequest) -> list[ClientError]:
    """Node 0 stops the gang; if it cannot be reached, ask every node for its part."""
    try:
        with Client(found.coordinator, timeout_s=ctl.timeout) as client:
            client.call(RUN_STOP, request)
        return []
    except ClientError as exc:
        errors = [exc]
    for target in found.nodes[1:]:
        try:
            with Client(target, timeout_s=ctl.timeout) as client:
                client.call(RUN_STOP, request)
        except ClientError as exc:
            errors.append(exc)
    return errors


def _finish(ctl: Ctl, found: FoundRun, message: str) -> None:
    if ctl.json:
        emit_json({"run": found.status.run})
    else:
        click.echo(message)


@click.command("resume")
@run_argument
@click.option("--wait", is_flag=True, help="Follow the run; exit 0 if it succeeds, else 1.")
@click.option("--queue", is_flag=True, help="If its GPUs are busy, wait for them in the queue.")
@click.option(
    "--from",
    "checkpoint",
    metavar="PATH",
    help="Start from this checkpoint (any, even another run's) instead of the run's latest.",
)
@json_option
@click.pass_obj
def resume_command(ctl: Ctl, run: str, wait: bool, queue: bool, checkpoint: str | None) -> None:
    """Start a new attempt of a stopped or failed run from its latest checkpoint.

    Only a checkpoint the run wrote counts: one its trainer reported, or a match of
    resume.pattern written after the run was created. Without one the attempt starts from
    scratch (or is refused, with resume.require_checkpoint)."""
    if (on_slurm := slurm_jobs.find(run)) is not None:
        slurm_verbs.resume(ctl, on_slurm, checkpoint)
        return
    found = find_run(ctl, run)
    if checkpoint is not None:
        checkpoint = os.path.abspath(checkpoint)
    request = ResumeRequest(run=found.id, queue=queue, checkpoint=checkpoint)
    try:
        with Client(found.coordinator, timeout_s=max(ctl.timeout, START_TIMEOUT_S)) as client:
            summary = client.call(RUN_RESUME, request)
    except ClientError as exc:
        fail(str(exc), exit_code_for(exc))
    assert isinstance(summary, RunSummary)
    found.status = found.status.model_copy(update={"run": summary})
    if not wait:
        if summary.state is RunState.QUEUED:
            _finish(ctl, found, f"{summary.id} is {summary.state_label}: {summary.reason}")
        else:
            start = f" {summary.start}" if summary.start else ""
            _finish(ctl, found, f"resumed {summary.id} as attempt {summary.attempt}{start}")
        return
    code = follow(ctl, found)
    _finish(ctl, found, outcome_line(found.status.run))
    sys.exit(code)


@click.command("logs")
@run_argument
@click.option("-f", "--follow", "follow_", is_flag=True, help="Keep printing new lines.")
@click.option("--node", "node", help="Only this node: its rank (0, 1, ...) or HOST:PORT.")
@click.option("--rank", type=click.IntRange(min=0), help="Only this global rank's lines.")
@click.option(
    "--tail",
    type=click.IntRange(min=1),
    help="Start with the last N lines (with --rank: that rank's last N lines).",
)
@click.option("--attempt", type=click.IntRange(min=1), help="An earlier attempt [latest].")
@json_option
@click.pass_obj
def logs_command(
    ctl: Ctl,
    run: str,
    follow_: bool,
    node: str | None,
    rank: int | None,
    tail: int | None,
    attempt: int | None,
) -> None:
    """A run's captured output (every rank's lines, with torchrun's rank prefixes)."""
    if (on_slurm := slurm_jobs.find(run)) is not None:
        slurm_verbs.logs(on_slurm, tail)
        return
    found = find_run(ctl, run)
    ranks = _pick_nodes(found, node)
    offsets: dict[int, int | None] = {r: None for r in ranks}
    multi = len(found.nodes) > 1 and node is None
    attempt = attempt or found.status.run.attempt
    while True:
        ended = True
        more = False  # a node has more to read right away
        for node_rank in ranks:
            chunk = _read(
                ctl,
                found,
                node_rank,
                LogsRequest(
                    run=found.id,
                    attempt=attempt,
                    offset=offsets[node_rank],
                    tail_lines=tail if offsets[node_rank] is None else None,
                    rank=rank,
                ),
            )
            if chunk is None:
                continue
            moved = chunk.next_offset > (offsets[node_rank] or 0) or chunk.lines
            offsets[node_rank] = chunk.next_offset
            ended = ended and chunk.ended
            prefix = f"[node{node_rank}] " if multi else ""
            for line in chunk.lines:
                if ctl.json:
                    emit_json({"node": node_rank, "attempt": chunk.attempt, "line": line})
                else:
                    click.echo(prefix + line)
            if chunk.next_offset < chunk.size and moved:
                more = True  # (not moved: an unfinished last line, held back)
        if more:
            continue  # the whole log, a chunk at a time, followed or not
        if not follow_ or ended:
            return
        time.sleep(0.5)


def _pick_nodes(found: FoundRun, node: str | None) -> list[int]:
    if node is None:
        return list(range(len(found.nodes)))
    if node.isdigit() and int(node) < len(found.nodes):
        return [int(node)]
    for rank, target in enumerate(found.nodes):
        if node in (target.label, target.control, target.name):
            return [rank]
    fail(
        f"run {found.id} has no node {node!r} (use 0..{len(found.nodes) - 1} or HOST:PORT)",
        EXIT_USAGE,
    )


def _read(ctl: Ctl, found: FoundRun, node_rank: int, request: LogsRequest) -> LogChunk | None:
    try:
        with Client(found.nodes[node_rank], timeout_s=ctl.timeout) as client:
            chunk = client.call(RUN_LOGS, request)
    except ClientError as exc:
        click.echo(f"gpuctl: error: node {node_rank}: {exc}", err=True)
        return None
    assert isinstance(chunk, LogChunk)
    return chunk
