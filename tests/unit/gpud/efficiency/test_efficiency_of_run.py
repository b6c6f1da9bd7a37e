"""A run's FLOP rate where no rank beats (issue 32 §4): a script that knows nothing of gpud
gives its step time through its pattern, or its pace through the steps it prints."""

from __future__ import annotations

import pytest

from gpud.efficiency.mfu import NO_RATE, SIMULATED, RunGpus
from gpud.efficiency.of_run import run_flops
from launch.spec import parse_spec

#: nanoGPT's GPT-2 124M: 12 × 1024-token sequences per rank and step.
NANOGPT = parse_spec(
    {
        "name": "nanogpt",
        "script": "train.py",
        "nproc_per_node": 1,
        "training": {"batch_size_per_gpu": 12, "seq_len": 1024, "model_params": 124e6},
    }
)
H200 = RunGpus(names=["NVIDIA H200"], count=1)


def test_a_logged_step_time_gives_the_rate() -> None:
    found = run_flops(NANOGPT, [], 1, {"loss": 3.2, "step_time_ms": 100.0}, H200)
    # 12 samples × 1024 tokens / 0.1 s × 6 × 124e6 FLOPs per token
    assert found.source == "model_params"
    assert found.flops_per_second == pytest.approx(12 * 1024 / 0.1 * 6 * 124e6)
    assert found.mfu is not None and found.why_not is None


def test_the_pace_of_printed_steps_gives_it_where_nothing_is_logged() -> None:
    found = run_flops(NANOGPT, [], 1, {"loss": 3.2}, H200, pace_s=0.2)
    assert found.flops_per_second == pytest.approx(12 * 1024 / 0.2 * 6 * 124e6)
    # a logged step time is the script's own measure: it wins over the pace
    logged = run_flops(NANOGPT, [], 1, {"step_time_s": 0.1}, H200, pace_s=0.2)
    assert logged.flops_per_second == pytest.approx(12 * 1024 / 0.1 * 6 * 124e6)


def test_without_either_the_line_says_there_is_no_rate_even_on_a_simulated_gpu() -> None:
    simulated = RunGpus(names=["NVIDIA H200"], count=1, simulated=True)
    found = run_flops(NANOGPT, [], 1, {"loss": 3.2}, simulated)
    assert found.flops_per_second is None and found.why_not == NO_RATE
    paced = run_flops(NANOGPT, [], 1, {"loss": 3.2}, simulated, pace_s=0.2)
    assert paced.flops_per_second is not None and paced.why_not == SIMULATED


def test_a_scripts_pace_is_over_the_steps_it_printed_lately() -> None:
    from gpud.runs.health.telemetry import PACE_WINDOW_S, _RunTelemetry

    state = _RunTelemetry(attempt=1)
    assert state.pace(100.0) is None
    state.seen.extend([(0, 100.0), (10, 102.0), (20, 104.0)])  # a line every 10 steps
    assert state.pace(104.0) == pytest.approx(0.2)
    assert state.pace(104.0 + PACE_WINDOW_S + 1) is None  # it stopped stepping: no rate
