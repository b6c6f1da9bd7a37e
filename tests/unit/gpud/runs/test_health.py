"""The health verdict from hand-made rank views."""

from __future__ import annotations

import pytest

from gpud.model.run import (
    NO_HEARTBEATS,
    BandwidthView,
    GpuTrouble,
    HealthSummary,
    RankView,
    RunState,
    verdict_word,
)
from gpud.runs.health.verdict import (
    assess,
    assess_by_output,
    baseline_for,
    find_stall,
    find_straggler,
)


def rank(
    r: int,
    step: int | None = 10,
    step_time: float | None = 0.1,
    coll: float = 0.0,
    phase: str = "compute",
    progress: float | None = 0.1,
    beat: float = 0.2,
    phase_for: float = 0.0,
) -> RankView:
    return RankView(
        rank=r,
        node_rank=0,
        local_rank=r,
        last_step=step,
        step_time_s=step_time,
        collective_s=coll,
        phase=phase,
        progress_age_s=progress,
        heartbeat_age_s=beat,
        phase_for_s=phase_for,
    )


def health(ranks: list[RankView], **kw: object):  # type: ignore[no-untyped-def]
    args: dict[str, object] = dict(
        run_id="r",
        attempt=1,
        now=100.0,
        state=RunState.RUNNING,
        ranks=ranks,
        backend="gloo",
        world_size=len(ranks),
        timeout_s=None,
        bandwidth=None,
        nccl_warnings=0,
        last_nccl_warning=None,
        gpu_trouble=[],
    )
    args.update(kw)
    return assess(**args)  # type: ignore[arg-type]


def test_healthy_ranks_are_ok() -> None:
    h = health([rank(0), rank(1), rank(2), rank(3)])
    assert (h.verdict, h.reasons, h.straggler, h.stall) == ("ok", [], None, None)


def test_the_straggler_is_found_by_compute_time_not_step_time() -> None:
    # Synchronous training: every step time is equal; the fast ranks wait 60 ms, the slow
    # one waits for nobody.
    ranks = [
        rank(0, step_time=0.1, coll=0.06),
        rank(1, step_time=0.1, coll=0.0),
        rank(2, step_time=0.1, coll=0.06),
        rank(3, step_time=0.1, coll=0.06),
    ]
    straggler = find_straggler(ranks)
    assert straggler is not None and straggler.rank == 1 and straggler.ratio == 2.5
    h = health(ranks)
    assert h.verdict == "degraded" and h.ranks[1].straggler and not h.ranks[0].straggler


def test_no_straggler_within_thirty_percent() -> None:
    assert find_straggler([rank(0, step_time=0.10), rank(1, step_time=0.125)]) is None


def test_the_rank_computing_while_others_wait_is_the_stall_culprit() -> None:
    ranks = [
        rank(0, step=20, phase="collective", progress=5.0, phase_for=4.9),
        rank(1, step=20, phase="compute", progress=5.0),
        rank(2, step=20, phase="collective", progress=5.0, phase_for=4.8),
    ]
    stall = find_stall(ranks, "nccl", timeout_s=60)
    assert stall is not None and stall.rank == 1
    assert stall.timeout_s == 60 and stall.countdown_s == 55.1
    assert "rank 1 has not finished step 22" in stall.why  # 21 done (index 20)
    h = health(ranks, backend="nccl", timeout_s=60.0)
    assert h.verdict == "stalled" and h.ranks[1].stalled


def test_every_rank_waiting_is_a_hang_without_a_single_culprit() -> None:
    ranks = [rank(r, phase="collective", progress=9.0, phase_for=9.0) for r in range(4)]
    stall = find_stall(ranks, "nccl", None)
    assert stall is not None and stall.rank is None
    assert stall.timeout_s == 600 and "every rank waits" in stall.why


def test_a_rank_behind_the_others_is_the_culprit() -> None:
    ranks = [rank(0, step=30, progress=3.0), rank(1, step=29, progress=3.0)]
    stall = find_stall(ranks, "gloo", None)
    assert stall is not None and stall.rank == 1 and stall.timeout_s == 1800
    assert "rank 1 is behind at step 30 (others at 31)" in stall.why  # steps done


