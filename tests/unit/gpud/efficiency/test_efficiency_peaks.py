"""The peak table: NVML names to models, dtypes to dense peaks."""

from __future__ import annotations

import pytest

from gpud.efficiency.peaks import TERA, dtype_of, model_of


@pytest.mark.parametrize(
    ("nvml_name", "model"),
    [
        ("NVIDIA H100 80GB HBM3", "H100 SXM"),
        ("NVIDIA H100 SXM5 80GB", "H100 SXM"),
        ("NVIDIA H100 PCIe", "H100 PCIe"),
        ("NVIDIA H200", "H200"),
        ("NVIDIA H200 141GB HBM3e", "H200"),
        ("NVIDIA A100-SXM4-80GB", "A100"),
        ("NVIDIA A100-PCIE-40GB", "A100"),
        ("NVIDIA L4", "L4"),
        ("NVIDIA L40S", "L40S"),
        ("NVIDIA B200", "B200"),
    ],
)
def test_nvml_names_find_their_model(nvml_name: str, model: str) -> None:
    found = model_of(nvml_name)
    assert found is not None and found.name == model


@pytest.mark.parametrize(
    "nvml_name", ["NVIDIA L40", "Tesla V100-SXM2-16GB", "NVIDIA GeForce RTX 4090"]
)
def test_a_gpu_outside_the_table_has_no_model(nvml_name: str) -> None:
    assert model_of(nvml_name) is None


@pytest.mark.parametrize(
    ("nvml_name", "dtype", "tflops"),
    [
        ("NVIDIA H100 80GB HBM3", "bf16", 989.4),
        ("NVIDIA H100 80GB HBM3", "fp8", 1978.9),
        ("NVIDIA H100 80GB HBM3", "tf32", 494.7),
        ("NVIDIA H100 80GB HBM3", "fp32", 66.9),
        ("NVIDIA H100 PCIe", "bf16", 756.5),
        ("NVIDIA H100 PCIe", "fp32", 51.2),
        ("NVIDIA H200", "fp16", 989.4),
        ("NVIDIA A100-SXM4-80GB", "bf16", 312.0),
        ("NVIDIA A100-SXM4-80GB", "tf32", 156.0),
        ("NVIDIA A100-SXM4-80GB", "fp32", 19.5),
        ("NVIDIA L4", "bf16", 121.0),
        ("NVIDIA L4", "fp32", 30.3),
        ("NVIDIA L40S", "bf16", 362.05),
        ("NVIDIA L40S", "fp32", 91.6),
        ("NVIDIA B200", "bf16", 2250.0),
        ("NVIDIA B200", "fp8", 4500.0),
    ],
)
def test_dense_peaks_from_the_datasheets(nvml_name: str, dtype: str, tflops: float) -> None:
    model = model_of(nvml_name)
    assert model is not None
    assert model.peak_flops(dtype) == pytest.approx(tflops * TERA)  # type: ignore[arg-type]


def test_a_dtype_the_gpu_lacks_has_no_peak() -> None:
    a100 = model_of("NVIDIA A100-SXM4-80GB")
    assert a100 is not None and a100.peak_flops("fp8") is None


@pytest.mark.parametrize(
    ("precision", "dtype"),
    [(None, "fp32"), ("no", "fp32"), ("fp32", "fp32"), ("bf16", "bf16"), ("fp16", "fp16"),
     ("fp8", "fp8")],
)  # fmt: skip
def test_a_runs_precision_is_its_dtype(precision: str | None, dtype: str) -> None:
    assert dtype_of(precision) == dtype
