"""The run book: the one owner of run records and their states on this node.

Every run this daemon knows, this node's part of each (its current attempt), the store
they are written to, the run events and what is published about them. Every change of a
run's state goes through `move()`, which enforces the transition table of `gpud.model.run`
(`WITHIN` an attempt, `NEXT_ATTEMPT` to open the next one); every other change goes
through `update()`, typed by `RunChanges`. The supervisor, the gang, telemetry and the
queries all read and write runs here, and nowhere else.

An illegal move is a bug in gpud. Under `GPUD_STRICT_LIFECYCLE=1` (the tests set it) it
raises `IllegalTransition`; in production it is logged as an error and applied, so a run
never stays stuck in a state the daemon cannot leave.
"""

from __future__ import annotations

import logging
import os
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel
from typing_extensions import Unpack

from gpud.model.run import (
    AttemptChanges,
    RunChanges,
    RunEvent,
    RunRecord,
    RunState,
    can_move,
)
from gpud.model.snapshot import Severity
from gpud.node.store import Store
from gpud.security.auth import Caller
from gpud.security.roles import Role
from gpud.wire.envelope import ErrorCode, ProtocolError
from gpud.wire.protocol import run_topic
from gpud.wire.run_messages import RunSummary
from launch.spec import RunSpec, parse_spec

if TYPE_CHECKING:
    from gpud.runs.state.part import Part

log = logging.getLogger("gpud.runs")

Publish = Callable[[str, BaseModel], None]
STRICT_ENV = "GPUD_STRICT_LIFECYCLE"
#: How often `RunBook.ticked` is recomputed even when nothing said it changed (a part that
#: ended by itself leaves it then).
TICKED_REFRESH_S = 5.0


class IllegalTransition(RuntimeError):
    """A move the transition table does not allow (a bug in gpud)."""


def check_coordinator(run: RunRecord, caller: Caller) -> None:
    """A peer may act on a run only if it is that run's node 0; ProtocolError forbidden."""
    if caller.role is Role.PEER and (
        run.coordinator is None or caller.key != run.coordinator.server_key
    ):
        raise ProtocolError(
            ErrorCode.FORBIDDEN, f"your key does not coordinate run {run.id} on this node"
        )


def check_member(run: RunRecord, caller: Caller) -> None:
    """A peer may ask node 0 about a run only if it is one of that run's other nodes;
    ProtocolError forbidden."""
    if caller.role is Role.PEER and (
        not run.is_coordinator or caller.key not in {n.server_key for n in run.nodes[1:]}
    ):
        raise ProtocolError(
            ErrorCode.FORBIDDEN, f"your key is not a node of run {run.id} on this node"
        )


