"""The daemon's side of quarantine and drain: each sample checked, the snapshot marked, and
the operator's `node.drain` and `node.undrain` served.

A new quarantine stops the runs on that GPU (`Supervisor.quarantined`: checkpoint, then
failed with the hardware as cause, and restarted on other GPUs by the run's policy). A
drain stops nothing: the runs on what was drained go on until they end, and the reply names
them so that `gpuctl drain --stop-runs` can stop each through its own node 0.
"""

from __future__ import annotations

from collections.abc import Callable

from gpud.heal.holds import HoldError, Holds
from gpud.model.run import CauseKind, FailureCause, RunRecord, RunState
from gpud.model.snapshot import GpuSample, Hold, NodeEvent, NodeSnapshot
from gpud.runs.lifecycle.supervisor import Supervisor
from gpud.runs.state.part import Outcome, Part
from gpud.security.auth import Caller
from gpud.wire.envelope import ErrorCode, ProtocolError
from gpud.wire.node_messages import DrainReply, DrainRequest, HeldGpu, UndrainRequest


class Healing:
    def __init__(
        self,
        holds: Holds,
        supervisor: Supervisor,
        latest: Callable[[], NodeSnapshot],
        replace_latest: Callable[[NodeSnapshot], None],
        emit: Callable[[list[NodeEvent]], None],
        acknowledge_xids: Callable[[int], object],
    ) -> None:
        self.holds = holds
        #: marks a GPU's XIDs handled (the daemon's `node.events.ack`)
        self._acknowledge_xids = acknowledge_xids
        self.supervisor = supervisor
        self._latest = latest
        self._replace_latest = replace_latest
        self._emit = emit
        #: Parts stopped because a GPU of theirs was quarantined: run → (attempt, cause).
        self._causes: dict[str, tuple[int, FailureCause]] = {}
        supervisor.explain.append(self._blame)
        supervisor.bad_gpus.append(self._failed_check)

    def observe(self, snapshot: NodeSnapshot) -> tuple[NodeSnapshot, list[NodeEvent]]:
        """Quarantine what this sample shows unsafe, stop the runs on it; the snapshot
        with every hold marked, and the quarantines' events."""
        events = []
        for gpu, hold, event in self.holds.observe(snapshot):
            events.append(event)
            self._stop_runs_on(gpu.index, gpu.uuid, hold)
        return self.holds.annotate(snapshot), events

    def _failed_check(self, run: RunRecord, failed: dict[int, str]) -> None:
        """GPUs of this node failed a preflight's matmul or memory check: quarantined (the
        attempt that checked them has not started; node 0 leaves this node out or starts
        nothing, and the next attempt leases other GPUs)."""
        latest = self._latest()
        by_index = {g.index: g for g in latest.gpus}
        events = []
        for index, why in sorted(failed.items()):
            gpu = by_index.get(index)
            current = self.holds.gpu_hold(gpu.uuid) if gpu is not None else None
            if gpu is None or (current is not None and current.kind == "quarantine"):
                continue
            reason = f"failed the preflight of run {run.id}: {why}"
            _hold, event = self.holds.quarantine(gpu, reason, self.supervisor.clock())
            events.append(event)
            self.supervisor.book.event(
                run, "quarantine", f"GPU {index} ({gpu.uuid}) quarantined: {why}", "critical"
            )
        if events:
            self._replace_latest(self.holds.annotate(latest))
            self._emit(events)

    def _stop_runs_on(self, index: int, uuid: str, hold: Hold) -> list[str]:
        """A GPU was quarantined: stop every part on it, with its checkpoint handshake, as
        failed with the hardware as its cause; the run's restart policy does the rest (on
        other GPUs: the quarantined one is never leased). Returns the runs stopped."""
        sup = self.supervisor
        stopped = []
        for run, part in sup.book.parts():
            record = part.record
            if record.state.terminal or part.external or uuid not in record.gpu_uuids:
                continue
            cause = FailureCause(
                kind=CauseKind.HARDWARE,
                summary=f"GPU {index} ({uuid}) quarantined: {hold.reason}",
                node_rank=run.node_rank,
                node=sup.node,
                attempt=record.attempt,
                step=run.last_step,
                time=hold.since,
                source="nvml",
            )
            self._causes[run.id] = (record.attempt, cause)
            reason = f"{cause.summary} ({cause.kind.label})"
            sup.book.event(run, "quarantine", f"{reason}; stopping with a checkpoint", "critical")
            sup.stop_part(run, force=False, reason=reason, failed=reason)
            stopped.append(run.id)
        return stopped

    def _blame(self, run: RunRecord, part: Part, outcome: Outcome) -> Outcome:
        """A part stopped for a quarantine failed because of it, whatever its ranks said."""
        held = self._causes.pop(run.id, None)
        if held is None or held[0] != part.record.attempt or outcome.state is not RunState.FAILED:
            return outcome
        cause = held[1]
        reason = f"{cause.summary} ({cause.kind.label})"
        return Outcome(outcome.state, reason, outcome.exit.model_copy(update={"cause": cause}))

    # ------------------------------------------------------------------ node.drain / undrain

    def drain(self, body: DrainRequest, caller: Caller) -> DrainReply:
        gpus = self._gpus(body.gpus)
        events, notes = self.holds.drain(gpus, body.reason, caller.name)
        return self._after(events, notes, self._runs_on(gpus))

    def undrain(self, body: UndrainRequest, caller: Caller) -> DrainReply:
        try:
            events, notes = self.holds.undrain(self._gpus(body.gpus), caller.name)
        except HoldError as exc:
            raise ProtocolError(ErrorCode.CONFLICT, str(exc)) from None
        # An operator who puts a GPU back has handled what held it: the XID that
        # quarantined it keeps it out of no preflight (gpud.heal.preflight) from now on.
        for index in sorted({e.gpu_index for e in events if e.gpu_index is not None}):
            self._acknowledge_xids(index)
        return self._after(events, notes, [])

    def _gpus(self, indices: list[int] | None) -> list[GpuSample] | None:
        if indices is None:
            return None
        if not indices:
            raise ProtocolError(ErrorCode.INVALID_BODY, "gpus: name at least one GPU, or omit it")
        by_index = {g.index: g for g in self._latest().gpus}
        unknown = sorted(set(indices) - set(by_index))
        if unknown:
            have = f"0-{len(by_index) - 1}" if by_index else "none"
            raise ProtocolError(
                ErrorCode.INVALID_BODY,
                f"{self.holds.node} has no GPU {', '.join(map(str, unknown))} (its GPUs: {have})",
            )
        return [by_index[i] for i in sorted(set(indices))]

    def _runs_on(self, gpus: list[GpuSample] | None) -> list[str]:
        uuids = None if gpus is None else {g.uuid for g in gpus}
        return sorted(
            run.id
            for run, part in self.supervisor.book.parts()
            if not part.record.state.terminal
            and (uuids is None or uuids & set(part.record.gpu_uuids))
        )

    def _after(self, events: list[NodeEvent], notes: list[str], runs: list[str]) -> DrainReply:
        latest = self.holds.annotate(self._latest())
        self._replace_latest(latest)  # a launch right after must see it, not a second later
        if events:
            self._emit(events)
        return DrainReply(
            node=self.holds.node,
            drained=self.holds.node_hold,
            gpus=[HeldGpu(index=g.index, uuid=g.uuid, hold=g.hold) for g in latest.gpus if g.hold],
            runs=runs,
            notes=notes,
        )
