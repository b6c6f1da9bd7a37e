"""`RunFlops`: a run's achieved FLOP/s, its GPUs' peak and the MFU, as every view reads it.

A record of its own (imports only `Reading`) so the run model can carry it without
importing the math."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from gpud.model.snapshot import Reading

FlopsSource = Literal["counted", "flops_per_sample", "model_params", "logged"]

#: Each source in words, for `gpuctl status` and gputop's Run screen.
SOURCE_TEXT: dict[str, str] = {
    "counted": "counted on the first step by run.count_flops()",
    "flops_per_sample": "training.flops_per_sample × samples/s",
    "model_params": "6 × training.model_params × tokens/s",
    "logged": "the trainer's logged flops_per_s",
}


class RunFlops(Reading):
    """Model FLOPs utilization of a run now: achieved ÷ (peak per GPU × GPUs)."""

    flops_per_second: float | None = Field(
        None, description="achieved FLOP/s, all ranks together; None: no FLOPs source"
    )
    source: FlopsSource | None = Field(None, description="where the FLOPs come from")
    gpu_model: str | None = Field(
        None, description="the peak table's GPU model; the NVML name where it has none"
    )
    dtype: str = Field("fp32", description="the run's precision: the peak it is held to")
    gpus: int = Field(0, description="GPUs the run uses, all nodes")
    peak_flops_per_gpu: float | None = Field(None, description="dense peak FLOP/s at dtype")
    mfu: float | None = Field(None, description="achieved ÷ (peak × gpus), 0 to 1; None: n/a")
    why_not: str | None = Field(None, description="why mfu (or flops_per_second) is n/a")
    sm_active: float | None = Field(
        None,
        description="the hardware's view: mean SM activity of the run's GPUs on node 0,"
        " 0 to 1 (DCGM_FI_PROF_SM_ACTIVE; None where the GPU does not offer it)",
    )

    @property
    def mfu_text(self) -> str:
        """`41.2%`, else `n/a` (the reason is in `why_not`)."""
        return "n/a" if self.mfu is None else f"{self.mfu * 100:.1f}%"

    @property
    def source_text(self) -> str:
        return SOURCE_TEXT.get(self.source or "", "none")

    @property
    def flops_line(self) -> str:
        """`312.4 TFLOP/s (where from)`, else `n/a: why`."""
        if self.flops_per_second is None:
            return f"n/a: {self.why_not}" if self.why_not else "n/a"
        return f"{flops_text(self.flops_per_second)} ({self.source_text})"

    @property
    def mfu_line(self) -> str:
        """`31.6% of 8 × H100 SXM at bf16 (989.4 TFLOP/s each)`, else `n/a: why`; then the
        hardware's view, `SM active 78%`, where the GPUs offer it."""
        if self.mfu is not None:
            text = (
                f"{self.mfu_text} of {self.gpus} × {self.gpu_model} at {self.dtype}"
                f" ({flops_text(self.peak_flops_per_gpu)} each)"
            )
        else:
            text = f"n/a: {self.why_not}" if self.why_not else "n/a"
        if self.sm_active is not None:
            text += f"; SM active {self.sm_active * 100:.0f}% (the hardware's view)"
        return text


def flops_text(flops_per_s: float | None) -> str:
    """FLOP/s for people: `312.4 TFLOP/s`, `1.2 PFLOP/s`, `850 GFLOP/s` (`-`: none)."""
    if flops_per_s is None:
        return "-"
    for scale, unit in ((1e15, "PFLOP/s"), (1e12, "TFLOP/s"), (1e9, "GFLOP/s"), (1e6, "MFLOP/s")):
        if flops_per_s >= scale:
            return f"{flops_per_s / scale:.1f} {unit}"
    return f"{flops_per_s:.0f} FLOP/s"


__all__ = ["SOURCE_TEXT", "FlopsSource", "RunFlops", "flops_text"]
