"""Notable hardware changes between two snapshots: XIDs, throttling, link and memory errors.

A pure function of (previous, current), so it is cheap to test and the daemon simply
publishes and stores what comes out.
"""

from __future__ import annotations

from collections.abc import Iterator

from gpud.model.snapshot import GpuSample, NodeEvent, NodeEventKind, NodeSnapshot, Severity

#: Common XIDs and what they usually mean (NVIDIA's XID catalogue, abridged).
XID_MEANINGS: dict[int, tuple[Severity, str]] = {
    13: ("warning", "graphics engine exception (often an application bug)"),
    31: ("warning", "GPU memory page fault (often an application bug)"),
    43: ("warning", "GPU stopped processing (a context was reset)"),
    45: ("info", "preemptive cleanup after a process was killed"),
    48: ("critical", "double-bit ECC error"),
    61: ("critical", "internal micro-controller breakpoint/warning"),
    62: ("critical", "internal micro-controller halt"),
    63: ("warning", "ECC page retirement or row remapping recorded"),
    64: ("critical", "ECC page retirement or row remapping failed"),
    74: ("critical", "NVLink error"),
    79: ("critical", "GPU has fallen off the bus"),
    92: ("warning", "high single-bit ECC error rate"),
    94: ("warning", "contained ECC error (the application was stopped)"),
    95: ("critical", "uncontained ECC error (reset the GPU)"),
    119: ("critical", "GSP RPC timeout"),
    120: ("critical", "GSP error"),
}

#: Clock-event reasons that mean the GPU is being slowed down against the user's will.
SLOWDOWN_REASONS = frozenset(
    {"hw_slowdown", "hw_thermal_slowdown", "sw_thermal_slowdown", "hw_power_brake_slowdown"}
)


def _increase(before: int | None, after: int | None) -> int:
    if before is None or after is None:
        return 0
    return max(0, after - before)


def _nvlink_errors(gpu: GpuSample) -> int | None:
    if not gpu.nvlinks:
        return None
    return sum(
        (link.crc_errors or 0) + (link.replay_errors or 0) + (link.recovery_errors or 0)
        for link in gpu.nvlinks
    )


def _gpu_events(
    prev: GpuSample, cur: GpuSample
) -> Iterator[tuple[NodeEventKind, Severity, str, dict[str, int | float | str | None]]]:
    i = cur.index
    if cur.lost and not prev.lost:
        yield "gpu_lost", "critical", f"GPU {i} is lost: the driver no longer reaches it", {}
    seen = prev.xid.recent[-1].time if prev.xid.recent else float("-inf")
    new_xids = [r for r in cur.xid.recent if r.time > seen]
    for record in new_xids:
        severity, meaning = XID_MEANINGS.get(record.code, ("warning", "see NVIDIA's XID catalogue"))
        yield "xid", severity, f"GPU {i}: XID {record.code} ({meaning})", {"code": record.code}
    started = SLOWDOWN_REASONS.intersection(cur.clock_event_reasons or ()) - set(
        prev.clock_event_reasons or ()
    )
    if started:
        reasons = ", ".join(sorted(started))
        yield "throttle", "warning", f"GPU {i} clocks slowed down: {reasons}", {"reasons": reasons}
    link_delta = _increase(_nvlink_errors(prev), _nvlink_errors(cur))
    if link_delta:
        yield (
            "nvlink_errors",
            "warning",
            f"GPU {i}: {link_delta} new NVLink CRC/replay/recovery errors",
            {"delta": link_delta},
        )
    replays = _increase(prev.pcie_replay_count, cur.pcie_replay_count)
    if replays:
        yield "pcie_replays", "warning", f"GPU {i}: {replays} new PCIe replays", {"delta": replays}
    uncorrected = _increase(prev.ecc_uncorrected_volatile, cur.ecc_uncorrected_volatile)
    if uncorrected:
        yield (
            "ecc_errors",
            "critical",
            f"GPU {i}: {uncorrected} new uncorrectable ECC errors",
            {"delta": uncorrected},
        )
    if cur.remapped_rows_failed and not prev.remapped_rows_failed:
        yield "remapped_rows", "critical", f"GPU {i}: row remapping failed (replace GPU)", {}
    elif cur.remapped_rows_pending and not prev.remapped_rows_pending:
        yield "remapped_rows", "warning", f"GPU {i}: row remap pending (reset the GPU)", {}


def detect_events(prev: NodeSnapshot | None, cur: NodeSnapshot) -> list[NodeEvent]:
    """Events that happened between two snapshots of the same node."""
    if prev is None:
        return []
    before = {g.uuid: g for g in prev.gpus}
    events: list[NodeEvent] = []
    for gpu in cur.gpus:
        old = before.get(gpu.uuid)
        if old is None:
            continue
        for kind, severity, message, data in _gpu_events(old, gpu):
            events.append(
                NodeEvent(
                    node=cur.node,
                    time=cur.time,
                    kind=kind,
                    severity=severity,
                    gpu_index=gpu.index,
                    message=message,
                    data=data,
                )
            )
    return events
