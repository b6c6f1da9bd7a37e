"""A GPU's preflight before an attempt takes it (issue 21 §2): what NVML says of it now.

Quarantine (`rules`) keeps a GPU that is unsafe from any new work until a reset. Preflight
is the milder, per-attempt look at a GPU that is not held: would a run that starts on it
now start well? A GPU that fails is left out of this attempt's choice (the lease takes
another, or says why it cannot), and is looked at afresh for the next:

- **clocks slowed by the hardware** (`hw_slowdown`, `hw_thermal_slowdown`,
  `hw_power_brake_slowdown`, `sw_thermal_slowdown`): a run on it would be the gang's
  straggler from its first step;
- **an XID in the last `XID_WINDOW_S`**, other than those an application causes (13, 31,
  43, 45) and those an operator has acknowledged since (`node.events.ack`, or undrain of
  the GPU: the XID that quarantined it was handled) — the fatal ones quarantine the GPU outright
  (`rules.FATAL_XIDS`);
- **memory held by no process NVML lists** (over `UNLISTED_MEMORY_BYTES`): a rank of a run
  that ended, in another PID namespace or a zombie, still holding it; processes NVML does
  list make a GPU busy already (`gpud.runs.placement.gpus.FOREIGN_MEMORY_BYTES`).

Pure functions of a sample and the time.
"""

from __future__ import annotations

import statistics

from gpud.hardware.events import SLOWDOWN_REASONS
from gpud.heal.rules import meaning
from gpud.model.snapshot import GpuSample
from gpud.wire.run_messages import PartPreflight

#: XIDs an application causes (a bad kernel, a page fault, a killed process): no fault of
#: the GPU's, and no reason to keep the next attempt off it.
APPLICATION_XIDS = frozenset({13, 31, 43, 45})
#: How far back an XID keeps a GPU out of a new attempt.
XID_WINDOW_S = 300.0
#: Memory in use that no listed process holds, beyond which a GPU is not free.
UNLISTED_MEMORY_BYTES = 2**30


def findings(gpu: GpuSample, now: float) -> list[str]:
    """Why the GPU should not start an attempt now, in words; empty when it may."""
    found = []
    slowed = sorted(SLOWDOWN_REASONS.intersection(gpu.clock_event_reasons or ()))
    if slowed:
        found.append(f"clocks slowed by the hardware ({', '.join(slowed)})")
    handled = gpu.xid.acknowledged_at
    recent = sorted(
        {
            r.code
            for r in gpu.xid.recent
            if now - r.time <= XID_WINDOW_S
            and r.code not in APPLICATION_XIDS
            and (handled is None or r.time > handled)
        }
    )
    if recent:
        codes = ", ".join(f"XID {code} ({meaning(code)})" for code in recent)
        found.append(f"{codes} in the last {XID_WINDOW_S / 60:g} min")
    unlisted = unlisted_memory_bytes(gpu)
    if unlisted > UNLISTED_MEMORY_BYTES:
        found.append(
            f"{unlisted / 2**30:.1f} GiB of its memory is held by no process NVML lists"
            " (a rank of an ended run in another PID namespace, or a zombie)"
        )
    return found


def unlisted_memory_bytes(gpu: GpuSample) -> int:
    """Memory in use beyond the driver's reserve and what the listed processes hold; 0
    where NVML could not say (no memory reading, or no process list at all)."""
    if gpu.memory_used_bytes is None or gpu.processes is None:
        return 0
    listed = sum(p.used_memory_bytes or 0 for p in gpu.processes)
    reserved = gpu.memory_reserved_bytes or 0
    return max(0, gpu.memory_used_bytes - reserved - listed)


def failed(gpus: list[GpuSample], now: float) -> dict[str, str]:
    """UUID → why, for each GPU that fails its preflight."""
    out = {}
    for gpu in gpus:
        found = findings(gpu, now)
        if found:
            out[gpu.uuid] = "; ".join(found)
    return out


#: A node whose all-reduce with node 0 reaches less than this share of the median of all
#: pairs is far below its peers.
SLOW_FRACTION = 0.5


