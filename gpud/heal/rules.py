"""When a GPU is unsafe for new work: pure functions of two samples.

An *event* quarantines a GPU once (an XID from the list below, an uncorrectable ECC
error counted since the last sample); a *level* holds as long as it reads so (the GPU lost,
a row remap pending or failed, uncorrectable ECC errors since the driver loaded), and an
operator cannot undrain a GPU while one does: it needs a reset first.

The XIDs are those NVIDIA's XID catalogue and its GPU debug guidelines say call for a
reset or a drain (docs.nvidia.com/deploy/xid-errors): 48 (double-bit ECC), 61 and 62 (the
GPU's micro-controller), 64 (row remapping failed), 74 (NVLink), 79 (fell off the bus),
94 and 95 (contained and uncontained ECC errors: both want a reset), 119 and 120 (GSP).
Not the ones an application causes (13, 31, 43, 45), nor 63 (a row remap that worked),
nor 92 (a high single-bit rate: a warning).
"""

from __future__ import annotations

from gpud.hardware.events import XID_MEANINGS
from gpud.model.snapshot import GpuSample

#: XIDs that quarantine a GPU.
FATAL_XIDS = frozenset({48, 61, 62, 64, 74, 79, 94, 95, 119, 120})


def meaning(code: int) -> str:
    return XID_MEANINGS.get(code, ("critical", "see NVIDIA's XID catalogue"))[1]


def unsafe_level(gpu: GpuSample) -> str | None:
    """What about the GPU, as it reads now, makes it unsafe until it is reset."""
    if gpu.lost:
        return "the driver lost the GPU (fell off the bus)"
    if gpu.remapped_rows_failed:
        return "row remapping failed (replace the GPU)"
    if gpu.remapped_rows_pending:
        return "a row remap is pending (reset the GPU)"
    if gpu.ecc_uncorrected_volatile:
        return (
            f"{gpu.ecc_uncorrected_volatile} uncorrectable ECC error(s) since the driver"
            " loaded (reset the GPU)"
        )
    return None


def unsafe_event(before: GpuSample | None, now: GpuSample, since: float) -> str | None:
    """A fatal XID received after `since`, on this GPU."""
    fatal = [r for r in now.xid.recent if r.time > since and r.code in FATAL_XIDS]
    if fatal:
        first = min(fatal, key=lambda r: r.time)
        return f"XID {first.code} ({meaning(first.code)})"
    return None


def unsafe(before: GpuSample | None, now: GpuSample, since: float) -> str | None:
    """Why the GPU must take no new work, from what happened since `since` and how it
    reads now; None when it is fine."""
    return unsafe_event(before, now, since) or unsafe_level(now)
