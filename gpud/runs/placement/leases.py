"""GPU leases on this node: which GPUs each run's part holds, kept in SQLite.

A part leases its GPUs by UUID when it starts and gives them back when it ends, however it
ends (`Supervisor._settle`). The store's key is the UUID, so no GPU is ever leased twice,
across daemon restarts too. A GPU is busy when a lease holds it, or when a process outside
gpud holds more than `gpus.FOREIGN_MEMORY_BYTES` on it (NVML's, or the simulated sampler's,
process list); the choice itself is `gpud.runs.placement.gpus.choose`.

A multi-node run's GPUs are *reserved* first: node 0 asks every node to lease its part's
GPUs for the coming attempt and starts the attempt only when all of them could (else it
gives back what it got). The part that starts then uses its reservation. A reservation no
part came to use (node 0 went away in between) expires after `RESERVATION_TTL_S`.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterable

import psutil

from gpud.heal import preflight
from gpud.model.run import gpus_text
from gpud.model.snapshot import Hold, NodeSnapshot
from gpud.node.store import LeaseConflict, Store, StoreFull
from gpud.runs.placement.gpus import (
    FOREIGN_MEMORY_BYTES,
    Gpu,
    GpuRequestError,
    GpusBusy,
    Holder,
    choose,
    closeness_from,
)
from gpud.slurm.jobs import SlurmJobs
from gpud.wire.envelope import ErrorCode, ProtocolError
from launch.spec import RunSpec

log = logging.getLogger("gpud.runs")

#: How long a reservation waits for its part to start before it is given back.
RESERVATION_TTL_S = 60.0


def hold_text(hold: Hold) -> str:
    """ "quarantined: XID 79 (…)", "drained by alice@box: maintenance"."""
    if hold.kind == "quarantine":
        return f"quarantined: {hold.reason}"
    return f"drained by {hold.by or 'an operator'}: {hold.reason}"


def _gpud_run_of(pid: int) -> str | None:
    """The gpud run a process belongs to (its GPUD_RUN_ID), or None: a process outside."""
    try:
        return psutil.Process(pid).environ().get("GPUD_RUN_ID")
    except psutil.Error:
        return None


class GpuLeases:
    def __init__(
        self,
        node: str,
        store: Store,
        hardware: Callable[[], NodeSnapshot],
        run_name: Callable[[str], str | None],
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.node = node
        self.store = store
        self.hardware = hardware
        self.run_name = run_name
        self.clock = clock
        self._slurm = SlurmJobs()
        #: The free GPUs the last choice left out because they failed their preflight.
        self.skipped: dict[int, str] = {}

    def busy(self, snapshot: NodeSnapshot) -> dict[str, Holder]:
        """Every busy GPU's UUID and who holds it: a lease, a quarantine or drain, or a
        process outside gpud."""
        held = {
            lease.uuid: Holder(run_id=lease.run_id, run_name=self.run_name(lease.run_id))
            for lease in self.store.gpu_leases()
        }
        for gpu in snapshot.gpus:
            if gpu.hold is not None and gpu.uuid not in held:
                held[gpu.uuid] = Holder(hold=hold_text(gpu.hold))
        for gpu in snapshot.gpus:
            if gpu.uuid in held:
                continue
            for proc in gpu.processes or []:
                if (proc.used_memory_bytes or 0) <= FOREIGN_MEMORY_BYTES:
                    continue
                run_id = _gpud_run_of(proc.pid)
                held[gpu.uuid] = (
                    Holder(run_id=run_id, run_name=self.run_name(run_id))
                    if run_id is not None
                    else Holder(
                        pid=proc.pid, process=proc.name, slurm_job=self._slurm.of(proc.pid) or None
                    )
                )
                break
        return held

    def choose(self, run_name: str, spec: RunSpec) -> list[Gpu]:
        """The GPUs this node would give the run now; raises a ProtocolError that says why
        not: `invalid_body` for what the node can never give, `unavailable` when busy."""
        snapshot = self.hardware()
        if snapshot.drained is not None:
            raise ProtocolError(
                ErrorCode.UNAVAILABLE,
                f"{self.node} is {hold_text(snapshot.drained)}: it takes no new runs or"
                f" attempts (gpuctl undrain {self.node})",
            )
        gpus = [Gpu(g.index, g.uuid) for g in snapshot.gpus if not g.lost]
        if not gpus and spec.gpus is None:
            return []  # a node without GPUs (gloo on CPU): nothing to lease
        closeness = closeness_from({g.index: g.peer_distance for g in snapshot.gpus})
        try:
            busy = self.busy(snapshot)
            without = dict(busy)
            failed = self._preflight(snapshot, busy) if spec.preflight else {}
            chosen = choose(spec.gpus, spec.nproc_per_node, gpus, busy, closeness)
            self.skipped = {}
            if failed:  # the GPUs it would have had, but for their preflight
                would = choose(spec.gpus, spec.nproc_per_node, gpus, without, closeness)
                taken = {g.index for g in chosen}
                self.skipped = {g.index: failed[g.index] for g in would if g.index in failed}
                self.skipped = {i: why for i, why in self.skipped.items() if i not in taken}
            return chosen
        except GpuRequestError as exc:
            raise ProtocolError(ErrorCode.INVALID_BODY, f"{self.node}: {exc}") from None
        except GpusBusy as exc:
            raise ProtocolError(
                ErrorCode.UNAVAILABLE, f"no GPUs for {run_name} on {self.node}: {exc}"
            ) from None

    def _preflight(self, snapshot: NodeSnapshot, busy: dict[str, Holder]) -> dict[int, str]:
        """Mark the free GPUs that fail their preflight busy, saying why (`gpud.heal
        .preflight`); returns them by index."""
        failed = preflight.failed([g for g in snapshot.gpus if g.uuid not in busy], self.clock())
        for uuid, why in failed.items():
            busy[uuid] = Holder(hold=f"failed its preflight: {why}")
        return {g.index: failed[g.uuid] for g in snapshot.gpus if g.uuid in failed}

    def held(self, run_id: str, attempt: int) -> list[Gpu]:
        """The GPUs leased to that attempt here (reserved, or held by its part)."""
        return [
            Gpu(lease.gpu_index, lease.uuid)
            for lease in self.store.gpu_leases()
            if lease.run_id == run_id and lease.attempt == attempt
        ]

    def take(self, run_id: str, run_name: str, spec: RunSpec, attempt: int) -> list[Gpu]:
        """Choose and lease, all or nothing (see `held` for a reservation already taken)."""
        chosen = self.choose(run_name, spec)
        if not chosen:
            return []
        indices = [g.index for g in chosen]
        try:
            pairs = [(g.index, g.uuid) for g in chosen]
            self.store.lease_gpus(run_id, attempt, pairs, self.clock())
        except LeaseConflict as exc:  # only if two leases raced; the store keeps it honest
            raise ProtocolError(
                ErrorCode.UNAVAILABLE, f"no GPUs for {run_name} on {self.node}: {exc}"
            ) from None
        except StoreFull as exc:
            raise ProtocolError(ErrorCode.UNAVAILABLE, f"{self.node}: {exc}") from None
        log.info("run %s (attempt %d): leased GPU(s) %s", run_id, attempt, gpus_text(indices))
        return chosen

    def release(self, run_id: str, attempt: int | None = None) -> None:
        """Give back the attempt's GPUs (every attempt's, without one)."""
        self.store.release_gpus(run_id, attempt)

    def expire(self, live: Iterable[tuple[str, int]], now: float) -> None:
        """Give back reservations no live part uses that are older than the TTL."""
        for run_id, attempt in self._release_unused(live, now - RESERVATION_TTL_S):
            log.warning("run %s: reservation for attempt %d expired unused", run_id, attempt)

    def sweep(self, live: Iterable[tuple[str, int]]) -> None:
        """At start-up: drop leases whose part is not live any more (it ended while the
        daemon was down and its ending was already settled, or it was never started)."""
        for run_id, attempt in self._release_unused(live, math.inf):
            log.info("run %s: released the stale lease of attempt %d", run_id, attempt)

    def _release_unused(
        self, live: Iterable[tuple[str, int]], leased_before: float
    ) -> list[tuple[str, int]]:
        keep = set(live)
        unused = sorted(
            {
                (lease.run_id, lease.attempt)
                for lease in self.store.gpu_leases()
                if (lease.run_id, lease.attempt) not in keep and lease.leased_at < leased_before
            }
        )
        for run_id, attempt in unused:
            self.store.release_gpus(run_id, attempt)
        return unused
