"""What node 0 does with a gang, decided from plain records: no sockets, no clock of its own.

`decide()` takes the run, what node 0 last saw of every part (its own included) and the
time, and returns one `GangDecision`: the run's state and reason, the parts to mark
`lost`, whether to stop the other parts because one failed, and when to restart. The gang
(`gang.py`) carries decisions out; tests drive this module with a fake clock.

- A part is **lost** when its node has not answered for `lost_after_s` (counted from the
  last answer, or from the start of the attempt if it never answered) while the part was
  not over. A lost part counts as over: nothing more will be heard from it.
- A **failed** or lost part fails the run: the other parts are stopped (once), and when
  every part is over the run ends `failed` with one `FailureCause` — the earliest one the
  failed parts found, or "node N lost" — or waits in `pending` for an automatic restart.
- A restart needs restarts left, a cause whose kind is in `restart.on`, and a failure that
  is not the same error at the same step as the attempt before.
- A **user stop** ends the run `stopped` once every part is over, lost ones included —
  unless the run was already failing (a failure propagated before the stop): then it ends
  `failed` with that failure, as it would have without the stop.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from gpud.model.run import (
    DEFAULT_RESTART_ON,
    EARLY_EXIT,
    EARLY_EXIT_SOURCE,
    ECHO_KINDS,
    CauseKind,
    FailureCause,
    NodeRef,
    RunRecord,
    RunState,
    cause_precedence,
)
from gpud.runs.diagnosis import hints
from gpud.wire.run_messages import PartView

#: A part that failed on a connection error (most often a peer's death seen from the
#: other side) waits this long before the other parts are stopped, so that the part
#: whose rank died first can say why: stopped first, its torchrun is cut short before its
#: summary, and the run's cause would be the echo.
ECHO_GRACE_S = 1.5


@dataclass(frozen=True)
class RestartPolicy:
    max_attempts: int = 0
    backoff_s: float = 10.0
    backoff_max_s: float = 300.0
    on: frozenset[CauseKind] = frozenset(DEFAULT_RESTART_ON)
    #: An elastic run: its next attempt leaves a lost node out instead of waiting for it.
    elastic: bool = False

    def delay(self, restarts: int) -> float:
        return float(min(self.backoff_s * 2**restarts, self.backoff_max_s))

    def refusal(self, run: RunRecord, cause: FailureCause) -> str | None:
        """Why this failure gets no restart although restarts are left; None: restart."""
        if cause.kind not in self.on:
            return f"not restarted: {cause.kind.value} is not in restart.on"
        before = run.cause
        if before is not None and before.attempt == run.attempt - 1 and cause.same_failure(before):
            return f"not restarted: the same error at the same step as attempt {before.attempt}"
        return None


@dataclass(frozen=True)
class GangDecision:
    state: RunState
    reason: str | None
    lost: list[int] = field(default_factory=list)
    #: Stop the other parts, recording them as failed for this reason.
    propagate: str | None = None
    #: Start the next attempt at this time (the run waits in `pending` until then).
    restart_at: float | None = None
    #: Why the run failed, structured (its one line is `reason`'s start).
    cause: FailureCause | None = None


def gang_state(states: list[RunState | None], user_stop: bool) -> RunState:
    """One state for the run from its parts' states (None: not heard from yet)."""
    known = [s or RunState.PENDING for s in states]
    everyone_done = all(s.terminal for s in known)
    if user_stop:
        return RunState.STOPPED if everyone_done else RunState.STOPPING
    if RunState.FAILED in known or RunState.LOST in known:
        return RunState.FAILED
    if everyone_done:
        if all(s is RunState.SUCCEEDED for s in known):
            return RunState.SUCCEEDED
        return RunState.STOPPED
    for state in (RunState.STOPPING, RunState.RUNNING, RunState.STARTING):
        if state in known:
            return state
    return RunState.PENDING


def newly_lost(
    parts: dict[int, PartView], own_rank: int, since: float, now: float, lost_after_s: float
) -> list[int]:
    """The other nodes' parts that are not over and whose node has been silent too long."""
    lost = []
    for rank, part in parts.items():
        if rank == own_rank or (part.state is not None and part.state.terminal):
            continue
        if now - (part.seen_at or since) >= lost_after_s:
            lost.append(rank)
    return lost


def _where(run: RunRecord, rank: int, part: PartView) -> str:
    return part.node.name or part.node.control.removeprefix("tcp://")


