"""Peak FLOP/s per GPU: a table of GPU model × dtype, and the lookup from NVML's name.

Dense figures (no 2:4 sparsity: NVIDIA's datasheets print the sparse figure first, marked
with an asterisk; the dense one is half of it), in TFLOP/s, per GPU, at the board's
default power limit. Sources, NVIDIA's datasheets:

- H100 SXM and PCIe: "NVIDIA H100 Tensor Core GPU" datasheet
  (nvidia.com/en-us/data-center/h100/): SXM bf16/fp16 989.4, fp8 1978.9, tf32 494.7,
  fp32 66.9; PCIe bf16/fp16 756.5, fp8 1513, tf32 378, fp32 51.2.
- H200: "NVIDIA H200 Tensor Core GPU" datasheet (nvidia.com/en-us/data-center/h200/): the
  same Hopper die and clocks as H100 SXM, the same figures.
- A100: "NVIDIA A100 Tensor Core GPU" datasheet (nvidia.com/en-us/data-center/a100/):
  SXM and PCIe alike, bf16/fp16 312, tf32 156, fp32 19.5 (no fp8 on Ampere).
- L4: "NVIDIA L4 Tensor Core GPU" datasheet (nvidia.com/en-us/data-center/l4/):
  bf16/fp16 121, fp8 242.5, tf32 60, fp32 30.3.
- L40S: "NVIDIA L40S" datasheet (nvidia.com/en-us/data-center/l40s/): bf16/fp16 362.05,
  fp8 733, tf32 183, fp32 91.6.
- B200: "NVIDIA HGX B200" / "DGX B200" datasheets (nvidia.com/en-us/data-center/hgx/),
  per GPU at 1,000 W: bf16/fp16 2250, fp8 4500, tf32 1100, fp32 75.

`fp32` is the CUDA cores' figure (what a plain fp32 run gets unless it allows TF32); a run
that sets `torch.backends.cuda.matmul.allow_tf32` uses the tensor cores' `tf32` figure,
which gpud cannot see, so its MFU against fp32 may read above 100 %.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

Dtype = Literal["fp32", "tf32", "bf16", "fp16", "fp8"]
TERA = 1e12


@dataclass(frozen=True)
class GpuModel:
    """One row of the table: a GPU model and its dense peak TFLOP/s by dtype."""

    name: str
    #: Matched against NVML's name, upper-cased; the first row that matches wins.
    pattern: str
    tflops: dict[str, float]

    def peak_flops(self, dtype: Dtype) -> float | None:
        """FLOP/s at `dtype` (None: the table has no figure for it)."""
        tflops = self.tflops.get(dtype)
        return None if tflops is None else tflops * TERA


_HOPPER_SXM = {"bf16": 989.4, "fp16": 989.4, "fp8": 1978.9, "tf32": 494.7, "fp32": 66.9}

#: Ordered: a more specific name first (H100 PCIe before H100, L40S before L4).
MODELS: tuple[GpuModel, ...] = (
    GpuModel("H100 PCIe", r"\bH100\b.*\bPCIE\b",
             {"bf16": 756.5, "fp16": 756.5, "fp8": 1513.0, "tf32": 378.0, "fp32": 51.2}),
    # "NVIDIA H100 80GB HBM3", "NVIDIA H100 SXM5 80GB": the SXM board.
    GpuModel("H100 SXM", r"\bH100\b", _HOPPER_SXM),
    GpuModel("H200", r"\bH200\b", _HOPPER_SXM),
    # "NVIDIA A100-SXM4-80GB", "NVIDIA A100-PCIE-40GB", "NVIDIA A100 80GB PCIe".
    GpuModel("A100", r"\bA100\b", {"bf16": 312.0, "fp16": 312.0, "tf32": 156.0, "fp32": 19.5}),
    GpuModel("L40S", r"\bL40S\b",
             {"bf16": 362.05, "fp16": 362.05, "fp8": 733.0, "tf32": 183.0, "fp32": 91.6}),
    GpuModel("L4", r"\bL4\b",
             {"bf16": 121.0, "fp16": 121.0, "fp8": 242.5, "tf32": 60.0, "fp32": 30.3}),
    GpuModel("B200", r"\bB200\b",
             {"bf16": 2250.0, "fp16": 2250.0, "fp8": 4500.0, "tf32": 1100.0, "fp32": 75.0}),
)  # fmt: skip


def model_of(nvml_name: str) -> GpuModel | None:
    """The table's row for a GPU by its NVML name (None: not in the table)."""
    upper = nvml_name.upper()
    return next((m for m in MODELS if re.search(m.pattern, upper)), None)


def dtype_of(precision: str | None) -> Dtype:
    """A run's compute dtype from its precision setting (`no`, None: fp32)."""
    if precision in ("bf16", "fp16", "fp8"):
        return precision  # type: ignore[return-value]
    return "fp32"


__all__ = ["MODELS", "TERA", "Dtype", "GpuModel", "dtype_of", "model_of"]
