"""Where a rank is: its step, time per step, time in collectives, and its phase.

The training thread writes these plain attributes (cheaply, on every step); the link
thread reads them to build a heartbeat about twice a second. No lock: a torn read costs
one slightly stale heartbeat, never a blocked step.
"""

from __future__ import annotations

import sys
from typing import Any

HEARTBEAT_INTERVAL_S = 0.5
_EMA = 0.2  # weight of the newest step in the running averages


class Pulse:
    def __init__(self, now: float) -> None:
        self.step: int | None = None
        self.step_time_s: float | None = None
        self.collective_s: float | None = None
        self.phase = "compute"
        self.phase_since = now
        self.gpu_uuid: str | None = None
        self.gpu_bus_id: str | None = None
        self._last_step_at: float | None = None
        self._in_collectives = 0.0  # since the last step
        self._next_beat = 0.0
        self._gpu_checked = False

    def step_done(self, step: int, now: float) -> None:
        previous = self.step
        if previous is not None and step > previous and self._last_step_at is not None:
            steps = step - previous
            per_step = (now - self._last_step_at) / steps
            waited = self._in_collectives / steps
            self.step_time_s = _ema(self.step_time_s, per_step)
            self.collective_s = _ema(self.collective_s, waited)
            self._in_collectives = 0.0
        if previous is None or step != previous:
            self._last_step_at = now
        self.step = step
        if not self._gpu_checked:
            self._gpu_checked = True
            self.gpu_uuid, self.gpu_bus_id = _gpu_identity()

    def enter_collective(self, now: float) -> None:
        self.phase = "collective"
        self.phase_since = now

    def leave_collective(self, now: float) -> None:
        self._in_collectives += now - self.phase_since
        self.phase = "compute"
        self.phase_since = now

    def add_collective_time(self, seconds: float) -> None:
        """Time measured elsewhere (a DDP comm hook) that counts as waiting in collectives."""
        self._in_collectives += seconds

    def heartbeat(self, now: float, force: bool = False) -> dict[str, Any] | None:
        """The heartbeat body when one is due (about twice a second) or `force`d, else None.

        `step` in it is the 0-based index of the last step finished, as `Run.log` got it.
        """
        if now < self._next_beat and not force:
            return None
        self._next_beat = now + HEARTBEAT_INTERVAL_S
        return {
            "step": self.step,
            "step_time_s": self.step_time_s,
            "collective_s": self.collective_s,
            "phase": self.phase,
            "phase_since": self.phase_since,
            "gpu_uuid": self.gpu_uuid,
            "gpu_bus_id": self.gpu_bus_id,
        }


def _ema(old: float | None, new: float) -> float:
    return new if old is None else (1 - _EMA) * old + _EMA * new


def _gpu_identity() -> tuple[str | None, str | None]:
    """The CUDA device this rank uses (uuid, PCI bus id), if torch has initialised CUDA."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None, None
    try:
        if not (torch.cuda.is_available() and torch.cuda.is_initialized()):
            return None, None
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        uuid = str(props.uuid)
        bus = f"{props.pci_domain_id:08X}:{props.pci_bus_id:02X}:{props.pci_device_id:02X}.0"
    except Exception:  # an exotic build without these properties: no identity, no crash
        return None, None
    return (uuid if uuid.startswith("GPU-") else f"GPU-{uuid}"), bus
