"""MFU's math: the FLOPs sources in their order, and MFU or the reason it is n/a."""

from __future__ import annotations

import pytest

from gpud.efficiency.mfu import (
    NO_GPU,
    NO_RATE,
    NO_SOURCE,
    SIMULATED,
    FlopsInputs,
    RunGpus,
    achieved,
    utilization,
)
from gpud.efficiency.model import flops_text
from gpud.efficiency.peaks import TERA

H100 = "NVIDIA H100 80GB HBM3"
EIGHT_H100 = RunGpus(names=[H100] * 8, count=8, sm_active_pct=[80.0] * 8)


def test_counted_flops_are_each_ranks_per_step_over_its_step_time() -> None:
    # Two ranks of 4 heard from, each 1e12 FLOPs per step; 0.5 s and 0.25 s per step.
    found = achieved(FlopsInputs(counted=[(1e12, 0.5), (1e12, 0.25)], world_size=4))
    assert found is not None and found[1] == "counted"
    assert found[0] == pytest.approx(3e12 * 4)


def test_spec_flops_per_sample_times_samples_per_second() -> None:
    found = achieved(FlopsInputs(samples_per_s=100.0, flops_per_sample=2e9))
    assert found is not None and found[1] == "flops_per_sample"
    assert found[0] == pytest.approx(2e11)


def test_six_n_tokens_from_model_params() -> None:
    found = achieved(FlopsInputs(tokens_per_s=1000.0, model_params=7_000_000_000))
    assert found is not None and found[1] == "model_params"
    assert found[0] == pytest.approx(6 * 7e9 * 1000)


def test_the_trainers_logged_flops() -> None:
    found = achieved(FlopsInputs(logged={"loss": 1.0, "flops_per_s": 5e14}))
    assert found == (5e14, "logged")


def test_the_best_source_wins() -> None:
    every = FlopsInputs(
        counted=[(1e12, 1.0)],
        world_size=1,
        logged={"flops_per_s": 9.0},
        samples_per_s=1.0,
        tokens_per_s=1.0,
        flops_per_sample=7.0,
        model_params=1,
    )
    assert achieved(every) == (1e12, "counted")
    no_count = FlopsInputs(logged={"flops_per_s": 9.0}, samples_per_s=1.0, flops_per_sample=7.0)
    assert achieved(no_count) == (7.0, "flops_per_sample")


def test_no_source_is_none() -> None:
    assert achieved(FlopsInputs(samples_per_s=100.0)) is None
    assert achieved(FlopsInputs(model_params=10)) is None  # no tokens/s: no seq_len


def test_mfu_is_achieved_over_peak_times_gpus() -> None:
    peak = 989.4 * TERA
    inputs = FlopsInputs(logged={"flops_per_s": 0.4 * peak * 8})
    found = utilization(inputs, EIGHT_H100, "bf16")
    assert found.mfu == pytest.approx(0.4)
    assert found.mfu_text == "40.0%"
    assert found.peak_flops_per_gpu == pytest.approx(peak)
    assert (found.gpu_model, found.dtype, found.gpus) == ("H100 SXM", "bf16", 8)
    assert found.sm_active == pytest.approx(0.8)
    assert found.why_not is None


def test_mfu_is_held_to_the_runs_dtype() -> None:
    inputs = FlopsInputs(logged={"flops_per_s": 66.9 * TERA * 0.5})
    found = utilization(inputs, RunGpus(names=[H100], count=1), None)  # fp32
    assert found.dtype == "fp32"
    assert found.mfu == pytest.approx(0.5)


def test_a_cpu_run_has_no_mfu() -> None:
    found = utilization(FlopsInputs(logged={"flops_per_s": 1e9}), RunGpus(), None)
    assert found.mfu is None and found.why_not == NO_GPU
    assert found.flops_per_second == 1e9  # the FLOP rate is still shown


