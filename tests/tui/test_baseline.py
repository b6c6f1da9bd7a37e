"""gputop against a scaling baseline (issue 13): the Run screen says "efficiency 87% of
linear at 8 GPUs" for a live run whose spec `gpuctl scaling` measured, and says when that
baseline is from other hardware. First from hand-made model states, then end to end: a
real `gpuctl scaling`, a real live run, a real gputop."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from gpud.model.run import RunState
from gpud.scaling.arithmetic import NodeHardware, ScalingPoint, ScalingResult, with_ratios
from gpud.scaling.baselines import load_baselines, save_baseline
from gpud.wire.node_messages import NodeInfo
from gpud.wire.run_messages import MetricRow, MetricsReply
from tests.support.daemons import RunningDaemon, gpuctl
from tests.support.runs import CPU_DDP, FAST, launch
from tests.tui import scenes
from tests.tui.screen import screen_text
from tests.tui.test_live import settle, stop_quietly, watch
from tui.app import GpuTop
from tui.model.baselines import CHECK_S, BaselineBook
from tui.model.fleet import FleetModel
from tui.widgets.run_header import header_text

RUN = "llm-5e6f7a"
NODE = "tcp://10.0.0.1:7711"
H100 = "NVIDIA H100 80GB HBM3"


def info(gpu_name: str) -> NodeInfo:
    return NodeInfo(
        node="n1",
        version="0",
        protocol=1,
        pid=1,
        started_at=scenes.T0,
        uptime_s=1.0,
        control=NODE,
        events="tcp://10.0.0.1:7712",
        backend="nvml",
        simulated=False,
        gpu_count=8,
        gpu_name=gpu_name,
        secure=True,
        role="viewer",
    )


def live_run(
    gpu_name: str = H100, run_id: str = RUN, clock: scenes.FixedClock | None = None
) -> FleetModel:
    """A run (of spec `llm`, by default) on 8 GPUs of one node, 3 steps a second."""
    model = FleetModel([scenes.target(1, "n1")], clock=clock or scenes.FixedClock())
    model.apply_info(NODE, info(gpu_name))
    summary = scenes.summary(run_id, [NODE], attempt=1, step=59, nproc=8)
    model.apply_event(NODE, scenes.event(f"run.{run_id}.state", summary))
    rows = [
        MetricRow(attempt=1, step=s, time=scenes.T0 + s / 3, values={"loss": 1.0})
        for s in range(60)
    ]
    model.apply_metrics_history(run_id, MetricsReply(run_id=run_id, rows=rows))
    return model


def baseline(steps_per_s: float) -> ScalingResult:
    """`llm` measured at 1 process: 4 steps/s, 256 samples/s; and at 2."""
    points = [
        ScalingPoint(
            nodes=1,
            procs_per_node=n,
            world=n,
            run_id=f"llm-{n}",
            state="succeeded",
            steps_per_s=sps,
            throughput=sps * 64 * n,
            unit="samples/s",
        )
        for n, sps in ((1, steps_per_s), (2, steps_per_s * 0.9))
    ]
    node = NodeHardware(node="n1", control="10.0.0.1:7711", gpu_name=H100, gpu_count=8)
    return ScalingResult(
        name="llm",
        measured_at=scenes.T0,
        steps=100,
        warmup=20,
        samples_per_rank_step=64,
        hardware=[node],
        points=with_ratios(points),
    )


def test_a_live_run_shows_its_efficiency_against_its_specs_baseline() -> None:
    clock = scenes.FixedClock()
    model = live_run(clock=clock)
    run = model.runs[RUN]
    assert model.efficiency(run) is None  # no baseline yet: no line
    assert "efficiency" not in header_text(run, "loss").plain
    save_baseline(baseline(steps_per_s=4.0))
    assert model.efficiency(run) is None  # gputop looks at the file every CHECK_S
    clock.now += CHECK_S
    live = model.efficiency(run)
    assert live is not None
    # 3 steps/s on 8 GPUs with 64 samples per GPU per step, against 8 × (4 steps/s × 64).
    assert live.efficiency == pytest.approx(0.75) and live.world == 8
    assert live.other_hardware is None
    text = header_text(run, "loss", live).plain.splitlines()
    assert text[2].startswith("efficiency 75% of linear at 8 GPUs  (baseline 256 samples/s at 1")


def test_a_baseline_from_other_hardware_says_so() -> None:
    save_baseline(baseline(steps_per_s=4.0))
    model = live_run(gpu_name="NVIDIA A100-SXM4-80GB")
    run = model.runs[RUN]
    live = model.efficiency(run)
    assert live is not None and live.other_hardware == f"n1: 8× {H100}"
    line = header_text(run, "loss", live).plain.splitlines()[2]
    assert line == (
        f"efficiency 75% of linear at 8 GPUs  (baseline from other hardware: n1: 8× {H100})"
    )


def test_an_ended_run_and_a_run_of_another_spec_show_no_efficiency() -> None:
    save_baseline(baseline(steps_per_s=4.0))
    model = live_run()
    assert model.efficiency(model.runs[RUN]) is not None
    ended = model.runs[RUN].summary.model_copy(update={"state": RunState.SUCCEEDED})
    model.apply_event(NODE, scenes.event(f"run.{RUN}.state", ended, seq=2))
    assert model.efficiency(model.runs[RUN]) is None
    other = live_run(run_id="cnn-0a1b2c")
    assert other.efficiency(other.runs["cnn-0a1b2c"]) is None


def test_gputop_reads_a_new_or_broken_baselines_file_at_its_next_look(config_dir: Path) -> None:
    clock = scenes.FixedClock()
    book = BaselineBook(clock=clock)
    assert book.get("llm") is None
    save_baseline(baseline(steps_per_s=4.0))
    clock.now += CHECK_S
    found = book.get("llm")
    assert found is not None and found.base is not None and found.base.steps_per_s == 4.0
    (config_dir / "scaling.json").write_text("{not json")
    clock.now += CHECK_S
    assert book.get("llm") is None
    assert book.error is not None and "scaling.json is not a readable baselines file" in book.error


@pytest.mark.slow
@pytest.mark.asyncio
async def test_gputop_shows_a_live_runs_efficiency_against_a_measured_baseline(
    daemon: RunningDaemon,
) -> None:
    measured = gpuctl(
        "--node", daemon.address, "scaling", str(CPU_DDP), "--procs", "1",
        "--steps", "300", "--warmup", "20", "--set", FAST, timeout=300,
    )  # fmt: skip
    assert measured.returncode == 0, measured.stderr
    base = load_baselines().baselines["cpu-ddp"].points[0]
    assert base.world == 1 and base.steps_per_s is not None

    run_id = launch(daemon, "training.max_steps=100000", FAST)  # 2 processes, 2 GPUs
    model, feed, _ = watch(daemon)
    app = GpuTop(model, feed, start_run=run_id, refresh_s=0.3)
    try:
        async with app.run_test(size=(140, 40)) as pilot:
            await settle(pilot, lambda: "efficiency" in screen_text(app), 90, "the efficiency")
            feed.stop()  # hold the model still, then read what it says and what is shown
            await pilot.pause(1.0)
            with model.lock:
                rate = model.runs[run_id].rate()
            assert rate is not None and rate.unit == "steps/s"
            expected = rate.value / base.steps_per_s * 100  # 64 samples per GPU either way
            shown = re.search(r"efficiency (\d+)% of linear at 2 GPUs", screen_text(app))
            assert shown is not None, screen_text(app)
            assert int(shown[1]) == round(expected)
            day = time.strftime(
                "%Y-%m-%d", time.localtime(load_baselines().baselines["cpu-ddp"].measured_at)
            )
            assert f"at 1 process, {day})" in screen_text(app)
    finally:
        stop_quietly(daemon, run_id)
