"""Quarantines and drains on this node: what takes no new work, why, since when, by whom.

Kept in the store (`holds`: a GPU's UUID, or NODE for the whole node), so a quarantine
survives a daemon restart. gpud quarantines a GPU itself when `rules.unsafe` says so; an
operator drains a GPU or the node and undrains it (`node.drain`, `node.undrain`, audited
as every operator action). A GPU held either way is never leased (`GpuLeases.choose`);
a drained node leases nothing. The snapshot carries each hold (`GpuSample.hold`,
`NodeSnapshot.drained`), so `gpuctl hw`, gputop and /metrics read one answer.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from gpud.heal import rules
from gpud.model.snapshot import GpuSample, Hold, NodeEvent, NodeSnapshot
from gpud.node.store import Store

log = logging.getLogger("gpud.heal")

#: The store's target for a drain of the whole node.
NODE = "node"


class HoldError(ValueError):
    """A drain or undrain that cannot be done (one line that says why)."""


class Holds:
    def __init__(self, store: Store, node: str, clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self.node = node
        self.clock = clock
        self._gpus: dict[str, tuple[int | None, Hold]] = {}
        self._node: Hold | None = None
        for target, index, hold in store.holds():
            if target == NODE:
                self._node = hold
            else:
                self._gpus[target] = (index, hold)
        self._checked_at = clock()
        self._before: dict[str, GpuSample] = {}

    # ------------------------------------------------------------------ reading

    @property
    def node_hold(self) -> Hold | None:
        return self._node

    def gpu_hold(self, uuid: str) -> Hold | None:
        held = self._gpus.get(uuid)
        return held[1] if held else None

    def held_gpus(self) -> dict[str, Hold]:
        return {uuid: hold for uuid, (_, hold) in self._gpus.items()}

    def annotate(self, snapshot: NodeSnapshot) -> NodeSnapshot:
        """The snapshot with every hold on it as it is now (the same object if no change)."""
        gpus = [
            g if g.hold == (hold := self.gpu_hold(g.uuid)) else g.model_copy(update={"hold": hold})
            for g in snapshot.gpus
        ]
        if snapshot.drained == self._node and all(
            a is b for a, b in zip(gpus, snapshot.gpus, strict=True)
        ):
            return snapshot
        return snapshot.model_copy(update={"gpus": gpus, "drained": self._node})

    # ------------------------------------------------------------------ gpud's own

    def observe(self, snapshot: NodeSnapshot) -> list[tuple[GpuSample, Hold, NodeEvent]]:
        """Quarantine each GPU this sample shows unsafe; returns the new quarantines."""
        since, self._checked_at = self._checked_at, snapshot.time
        found = []
        for gpu in snapshot.gpus:
            before = self._before.get(gpu.uuid)
            self._before[gpu.uuid] = gpu
            if gpu.uuid in self._gpus and self._gpus[gpu.uuid][1].kind == "quarantine":
                continue
            why = rules.unsafe(before, gpu, since)
            if why is not None:
                found.append((gpu, *self.quarantine(gpu, why, snapshot.time)))
        return found

    def quarantine(self, gpu: GpuSample, why: str, now: float) -> tuple[Hold, NodeEvent]:
        """Quarantine one GPU (what a sample showed, or a failed preflight check)."""
        hold = Hold(kind="quarantine", reason=why, since=now)
        self._put(gpu.uuid, gpu.index, hold)
        message = f"GPU {gpu.index} ({gpu.uuid}) quarantined: {why}; it gets no new work"
        log.warning("%s", message)
        event = NodeEvent(
            node=self.node, time=now, kind="quarantine", severity="critical",
            gpu_index=gpu.index, message=message, data={"uuid": gpu.uuid, "reason": why},
        )  # fmt: skip
        return hold, event

    # ------------------------------------------------------------------ an operator's

    def drain(
        self, gpus: list[GpuSample] | None, reason: str, by: str
    ) -> tuple[list[NodeEvent], list[str]]:
        """Drain the node (`gpus` None) or those GPUs; returns the events and notes (a GPU
        already quarantined keeps its quarantine)."""
        now = self.clock()
        hold = Hold(kind="drain", reason=reason, since=now, by=by)
        events: list[NodeEvent] = []
        notes: list[str] = []
        if gpus is None:
            self._node = hold
            self.store.put_hold(NODE, None, hold)
            events.append(self._event(now, None, f"node {self.node} drained by {by}: {reason}"))
            return events, notes
        for gpu in gpus:
            current = self.gpu_hold(gpu.uuid)
            if current is not None and current.kind == "quarantine":
                notes.append(f"GPU {gpu.index} stays quarantined: {current.reason}")
                continue
            self._put(gpu.uuid, gpu.index, hold)
            events.append(self._event(now, gpu.index, f"GPU {gpu.index} drained by {by}: {reason}"))
        return events, notes

    def undrain(self, gpus: list[GpuSample] | None, by: str) -> tuple[list[NodeEvent], list[str]]:
        """Lift the node's drain (`gpus` None), or each GPU's drain or quarantine; a GPU
        that still reads unsafe (lost, a remap pending, uncorrectable ECC) stays held."""
        now = self.clock()
        events: list[NodeEvent] = []
        notes: list[str] = []
        if gpus is None:
            if self._node is not None:
                self._node = None
                self.store.drop_hold(NODE)
                events.append(self._event(now, None, f"node {self.node} undrained by {by}"))
            for _uuid, (index, hold) in sorted(self._gpus.items(), key=lambda kv: kv[1][0] or 0):
                notes.append(
                    f"GPU {index} stays {'quarantined' if hold.kind == 'quarantine' else 'drained'}"
                    f" ({hold.reason}): undrain {self.node} --gpu {index}"
                )
            return events, notes
        for gpu in gpus:
            still = rules.unsafe_level(gpu) if gpu.uuid in self._gpus else None
            if still is not None:  # nothing is undrained then
                raise HoldError(f"GPU {gpu.index} still reads unsafe: {still}; reset it first")
        for gpu in gpus:
            if gpu.uuid not in self._gpus:
                notes.append(f"GPU {gpu.index} was not drained")
                continue
            del self._gpus[gpu.uuid]
            self.store.drop_hold(gpu.uuid)
            events.append(self._event(now, gpu.index, f"GPU {gpu.index} undrained by {by}"))
        return events, notes

    # ------------------------------------------------------------------ inside

    def _put(self, uuid: str, index: int, hold: Hold) -> None:
        self._gpus[uuid] = (index, hold)
        self.store.put_hold(uuid, index, hold)

    def _event(self, now: float, gpu_index: int | None, message: str) -> NodeEvent:
        return NodeEvent(
            node=self.node, time=now, kind="drain", severity="warning", gpu_index=gpu_index,
            message=message,
        )  # fmt: skip
