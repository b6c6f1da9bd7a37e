"""The scaling arithmetic (gpud/scaling/arithmetic.py): which steps are timed, where throughput
comes from, the heartbeats' split, ratios against the smallest count, and a live run against
a baseline. Runs' records are built by hand here; tests/integration/test_scaling.py takes
them from real runs."""

from __future__ import annotations

import pytest

from gpud.efficiency.mfu import SIMULATED
from gpud.efficiency.model import RunFlops
from gpud.model.run import HealthSummary, RankView
from gpud.scaling.arithmetic import (
    RANK_STEPS,
    SAMPLES,
    TOKENS,
    ScalingPoint,
    ScalingResult,
    flops_mean,
    heartbeat_split,
    live_efficiency,
    throughput,
    timed_window,
    with_ratios,
)
from gpud.wire.run_messages import MetricRow


def rows(times: dict[int, float], attempt: int = 1, **values: float) -> list[MetricRow]:
    return [
        MetricRow(attempt=attempt, step=s, time=t, values=dict(values)) for s, t in times.items()
    ]


def test_the_window_starts_at_the_end_of_the_last_warmup_step_and_stops_at_the_last() -> None:
    # Warm-up steps 0..4 are slow (5 s each); steps 5..14 take 0.5 s; step 15 and on are
    # past the last timed step (a script that ignores max_steps).
    times = {s: 5.0 * (s + 1) for s in range(5)}
    times.update({s: 25.0 + 0.5 * (s - 4) for s in range(5, 20)})
    window = timed_window(rows(times), warmup=5, last_step=14)
    assert window is not None
    assert (window.steps, window.seconds) == (10, 5.0)
    assert window.steps_per_s == 2.0


def test_only_the_latest_attempt_counts_and_too_few_steps_are_none() -> None:
    old = rows({s: float(s) for s in range(10)}, attempt=1)
    new = rows({s: 100.0 + 2 * s for s in range(10)}, attempt=2)
    window = timed_window(old + new, warmup=2, last_step=9)
    assert window is not None and window.steps_per_s == 0.5
    assert timed_window(rows({0: 1.0, 1: 2.0}), warmup=5, last_step=9) is None
    assert timed_window([], warmup=0, last_step=9) is None


def test_throughput_is_what_the_trainer_logs_first_then_the_step_rate() -> None:
    times = {s: 0.1 * s for s in range(11)}  # 10 steps per second
    logged = timed_window(rows(times, samples_per_s=900.0, tokens_per_s=5.0), 0, 10)
    tokens = timed_window(rows(times, tokens_per_s=4096.0), 0, 10)
    bare = timed_window(rows(times, loss=1.0), 0, 10)
    assert logged is not None and tokens is not None and bare is not None
    assert throughput(logged, world=4, per_rank_step=64)[:2] == (900.0, SAMPLES)
    assert throughput(tokens, world=4, per_rank_step=64)[:2] == (4096.0, TOKENS)
    # 10 steps/s × 64 samples per process per step × 4 processes.
    value, unit, _ = throughput(bare, world=4, per_rank_step=64)
    assert value == pytest.approx(2560.0) and unit == SAMPLES
    value, unit, _ = throughput(bare, world=4, per_rank_step=None)
    assert value == pytest.approx(40.0) and unit == RANK_STEPS  # 10 steps/s × 4 processes


def test_a_logged_throughput_is_the_mean_over_the_timed_steps_only() -> None:
    data = [
        MetricRow(attempt=1, step=s, time=float(s), values={"samples_per_s": 10.0 * s})
        for s in range(10)
    ]
    window = timed_window(data, warmup=4, last_step=7)
    assert window is not None
    assert window.logged["samples_per_s"] == pytest.approx((40 + 50 + 60 + 70) / 4)


def health(time: float, steps: list[int], step_s: float, collective_s: float) -> HealthSummary:
    ranks = [
        RankView(
            rank=r,
            node_rank=0,
            local_rank=r,
            last_step=s,
            step_time_s=step_s,
            collective_s=collective_s,
        )
        for r, s in enumerate(steps)
    ]
    return HealthSummary(run_id="r", attempt=1, time=time, verdict="ok", ranks=ranks)