def failure_of(
    run: RunRecord,
    parts: dict[int, PartView],
    states: dict[int, RunState | None],
    lost_after_s: float,
    step: int | None,
) -> FailureCause | None:
    """The run's cause: a lost node, else the cause the failed parts found — one that is
    not a connection error first (those are most often a dead peer's echo), then the
    earliest. None when no failed part knows why."""
    gone = sorted(rank for rank, s in states.items() if s is RunState.LOST)
    if gone:
        rank = gone[0]
        return FailureCause(
            kind=CauseKind.NETWORK,
            summary=f"lost, no answer for {lost_after_s:g}s",
            node_rank=rank,
            node=_where(run, rank, parts[rank]),
            source="gang",
            attempt=run.attempt,
            step=step,
        )
    failed = sorted(r for r, s in states.items() if s is RunState.FAILED)
    found = [(cause, r) for r in failed if (cause := parts[r].cause) is not None]
    if not found:
        return None
    cause, rank = min(found, key=lambda c: (*cause_precedence(c[0]), c[1]))
    early = early_exit(run, parts, states, cause, step)
    if early is not None and early.source != EARLY_EXIT_SOURCE:
        return early  # a part that ended with exit 0: it says where itself
    cause = early or cause
    return cause.model_copy(
        update={
            "node_rank": rank,
            "node": _where(run, rank, parts[rank]),
            "attempt": run.attempt,
            # The failing rank's own last step where it said; else the run's latest.
            "step": cause.step if cause.step is not None else step,
        }
    )


def early_exit(
    run: RunRecord,
    parts: dict[int, PartView],
    states: dict[int, RunState | None],
    best: FailureCause,
    step: int | None,
) -> FailureCause | None:
    """A part whose ranks exited 0 while the others trained: its script ended early, and
    the others' connection errors are the echo (issue 26 §3). Its node says so (torchrun
    waited at its exit barrier: `Part.early_exit`), or, where nothing waits (one process
    per node), its part simply ended with exit 0 while another failed with nothing but
    connection errors. Not when the run had done its steps (a failure at teardown)."""
    max_steps = (run.spec.get("training") or {}).get("max_steps")
    if isinstance(max_steps, int) and step is not None and step + 1 >= max_steps:
        return None
    at = f" after step {step}" if step is not None else ""  # the last seen, as numbered
    if best.source == EARLY_EXIT_SOURCE:
        return best.model_copy(
            update={"summary": best.summary.replace(" exited 0", f" exited 0{at}", 1)}
        )
    if best.kind not in ECHO_KINDS:
        return None
    done = sorted(r for r, s in states.items() if s is RunState.SUCCEEDED)
    if not done:
        return None
    rank = done[0]
    one = run.spec.get("nproc_per_node") == 1 or run.spec.get("launcher") == "python"
    who = f"rank {rank}" if one else f"node {rank}'s ranks"
    return FailureCause(
        kind=CauseKind.USER,
        summary=f"{who} exited 0{at}" + EARLY_EXIT.removeprefix("exited 0"),
        rank=rank if one else None,
        node_rank=rank,
        node=_where(run, rank, parts[rank]),
        source="gang",
        attempt=run.attempt,
        step=step,
        lines=[f"the others saw: {best.summary}"],
    )


def _unexplained(
    run: RunRecord, parts: dict[int, PartView], rank: int, step: int | None
) -> FailureCause:
    return FailureCause(
        kind=CauseKind.UNKNOWN,
        summary=parts[rank].reason or "failed",
        node_rank=rank,
        node=_where(run, rank, parts[rank]),
        source="gang",
        attempt=run.attempt,
        step=step,
    )


def _with_findings(failure: FailureCause, parts: dict[int, PartView]) -> FailureCause:
    """The cause with every part's flight-recorder findings."""
    found = [f for p in parts.values() for f in p.flight_recorder]
    if not found:
        return failure
    return failure.model_copy(update={"flight_recorder": list(dict.fromkeys(found))})


