"""Scaling baselines in the user's config dir: one per spec name, the latest wins, a bad
file is one clear error."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpud.scaling.arithmetic import NodeHardware, ScalingPoint, ScalingResult
from gpud.scaling.baselines import BaselineFileError, load_baselines, save_baseline


def result(name: str, value: float) -> ScalingResult:
    point = ScalingPoint(nodes=1, procs_per_node=1, world=1, run_id="r", state="succeeded",
                         throughput=value, unit="samples/s")  # fmt: skip
    node = NodeHardware(node="gpu-a", control="gpu-a:7711", gpu_name="NVIDIA H100", gpu_count=8)
    return ScalingResult(name=name, measured_at=1.0, steps=100, warmup=20, hardware=[node],
                         points=[point])  # fmt: skip


def test_one_baseline_per_spec_name_in_the_config_dir(config_dir: Path) -> None:
    path = save_baseline(result("llm", 100.0))
    save_baseline(result("cnn", 7.0))
    save_baseline(result("llm", 120.0))
    assert path == config_dir / "scaling.json"
    assert path.stat().st_mode & 0o077 == 0  # the user's own
    stored = load_baselines().baselines
    assert sorted(stored) == ["cnn", "llm"]
    assert stored["llm"].points[0].throughput == 120.0
    assert stored["llm"].hardware[0].describe() == "gpu-a: 8× NVIDIA H100"


def test_a_broken_file_is_one_line_naming_it(config_dir: Path) -> None:
    config_dir.mkdir(parents=True)
    (config_dir / "scaling.json").write_text("{not json")
    with pytest.raises(BaselineFileError, match=r"scaling.json is not a readable baselines file"):
        load_baselines()
