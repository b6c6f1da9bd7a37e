"""The recommendation table: memory classes, precision, ZeRO stage, workers, accumulation."""

from __future__ import annotations

import pytest

from gpud.hardware.host import HostSampler
from gpud.hardware.node import NodeSampler
from gpud.hardware.simulated import SimulatedSampler
from launch.autotune import MEMORY_CLASSES, memory_class, recommend, recommend_for_node

GIB = 1024**3
MIB = 1024**2


@pytest.mark.parametrize(
    ("board", "memory_bytes", "label"),
    [
        ("H100 80GB", 81559 * MIB, "≥80 GB"),
        ("H200", 143771 * MIB, "≥80 GB"),
        ("A100 40GB", 40960 * MIB, "40–80 GB"),
        ("RTX 4090", 24564 * MIB, "20–40 GB"),
        ("V100 16GB", 16160 * MIB, "14–20 GB"),
        ("T4", 15360 * MIB, "14–20 GB"),
        ("RTX 3080 12GB", 12288 * MIB, "10–14 GB"),
        ("RTX 3070 8GB", 8192 * MIB, "6–10 GB"),
        ("GTX 1650 4GB", 4096 * MIB, "<6 GB"),
    ],
)
def test_real_boards_land_in_their_advertised_class(
    board: str, memory_bytes: int, label: str
) -> None:
    assert memory_class(memory_bytes).label == label, board


def test_classes_are_ordered_and_cover_zero() -> None:
    bounds = [c.min_gb for c in MEMORY_CLASSES]
    assert bounds == sorted(bounds, reverse=True)
    assert bounds[-1] == 0
    assert [c.label for c in MEMORY_CLASSES] == [
        "≥80 GB",
        "40–80 GB",
        "20–40 GB",
        "14–20 GB",
        "10–14 GB",
        "6–10 GB",
        "<6 GB",
    ]


def test_single_gpu_needs_no_zero_and_bf16_follows_compute_capability() -> None:
    rec = recommend(1, 24 * GIB, (8, 9), cpu_cores=16)
    assert rec.zero_stage == 0
    assert rec.mixed_precision == "bf16"
    assert recommend(1, 16 * GIB, (7, 0), cpu_cores=16).mixed_precision == "fp16"


def test_several_gpus_use_zero2_unless_memory_is_tight() -> None:
    assert recommend(8, 80 * GIB, (9, 0), cpu_cores=96).zero_stage == 2
    assert recommend(4, 12 * GIB, (8, 6), cpu_cores=32).zero_stage == 3
    assert recommend(4, 8 * GIB, (8, 6), cpu_cores=32).gradient_checkpointing is True
    assert recommend(4, 80 * GIB, (9, 0), cpu_cores=32).gradient_checkpointing is False


def test_accumulation_reaches_the_target_batch() -> None:
    rec = recommend(2, 12 * GIB, (8, 6), cpu_cores=16, target_batch=256)
    assert rec.batch_size_per_gpu == 4
    assert rec.gradient_accumulation == 32
    assert rec.effective_batch == 256
    big = recommend(8, 80 * GIB, (9, 0), cpu_cores=96, target_batch=256)
    assert (big.batch_size_per_gpu, big.gradient_accumulation, big.effective_batch) == (32, 1, 256)
    odd = recommend(3, 8 * GIB, (8, 0), cpu_cores=16, target_batch=100)
    assert odd.effective_batch >= 100
    assert odd.effective_batch - odd.batch_size_per_gpu * 3 < 100  # no whole extra step


def test_workers_are_three_per_gpu_bounded_by_cores() -> None:
    assert recommend(8, 80 * GIB, (9, 0), cpu_cores=128).dataloader_workers_per_gpu == 3
    assert recommend(8, 80 * GIB, (9, 0), cpu_cores=24).dataloader_workers_per_gpu == 2
    assert recommend(8, 80 * GIB, (9, 0), cpu_cores=2).dataloader_workers_per_gpu == 0


def test_no_gpu_means_cpu_training() -> None:
    rec = recommend(0, None, None, cpu_cores=2)
    assert rec.memory_class == "no GPU (CPU)"
    assert (rec.mixed_precision, rec.zero_stage) == ("fp32", 0)


def test_bad_target_batch_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        recommend(1, GIB, None, cpu_cores=1, target_batch=0)


def test_recommendation_for_a_simulated_node_snapshot() -> None:
    sampler = NodeSampler("n", SimulatedSampler(8, "n"), HostSampler(), interval_s=1.0)
    rec = recommend_for_node(sampler.sample())
    assert rec.memory_class == "≥80 GB" and rec.gpus == 8
    assert rec.mixed_precision == "bf16" and rec.zero_stage == 2