def decide(
    run: RunRecord,
    parts: dict[int, PartView],
    *,
    now: float,
    since: float,
    lost_after_s: float,
    restart: RestartPolicy,
    cause: FailureCause | None = None,
    teardown_abort: bool = False,
    step_of: Callable[[], int | None] = lambda: None,
) -> GangDecision:
    """The run's next state from its parts (rank → view, node 0's own part included).

    `cause`: the failure already propagated to the other parts (they end `failed` because
    of it, so it stays the run's cause rather than one of their echoes). `step_of`: the
    run's latest step, asked only when it fails.
    """
    lost = newly_lost(parts, run.node_rank, since, now, lost_after_s)
    states = {rank: RunState.LOST if rank in lost else p.state for rank, p in parts.items()}
    everyone_done = all(s is not None and s.terminal for s in states.values())
    gone = sorted(rank for rank, s in states.items() if s is RunState.LOST)
    lost_note = "; ".join(f"node {r} ({_where(run, r, parts[r])}) lost" for r in gone)
    new = gang_state(list(states.values()), run.stop_requested)

    if run.stop_requested:
        if new is RunState.STOPPED and cause is not None and run.state is not RunState.PENDING:
            # It was failing before the stop came (the failure was propagated): it failed,
            # and the stop only hurried its end. No restart: a person asked it to stop.
            failing = hints.for_run(_with_findings(cause, parts))
            note = "; a stop was asked while the other parts were stopping"
            return GangDecision(RunState.FAILED, failing.one_line() + note, lost, cause=failing)
        if new is RunState.STOPPED:
            reason = run.reason if run.state is RunState.STOPPING else "stopped"
            if lost_note:
                reason = f"{reason or 'stopped'}; {lost_note}"
            return GangDecision(RunState.STOPPED, reason, lost)
        return GangDecision(new, run.reason, lost)

    if new is RunState.FAILED:
        # The parts' own causes win over the one propagated (a part that lost the race
        # to report may still hold the first cause); the parts stopped because of it have
        # none of their own.
        step = step_of()
        if cause is not None and cause.kind is CauseKind.HANG:
            failure: FailureCause | None = cause  # the gang stopped it: the rest are echoes
        else:
            failure = failure_of(run, parts, states, lost_after_s, step) or cause
        if failure is None:
            failed = min(r for r, s in states.items() if s is RunState.FAILED)
            failure = _unexplained(run, parts, failed, step)
        failure = hints.for_run(_with_findings(failure, parts))
        reason = failure.one_line()
        propagate = None if cause is not None or (len(parts) == 1 and not gone) else reason
        if not everyone_done:
            return GangDecision(
                RunState.STOPPING,
                f"{reason}; stopping the other parts",
                lost,
                propagate,
                cause=failure,
            )
        if run.restarts < restart.max_attempts and not teardown_abort:
            refusal = restart.refusal(run, failure)
            if refusal is not None:
                return GangDecision(
                    RunState.FAILED, f"{reason}; {refusal}", lost, propagate, cause=failure
                )
            count = f"restart {run.restarts + 1} of {restart.max_attempts}"
            if gone and restart.elastic:
                # Not a crash loop: the node is gone, and the next attempt leaves it out.
                # No backoff (it would only add to the time the run does not train).
                delay = 0.0
                nodes = ", ".join(str(r) for r in gone)
                why = f"{reason}; restarting now without node {nodes} ({count})"
            else:
                delay = restart.delay(run.restarts)
                why = f"{reason}; restarting in {delay:g}s ({count})"
                if gone:
                    why += " once every node answers"
            return GangDecision(
                RunState.PENDING, why, lost, propagate, restart_at=now + delay, cause=failure
            )
        return GangDecision(RunState.FAILED, reason, lost, propagate, cause=failure)

    if new is RunState.RUNNING:
        return GangDecision(new, f"attempt {run.attempt}", lost)
    if new is RunState.SUCCEEDED:
        return GangDecision(new, "every part finished", lost)
    if new is RunState.STOPPED:
        return GangDecision(new, run.reason if run.state is RunState.STOPPING else "stopped", lost)
    return GangDecision(new, run.reason, lost)


@dataclass
class GangView:
    """The other nodes' parts of the current attempt, as node 0 last saw them."""

    nodes: list[NodeRef]
    since: float
    #: The run's nodes in this attempt (None: all); an elastic attempt may use fewer.
    members: list[int] | None = None
    parts: dict[int, PartView] = field(default_factory=dict)
    last_poll: float = 0.0
    cause: FailureCause | None = None  # the failure propagated to every part
    #: When a failure that reads as an echo (a connection error) was first seen: the
    #: others are stopped ECHO_GRACE_S later, unless the part that failed first says why.
    echo_since: float | None = None

    def __post_init__(self) -> None:
        ranks = self.members if self.members is not None else range(len(self.nodes))
        self.parts = {
            rank: PartView(node_rank=rank, node=self.nodes[rank]) for rank in ranks if rank > 0
        }


def echo_wait(view: GangView, decision: GangDecision, now: float) -> bool:
    """Whether to hold the stop of the other parts a little: the failure so far is a
    connection error (the echo of a peer's death, as often as not) on nodes that all
    still answer, first seen less than ECHO_GRACE_S ago."""
    cause = decision.cause
    if cause is None or cause.kind not in ECHO_KINDS or decision.lost:
        return False
    if view.echo_since is None:
        view.echo_since = now
    return now - view.echo_since < ECHO_GRACE_S
