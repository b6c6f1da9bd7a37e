"""A run's health from its ranks: straggler, stall, bandwidth, warnings, verdict.

A pure function of what the daemons know (rank views, the latest probe, NCCL events,
GPU trouble), so it is tested on hand-made inputs and computed the same on every node.

- **Straggler**: judged by *compute* time per step (step time minus time waiting in
  collectives; the daemon's median over a few seconds of heartbeats). In synchronous
  training every rank's step time is the same — the fast ones wait for the slow one — so
  step time alone cannot tell who is slow; the waiting can. The slowest rank is a
  straggler when its compute time is at least 1.3× its *baseline*: the median compute
  time of the *other* ranks, but never less than a floor of 1 ms or 10 % of the median
  step time. Leaving the rank out of its own baseline keeps the ratio meaningful with 2
  ranks (against the median of both it could never pass 2.0); the floor keeps a fast rank
  whose compute reads about 0 (it spends its step waiting) from making any difference
  look like an enormous ratio.
- **Stall**: no rank has made progress for longer than a heartbeat-and-step-time based
  threshold. The culprit is a rank that went silent (no heartbeat: stopped, frozen or
  dead — its heartbeat thread stopped with it) while the others wait in a collective,
  else the rank that is *not* waiting in a collective, else the one furthest behind;
  when every rank waits, nobody in the job is computing: a hang in the network or NCCL,
  or a rank that died. The countdown is to the collective timeout that will end the
  wait: the timeout minus the longest that a rank still heard from has waited.
- **The verdict holds still** (`gpud.runs.health.stragglers`): `assess` names a straggler only
  when its caller's `StragglerWatch` has seen the same rank as the candidate in most of
  the last seconds, and never in the seconds after a stall.
- **A script without the trainers library** sends no heartbeats: its health is judged
  from its output (`assess_by_output`): the time since any node printed a line, and
  since its metric patterns last found a new step. Quiet for `restart.hang_timeout_s`
  while its processes live is a stall of no one rank (and so a hang); without a
  timeout it is never called stalled, only reported. Its `ok` is not one gpud can vouch
  for: the views show NO_HEARTBEATS in its place (`HealthSummary.judged_from_output`).
- **An ended run** has a final verdict and nothing live: `failed` when it failed, `ok`
  when it succeeded, `idle` otherwise (stopped, or not running yet); never a stall, a
  countdown or a straggler.
"""

from __future__ import annotations

import statistics

from gpud.model.run import (
    NO_HEARTBEATS,
    BandwidthView,
    GpuTrouble,
    HealthSummary,
    RankView,
    RunState,
    Stall,
    Straggler,
    Verdict,
    completed_steps,
)
from gpud.runs.health.stragglers import StragglerWatch

HEARTBEAT_INTERVAL_S = 0.5
STRAGGLER_RATIO = 1.3
#: A rank whose heartbeats stop for this long (× the interval) is reported as silent.
SILENT_AFTER_BEATS = 4
#: The collective timeouts PyTorch uses when the trainer sets none.
DEFAULT_TIMEOUT_S = {"nccl": 600.0, "gloo": 1800.0}
#: A straggler's baseline is at least this, and at least this share of the median step time.
MIN_BASELINE_S = 0.001
BASELINE_STEP_SHARE = 0.1
#: busbw below this share of the baseline makes a run degraded.
SLOW_BUSBW_SHARE = 0.5

#: Typical large-message all-reduce bus bandwidth (GB/s) by GPU family and interconnect,
#: as nccl-tests reports it on healthy single-node systems. A baseline, not a promise.
BUSBW_BASELINES: tuple[tuple[str, str, float], ...] = (
    ("H200", "nvlink", 360.0),
    ("H100", "nvlink", 360.0),
    ("A100", "nvlink", 230.0),
    ("V100", "nvlink", 130.0),
    ("", "pcie5", 24.0),
    ("", "pcie4", 12.0),
    ("", "pcie3", 6.0),
)