def test_slow_steps_are_not_a_stall_and_start_up_is_not_either() -> None:
    # 10 s steps: 5 s without progress is normal.
    assert find_stall([rank(0, step_time=10.0, progress=5.0)] * 2, "nccl", None) is None
    # One rank has not finished a step yet: still starting.
    assert (
        find_stall([rank(0, progress=9.0), rank(1, step=None, progress=None)], "gloo", None) is None
    )


def test_warnings_trouble_and_slow_bandwidth_degrade_the_run() -> None:
    ok = [rank(0), rank(1)]
    assert health(ok, nccl_warnings=2, last_nccl_warning="NCCL WARN x").verdict == "degraded"
    trouble = GpuTrouble(node="n", gpu_index=3, xid=1, events=["GPU 3: XID 79"])
    h = health(ok, gpu_trouble=[trouble])
    assert h.verdict == "degraded" and "GPU 3 on n: 1 XID" in h.reasons[0]
    slow = BandwidthView(
        busbw_gbps=90.0,
        algbw_gbps=50.0,
        size_bytes=1,
        step=0,
        time=0,
        baseline_gbps=360.0,
        baseline="H100 over NVLink",
    )
    assert "under half" in health(ok, bandwidth=slow).reasons[0]
    fine = slow.model_copy(update={"busbw_gbps": 350.0})
    assert health(ok, bandwidth=fine).verdict == "ok"


def test_silent_ranks_and_run_states() -> None:
    h = health([rank(0), rank(1, beat=5.0)])
    assert h.verdict == "degraded" and "no heartbeat from rank(s) 1" in h.reasons
    assert health([rank(0)], state=RunState.FAILED).verdict == "failed"
    assert health([rank(0)], state=RunState.STOPPING).verdict == "idle"


def test_busbw_baselines() -> None:
    assert baseline_for("NVIDIA H100 80GB HBM3", True, 5) == (360.0, "H100 over NVLink")
    assert baseline_for("NVIDIA RTX 4090", False, 4) == (12.0, "any GPU over PCIe gen4")
    assert baseline_for(None, False, None) is None


def test_the_windowed_compute_time_wins_over_one_noisy_step() -> None:
    # Latest step times say rank 1 is slow, but its window over the last seconds says not.
    ranks = [
        rank(0, step_time=0.1, coll=0.05).model_copy(update={"compute_s": 0.05}),
        rank(1, step_time=0.1, coll=0.0).model_copy(update={"compute_s": 0.052}),
    ]
    assert find_straggler(ranks) is None


# ---------------------------------------------------------------- issue 8: health correctness


def test_two_ranks_a_straggler_is_measured_against_the_other_rank() -> None:
    # Against the median of both ranks the ratio could never pass 2.0; against the other
    # rank it says how much slower the slow one really is.
    ranks = [rank(0, step_time=0.1, coll=0.08), rank(1, step_time=0.1, coll=0.03)]
    straggler = find_straggler(ranks)
    assert straggler is not None and straggler.rank == 1
    assert straggler.ratio == 3.5 and straggler.median_step_time_s == pytest.approx(0.02)


def test_a_fast_rank_computing_about_nothing_gives_a_finite_sane_ratio() -> None:
    # Rank 0 spends its whole step waiting for rank 1: compute 0. The baseline is floored
    # at 10 % of the step time (6 ms), not 0 (an infinite ratio) nor the mean (2.0).
    ranks = [rank(0, step_time=0.06, coll=0.06), rank(1, step_time=0.06, coll=0.0)]
    straggler = find_straggler(ranks)
    assert straggler is not None and straggler.rank == 1
    assert straggler.median_step_time_s == pytest.approx(0.006) and straggler.ratio == 10.0
    # Without step times the floor is 1 ms.
    bare = [
        rank(0, step_time=None).model_copy(update={"compute_s": 0.0}),
        rank(1, step_time=None).model_copy(update={"compute_s": 0.004}),
    ]
    straggler = find_straggler(bare)
    assert straggler is not None and straggler.ratio == 4.0
    # A few ms of noise over a zero compute in a 100 ms step is no straggler.
    noise = [rank(0, step_time=0.1, coll=0.1), rank(1, step_time=0.1, coll=0.095)]
    assert find_straggler(noise) is None


