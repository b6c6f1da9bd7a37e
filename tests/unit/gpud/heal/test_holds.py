"""What quarantines a GPU (pure rules), and the holds kept in a real store: across a
restart, drains over quarantines, undrains refused while the GPU still reads unsafe."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpud.heal.holds import HoldError, Holds
from gpud.heal.rules import FATAL_XIDS, unsafe
from gpud.model.snapshot import GpuSample, NodeSnapshot, XidRecord, XidSummary
from gpud.node.store import Store
from tests.support.samples import host_sample


def gpu(index: int = 0, **fields: object) -> GpuSample:
    base: dict[str, object] = {"index": index, "name": "G", "uuid": f"GPU-{index}"}
    return GpuSample.model_validate({**base, **fields})


def xid(code: int, at: float) -> XidSummary:
    return XidSummary(total=1, counts={code: 1}, recent=[XidRecord(code=code, time=at)])


def snap(*gpus: GpuSample, t: float = 10.0) -> NodeSnapshot:
    return NodeSnapshot(
        node="n0", seq=1, time=t, interval_s=1.0, backend="nvml", simulated=False,
        gpus=list(gpus), host=host_sample(),
    )  # fmt: skip


def test_the_fatal_xids_quarantine_and_an_applications_do_not() -> None:
    assert {48, 79, 94, 95, 119, 120} <= FATAL_XIDS
    assert unsafe(None, gpu(xid=xid(79, 5.0)), since=4.0) == "XID 79 (GPU has fallen off the bus)"
    assert unsafe(None, gpu(xid=xid(79, 5.0)), since=6.0) is None  # seen before: not again
    assert unsafe(None, gpu(xid=xid(13, 5.0)), since=4.0) is None  # the program's own fault
    assert unsafe(None, gpu(xid=xid(43, 5.0)), since=4.0) is None


def test_levels_that_need_a_reset_quarantine() -> None:
    assert "lost" in (unsafe(None, gpu(lost=True), 0.0) or "")
    assert "pending" in (unsafe(None, gpu(remapped_rows_pending=True), 0.0) or "")
    assert "failed" in (unsafe(None, gpu(remapped_rows_failed=True), 0.0) or "")
    assert "uncorrectable ECC" in (unsafe(None, gpu(ecc_uncorrected_volatile=2), 0.0) or "")
    assert unsafe(None, gpu(ecc_corrected_volatile=9), 0.0) is None


def test_a_quarantine_is_kept_and_outlives_the_store(tmp_path: Path) -> None:
    store = Store(tmp_path / "state.db")
    holds = Holds(store, "n0", clock=lambda: 9.0)
    found = holds.observe(snap(gpu(0), gpu(1, xid=xid(79, 9.5))))
    assert [(g.index, h.kind) for g, h, _ in found] == [(1, "quarantine")]
    assert found[0][2].kind == "quarantine" and found[0][2].severity == "critical"
    assert holds.observe(snap(gpu(0), gpu(1, xid=xid(79, 9.5)), t=11.0)) == []  # once
    store.close()
    again = Holds(Store(tmp_path / "state.db"), "n0")
    marked = again.annotate(snap(gpu(0), gpu(1)))
    assert marked.gpus[0].hold is None
    assert marked.gpus[1].hold is not None and marked.gpus[1].hold.reason.startswith("XID 79")


def test_drains_undrains_and_what_stays_held(tmp_path: Path) -> None:
    holds = Holds(Store(tmp_path / "state.db"), "n0", clock=lambda: 5.0)
    bad = gpu(1, remapped_rows_pending=True)
    holds.observe(snap(gpu(0), bad))  # quarantined: a remap pending
    events, notes = holds.drain([gpu(0), bad], "maintenance", by="op@box")
    assert [e.gpu_index for e in events] == [0]
    assert notes == ["GPU 1 stays quarantined: a row remap is pending (reset the GPU)"]
    with pytest.raises(HoldError, match="still reads unsafe"):
        holds.undrain([gpu(0), bad], by="op@box")
    assert holds.gpu_hold("GPU-0") is not None  # nothing was undrained
    holds.undrain([gpu(0), gpu(1)], by="op@box")  # reset: it reads fine now
    assert holds.held_gpus() == {}
    holds.drain(None, "reboot", by="op@box")
    assert holds.node_hold is not None and holds.annotate(snap(gpu(0))).drained is not None
    events, _ = holds.undrain(None, by="op@box")
    assert holds.node_hold is None and "undrained" in events[0].message