def baseline_for(
    gpu_name: str | None, nvlink: bool, pcie_gen: int | None
) -> tuple[float, str] | None:
    """(GB/s, what it is for) for a single-node NCCL run on these GPUs, when known."""
    if gpu_name is None:
        return None
    link = "nvlink" if nvlink else f"pcie{pcie_gen}" if pcie_gen else None
    for family, interconnect, gbps in BUSBW_BASELINES:
        if interconnect == link and family in gpu_name:
            label = f"{family or 'any GPU'} over {'NVLink' if nvlink else f'PCIe gen{pcie_gen}'}"
            return gbps, label
    return None


def stall_threshold(median_step_s: float | None) -> float:
    """How long without progress counts as stuck: two heartbeats, or three steps."""
    return max(2 * HEARTBEAT_INTERVAL_S, 3 * (median_step_s or 0.0))


def _compute(rank: RankView) -> float | None:
    """Compute time per step: the windowed median when the daemon has one."""
    if rank.compute_s is not None:
        return rank.compute_s
    if rank.step_time_s is None:
        return None
    return max(0.0, rank.step_time_s - (rank.collective_s or 0.0))


def find_straggler(ranks: list[RankView]) -> Straggler | None:
    """The slowest rank by compute time, when it is 1.3× its baseline (see the module).

    Only the slowest rank can be one: its baseline (the median of everyone else) is the
    lowest of any rank's, so its ratio is the highest. `median_step_time_s` in the result
    is that baseline.
    """
    computes = sorted(
        ((c, r.rank, r) for r in ranks if (c := _compute(r)) is not None), key=lambda t: t[:2]
    )
    if len(computes) < 2:
        return None
    slowest, _, rank = computes[-1]
    others = statistics.median(c for c, _, _ in computes[:-1])
    step_times = [r.step_time_s for r in ranks if r.step_time_s is not None]
    floor = max(
        MIN_BASELINE_S,
        BASELINE_STEP_SHARE * statistics.median(step_times) if step_times else 0.0,
    )
    baseline = max(others, floor)
    if slowest < STRAGGLER_RATIO * baseline:
        return None
    return Straggler(
        rank=rank.rank,
        step_time_s=slowest,
        median_step_time_s=baseline,
        ratio=round(slowest / baseline, 2),
    )


def find_stall(ranks: list[RankView], backend: str | None, timeout_s: float | None) -> Stall | None:
    started = [r for r in ranks if r.last_step is not None and r.progress_age_s is not None]
    if not started or len(started) < len(ranks):
        return None  # someone has not finished a step yet: start-up, not a stall
    median_step = statistics.median(
        [r.step_time_s for r in started if r.step_time_s is not None] or [0.0]
    )
    threshold = stall_threshold(median_step)
    freshest = min(r.progress_age_s or 0.0 for r in started)
    if freshest <= threshold:
        return None  # somebody is still making progress
    # A silent rank's phase is whatever it was at its last heartbeat: stale, so it neither
    # waits nor computes as far as the others are concerned.
    heard = [r for r in started if not _silent(r)]
    silent = [r for r in started if _silent(r)]
    computing = [r for r in heard if r.phase == "compute"]
    waiting = [r for r in heard if r.phase == "collective"]
    timeout = timeout_s or DEFAULT_TIMEOUT_S.get(backend or "", DEFAULT_TIMEOUT_S["nccl"])
    waited = max((r.phase_for_s for r in waiting), default=0.0)
    if silent and waiting:
        culprit = min(silent, key=lambda r: (r.last_step or 0, r.rank))
        why = (
            f"rank {culprit.rank} has sent no heartbeat for {culprit.heartbeat_age_s:.1f}s "
            f"(stopped, frozen or dead) while {len(waiting)} rank(s) wait in a collective"
        )
        stuck = culprit.progress_age_s or 0.0
        rank: int | None = culprit.rank
    elif computing and waiting:
        culprit = min(computing, key=lambda r: (r.last_step or 0, r.rank))
        why = (
            f"rank {culprit.rank} has not finished step {(culprit.steps_done or 0) + 1} for "
            f"{culprit.progress_age_s:.1f}s while {len(waiting)} rank(s) wait in a collective"
        )
        stuck = culprit.progress_age_s or 0.0
        rank = culprit.rank
    else:
        behind = min(started, key=lambda r: (r.last_step or 0, r.rank))
        ahead = max(r.steps_done or 0 for r in started)
        if (behind.steps_done or 0) < ahead:
            rank = behind.rank
            why = f"rank {rank} is behind at step {behind.steps_done} (others at {ahead})"
        elif waiting:
            rank = None
            why = "every rank waits in a collective: a network or NCCL hang, or a dead rank"
        else:
            rank = None
            why = "no rank has made progress (none is waiting in a measured collective)"
        stuck = freshest
    return Stall(
        rank=rank,
        stuck_for_s=round(stuck, 1),
        timeout_s=timeout,
        countdown_s=round(max(0.0, timeout - waited), 1),
        why=why,
    )