def slow_nodes(pairs: dict[int, float]) -> dict[int, str]:
    """Node rank → why, for each node whose all-reduce with node 0 (`trainers.preflight`'s
    pairs, bus bandwidth in GB/s) is far below its peers'. Two pairs at least: with one,
    there are no peers to be below."""
    if len(pairs) < 2:
        return {}
    median = statistics.median(pairs.values())
    return {
        rank: f"all-reduce with node 0 at {busbw:.3g} GB/s, under {SLOW_FRACTION:.0%} of"
        f" its peers' median {median:.3g} GB/s"
        for rank, busbw in sorted(pairs.items())
        if busbw < SLOW_FRACTION * median
    }


#: How many of a node's earlier figures in a run make its baseline (their median).
BASELINE_KEEP = 5


def below_baseline(pairs: dict[int, float], history: dict[int, list[float]]) -> dict[int, str]:
    """Node rank → why, for each node whose all-reduce with node 0 now is far below the
    median of its own earlier attempts' figures in this run (`history`): a node alone with
    node 0 (a 2-node run) has no peers to be below, but it has its past."""
    named = {}
    for rank, busbw in sorted(pairs.items()):
        past = history.get(rank) or []
        if past and busbw < SLOW_FRACTION * (baseline := statistics.median(past)):
            named[rank] = (
                f"all-reduce with node 0 at {busbw:.3g} GB/s, under {SLOW_FRACTION:.0%} of its"
                f" baseline {baseline:.3g} GB/s (its earlier attempts in this run)"
            )
    return named


def with_figures(
    history: dict[int, list[float]], pairs: dict[int, float]
) -> dict[int, list[float]]:
    """The run's bandwidth history with this attempt's figures added (the last few kept)."""
    merged = {rank: list(past) for rank, past in history.items()}
    for rank, busbw in pairs.items():
        merged[rank] = [*merged.get(rank, []), busbw][-BASELINE_KEEP:]
    return merged


def judge_collective(
    members: list[int], results: dict[int, PartPreflight]
) -> tuple[dict[int, str], str]:
    """What the attempt's collective check found: node rank → why it fails (a GPU that
    failed its matmul or memory test, a node far below its peers), and a line for the
    attempt's events. `members[i]` is check rank i, node 0 first; `results` by node rank.
    A check that could not run is no verdict on anybody. (`below_baseline` is the other
    verdict, on a node's own past: it names a node, and leaves it in.)"""
    failing = {
        node: "its GPU check failed: " + ", ".join(r.gpu_failures)
        for node, r in sorted(results.items())
        if r.gpu_failures
    }
    pairs = node_pairs(members, results)
    for node, why in slow_nodes(pairs).items():
        failing.setdefault(node, why)
    took = max((r.seconds or 0.0 for r in results.values()), default=0.0)
    own = results.get(0)
    if len(members) == 1 and own is not None and (own.ok or own.gpu_failures):
        # One node on real GPUs: no all-reduce to measure, the GPUs' own test only.
        verdict = failing.get(0) or "its GPUs passed the matmul and memory test"
        return failing, f"preflight on 1 node in {took:.1f}s: {verdict}"
    if pairs:
        figures = ", ".join(
            f"node {node} {busbw:.3g} GB/s" for node, busbw in sorted(pairs.items())
        )
        line = f"preflight across {len(members)} nodes in {took:.1f}s: all-reduce with node 0: "
        line += figures
    else:
        errors = sorted({r.error for r in results.values() if r.error}) or ["no answer"]
        line = f"preflight's collective check did not complete ({errors[0]}): no verdict"
    return failing, line


def node_pairs(members: list[int], results: dict[int, PartPreflight]) -> dict[int, float]:
    """Node 0's figures by node rank (the check numbers its ranks in `members`' order)."""
    own = results.get(0)
    return {
        members[rank]: busbw
        for rank, busbw in (own.pairs if own is not None else {}).items()
        if 0 < rank < len(members)
    }
