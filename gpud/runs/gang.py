"""The gang, as node 0 runs it: one state for the whole run, whatever node it comes from.

Node 0 polls the other nodes' parts, folds every part's state into the run's state, stops
the other parts when one fails, and starts new attempts — for `resume` and for automatic
restarts after a failure, by the same path. Functions here take the supervisor; they hold
no state of their own beyond the `GangView` of each run.
"""

from __future__ import annotations

import asyncio
import glob
import logging
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gpud.client import ClientError
from gpud.protocol import (
    PART_HEALTH,
    PART_START,
    PART_STATUS,
    PART_STOP,
    ErrorCode,
    Method,
    PartHealth,
    PartStartRequest,
    PartStatusRequest,
    PartStopRequest,
    PartView,
    ProtocolError,
    RunLogEvent,
    RunMetricsEvent,
)
from gpud.runmodel import AttemptRecord, MetricPoint, NodeRef, RunRecord, RunState
from gpud.runs.peers import PeerLink
from gpud.runs.ports import NoFreePort, pick_port
from launch.spec import parse_spec

if TYPE_CHECKING:
    from gpud.runs.part import Part
    from gpud.runs.supervisor import Supervisor

log = logging.getLogger("gpud.runs")

POLL_S = 0.5


@dataclass
class GangView:
    """The other nodes' parts of the current attempt, as node 0 last saw them."""

    nodes: list[NodeRef]
    parts: dict[int, PartView] = field(default_factory=dict)
    last_poll: float = 0.0
    propagated: bool = False

    def __post_init__(self) -> None:
        self.parts = {
            rank: PartView(node_rank=rank, node=node)
            for rank, node in enumerate(self.nodes)
            if rank > 0
        }


def gang_state(states: list[RunState | None], user_stop: bool) -> RunState:
    """One state for the run from its parts' states (None: not heard from yet)."""
    known = [s or RunState.PENDING for s in states]
    everyone_done = all(s.terminal for s in known)
    if user_stop:
        return RunState.STOPPED if everyone_done else RunState.STOPPING
    if RunState.FAILED in known:
        return RunState.FAILED
    if everyone_done:
        if all(s is RunState.SUCCEEDED for s in known):
            return RunState.SUCCEEDED
        return RunState.STOPPED
    for state in (RunState.STOPPING, RunState.RUNNING, RunState.STARTING):
        if state in known:
            return state
    return RunState.PENDING


def _link(sup: Supervisor, ref: NodeRef) -> PeerLink:
    link = sup.peers.get(ref.control)
    if link is None:
        link = sup.peers[ref.control] = PeerLink(ref, sup.keys)
    return link


async def _call_peers(
    sup: Supervisor, run: RunRecord, method: Method[Any, Any], body_for: Any
) -> dict[int, Any]:
    """Call every other node concurrently; each result is a reply or a ClientError."""

    async def one(rank: int, node: NodeRef) -> tuple[int, Any]:
        try:
            return rank, await asyncio.to_thread(_link(sup, node).call, method, body_for(rank))
        except ClientError as exc:
            return rank, exc

    pairs = await asyncio.gather(
        *(one(rank, node) for rank, node in enumerate(run.nodes) if rank > 0)
    )
    return dict(pairs)


async def _poll(sup: Supervisor, run: RunRecord, view: GangView, now: float) -> None:
    view.last_poll = now
    replies = await _call_peers(
        sup, run, PART_STATUS, lambda rank: PartStatusRequest(run_id=run.id)
    )
    healths = await _call_peers(
        sup, run, PART_HEALTH, lambda rank: PartStatusRequest(run_id=run.id)
    )
    sup.telemetry.peer_health[run.id] = {
        rank: reply for rank, reply in healths.items() if isinstance(reply, PartHealth)
    }
    for rank, reply in replies.items():
        old = view.parts[rank]
        if isinstance(reply, ClientError):
            view.parts[rank] = old.model_copy(update={"error": str(reply)})
        elif isinstance(reply, AttemptRecord) and reply.attempt == run.attempt:
            view.parts[rank] = old.model_copy(
                update={"state": reply.state, "reason": reply.reason, "seen_at": now, "error": None}
            )