def test_a_silent_rank_is_the_culprit_and_the_countdown_runs_with_the_wait() -> None:
    # Rank 1 was stopped (SIGSTOP): no heartbeat for 3 s; its last one said it was in a
    # collective, which is stale. Rank 0 has waited in DDP's all-reduce for 2.9 s.
    def ranks(later: float) -> list[RankView]:
        return [
            rank(0, phase="collective", progress=3.0 + later, phase_for=2.9 + later, beat=0.3),
            rank(1, phase="collective", progress=3.1 + later, phase_for=3.5, beat=3.0 + later),
        ]

    stall = find_stall(ranks(0.0), "gloo", timeout_s=120)
    assert stall is not None and stall.rank == 1
    assert stall.countdown_s == 117.1 and stall.stuck_for_s == 3.1
    assert "rank 1 has sent no heartbeat for 3.0s" in stall.why
    later = find_stall(ranks(2.0), "gloo", timeout_s=120)
    assert later is not None and later.rank == 1 and later.countdown_s == 115.1
    h = health(ranks(0.0), timeout_s=120.0)
    assert h.verdict == "stalled" and h.ranks[1].stalled and not h.ranks[0].stalled


def test_an_ended_run_has_its_final_verdict_and_nothing_live() -> None:
    # What the ranks last said looks stalled (and rank 1 slow); the run has ended.
    ranks = [
        rank(0, phase="collective", progress=50.0, phase_for=50.0, beat=40.0, coll=0.09),
        rank(1, phase="compute", progress=50.0, beat=40.0, coll=0.0),
    ]
    assert health(ranks).verdict == "stalled"  # while it runs, this is a stall
    for state, verdict, why in [
        (RunState.SUCCEEDED, "ok", "the run succeeded"),
        (RunState.FAILED, "failed", "the run failed"),
        (RunState.STOPPED, "idle", "the run was stopped"),
    ]:
        h = health(ranks, state=state)
        assert (h.verdict, h.reasons) == (verdict, [why])
        assert h.stall is None and h.straggler is None
        assert not any(r.stalled or r.straggler for r in h.ranks)


def test_a_rank_on_a_gpu_outside_its_lease_degrades_the_run() -> None:
    stray = rank(1).model_copy(update={"gpu_index": 5, "outside_lease": True})
    h = health([rank(0), stray])
    assert h.verdict == "degraded"
    assert h.reasons == [
        "outside the run's GPU lease: rank 1 on GPU 5 (does the script override"
        " CUDA_VISIBLE_DEVICES or pick a device by hand?)"
    ]


def test_a_run_without_heartbeats_is_judged_from_its_output() -> None:

    def judge(quiet: float, timeout: float | None) -> HealthSummary:
        return assess_by_output(
            run_id="r", attempt=1, now=100.0, world_size=4, quiet_s=quiet, step=(49, quiet),
            hang_timeout_s=timeout, backend="gloo", timeout_s=None, nccl_warnings=0,
            last_nccl_warning=None, gpu_trouble=[],
        )  # fmt: skip

    flowing = judge(0.4, 5.0)
    assert flowing.verdict == "ok" and flowing.world_size == 4 and flowing.stall is None
    assert flowing.reasons == [f"{NO_HEARTBEATS}; last output 0.4s ago, step 50 0.4s ago"]
    # An `ok` from output alone is not shown as ok: gpud cannot see the ranks.
    assert flowing.judged_from_output and flowing.ok_from_output
    assert verdict_word(flowing.verdict, flowing.judged_from_output) == "no beats"
    quiet = judge(6.0, 5.0)
    assert quiet.verdict == "stalled" and quiet.stall is not None and quiet.stall.rank is None
    assert quiet.stall.stuck_for_s == 6.0 and quiet.stall.countdown_s == 1800.0 - 6.0
    # a stall seen in the output still reads as one
    assert quiet.judged_from_output and not quiet.ok_from_output
    assert verdict_word(quiet.verdict, quiet.judged_from_output) == "stalled"
    # Without a hang timeout the quiet is reported, never called a stall.
    assert judge(600.0, None).verdict == "ok"


def test_a_run_with_heartbeats_is_not_judged_from_its_output() -> None:
    ok = health([rank(0), rank(1)])
    assert ok.verdict == "ok" and not ok.judged_from_output and not ok.ok_from_output
    assert verdict_word(ok.verdict, ok.judged_from_output) == "ok"
