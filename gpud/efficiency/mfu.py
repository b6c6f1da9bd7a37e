"""The math of MFU: achieved FLOP/s from the best source a run offers, and MFU against the
peak of its GPUs at its precision. Pure: numbers in, an `RunFlops` out.

Sources, best first (the first a run offers is used, and named):

1. `counted`: the trainers library counted one step's FLOPs on each rank
   (`run.count_flops()`, torch.utils.flop_counter, once); achieved = Σ over ranks of FLOPs
   per step ÷ the rank's step time (ranks not heard from count as the mean of those heard).
2. `flops_per_sample`: the spec's `training.flops_per_sample` × samples/s.
3. `model_params`: the 6·N rule, 6 × `training.model_params` × tokens/s (forward 2N,
   backward 4N per token; attention's own FLOPs are not counted, so it reads a little low
   for long sequences).
4. `logged`: the trainer logs `flops_per_s` itself (all ranks together).

MFU = achieved ÷ (peak per GPU × GPUs). It is n/a, with the reason in `why_not`, for a run
without GPUs (a CPU run), on simulated GPUs (the work runs on the CPU: an MFU against an
H100's peak would be a made-up number, so gpud shows the FLOP/s and says why there is no
MFU), on a GPU model or dtype the table lacks, and on GPUs of several models.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from gpud.efficiency.model import FlopsSource, RunFlops
from gpud.efficiency.peaks import dtype_of, model_of

#: Metric names a trainer may log its achieved FLOP/s under (all ranks together).
LOGGED_FLOPS_NAMES = ("flops_per_s", "flops/s", "flops_per_sec")
#: FLOPs per parameter and token for a training step: 2 forward, 4 backward.
FLOPS_PER_PARAM_TOKEN = 6

NO_SOURCE = (
    "no FLOPs source: wrap a step in run.count_flops(), set training.flops_per_sample or"
    " training.model_params (with seq_len), or log flops_per_s"
)
NO_GPU = "no GPU: the run trains on CPU"
SIMULATED = "simulated GPU: its work runs on the CPU, so no peak applies"
NO_RATE = (
    "no step rate yet: the run has reported no step time and not two steps lately"
    " (or training.batch_size_per_gpu is unset)"
)


@dataclass(frozen=True)
class FlopsInputs:
    """What the daemon knows of a training run's work."""

    #: Per rank that counted: (FLOPs per step, its recent seconds per step).
    counted: Sequence[tuple[float, float]] = ()
    world_size: int | None = None
    logged: Mapping[str, float] = field(default_factory=dict)
    samples_per_s: float | None = None
    tokens_per_s: float | None = None
    flops_per_sample: float | None = None
    model_params: float | None = None


@dataclass(frozen=True)
class RunGpus:
    """The GPUs a run uses, as node 0 sees its own (all nodes are assumed alike)."""

    names: Sequence[str] = ()  # NVML names of the run's GPUs on node 0
    count: int = 0  # GPUs on all nodes
    simulated: bool = False
    sm_active_pct: Sequence[float] = ()  # the GPUs' SM activity where offered


def achieved(inputs: FlopsInputs) -> tuple[float, FlopsSource] | None:
    """Achieved FLOP/s and its source, from the best source available (None: none)."""
    rates = [flops / seconds for flops, seconds in inputs.counted if flops > 0 and seconds > 0]
    if rates:
        ranks = max(inputs.world_size or 0, len(rates))
        return statistics.fmean(rates) * ranks, "counted"
    if inputs.flops_per_sample and inputs.samples_per_s:
        return inputs.flops_per_sample * inputs.samples_per_s, "flops_per_sample"
    if inputs.model_params and inputs.tokens_per_s:
        return FLOPS_PER_PARAM_TOKEN * inputs.model_params * inputs.tokens_per_s, "model_params"
    for name in LOGGED_FLOPS_NAMES:
        if name in inputs.logged and inputs.logged[name] > 0:
            return inputs.logged[name], "logged"
    return None


def utilization(inputs: FlopsInputs, gpus: RunGpus, precision: str | None) -> RunFlops:
    """The run's achieved FLOP/s, its GPUs' peak at its precision, and the MFU (or why not)."""
    dtype = dtype_of(precision)
    found = achieved(inputs)
    flops, source = found if found else (None, None)
    sm = [p for p in gpus.sm_active_pct if p is not None]
    base = RunFlops(
        flops_per_second=flops,
        source=source,
        dtype=dtype,
        gpus=gpus.count,
        sm_active=round(statistics.fmean(sm) / 100, 4) if sm else None,
    )
    rows = [model_of(name) for name in gpus.names]
    kinds = {row.name if row else name for row, name in zip(rows, gpus.names, strict=True)}
    model = rows[0] if rows and len(kinds) == 1 else None
    named = model.name if model else (gpus.names[0] if gpus.names else None)
    if gpus.simulated and named:
        named += " (simulated)"
    peak = model.peak_flops(dtype) if model and not gpus.simulated else None
    base = base.model_copy(update={"gpu_model": named, "peak_flops_per_gpu": peak})
    if flops is None:  # no FLOP rate at all: that is the news, whatever the GPUs
        return base.model_copy(update={"why_not": _no_flops(inputs)})
    if gpus.count == 0 or not gpus.names:
        return base.model_copy(update={"why_not": NO_GPU})
    if gpus.simulated:
        return base.model_copy(update={"why_not": SIMULATED})
    if len(kinds) > 1:
        return base.model_copy(update={"why_not": "GPUs of several models: no one peak"})
    if model is None:
        return base.model_copy(
            update={"why_not": f"{gpus.names[0]}: not in gpud's peak table (gpud.efficiency)"}
        )
    if peak is None:
        return base.model_copy(update={"why_not": f"the table has no {dtype} peak for {named}"})
    return base.model_copy(update={"mfu": round(flops / (peak * gpus.count), 6)})


def _no_flops(inputs: FlopsInputs) -> str:
    """Why there is no FLOP rate: no source named, or a source without a rate to apply."""
    if inputs.flops_per_sample or inputs.model_params:
        return NO_RATE
    return NO_SOURCE


__all__ = [
    "FLOPS_PER_PARAM_TOKEN",
    "LOGGED_FLOPS_NAMES",
    "NO_GPU",
    "NO_SOURCE",
    "SIMULATED",
    "FlopsInputs",
    "RunGpus",
    "achieved",
    "utilization",
]
