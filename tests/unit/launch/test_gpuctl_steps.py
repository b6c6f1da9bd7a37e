"""gpuctl's progress texts (issue 8): steps done, as done/total, in status and health."""

from __future__ import annotations

from gpud.model.run import NO_HEARTBEATS, HealthSummary, RankView, RunState
from gpud.wire.run_messages import RunSummary
from launch.gpuctl.follow import progress_line
from launch.gpuctl.observe import render_health


def finished(last_step: int | None = 19) -> RunSummary:
    return RunSummary(
        id="r-1", name="r", state=RunState.SUCCEEDED, state_since=0.0, attempt=1,
        created_at=0.0, node_rank=0, nodes=[], launcher="torchrun",
        last_step=last_step, max_steps=20, last_values={"loss": 0.5},
    )  # fmt: skip


def test_status_progress_of_a_finished_run_is_20_of_20() -> None:
    line = progress_line(finished())
    assert "step 20/20" in line and "█" * 24 in line
    assert "step 1/20" in progress_line(finished(0))
    assert "waiting for the first step" in progress_line(finished(None))


def test_health_shows_each_ranks_steps_done_of_the_total() -> None:
    health = HealthSummary(
        run_id="r-1", attempt=1, time=0.0, verdict="ok", backend="gloo", world_size=2,
        ranks=[
            RankView(rank=0, node_rank=0, local_rank=0, last_step=19, heartbeat_age_s=0.1),
            RankView(rank=1, node_rank=0, local_rank=1),
        ],
    )  # fmt: skip
    rows = "\n".join(render_health(health, max_steps=20)).splitlines()[-2:]
    assert rows[0].split()[:3] == ["0", "0", "20/20"]
    assert rows[1].split()[:3] == ["1", "0", "-"]
    without_total = "\n".join(render_health(health)).splitlines()[-2]
    assert without_total.split()[:3] == ["0", "0", "20"]


def test_health_of_a_script_without_heartbeats_says_so_in_place_of_ok() -> None:
    def verdict(h: HealthSummary) -> str:
        return next(line for line in render_health(h) if line.startswith("verdict"))

    heard = f"{NO_HEARTBEATS}; last output 0.4s ago, step 50 0.4s ago"
    plain = HealthSummary(
        run_id="r-1", attempt=1, time=0.0, verdict="ok", world_size=2, reasons=[heard],
        judged_from_output=True,
    )  # fmt: skip
    assert verdict(plain) == f"verdict   {heard}"  # the note once, no OK
    stalled = plain.model_copy(update={"verdict": "stalled", "reasons": [heard, "no output"]})
    assert verdict(stalled) == f"verdict   STALLED: {heard}; no output"
    # A daemon older than the flag: its ok reads as it did
    assert verdict(plain.model_copy(update={"judged_from_output": False})).startswith(
        "verdict   OK: no heartbeats"
    )