def test_the_split_uses_summaries_past_the_warmup_once_each_without_the_first() -> None:
    summaries = [
        health(1.0, [3, 3], 0.9, 0.0),  # warm-up
        health(2.0, [12, 9], 0.5, 0.1),  # rank 1 still in warm-up
        health(3.0, [20, 20], 0.3, 0.2),  # the first one past it: may hold warm-up steps
        health(4.0, [30, 30], 0.1, 0.04),
        health(4.0, [30, 30], 0.1, 0.04),  # the same summary, read twice
        health(5.0, [40, 40], 0.2, 0.06),
    ]
    split = heartbeat_split(summaries, warmup=10)
    assert split is not None
    assert split.samples == 2
    # Per step, not per interval: 0.5 s at 0.1 s a step and 0.5 s at 0.2 s a step are 7.5
    # steps in 1 s (0.1333 s each), 5 of them with 0.04 s in collectives, 2.5 with 0.06 s.
    assert split.step_time_s == pytest.approx(1 / 7.5)
    assert split.collective_s == pytest.approx((5 * 0.04 + 2.5 * 0.06) / 7.5)
    assert split.compute_s == pytest.approx(split.step_time_s - split.collective_s)
    assert heartbeat_split(summaries[:2], warmup=10) is None


def test_mfu_is_the_mean_of_node_0s_rounds_past_the_warmup_each_once() -> None:
    def with_flops(time: float, steps: list[int], mfu: float | None) -> HealthSummary:
        flops = RunFlops(flops_per_second=(mfu or 0.1) * 1e15, mfu=mfu, gpus=2,
                         why_not=None if mfu is not None else SIMULATED)  # fmt: skip
        return health(time, steps, 0.1, 0.0).model_copy(update={"flops": flops})

    rounds = [with_flops(1.0, [3, 3], 0.9), with_flops(2.0, [20, 20], 0.40),
              with_flops(2.0, [20, 20], 0.40), with_flops(3.0, [30, 30], 0.44)]  # fmt: skip
    found = flops_mean(rounds, warmup=10)
    assert found.mfu == pytest.approx(0.42) and found.why_not is None
    assert found.flops_per_second == pytest.approx(0.42e15)
    simulated = flops_mean([with_flops(2.0, [20, 20], None)], warmup=10)
    assert simulated.mfu is None and simulated.why_not == SIMULATED
    assert simulated.flops_per_second == pytest.approx(1e14)
    none = flops_mean([health(2.0, [20, 20], 0.1, 0.0)], warmup=10)  # an older daemon
    assert (none.flops_per_second, none.mfu, none.why_not) == (None, None, None)


def point(world: int, value: float | None, unit: str = SAMPLES, sps: float = 1.0) -> ScalingPoint:
    return ScalingPoint(
        nodes=1,
        procs_per_node=world,
        world=world,
        run_id=f"r{world}",
        state="succeeded" if value is not None else "failed",
        throughput=value,
        unit=unit,
        steps_per_s=sps,
    )


def test_speedup_and_efficiency_are_against_the_smallest_measured_count() -> None:
    points = with_ratios([point(8, 6000.0), point(1, 1000.0), point(2, 1900.0), point(4, None)])
    assert [p.world for p in points] == [1, 2, 4, 8]
    assert [p.speedup for p in points] == [1.0, 1.9, None, 6.0]
    assert points[1].efficiency == 1900.0 / (2 * 1000.0)
    assert points[3].efficiency == 6000.0 / (8 * 1000.0)
    assert [p.guide_speedup for p in points] == [None, (1.8, 1.9), None, (6.0, 6.5)]


def test_without_one_process_the_base_is_the_smallest_count_and_guides_stay_blank() -> None:
    points = with_ratios([point(1, None), point(2, 1800.0), point(4, 3000.0)])
    assert points[0].speedup is None and points[1].speedup == 1.0
    assert points[2].efficiency == 3000.0 / (4 / 2 * 1800.0)
    assert all(p.guide_speedup is None for p in points)


def baseline(*points: ScalingPoint) -> ScalingResult:
    return ScalingResult(
        name="llm", measured_at=0.0, steps=100, warmup=20, points=with_ratios(points)
    )


def test_a_live_run_against_its_baseline() -> None:
    result = baseline(point(1, 1000.0, sps=4.0), point(2, 1800.0, sps=3.6))
    # The trainer logs samples/s: 8 processes at 6400 samples/s, against 8 × 1000.
    assert live_efficiency(result, 6400.0, "samples/s", 8) == pytest.approx(0.8)
    # gputop's steps/s: with the same batch per process, the step rate keeps the ratio.
    assert live_efficiency(result, 3.0, "steps/s", 8) == pytest.approx(0.75)
    assert live_efficiency(result, 3.0, "tokens/s", 8) is None  # another unit
    assert live_efficiency(baseline(point(1, None)), 3.0, "steps/s", 8) is None
