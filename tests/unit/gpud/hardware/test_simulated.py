"""Simulated GPUs: deterministic, plausible, flagged, and responsive to attached load."""

from __future__ import annotations

import pytest

from gpud.hardware.simulated import SimulatedLoad, SimulatedSampler

MIB = 1024 * 1024


def test_same_time_same_values_and_everything_is_flagged() -> None:
    a = SimulatedSampler(4, "n", clock=lambda: 1000.0).sample()
    b = SimulatedSampler(4, "n", clock=lambda: 1000.0).sample()
    assert a == b
    assert len(a) == 4 and all(g.simulated for g in a)
    assert [g.index for g in a] == [0, 1, 2, 3]


def test_values_are_plausible_for_an_idle_h100() -> None:
    for t in (0.0, 3.3, 17.0, 1234.5):
        for gpu in SimulatedSampler(8, "n", clock=lambda: t).sample():  # noqa: B023
            assert 0 <= gpu.utilization_gpu_pct <= 5  # type: ignore[operator]
            assert gpu.memory_used_bytes < gpu.memory_total_bytes  # type: ignore[operator]
            assert 25 <= gpu.temperature_c <= 45  # type: ignore[operator]
            assert 0 < gpu.power_w < gpu.power_limit_w  # type: ignore[operator]
            assert gpu.clock_sm_mhz <= gpu.clock_sm_max_mhz  # type: ignore[operator]
            assert gpu.fan_pct is None  # SXM: no fan reading, not a zero
            assert gpu.clock_event_reasons == ["gpu_idle"]


def test_uuids_differ_between_nodes_and_gpus() -> None:
    a = [g.uuid for g in SimulatedSampler(4, "a").sample()]
    b = [g.uuid for g in SimulatedSampler(4, "b").sample()]
    assert len(set(a)) == 4 and not set(a) & set(b)


def test_attached_processes_make_a_gpu_busy() -> None:
    loads = {1: [SimulatedLoad(pid=42, name="python", used_memory_bytes=10_000 * MIB, busy_pct=97)]}
    gpus = SimulatedSampler(2, "n", clock=lambda: 5.0, loads=lambda: loads).sample()
    idle, busy = gpus
    assert busy.utilization_gpu_pct > 85 > idle.utilization_gpu_pct  # type: ignore[operator]
    assert busy.memory_used_bytes > idle.memory_used_bytes + 9_000 * MIB  # type: ignore[operator]
    assert busy.power_w > idle.power_w  # type: ignore[operator]
    assert busy.processes and busy.processes[0].pid == 42
    assert idle.processes == []
    assert busy.nvlinks and all((link.tx_bytes_per_s or 0) > 0 for link in busy.nvlinks)
    assert idle.nvlinks and all(link.tx_bytes_per_s == 0 for link in idle.nvlinks)


def test_an_idle_gpus_links_are_built_once_and_a_busy_ones_follow_its_load() -> None:
    """An idle daemon samples 8 GPUs x 18 links a second: the idle ones' links (frozen
    models, traffic 0) are the same objects from sample to sample."""
    now = [5.0]
    loads = {1: [SimulatedLoad(pid=42, name="python", used_memory_bytes=MIB, busy_pct=90)]}
    sampler = SimulatedSampler(2, "n", clock=lambda: now[0], loads=lambda: loads)
    first = sampler.sample()
    now[0] = 7.5
    second = sampler.sample()
    assert first[0].nvlinks and second[0].nvlinks and first[1].nvlinks and second[1].nvlinks
    # Idle: the same links; busy: new ones, their rate moved with the load.
    assert all(a is b for a, b in zip(second[0].nvlinks, first[0].nvlinks, strict=True))
    assert second[1].nvlinks[0].tx_bytes_per_s != first[1].nvlinks[0].tx_bytes_per_s
    loads.clear()
    now[0] = 9.0
    assert all(link.tx_bytes_per_s == 0 for link in sampler.sample()[1].nvlinks or [])


def test_xids_are_counted_and_acknowledged() -> None:
    sampler = SimulatedSampler(2, "n", clock=lambda: 7.0)
    sampler.xids.record(1, 79)
    sampler.xids.record(1, 79)
    sampler.xids.record(1, 48)
    summary = sampler.sample()[1].xid
    assert summary.total == 3 and summary.counts == {79: 2, 48: 1}
    assert [r.code for r in summary.recent] == [79, 79, 48]
    assert summary.unacknowledged == 3
    assert sampler.acknowledge_xids(None) == 3
    after = sampler.sample()[1].xid
    assert after.unacknowledged == 0 and after.total == 3


def test_dcgm_exporters_default_fields_are_there_and_plausible() -> None:
    now = [100.0]
    loads = {1: [SimulatedLoad(pid=42, name="python", used_memory_bytes=10 * MIB, busy_pct=97)]}
    sampler = SimulatedSampler(2, "n", clock=lambda: now[0], loads=lambda: loads)
    first = sampler.sample()
    now[0] += 10.0
    idle, busy = sampler.sample()
    # Energy: a counter from 0 when the simulated driver loads, growing by power × time.
    assert [g.energy_mj for g in first] == [0, 0]
    assert idle.power_w is not None and busy.power_w is not None
    assert idle.energy_mj == pytest.approx(idle.power_w * 10 * 1000, rel=0.01)
    assert busy.energy_mj > idle.energy_mj  # type: ignore[operator]
    for gpu in (idle, busy):
        assert gpu.temperature_c < gpu.memory_temperature_c < 95  # type: ignore[operator]
        assert (gpu.encoder_utilization_pct, gpu.decoder_utilization_pct) == (0.0, 0.0)
    assert 85 < busy.graphics_activity_pct <= 100  # type: ignore[operator]
    assert 0 < busy.dram_activity_pct < busy.graphics_activity_pct  # type: ignore[operator]
    assert idle.graphics_activity_pct < 5 and idle.dram_activity_pct < 5  # type: ignore[operator]
