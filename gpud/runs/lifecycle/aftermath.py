"""After a part ended: whose fault it was, and that nothing of it is left.

`explained`: the outcome as this node can tell it, before it is recorded. `blame_hardware`:
a part that failed right after an XID (or a lost GPU) on its GPUs failed because of the
hardware, whatever its ranks said. `check_nothing_left`: no process of the part may survive
it (survivors are killed, and said so), and none may hold GPU memory (NVML's process lists,
on real GPUs); the run's events say which.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Awaitable, Callable

from gpud.model.run import RunRecord, RunState
from gpud.model.snapshot import Backend, GpuSample, NodeSnapshot
from gpud.runs.diagnosis import causes, flight, hints
from gpud.runs.lifecycle.starting import interpreter
from gpud.runs.state.book import RunBook
from gpud.runs.state.part import Outcome, Part


def blame_hardware(gpus: list[GpuSample], part: Part, outcome: Outcome, now: float) -> Outcome:
    """The hardware as the cause, the ranks' words its lines, when an XID or a lost GPU hit
    the part's GPUs in the minute before it failed."""
    found = outcome.exit.cause
    if outcome.state is not RunState.FAILED or found is None or not part.record.gpu_uuids:
        return outcome
    record = part.record
    hardware = causes.hardware_cause(gpus, record.gpu_uuids, record.started_at, now)
    if hardware is None:
        return outcome
    hardware = hardware.model_copy(
        update={
            "rank": found.rank,
            "node_rank": found.node_rank,
            "attempt": found.attempt,
            "step": found.step,
            "lines": [f"the ranks saw: {found.summary}", *found.lines],
        }
    )
    reason = f"{hardware.summary} ({hardware.kind.label})"
    return Outcome(outcome.state, reason, outcome.exit.model_copy(update={"cause": hardware}))


async def explained(
    book: RunBook,
    run: RunRecord,
    part: Part,
    outcome: Outcome,
    snapshot: NodeSnapshot,
    explain: list[Callable[[RunRecord, Part, Outcome], Outcome]],
    now: float,
) -> Outcome:
    """A part's end as this node can tell it: the hardware's fault (`blame_hardware`), what
    else may explain it (`explain`: gpud.heal's quarantine), the NCCL flight recorder's
    findings, and what to do about a known cause (its hint)."""
    outcome = blame_hardware(snapshot.gpus, part, outcome, now)
    for other in explain:
        outcome = other(run, part, outcome)
    findings: list[str] = []
    if outcome.state is RunState.FAILED and flight.dumps(part.dir):
        findings = await asyncio.to_thread(flight.analyze, part.dir)
        if findings:
            book.event(run, "flight_recorder", "flight recorder: " + "; ".join(findings), "warning")
            exit_info = outcome.exit.model_copy(update={"flight_recorder": findings})
            outcome = Outcome(outcome.state, outcome.reason, exit_info)
    if outcome.exit.cause is not None:
        # What to do about it, from what this node knows (its interpreter, its GPUs).
        facts = hints.facts_for(
            book.spec(run),
            snapshot,
            master_port=part.record.master_port,
            own_python=interpreter(),
        )
        cause = outcome.exit.cause.model_copy(update={"flight_recorder": findings})
        exit_info = outcome.exit.model_copy(update={"cause": hints.with_hint(cause, facts)})
        outcome = Outcome(outcome.state, outcome.reason, exit_info)
    return outcome


async def check_nothing_left(
    book: RunBook,
    run: RunRecord,
    part: Part,
    backend: Backend,
    sample_gpus: Callable[[], Awaitable[list[GpuSample]]],
) -> None:
    """No process of the part may survive it, and none may hold GPU memory."""
    leftovers = await asyncio.to_thread(part.leftovers)
    if leftovers:
        await asyncio.to_thread(_kill, leftovers)
        book.event(
            run,
            "leftovers",
            f"{len(leftovers)} process(es) outlived the attempt and were killed: {leftovers}",
            "warning",
            pids=leftovers,
        )
    holders: list[str] = []
    memory = "no GPU memory held by it (simulated GPUs: no NVML check)"
    if backend == "none":
        memory = "no GPUs on this node"
    elif backend == "nvml":
        gpus = await sample_gpus()
        memory = "no GPU memory held by it (NVML)"
        for gpu in gpus:
            for proc in gpu.processes or []:
                if proc.pid in part.pids_seen or proc.pid in leftovers:
                    holders.append(f"pid {proc.pid} on GPU {gpu.index}")
    if holders:
        book.event(run, "gpu_memory", "GPU memory still held: " + ", ".join(holders),
                   "critical", holders=holders)  # fmt: skip
    else:
        book.event(
            run,
            "verified",
            f"no process of attempt {part.record.attempt} is left on {book.node}; {memory}",
        )


def _kill(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