def _own(sup: Supervisor, run: RunRecord) -> Part | None:
    part = sup.parts.get(run.id)
    return part if part is not None and part.record.attempt == run.attempt else None


def part_views(sup: Supervisor, run: RunRecord, view: GangView | None) -> list[PartView]:
    own = _own(sup, run)
    mine = PartView(
        node_rank=run.node_rank,
        node=run.nodes[run.node_rank],
        state=own.record.state if own else None,
        reason=own.record.reason if own else None,
        seen_at=sup.clock(),
    )
    others = list(view.parts.values()) if view is not None and run.is_coordinator else []
    return [mine, *others]


async def tick(sup: Supervisor, now: float) -> None:
    for run in list(sup.runs.values()):
        if not run.is_coordinator:
            continue
        if run.state is RunState.PENDING and run.next_restart_at is not None:
            if now >= run.next_restart_at:
                try:
                    await start_attempt(sup, run, why="automatic restart", automatic=True)
                except ProtocolError as exc:
                    log.error("run %s: restart failed: %s", run.id, exc.message)
            continue
        if run.state.terminal:
            continue
        view = sup.views.get(run.id)
        if view is None:
            view = sup.views[run.id] = GangView(run.nodes)
        if len(run.nodes) > 1 and now - view.last_poll >= POLL_S:
            await _poll(sup, run, view, now)
        await _decide(sup, sup.runs[run.id], view)


async def _decide(sup: Supervisor, run: RunRecord, view: GangView) -> None:
    own = _own(sup, run)
    states: dict[int, RunState | None] = {0: own.record.state if own else None}
    states.update({rank: part.state for rank, part in view.parts.items()})
    new = gang_state(list(states.values()), run.stop_requested)
    failed = [rank for rank, state in states.items() if state is RunState.FAILED]
    reason = run.reason
    if new is RunState.FAILED:
        rank = failed[0]
        why = own.record.reason if rank == 0 and own else view.parts[rank].reason
        where = sup.node if rank == 0 else (run.nodes[rank].name or run.nodes[rank].control)
        reason = f"node {rank} ({where}) failed: {why}"
        if not view.propagated:
            view.propagated = True
            if len(run.nodes) > 1:
                sup.event(run, "propagate", f"{reason}; stopping the other parts", "warning")
            # The others are most likely stuck in a collective with the dead ranks: no
            # handshake, straight to SIGTERM.
            if own is not None and not own.record.state.terminal:
                sup._stop_own_part(run, force=False, reason=reason, grace_s=0.0)
                run = sup.runs[run.id]
            await stop_peers(sup, run, force=False, reason=reason)
        everyone_done = all(s is not None and s.terminal for s in states.values())
        if everyone_done:
            await _maybe_restart(sup, run, own, reason)
            return
        # Not over until every part has ended (and a restart may follow): stopping.
        new, reason = RunState.STOPPING, f"{reason}; stopping the other parts"
    elif new is RunState.RUNNING:
        reason = f"attempt {run.attempt}"
    elif new is RunState.SUCCEEDED:
        reason = "every part finished"
    elif new is RunState.STOPPED:
        reason = run.reason if run.state is RunState.STOPPING else "stopped"
    sup._set_run_state(run, new, reason)


async def _maybe_restart(
    sup: Supervisor, run: RunRecord, own: Part | None, reason: str | None
) -> None:
    spec = parse_spec(run.spec)
    teardown = own is not None and own.record.exit is not None and own.record.exit.teardown_abort
    if run.restarts < spec.restart.max_attempts and not teardown and not run.stop_requested:
        delay = min(spec.restart.backoff_s * 2**run.restarts, spec.restart.backoff_max_s)
        run = sup._save_run(run.model_copy(update={"next_restart_at": sup.clock() + delay}))
        sup._set_run_state(
            run,
            RunState.PENDING,
            f"{reason}; restarting in {delay:g}s "
            f"(restart {run.restarts + 1} of {spec.restart.max_attempts})",
        )
        return
    sup._set_run_state(run, RunState.FAILED, reason)


