"""Elastic runs (issue 21 §3): which of a run's nodes an attempt uses, and what it is told.

A run's `nodes` are its primary nodes (the spec's, node 0 first) and then its spares
(`elastic.spares`: joined at launch, idle until needed). Each attempt uses `members`, a
list of indices into `nodes`, node 0 first: every primary node for a run that is not
elastic, or when all are healthy. When a node is lost, drained or refused, node 0 starts
the next attempt on the primary nodes that answer and can give their GPUs, topped up with
spares, up to `elastic.max_nodes` (default: as many as the primary nodes); with fewer than
`elastic.min_nodes` an automatic restart waits (queued) when the spec has `queue: true`,
and fails otherwise. The attempt's node rank of a node is its place in `members`, so
torchrun sees a smaller `--nnodes` and a contiguous rank.

With `keep_global_batch` (the default) the gradient accumulation grows as the world
shrinks (`grad_accum_for`), so batch × accumulation × world stays as it was; the
learning rate is left alone. Node 0 must be in every attempt: it coordinates the run and
hosts the rendezvous, so a run whose node 0 is lost fails as before.

Pure: run records and specs in, decisions out; `reads_grad_accum` alone reads the script
(`launch.scripts`), to say whether a smaller world keeps the global batch.
"""

from __future__ import annotations

import math
import re

from gpud.model.run import RunRecord
from launch.scripts import USES_LIBRARY, script_text
from launch.spec import RunSpec


def spare_count(run: RunRecord, spec: RunSpec) -> int:
    """How many of the run's nodes, at the end of the list, are spares."""
    spares = len(spec.elastic.spares) if spec.elastic is not None else 0
    return min(spares, max(0, len(run.nodes) - 1))


def primary(run: RunRecord, spec: RunSpec) -> list[int]:
    """The run's primary nodes: the ones the spec (or --node) named, node 0 first."""
    return list(range(len(run.nodes) - spare_count(run, spec)))


def members_of(run: RunRecord, spec: RunSpec | None = None) -> list[int]:
    """The nodes of the current attempt (every primary node unless elastic chose)."""
    if run.members is not None:
        return list(run.members)
    if spec is None:
        return list(range(len(run.nodes)))
    return primary(run, spec)


def attempt_rank(run: RunRecord, members: list[int]) -> int:
    """This node's rank in the attempt (its place in `members`)."""
    return members.index(run.node_rank)


def choose_members(
    run: RunRecord, spec: RunSpec, available: set[int]
) -> tuple[list[int] | None, str]:
    """The nodes the next attempt uses, from those `available` (answering, not drained,
    their GPUs free), and a few words on the choice; None and why when too few are."""
    first = primary(run, spec)
    if spec.elastic is None:
        missing = [r for r in first if r not in available]
        if missing:
            return None, "node(s) " + ", ".join(map(str, missing)) + " not available"
        return first, f"all {len(first)} node(s)"
    if 0 not in available:
        return None, "node 0 coordinates the run and is not available"
    most = spec.elastic.max_nodes or len(first)
    chosen = [r for r in first if r in available][:most]
    spares = [r for r in range(len(first), len(run.nodes)) if r in available]
    added = spares[: max(0, min(most, len(first)) - len(chosen))]
    chosen += added
    if len(chosen) < spec.elastic.min_nodes:
        which = ", ".join(map(str, chosen))
        return None, (
            f"{len(chosen)} healthy node(s) ({which}), fewer than elastic.min_nodes"
            f" {spec.elastic.min_nodes}"
        )
    left_out = [r for r in first if r not in chosen]
    words = f"{len(chosen)}/{len(first)} node(s)"
    if left_out:
        words += " without node(s) " + ", ".join(map(str, left_out))
    if added:
        words += ", with spare(s) " + ", ".join(map(str, added))
    return chosen, words


def grad_accum_for(spec: RunSpec, nodes_now: int, nodes_full: int) -> int | None:
    """The accumulation that keeps the global batch at `nodes_now` of `nodes_full` nodes
    (rounded up when it does not divide); None: leave the spec's."""
    if spec.elastic is None or not spec.elastic.keep_global_batch or nodes_now >= nodes_full:
        return None
    base = spec.training.gradient_accumulation or 1
    return math.ceil(base * nodes_full / nodes_now)


#: A script that reads the accumulation gpud sets (or imports the library, which does).
_READS_GRAD_ACCUM = re.compile(rf"GPUD_GRAD_ACCUM|{USES_LIBRARY.pattern}", re.M)


def reads_grad_accum(spec: RunSpec, library: bool) -> bool:
    """Whether the run's script takes GPUD_GRAD_ACCUM: it uses the trainers library (a rank
    said hello), or its text names the variable or imports the library. A script this
    node cannot read counts as not (issue 32 §6: the event must not promise a kept batch)."""
    if library:
        return True
    text = script_text(spec)
    return text is not None and _READS_GRAD_ACCUM.search(text) is not None


def batch_note(grad_accum: int, kept: bool) -> str:
    """What an elastic attempt's event says of its batch."""
    if kept:
        return f", gradient accumulation {grad_accum} (the global batch kept)"
    return (
        f", GPUD_GRAD_ACCUM={grad_accum}, which the script does not read: its global batch"
        " shrinks with the nodes (the trainers library, or a script that reads it, keeps it)"
    )