def _silent(rank: RankView) -> bool:
    age = rank.heartbeat_age_s
    return age is not None and age > SILENT_AFTER_BEATS * HEARTBEAT_INTERVAL_S


#: The final verdict of a run that is not running, and why.
_NOT_RUNNING: dict[RunState, tuple[Verdict, str]] = {
    RunState.SUCCEEDED: ("ok", "the run succeeded"),
    RunState.FAILED: ("failed", "the run failed"),
    RunState.STOPPED: ("idle", "the run was stopped"),
}


def assess(
    run_id: str,
    attempt: int,
    now: float,
    state: RunState,
    ranks: list[RankView],
    backend: str | None,
    world_size: int | None,
    timeout_s: float | None,
    bandwidth: BandwidthView | None,
    nccl_warnings: int,
    last_nccl_warning: str | None,
    gpu_trouble: list[GpuTrouble],
    watch: StragglerWatch | None = None,
) -> HealthSummary:
    """The health summary of one run right now.

    Only a running run is judged live; any other state gets its final (or not yet
    started) verdict, without a stall or a straggler, whatever its ranks last said.
    With a `watch` (the daemon keeps one per attempt), a straggler is named only once it
    persists (`StragglerWatch.judge`); without one, this instant's slowest rank is.
    """
    straggler = stall = None
    reasons: list[str] = []
    verdict: Verdict
    if state is not RunState.RUNNING:
        verdict, why = _NOT_RUNNING.get(state, ("idle", f"the run is {state.value}"))
        reasons.append(why)
    else:
        stall = find_stall(ranks, backend, timeout_s)
        if stall is not None:
            if watch is not None:
                watch.stalled(now)
        elif watch is not None:
            straggler = watch.judge(now, find_straggler(ranks))
        else:
            straggler = find_straggler(ranks)
        silent = [
            r.rank
            for r in ranks
            if r.heartbeat_age_s is None
            or r.heartbeat_age_s > SILENT_AFTER_BEATS * HEARTBEAT_INTERVAL_S
        ]
        if stall is not None:
            reasons.append(stall.why)
        if straggler is not None:
            held = ""
            if watch is not None:
                named, kept = watch.score
                held = f" (the slowest in {named} of the last {kept} s)"
            reasons.append(
                f"rank {straggler.rank} is a straggler: {straggler.ratio}× the median "
                f"compute time per step{held}"
            )
        if silent and any(r.heartbeat_age_s is not None for r in ranks):
            reasons.append(f"no heartbeat from rank(s) {_ranks_text(silent)}")
        strays = [r for r in ranks if r.outside_lease]
        if strays:
            where = ", ".join(
                f"rank {r.rank} on GPU {'?' if r.gpu_index is None else r.gpu_index}"
                for r in strays[:8]
            )
            reasons.append(
                f"outside the run's GPU lease: {where} (does the script override"
                " CUDA_VISIBLE_DEVICES or pick a device by hand?)"
            )
        reasons += _trouble(nccl_warnings, gpu_trouble)
        if (
            bandwidth is not None
            and bandwidth.baseline_gbps
            and bandwidth.busbw_gbps < SLOW_BUSBW_SHARE * bandwidth.baseline_gbps
        ):
            reasons.append(
                f"busbw {bandwidth.busbw_gbps:.1f} GB/s is under half the "
                f"{bandwidth.baseline_gbps:.0f} GB/s expected for {bandwidth.baseline}"
            )
        verdict = "stalled" if stall else ("degraded" if reasons else "ok")
    marked = [
        r.model_copy(
            update={
                "straggler": straggler is not None and r.rank == straggler.rank,
                "stalled": stall is not None and r.rank == stall.rank,
            }
        )
        for r in ranks
    ]
    return HealthSummary(
        run_id=run_id,
        attempt=attempt,
        time=now,
        verdict=verdict,
        reasons=reasons,
        backend=backend,
        world_size=world_size,
        ranks=marked,
        straggler=straggler,
        stall=stall,
        bandwidth=bandwidth,
        nccl_warnings=nccl_warnings,
        last_nccl_warning=last_nccl_warning,
        gpu_trouble=gpu_trouble,
    )


