"""What the gang needs of this node: its own parts (`LocalParts`, which the supervisor
implements), and where the health other nodes report goes (`HealthSink`).

The gang starts, stops and reserves this node's part only through these, so node 0 treats
its own part as it treats any other node's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from gpud.model.run import RunRecord
from gpud.runs.placement.gpus import Gpu
from gpud.runs.state.checkpoints import ResumePoint
from gpud.runs.state.part import Part
from gpud.wire.run_messages import PartHealth, PartPreflight, PartStopRequest
from launch.spec import RunSpec


class LocalParts(Protocol):
    """What the gang needs from the supervisor: this node's part, started and stopped."""

    def start_part(
        self,
        run: RunRecord,
        spec: RunSpec,
        attempt: int,
        master_addr: str,
        master_port: int,
        resume: ResumePoint,
    ) -> Part: ...

    def reserve_gpus(
        self, run: RunRecord, spec: RunSpec, attempt: int, key: tuple[float, str]
    ) -> list[Gpu]:
        """Lease this node's GPUs for the attempt, or raise a ProtocolError that says why
        not (`unavailable`: busy, or runs ahead of `key` in the queue)."""
        ...

    def release_gpus(self, run: RunRecord, attempt: int) -> None:
        """Give back the attempt's reservation here (not GPUs a live part runs on)."""
        ...

    def stop_part(
        self,
        run: RunRecord,
        *,
        force: bool,
        reason: str,
        grace_s: float | None = None,
        failed: str | None = None,
        dump: bool = False,
    ) -> None: ...

    def obey_stop(self, run: RunRecord, req: PartStopRequest) -> None:
        """Stop this node's part as node 0 asked."""
        ...

    async def run_preflight(
        self, run: RunRecord, spec: RunSpec, attempt: int, master: str, world: int, rank: int
    ) -> PartPreflight:
        """This node's part of the attempt's collective check; never raises."""
        ...

    def holds_real_gpus(self, run: RunRecord, attempt: int) -> bool:
        """Whether the attempt reserved real GPUs here (not simulated ones)."""
        ...

    def state_full(self) -> str | None:
        """Why the state dir cannot take more, or None: it has room."""
        ...

    def free_master_port(self) -> int:
        """A port for a rendezvous from the daemon's `--master-ports`: not leased here,
        free, and claimed host-wide; `NoFreePort` when none is."""
        ...


HealthSink = Callable[[str, dict[int, PartHealth]], None]
