"""A GPU's preflight (issue 21 §2): what leaves a free GPU out of an attempt, by NVML's
reading of it now, and what does not."""

from __future__ import annotations

from gpud.heal.preflight import (
    BASELINE_KEEP,
    UNLISTED_MEMORY_BYTES,
    XID_WINDOW_S,
    below_baseline,
    failed,
    findings,
    judge_collective,
    slow_nodes,
    with_figures,
)
from gpud.model.snapshot import GpuProcess, GpuSample, XidRecord, XidSummary
from gpud.wire.run_messages import PartPreflight

GIB = 2**30
NOW = 10_000.0


def gpu(index: int = 0, **fields: object) -> GpuSample:
    base: dict[str, object] = {"index": index, "name": "G", "uuid": f"GPU-{index}"}
    return GpuSample.model_validate({**base, **fields})


def xids(*records: tuple[int, float]) -> XidSummary:
    return XidSummary(total=len(records), recent=[XidRecord(code=c, time=t) for c, t in records])


def test_a_healthy_gpu_passes_even_with_the_power_cap_and_idle_clocks() -> None:
    reading = gpu(
        clock_event_reasons=["gpu_idle", "sw_power_cap"], memory_used_bytes=600 * 2**20,
        memory_reserved_bytes=500 * 2**20, processes=[],
    )  # fmt: skip
    assert findings(reading, NOW) == []


def test_the_hardware_slowing_its_clocks_fails_it_naming_the_reasons() -> None:
    slowed = gpu(clock_event_reasons=["hw_thermal_slowdown", "sw_power_cap", "hw_slowdown"])
    assert findings(slowed, NOW) == [
        "clocks slowed by the hardware (hw_slowdown, hw_thermal_slowdown)"
    ]


def test_a_recent_xid_fails_it_but_not_an_applications_nor_an_old_one() -> None:
    recent = gpu(xid=xids((92, NOW - 10), (13, NOW - 5)))
    assert findings(recent, NOW) == ["XID 92 (high single-bit ECC error rate) in the last 5 min"]
    assert findings(gpu(xid=xids((13, NOW), (31, NOW), (43, NOW), (45, NOW))), NOW) == []
    assert findings(gpu(xid=xids((92, NOW - XID_WINDOW_S - 1))), NOW) == []


def test_an_xid_an_operator_acknowledged_fails_it_no_more_but_a_later_one_does() -> None:
    handled = xids((79, NOW - 20)).model_copy(update={"acknowledged_at": NOW - 10})
    assert findings(gpu(xid=handled), NOW) == []
    again = handled.model_copy(
        update={"recent": [*handled.recent, XidRecord(code=92, time=NOW - 5)]}
    )
    assert findings(gpu(xid=again), NOW) == [
        "XID 92 (high single-bit ECC error rate) in the last 5 min"
    ]


def test_memory_no_listed_process_holds_fails_it() -> None:
    ghost = gpu(
        memory_used_bytes=9 * GIB, memory_reserved_bytes=GIB // 2,
        processes=[GpuProcess(pid=7, used_memory_bytes=GIB)],
    )  # fmt: skip
    (why,) = findings(ghost, NOW)
    assert why.startswith("7.5 GiB of its memory is held by no process NVML lists")
    listed = gpu(
        memory_used_bytes=9 * GIB, processes=[GpuProcess(pid=7, used_memory_bytes=9 * GIB)]
    )
    assert findings(listed, NOW) == []  # a listed process makes it busy, not a failure
    edge = gpu(memory_used_bytes=UNLISTED_MEMORY_BYTES, processes=[])
    assert findings(edge, NOW) == []
    unknown = gpu(memory_used_bytes=9 * GIB, processes=None)  # NVML could not list them
    assert findings(unknown, NOW) == []


def test_failed_maps_each_failing_gpu_to_every_reason() -> None:
    both = gpu(1, clock_event_reasons=["hw_power_brake_slowdown"], xid=xids((74, NOW)))
    assert failed([gpu(0), both], NOW) == {
        "GPU-1": "clocks slowed by the hardware (hw_power_brake_slowdown); XID 74 (NVLink"
        " error) in the last 5 min"
    }


def test_a_node_far_below_its_peers_all_reduce_is_named() -> None:
    named = slow_nodes({1: 2.0, 2: 0.4, 3: 1.8})
    assert named == {
        2: "all-reduce with node 0 at 0.4 GB/s, under 50% of its peers' median 1.8 GB/s"
    }
    assert slow_nodes({1: 2.0, 2: 1.1, 3: 1.8}) == {}  # slower, not far below
    assert slow_nodes({1: 0.01}) == {}  # one pair: no peers to be below


def test_a_node_far_below_its_own_past_is_named_with_its_baseline() -> None:
    history = with_figures({}, {1: 1.2})
    history = with_figures(history, {1: 1.0})
    history = with_figures(history, {1: 1.4})
    assert history == {1: [1.2, 1.0, 1.4]}
    named = below_baseline({1: 0.3}, history)
    assert named == {
        1: "all-reduce with node 0 at 0.3 GB/s, under 50% of its baseline 1.2 GB/s"
        " (its earlier attempts in this run)"
    }
    assert below_baseline({1: 0.7}, history) == {}  # slower, not far below
    assert below_baseline({2: 0.01}, history) == {}  # no past: no baseline
    for _ in range(10):
        history = with_figures(history, {1: 0.5})
    assert history[1] == [0.5] * BASELINE_KEEP  # only the last few count


# ------------------------------------------------------------ the collective check's verdict


def part(rank: int, **fields: object) -> PartPreflight:
    return PartPreflight.model_validate({"node_rank": rank, "ok": True, "seconds": 4.2, **fields})


def test_one_node_on_real_gpus_is_judged_by_its_gpu_test_alone() -> None:
    failing, line = judge_collective([0], {0: part(0)})
    assert failing == {}
    assert line == "preflight on 1 node in 4.2s: its GPUs passed the matmul and memory test"
    bad = part(0, ok=False, gpu_failures=["GPU 1: matmul off by 3.1e+02"], failed_gpus=[1])
    failing, line = judge_collective([0], {0: bad})
    assert failing == {0: "its GPU check failed: GPU 1: matmul off by 3.1e+02"}
    assert line == "preflight on 1 node in 4.2s: its GPU check failed: GPU 1: matmul off by 3.1e+02"


def test_a_check_that_could_not_run_is_no_verdict() -> None:
    failing, line = judge_collective([0], {0: part(0, ok=False, error="no torch for python3")})
    assert failing == {}
    assert (
        line == "preflight's collective check did not complete (no torch for python3): no verdict"
    )
    assert judge_collective([0, 1], {})[1].endswith("(no answer): no verdict")


def test_a_node_far_below_its_peers_is_named_with_the_figures() -> None:
    own = part(0, pairs={1: 1.46, 2: 1.52, 3: 0.079})
    failing, line = judge_collective([0, 1, 2, 3], {0: own, 1: part(1), 2: part(2), 3: part(3)})
    assert list(failing) == [3] and "GB/s" in failing[3]
    assert line.startswith("preflight across 4 nodes in 4.2s: all-reduce with node 0: ")
    assert "node 3 0.079 GB/s" in line
