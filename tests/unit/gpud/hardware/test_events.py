"""Hardware events from two snapshots: XIDs, slowdowns, link and memory errors."""

from __future__ import annotations

from gpud.hardware.events import detect_events
from gpud.model.snapshot import GpuSample, NodeSnapshot, NvLinkSample, XidRecord, XidSummary
from tests.support.samples import host_sample

HOST = host_sample()


def gpu(**fields: object) -> GpuSample:
    base: dict[str, object] = {"index": 0, "name": "G", "uuid": "GPU-0"}
    return GpuSample.model_validate({**base, **fields})


def snap(*gpus: GpuSample, t: float = 1.0) -> NodeSnapshot:
    return NodeSnapshot(
        node="n",
        seq=1,
        time=t,
        interval_s=1.0,
        backend="nvml",
        simulated=False,
        gpus=list(gpus),
        host=HOST,
    )


def test_first_snapshot_has_no_events() -> None:
    assert detect_events(None, snap(gpu())) == []


def test_no_change_no_events() -> None:
    g = gpu(pcie_replay_count=5, clock_event_reasons=["hw_slowdown"])
    assert detect_events(snap(g), snap(g)) == []


def test_new_xids_each_become_an_event_with_meaning() -> None:
    before = gpu(xid=XidSummary(total=1, counts={13: 1}, recent=[XidRecord(code=13, time=1.0)]))
    after = gpu(
        xid=XidSummary(
            total=3,
            counts={13: 1, 79: 1, 31: 1},
            recent=[
                XidRecord(code=13, time=1.0),
                XidRecord(code=79, time=2.0),
                XidRecord(code=31, time=2.5),
            ],
        )
    )
    events = detect_events(snap(before), snap(after, t=3.0))
    assert [(e.kind, e.severity, e.data["code"]) for e in events] == [
        ("xid", "critical", 79),
        ("xid", "warning", 31),
    ]
    assert "fallen off the bus" in events[0].message and events[0].gpu_index == 0


def test_slowdown_starts_are_reported_but_power_capping_is_not() -> None:
    before = gpu(clock_event_reasons=["gpu_idle"])
    capped = gpu(clock_event_reasons=["sw_power_cap"])
    hot = gpu(clock_event_reasons=["sw_power_cap", "hw_thermal_slowdown"])
    assert detect_events(snap(before), snap(capped)) == []
    (event,) = detect_events(snap(capped), snap(hot))
    assert event.kind == "throttle" and "hw_thermal_slowdown" in event.message


def test_link_and_memory_errors() -> None:
    link = NvLinkSample(link=0, crc_errors=0, replay_errors=0, recovery_errors=0)
    before = gpu(
        nvlinks=[link],
        pcie_replay_count=10,
        ecc_uncorrected_volatile=0,
        remapped_rows_pending=False,
        remapped_rows_failed=False,
    )
    after = gpu(
        nvlinks=[link.model_copy(update={"crc_errors": 3, "replay_errors": 1})],
        pcie_replay_count=14,
        ecc_uncorrected_volatile=2,
        remapped_rows_pending=True,
        remapped_rows_failed=False,
    )
    events = {e.kind: e for e in detect_events(snap(before), snap(after))}
    assert events["nvlink_errors"].data["delta"] == 4
    assert events["pcie_replays"].data["delta"] == 4
    assert events["ecc_errors"].severity == "critical"
    assert events["remapped_rows"].severity == "warning"


def test_unavailable_counters_never_look_like_errors() -> None:
    before = gpu(pcie_replay_count=None, ecc_uncorrected_volatile=None)
    after = gpu(pcie_replay_count=7, ecc_uncorrected_volatile=3)
    assert detect_events(snap(before), snap(after)) == []


def test_lost_gpu_is_critical() -> None:
    (event,) = detect_events(snap(gpu()), snap(gpu(lost=True)))
    assert (event.kind, event.severity) == ("gpu_lost", "critical")