def _trouble(nccl_warnings: int, gpu_trouble: list[GpuTrouble]) -> list[str]:
    """The reasons NCCL's warnings and the run's GPUs give, whatever health is judged from."""
    found = [f"{nccl_warnings} NCCL warning(s)"] if nccl_warnings else []
    return found + [f"GPU {t.gpu_index} on {t.node}: {t.describe()}" for t in gpu_trouble]


def _ranks_text(ranks: list[int]) -> str:
    return ", ".join(str(r) for r in ranks[:8]) + (" ..." if len(ranks) > 8 else "")


def assess_by_output(
    run_id: str,
    attempt: int,
    now: float,
    world_size: int | None,
    quiet_s: float,
    step: tuple[int, float] | None,
    hang_timeout_s: float | None,
    backend: str | None,
    timeout_s: float | None,
    nccl_warnings: int,
    last_nccl_warning: str | None,
    gpu_trouble: list[GpuTrouble],
) -> HealthSummary:
    """A running run's health when no rank sends heartbeats: from its output alone.

    `quiet_s`: how long since any of its nodes printed a line (or since it started, if
    none did yet); `step`: its newest metric step and how long ago its patterns found it.
    Quiet for `hang_timeout_s` is a stall with no culprit (gpud cannot see its ranks).
    The summary is `judged_from_output`: its `ok` reads NO_HEARTBEATS in every view. The
    first reason says so too, for readers older than that flag.
    """
    heard = f"last output {quiet_s:.1f}s ago"
    if step is not None:
        heard += f", step {completed_steps(step[0])} {step[1]:.1f}s ago"
    reasons = [f"{NO_HEARTBEATS}; {heard}"]
    stall = None
    if hang_timeout_s is not None and quiet_s >= hang_timeout_s:
        timeout = timeout_s or DEFAULT_TIMEOUT_S.get(backend or "", DEFAULT_TIMEOUT_S["nccl"])
        stall = Stall(
            rank=None,
            stuck_for_s=round(quiet_s, 1),
            timeout_s=timeout,
            countdown_s=round(max(0.0, timeout - quiet_s), 1),
            why=f"no output and no new step for {quiet_s:.1f}s while its processes run"
            " (judged from its output: the script does not use the trainers library)",
        )
        reasons.append(stall.why)
    reasons += _trouble(nccl_warnings, gpu_trouble)
    verdict: Verdict = "stalled" if stall else ("degraded" if len(reasons) > 1 else "ok")
    return HealthSummary(
        run_id=run_id,
        attempt=attempt,
        time=now,
        verdict=verdict,
        reasons=reasons,
        backend=backend,
        world_size=world_size,
        stall=stall,
        nccl_warnings=nccl_warnings,
        last_nccl_warning=last_nccl_warning,
        gpu_trouble=gpu_trouble,
        judged_from_output=True,
    )