async def stop_peers(sup: Supervisor, run: RunRecord, force: bool, reason: str) -> None:
    if len(run.nodes) < 2:
        return
    replies = await _call_peers(
        sup,
        run,
        PART_STOP,
        lambda rank: PartStopRequest(run_id=run.id, force=force, reason=reason[:500]),
    )
    for rank, reply in replies.items():
        if isinstance(reply, ClientError):
            sup.event(
                run, "stop", f"could not reach node {rank} to stop its part: {reply}", "warning"
            )


def find_checkpoint(run: RunRecord) -> str | None:
    """The checkpoint a new attempt starts from, as `resume.latest` says to find it."""
    spec = parse_spec(run.spec)
    how = spec.resume.latest
    reported = run.last_checkpoint.path if run.last_checkpoint else None
    if how in ("reported", "auto") and reported and os.path.exists(reported):
        return reported
    if how in ("newest", "auto"):
        pattern = spec.resume.pattern
        if not os.path.isabs(pattern):
            pattern = os.path.join(run.checkpoint_dir, pattern)
        candidates = [p for p in glob.glob(pattern) if not os.path.basename(p).startswith(".")]
        if candidates:
            return max(candidates, key=os.path.getmtime)
    return None


async def start_attempt(
    sup: Supervisor, run: RunRecord, why: str, automatic: bool = False
) -> RunRecord:
    """A new attempt of the whole run, from the latest checkpoint: resume and restart."""
    spec = parse_spec(run.spec)
    attempt = run.attempt + 1
    resume_from = find_checkpoint(run)
    own = sup.parts.get(run.id)
    master_addr = own.record.master_addr if own else "127.0.0.1"
    try:
        port = pick_port(sup.store.leased_ports())
    except NoFreePort as exc:
        raise ProtocolError(ErrorCode.UNAVAILABLE, str(exc)) from None
    sup.store.lease_port(port, run.id, attempt, sup.clock())
    run = sup._save_run(
        run.model_copy(
            update={
                "attempt": attempt,
                "stop_requested": False,
                "next_restart_at": None,
                "restarts": run.restarts + (1 if automatic else 0),
            }
        )
    )
    sup.views[run.id] = GangView(run.nodes)
    start = "from " + resume_from if resume_from else "from scratch (no checkpoint found)"
    sup.event(run, "attempt", f"attempt {attempt}: {why}, {start}")
    sup._start_part(run, spec, attempt, master_addr, port, resume_from)
    run = sup._set_run_state(run, RunState.STARTING, f"attempt {attempt}: {why}")
    replies = await _call_peers(
        sup,
        run,
        PART_START,
        lambda rank: PartStartRequest(
            run_id=run.id,
            attempt=attempt,
            master_addr=master_addr,
            master_port=port,
            resume_from=resume_from,
        ),
    )
    failed = {rank: reply for rank, reply in replies.items() if isinstance(reply, Exception)}
    if failed:
        rank, error = next(iter(failed.items()))
        message = f"node {rank} could not start attempt {attempt}: {error}"
        run = sup._save_run(run.model_copy(update={"stop_requested": True}))
        sup._stop_own_part(run, force=True, reason=message, grace_s=0.0)
        await stop_peers(sup, run, force=True, reason=message)
        raise ProtocolError(ErrorCode.UNAVAILABLE, message)
    return sup.runs[run.id]


def metrics_event(run_id: str, points: list[MetricPoint]) -> RunMetricsEvent:
    return RunMetricsEvent(
        run_id=run_id,
        attempt=points[-1].attempt,
        points=[{"step": p.step, "time": p.time, "values": p.values} for p in points],
    )


def log_event(node: str, run: RunRecord, part: Part, lines: list[str]) -> RunLogEvent:
    return RunLogEvent(
        node=node,
        node_rank=run.node_rank,
        attempt=part.record.attempt,
        offset=part.record.log_offset,
        lines=lines,
    )
