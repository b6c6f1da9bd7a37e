"""Which GPUs a run's part gets: the spec's `gpus`, the node's GPUs, and who holds them.

Pure functions of plain values (no NVML, no store, no processes), so every rule is tested
on hand-made inputs:

- `gpus` unset: `nproc_per_node` GPUs, or every free GPU when it is `auto`;
- a count: that many free GPUs, close together (`closeness`: NVML's topology, where the
  box has a mix of NVLink and PCIe paths);
- a list of indices or UUIDs: exactly those, each free;
- `all`: every GPU of the node, each free.

A GPU is busy when an active run holds its lease, or when a process that belongs to no
gpud run holds more than `FOREIGN_MEMORY_BYTES` on it. A request the node can never meet
(a GPU it does not have, more GPUs than it has) is a `GpuRequestError`; one it cannot meet
now is `GpusBusy`, which names who holds the GPUs and how many are free.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from gpud.model.run import gpus_text

#: A process outside gpud that holds less than this on a GPU does not make it busy (the
#: CUDA context of a monitoring tool, a stray `nvidia-smi`).
FOREIGN_MEMORY_BYTES = 256 * 2**20

GpusWanted = int | list[int | str] | Literal["all"] | None


@dataclass(frozen=True)
class Gpu:
    """One GPU of the node, as leases name it."""

    index: int
    uuid: str


@dataclass(frozen=True)
class Holder:
    """Who holds a GPU: a gpud run, or a process outside gpud."""

    run_id: str | None = None
    run_name: str | None = None
    pid: int | None = None
    process: str | None = None
    slurm_job: str | None = None  # the Slurm job the outside process belongs to
    hold: str | None = None  # quarantined or drained (gpud.heal): why, in words

    @property
    def text(self) -> str:
        if self.hold is not None:
            return self.hold
        if self.run_id is not None:
            return f"run {self.run_id}" + (f" ({self.run_name})" if self.run_name else "")
        if self.slurm_job:
            return f"Slurm job {self.slurm_job} (pid {self.pid}, {self.process or '?'})"
        return f"pid {self.pid} ({self.process or '?'}) outside gpud"


class GpuRequestError(ValueError):
    """The spec asks for GPUs this node does not have: no wait makes it possible."""


class GpusBusy(Exception):
    """The GPUs the spec asks for are held now."""

    def __init__(self, needed: int, free: int, holders: Sequence[tuple[Gpu, Holder]]) -> None:
        self.needed = needed
        self.free = free
        self.holders = list(holders)
        by_holder: dict[str, list[int]] = {}
        for gpu, holder in self.holders:
            what = holder.text if holder.hold is not None else f"held by {holder.text}"
            by_holder.setdefault(what, []).append(gpu.index)
        held = "; ".join(f"GPU {gpus_text(i)} {what}" for what, i in by_holder.items())
        super().__init__(f"needs {needed} GPU(s), {free} free" + (f": {held}" if held else ""))


Closeness = Callable[[int, int], int]


def _no_topology(a: int, b: int) -> int:
    return 0


def _resolve(entry: int | str, gpus: Sequence[Gpu]) -> Gpu:
    for gpu in gpus:
        if (isinstance(entry, int) and gpu.index == entry) or (
            isinstance(entry, str) and gpu.uuid == entry
        ):
            return gpu
    have = f"GPUs 0-{len(gpus) - 1}" if gpus else "no GPUs"
    raise GpuRequestError(f"gpus: the node has no GPU {entry!r} (it has {have})")


def wanted(want: GpusWanted, nproc: int | Literal["auto"], gpus: Sequence[Gpu]) -> int | None:
    """How many GPUs the request needs; None: every free one (`auto` with `gpus` unset)."""
    if want == "all":
        return len(gpus)
    if isinstance(want, list):
        return len(want)
    count = want if want is not None else (None if nproc == "auto" else nproc)
    if count is not None and count > len(gpus):
        raise GpuRequestError(
            f"gpus: {count} GPU(s) asked for, the node has {len(gpus)}"
            + ("" if want is not None else " (from nproc_per_node; set `gpus` to share them)")
        )
    return count


def choose(
    want: GpusWanted,
    nproc: int | Literal["auto"],
    gpus: Sequence[Gpu],
    busy: Mapping[str, Holder],
    closeness: Closeness | None = None,
) -> list[Gpu]:
    """The GPUs to lease, in index order; raises GpuRequestError or GpusBusy.

    `busy` maps a busy GPU's UUID to who holds it; `closeness(a, b)` (by index) is how far
    apart two GPUs are, lower is closer (NVML's topology levels, NVLink 0).
    """
    free = [g for g in gpus if g.uuid not in busy]
    count = wanted(want, nproc, gpus)
    if want == "all" or isinstance(want, list):
        chosen = list(gpus) if want == "all" else [_resolve(e, gpus) for e in want]
        held = [(g, busy[g.uuid]) for g in chosen if g.uuid in busy]
        if held:
            raise GpusBusy(len(chosen), len(free), held)
        return sorted(chosen, key=lambda g: g.index)
    if count is None:  # auto: every free GPU
        if not free:
            raise GpusBusy(1, 0, [(g, busy[g.uuid]) for g in gpus])
        return free
    if len(free) < count:
        raise GpusBusy(count, len(free), [(g, busy[g.uuid]) for g in gpus if g.uuid in busy])
    return closest(free, count, closeness or _no_topology)


def closeness_from(peer_distance: Mapping[int, Mapping[int, int] | None]) -> Closeness:
    """`closeness` from each GPU's `peer_distance` (NVML's topology; unknown reads as 0,
    so without a topology the lowest free indices win)."""

    def closeness(a: int, b: int) -> int:
        return 0 if a == b else (peer_distance.get(a) or {}).get(b, 0)

    return closeness


def closest(free: Sequence[Gpu], count: int, closeness: Closeness) -> list[Gpu]:
    """`count` of the free GPUs that sit closest together.

    Greedy from every seed: the seed and its nearest free GPUs (by distance, then index);
    the set with the smallest farthest pair wins, then the smallest total, then the lowest
    indices. Exact enough for the topologies NVML reports (a few levels, symmetric).
    """
    best: tuple[tuple[int, int, list[int]], list[Gpu]] | None = None
    for seed in free:
        near = sorted(free, key=lambda g: (closeness(seed.index, g.index), g.index))
        pick = sorted([seed, *[g for g in near if g != seed][: count - 1]], key=lambda g: g.index)
        pairs = [closeness(a.index, b.index) for i, a in enumerate(pick) for b in pick[i + 1 :]]
        score = (max(pairs, default=0), sum(pairs), [g.index for g in pick])
        if best is None or score < best[0]:
            best = (score, pick)
    assert best is not None
    return best[1]