class RunBook:
    def __init__(
        self,
        node: str,
        store: Store,
        publish: Publish,
        clock: Callable[[], float],
        strict: bool | None = None,
    ) -> None:
        self.node = node
        self.store = store
        self.publish = publish
        self.clock = clock
        self.strict = os.environ.get(STRICT_ENV) == "1" if strict is None else strict
        self._runs: dict[str, RunRecord] = {}
        #: Each run's spec, parsed once from its stored dict (a run's spec never changes).
        self._specs: dict[str, RunSpec] = {}
        self._parts: dict[str, Part] = {}  # run id → this node's part of its latest attempt
        self._ticked: list[str] | None = None  # `ticked`'s run ids; None: to be recomputed
        self._ticked_at = 0.0
        self._busy: list[str] | None = None  # `busy_parts`' run ids, the same way
        self._ended: deque[tuple[float, str]] = deque()  # (when, run id), as runs end
        self._busy_at = 0.0
        #: Called after a run's state became terminal (the final health, for one).
        self.on_ended: list[Callable[[RunRecord], None]] = []
        #: Called after every move, with the run as it is now (alerts: gpud.notify).
        self.on_moved: list[Callable[[RunRecord], None]] = []
        #: Called when the ticks may have something new to look at: a run or part added
        #: or read back, a part's log to read again (the supervisor's idle tick wakes).
        self.on_work: list[Callable[[], None]] = []

    # ------------------------------------------------------------------ reading

    def get(self, run_id: str) -> RunRecord | None:
        return self._runs.get(run_id)

    def spec(self, run: RunRecord) -> RunSpec:
        """The run's spec, typed: the one place a stored run's spec dict becomes a
        `RunSpec`, parsed the first time it is asked for and kept (a spec never changes
        after the run is made; an unknown run's is parsed, not kept)."""
        spec = self._specs.get(run.id)
        if spec is None:
            spec = parse_spec(run.spec, f"run {run.id}")
            if run.id in self._runs:
                self._specs[run.id] = spec
        return spec

    def runs(self) -> list[RunRecord]:
        return list(self._runs.values())

    def ticked(self) -> list[RunRecord]:
        """The runs the ticks look at: not ended, or ended with this node's part still
        live (a stop it missed). A daemon holds a thousand finished runs until retention
        removes them; ticks that walked them all cost an idle daemon half a percent of a
        core. Recomputed when a run or part starts or ends, and every `TICKED_REFRESH_S`."""
        now = self.clock()
        ids = self._ticked  # read once: the sampler thread calls `live_shims` too
        if ids is None or now - self._ticked_at >= TICKED_REFRESH_S:
            ids = [i for i, run in list(self._runs.items()) if self._ticks(run)]
            self._ticked, self._ticked_at = ids, now
        runs = [self._runs.get(i) for i in ids]
        return [run for run in runs if run is not None]

    def ended_since(self, since: float) -> list[RunRecord]:
        """The runs held that ended at or after `since`, newest first (the node brief's:
        it must not walk the thousand finished runs a daemon holds, once a second)."""
        while self._ended and self._ended[0][0] < since:
            self._ended.popleft()
        found: dict[str, RunRecord] = {}
        for _, run_id in reversed(self._ended):
            run = self._runs.get(run_id)
            if run is not None and run.state.terminal and run.state_since >= since:
                found.setdefault(run_id, run)
        return list(found.values())

    def live_shims(self) -> list[int | None]:
        """The shim pids of this node's parts not ended (the simulated GPUs' load)."""
        found = []
        for run in self.ticked():
            part = self._parts.get(run.id)
            if part is not None and not part.record.state.terminal:
                found.append(part.record.shim_pid)
        return found

    def _ticks(self, run: RunRecord) -> bool:
        if not run.state.terminal:
            return True
        part = self._parts.get(run.id)
        return part is not None and not part.record.state.terminal

    def find(self, ref: str) -> RunRecord:
        """A run by id, else the newest run of that name; ProtocolError not_found."""
        if ref in self._runs:
            return self._runs[ref]
        run = self.store.run(ref)
        if run is not None:
            return run
        named = [r for r in self.store.runs(limit=1000) if r.name == ref]
        if named:
            return named[0]
        raise ProtocolError(ErrorCode.NOT_FOUND, f"no run {ref!r} on node {self.node}")

    def queue(self) -> list[RunRecord]:
        """This node's queue: the runs waiting for GPUs here, first come first."""
        waiting = [run for run in self._runs.values() if run.state is RunState.QUEUED]
        return sorted(waiting, key=lambda run: run.queue_key)

    def ahead_of(self, run: RunRecord, key: tuple[float, str]) -> list[RunRecord]:
        """The queued runs here that come before `key` (other than the run itself)."""
        return [r for r in self.queue() if r.id != run.id and r.queue_key < key]

    def known(self, run_id: str) -> RunRecord | None:
        """A run from memory or the store, without the not-found error."""
        return self._runs.get(run_id) or self.store.run(run_id)

    def forget(self, run_id: str) -> None:
        """Let go of an ended run retention removes (gpud.retention): it is unknown after."""
        self._runs.pop(run_id, None)
        self._specs.pop(run_id, None)
        self._parts.pop(run_id, None)
        self._ticked = self._busy = None

    # ------------------------------------------------------------------ runs

    def load(self, run: RunRecord) -> None:
        """Hold a run read back from the store (adoption after a daemon restart)."""
        self._runs[run.id] = run
        self._ticked = None
        self._work()

    def add(self, run: RunRecord) -> RunRecord:
        """A new run, as launched or joined here."""
        old = self._runs.get(run.id)
        if old is None or old.state.terminal != run.state.terminal:
            self._ticked = None
            self._work()
        self._runs[run.id] = run
        self.store.put_run(run)
        return run

    def update(self, run_id: str, **changes: Unpack[RunChanges]) -> RunRecord:
        """Change anything but the state (that is `move`)."""
        run = self._runs[run_id].model_copy(update=dict(changes))
        return self.add(run)

    def note_step(self, run_id: str, step: int) -> None:
        """The newest step seen in metrics (memory only: the store has the metrics)."""
        run = self._runs.get(run_id)
        if run is not None and (run.last_step is None or step > run.last_step):
            self._runs[run_id] = run.model_copy(update={"last_step": step})

    def move(
        self,
        run_id: str,
        state: RunState,
        reason: str | None,
        *,
        next_attempt: bool = False,
        **changes: Unpack[RunChanges],
    ) -> RunRecord:
        """The one way a run changes state: checked, stored, logged, evented, published."""
        run = self._runs[run_id]
        if changes:
            run = self.update(run_id, **changes)
        if run.state == state and run.reason == reason:
            return run
        if not can_move(run.state, state, next_attempt):
            message = (
                f"illegal run state transition: run {run.id} (attempt {run.attempt}) "
                f"{run.state.value} → {state.value} ({reason})"
            )
            if self.strict:
                raise IllegalTransition(message)
            log.error("%s; applied anyway", message)
        run = self.add(
            run.model_copy(update={"state": state, "state_since": self.clock(), "reason": reason})
        )
        self.event(run, "state", f"{state.value}: {reason or ''}".rstrip(": "))
        self.publish(run_topic(run.id, "state"), self.summary(run))
        level = logging.WARNING if state is RunState.FAILED else logging.INFO
        log.log(
            level,
            "run %s (attempt %d): %s%s",
            run.id,
            run.attempt,
            state.value,
            f" — {reason}" if reason else "",
        )
        if state.terminal:
            self._ended.append((run.state_since, run.id))
            if run.is_coordinator:
                self.store.release_ports(run.id)
            self._call(self.on_ended, run)
        self._call(self.on_moved, run)
        return run

    @staticmethod
    def _call(hooks: list[Callable[[RunRecord], None]], run: RunRecord) -> None:
        for hook in hooks:
            try:
                hook(run)
            except Exception:  # a view of the move must never undo the move
                log.exception("run %s: a hook on its move to %s failed", run.id, run.state.value)

    def cancel_queued(self, run_id: str, reason: str) -> RunRecord:
        """A queued run is stopped before it started: it leaves the queue as `stopped`."""
        return self.move(
            run_id,
            RunState.STOPPED,
            f"{reason} (cancelled while queued)",
            stop_requested=True,
            queued_restart=False,
        )

    def event(
        self,
        run: RunRecord,
        kind: str,
        message: str,
        severity: Severity = "info",
        **data: Any,
    ) -> None:
        event = RunEvent(
            run_id=run.id,
            attempt=run.attempt,
            time=self.clock(),
            node=self.node,
            kind=kind,
            severity=severity,
            message=message,
            data=data,
        )
        self.store.add_run_event(event)
        self.publish(run_topic(run.id, "event"), event)

    # ------------------------------------------------------------------ parts

    def part(self, run_id: str) -> Part | None:
        """This node's part of the run's latest attempt here (None: none started)."""
        return self._parts.get(run_id)

    def current_part(self, run: RunRecord) -> Part | None:
        """This node's part of the run's *current* attempt."""
        part = self._parts.get(run.id)
        return part if part is not None and part.record.attempt == run.attempt else None

    def parts(self) -> list[tuple[RunRecord, Part]]:
        return [(self._runs[i], p) for i, p in list(self._parts.items()) if i in self._runs]

    def busy_parts(self) -> list[tuple[RunRecord, Part]]:
        """The parts a tick still has to look at: not ended with their log and metrics read
        to the end. A daemon keeps a thousand finished runs; its ticks must not cost more
        for them (four times a second, each of them cost an idle daemon 1 % of a core; even
        the walk to skip them cost 0.1 %). A part only becomes busy when it is added or
        `part_busy_again`; one done is dropped within `TICKED_REFRESH_S`."""
        now = self.clock()
        ids = self._busy
        if ids is None or now - self._busy_at >= TICKED_REFRESH_S:
            ids = [i for i, p in list(self._parts.items()) if not (p.log_done and p.metrics_done)]
            self._busy, self._busy_at = ids, now
        found = []
        for i in ids:
            part, run = self._parts.get(i), self._runs.get(i)
            if part is not None and run is not None:
                found.append((run, part))
        return found

    def part_busy_again(self) -> None:
        """A part's log or metrics are to be read again: the ticks look at it now."""
        self._busy = None
        self._work()

    def add_part(self, part: Part) -> None:
        self._parts[part.record.run_id] = part
        self._ticked = self._busy = None
        self.store.put_attempt(part.record)
        self._work()

    def update_part(self, part: Part, **changes: Unpack[AttemptChanges]) -> None:
        ended = part.record.state.terminal
        part.update(**changes)
        if part.record.state.terminal != ended:
            self._ticked = None
            self._work()
        self.store.put_attempt(part.record)

    def _work(self) -> None:
        for wake in self.on_work:
            wake()

    # ------------------------------------------------------------------ views

    def summary(self, run: RunRecord) -> RunSummary:
        part = self._parts.get(run.id)
        attempt = part.record if part else None
        latest = self.store.latest_metrics(run.id)
        spec = run.spec
        return RunSummary(
            id=run.id,
            name=run.name,
            state=run.state,
            state_since=run.state_since,
            reason=run.reason,
            attempt=run.attempt,
            restarts=run.restarts,
            created_at=run.created_at,
            node_rank=run.node_rank,
            nodes=run.nodes,
            nproc=attempt.nproc if attempt else None,
            gpus=attempt.held_gpus if attempt else [],
            launcher=str(spec.get("launcher", "torchrun")),
            last_step=latest[0] if latest else run.last_step,
            max_steps=(spec.get("training") or {}).get("max_steps"),
            last_values=latest[1] if latest else {},
            last_checkpoint=run.last_checkpoint,
            next_restart_at=run.next_restart_at,
            queued_at=run.queued_at if run.state is RunState.QUEUED else None,
            queue_position=self._position(run),
            cause=run.cause,
            start=attempt.start if attempt else None,
            attached=run.attached,
            members=run.members,
            world_size=attempt.world_size if attempt else None,
            elastic=spec.get("elastic") is not None,
            planned_nodes=len(run.nodes) - len((spec.get("elastic") or {}).get("spares") or []),
            goodput=run.goodput,
        )

    def _position(self, run: RunRecord) -> int | None:
        if run.state is not RunState.QUEUED:
            return None
        return 1 + len(self.ahead_of(run, run.queue_key))