def test_a_simulated_gpu_has_flops_but_no_mfu() -> None:
    gpus = RunGpus(names=[H100], count=1, simulated=True)
    found = utilization(FlopsInputs(samples_per_s=10.0, flops_per_sample=1e6), gpus, "bf16")
    assert found.flops_per_second == pytest.approx(1e7)
    assert found.mfu is None and found.mfu_text == "n/a"
    assert found.why_not == SIMULATED
    assert found.gpu_model == "H100 SXM (simulated)"
    assert found.peak_flops_per_gpu is None


def test_an_unknown_gpu_says_so() -> None:
    gpus = RunGpus(names=["Tesla V100-SXM2-16GB"], count=1)
    found = utilization(FlopsInputs(logged={"flops_per_s": 1e12}), gpus, "fp16")
    assert found.mfu is None
    assert found.why_not == "Tesla V100-SXM2-16GB: not in gpud's peak table (gpud.efficiency)"


def test_a_dtype_the_table_lacks_says_so() -> None:
    gpus = RunGpus(names=["NVIDIA A100-SXM4-80GB"], count=1)
    found = utilization(FlopsInputs(logged={"flops_per_s": 1e12}), gpus, "fp8")
    assert found.why_not == "the table has no fp8 peak for A100"


def test_gpus_of_two_models_have_no_one_peak() -> None:
    gpus = RunGpus(names=[H100, "NVIDIA A100-SXM4-80GB"], count=2)
    found = utilization(FlopsInputs(logged={"flops_per_s": 1e12}), gpus, "bf16")
    assert found.mfu is None and found.why_not == "GPUs of several models: no one peak"


def test_no_source_says_how_to_give_one() -> None:
    found = utilization(FlopsInputs(), EIGHT_H100, "bf16")
    assert found.flops_per_second is None and found.why_not == NO_SOURCE
    assert found.peak_flops_per_gpu == pytest.approx(989.4 * TERA)


@pytest.mark.parametrize(
    "gpus",
    [RunGpus(names=[H100], count=1, simulated=True), RunGpus(), EIGHT_H100],
    ids=["simulated", "cpu", "h100"],
)
def test_no_flop_rate_is_said_before_what_the_gpus_would_say(gpus: RunGpus) -> None:
    # Issue 32 §4: on simulated GPUs the line said "simulated GPU", hiding that there
    # was no FLOP rate at all.
    assert utilization(FlopsInputs(), gpus, "bf16").why_not == NO_SOURCE
    named = FlopsInputs(model_params=124e6, world_size=1)  # a source, but no rate to apply
    assert utilization(named, gpus, "bf16").why_not == NO_RATE


@pytest.mark.parametrize(
    ("value", "text"),
    [(None, "-"), (3.124e14, "312.4 TFLOP/s"), (1.2e15, "1.2 PFLOP/s"), (8.5e11, "850.0 GFLOP/s")],
)
def test_flops_for_people(value: float | None, text: str) -> None:
    assert flops_text(value) == text


def test_the_lines_gpuctl_status_prints() -> None:
    peak = 989.4 * TERA
    found = utilization(FlopsInputs(logged={"flops_per_s": 0.412 * peak * 8}), EIGHT_H100, "bf16")
    assert found.flops_line == "3.3 PFLOP/s (the trainer's logged flops_per_s)"
    assert found.mfu_line == (
        "41.2% of 8 × H100 SXM at bf16 (989.4 TFLOP/s each); SM active 80% (the hardware's view)"
    )
    cpu = utilization(FlopsInputs(samples_per_s=10.0, flops_per_sample=1e9), RunGpus(), None)
    assert cpu.flops_line == "10.0 GFLOP/s (training.flops_per_sample × samples/s)"
    assert cpu.mfu_line == f"n/a: {NO_GPU}"
    nothing = utilization(FlopsInputs(), EIGHT_H100, "bf16")
    assert nothing.flops_line == f"n/a: {NO_SOURCE}"
