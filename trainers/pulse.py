"""Where a rank is: its step, time per step, time in collectives, and its phase.

Three threads touch a Pulse. The training thread marks steps (`step_done`, on every
step: a few attribute reads and writes, no lock). Collectives are marked when they are
*entered* and when they are left, by the training thread and by DDP's comm hook, whose
all-reduces complete on another thread: those writers take a small lock between them and
publish their state as one tuple, so readers need no lock and never see half an update.
The link thread calls `heartbeat` every few milliseconds and builds a heartbeat about
twice a second.

A heartbeat's times are measured over the interval since the previous heartbeat, not
averaged over the past: `step_time_s` and `collective_s` are the wall time and the time
with a collective in flight of the steps finished in that interval, divided by their
count (an interval without a finished step repeats the last measurement). One long step
marks one interval only, never the next seconds.

A pause of the whole process (SIGSTOP, a suspended VM) freezes the link thread too, which
then sees a gap between its calls: the interval that spans it is dropped, and so is any
step that began before the pause ended. A rank that resumes reads as fast as it is, not
as slow as its frozen step.
"""

from __future__ import annotations

import sys
import threading
from typing import Any

HEARTBEAT_INTERVAL_S = 0.5
#: The link thread calls `heartbeat` every few ms: a gap this long between two calls means
#: the process was paused (or starved of CPU), and what was measured across it is dropped.
PAUSE_GAP_S = 1.0

#: (steps measured, their wall time, their time with a collective in flight), cumulative.
_Totals = tuple[int, float, float]
#: (collectives in flight, when that number last went to or from 0, the wall time with
#: one or more in flight before then).
_Collectives = tuple[int, float, float]


class Pulse:
    def __init__(self, now: float) -> None:
        self.step: int | None = None
        self.step_time_s: float | None = None
        self.collective_s: float | None = None
        self.gpu_uuid: str | None = None
        self.gpu_bus_id: str | None = None
        #: FLOPs of one step, once counted (Run.count_flops): every heartbeat carries it.
        self.flops_per_step: float | None = None
        self._gpu_checked = False
        # The training thread's: one tuple, so the link thread never reads half an update.
        self._totals: _Totals = (0, 0.0, 0.0)
        self._last_step_at: float | None = None
        self._collective_at_step = 0.0
        # Collectives: written from any thread under the lock, read without it.
        self._lock = threading.Lock()
        self._collectives: _Collectives = (0, now, 0.0)
        # The link thread's.
        self._next_beat = 0.0
        self._called_at: float | None = None
        self._resumed_at = float("-inf")  # when it last saw a pause end
        self._beat_totals: _Totals = (0, 0.0, 0.0)

    def step_done(self, step: int, now: float) -> None:
        previous = self.step
        in_collectives = self.collective_time(now)
        last = self._last_step_at
        # A step that began before the link thread saw a pause end may hold the pause.
        if (
            previous is not None
            and step > previous
            and last is not None
            and last >= self._resumed_at
        ):
            steps, wall, waited = self._totals
            self._totals = (
                steps + step - previous,
                wall + (now - last),
                waited + (in_collectives - self._collective_at_step),
            )
        if previous is None or step != previous:
            self._last_step_at = now
            self._collective_at_step = in_collectives
        self.step = step
        if not self._gpu_checked:
            self._gpu_checked = True
            self.gpu_uuid, self.gpu_bus_id = _gpu_identity()

    def enter_collective(self, now: float) -> None:
        """A collective starts: the rank waits on the others from `now` until it is left."""
        with self._lock:
            in_flight, since, total = self._collectives
            self._collectives = (in_flight + 1, now if in_flight == 0 else since, total)

    def leave_collective(self, now: float) -> None:
        """A collective entered before is done (completed or failed)."""
        with self._lock:
            in_flight, since, total = self._collectives
            if in_flight == 0:
                return  # a leave without its enter: nothing to close
            if in_flight == 1:
                self._collectives = (0, now, total + max(0.0, now - since))
            else:
                self._collectives = (in_flight - 1, since, total)

    @property
    def phase(self) -> str:
        """The rank's phase: collective while one or more are in flight, else compute."""
        return "collective" if self._collectives[0] else "compute"

    @property
    def phase_since(self) -> float:
        """When the rank entered its phase (the first of the collectives now in flight)."""
        return self._collectives[1]

    def collective_time(self, now: float) -> float:
        """Wall time so far with at least one collective in flight (overlapping ones once)."""
        in_flight, since, total = self._collectives
        return total + max(0.0, now - since) if in_flight else total

    def heartbeat(self, now: float, force: bool = False) -> dict[str, Any] | None:
        """The heartbeat body when one is due (about twice a second) or `force`d, else None.

        Called by the link thread every few milliseconds, due or not: that is how it
        notices a pause. `step` in it is the 0-based index of the last step finished, as
        `Run.log` got it.
        """
        called_at, self._called_at = self._called_at, now
        if called_at is not None and now - called_at > PAUSE_GAP_S:
            # Frozen from called_at to now: drop what the interval measured, and make the
            # training thread drop the step it is in.
            self._resumed_at = now
            self._beat_totals = self._totals
        if now < self._next_beat and not force:
            return None
        self._next_beat = now + HEARTBEAT_INTERVAL_S
        totals, before = self._totals, self._beat_totals
        self._beat_totals = totals
        steps = totals[0] - before[0]
        if steps > 0:
            step_time = (totals[1] - before[1]) / steps
            self.step_time_s = step_time
            self.collective_s = min(step_time, max(0.0, (totals[2] - before[2]) / steps))
        in_flight, since, _ = self._collectives
        return {
            "step": self.step,
            "step_time_s": self.step_time_s,
            "collective_s": self.collective_s,
            "phase": "collective" if in_flight else "compute",
            "phase_since": since,
            "gpu_uuid": self.gpu_uuid,
            "gpu_bus_id": self.gpu_bus_id,
            "flops_per_step": self.flops_per_step,
        }


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
