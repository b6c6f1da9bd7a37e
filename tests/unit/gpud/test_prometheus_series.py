"""The run series a scrape renders from a run's summary and health: throughput from what
the trainer logs or from the step rate and the spec's batch, and per-rank flags that are
0 as well as 1, so a dashboard and an alert see the series before anything goes wrong."""

from __future__ import annotations

from gpud.efficiency.goodput import Goodput, GoodputClock
from gpud.efficiency.mfu import SIMULATED
from gpud.efficiency.model import RunFlops
from gpud.model.run import HealthSummary, NodeRef, RankView, RunState, Stall
from gpud.prometheus.series import RunOnNode, run_families
from gpud.wire.run_messages import RunSummary


def summary(state: RunState = RunState.RUNNING, **values: float) -> RunSummary:
    return RunSummary(
        id="r-1", name="demo", state=state, state_since=0.0, attempt=1,
        created_at=0.0, node_rank=0, nodes=[], launcher="torchrun", last_values=values,
    )  # fmt: skip


def health(step_times: list[float], stall: Stall | None = None, slow: int = -1) -> HealthSummary:
    ranks = [
        RankView(rank=i, node_rank=0, local_rank=i, step_time_s=t, straggler=i == slow)
        for i, t in enumerate(step_times)
    ]
    return HealthSummary(
        run_id="r-1", attempt=1, time=0.0, verdict="ok", world_size=len(ranks), ranks=ranks,
        stall=stall,
    )  # fmt: skip


def rendered(run: RunOnNode) -> dict[str, dict[tuple[str, ...], float]]:
    found: dict[str, dict[tuple[str, ...], float]] = {}
    for family in run_families([run]):
        for sample in family.samples:
            key = tuple(f"{k}={v}" for k, v in sorted(sample.labels.items()) if k != "run")
            found.setdefault(sample.name, {})[key] = sample.value
    return found


def test_throughput_comes_from_the_step_rate_and_the_global_batch() -> None:
    # 4 ranks, median step time 0.5 s; 8 samples × 2 micro-steps per rank and step.
    run = RunOnNode(
        summary(loss=1.0), health([0.4, 0.5, 0.5, 2.0]), samples_per_rank_step=16,
        tokens_per_sample=1024,
    )  # fmt: skip
    series = rendered(run)
    assert series["gpud_run_samples_per_second"] == {(): 16 * 4 / 0.5}
    assert series["gpud_run_tokens_per_second"] == {(): 16 * 4 / 0.5 * 1024}


def test_what_the_trainer_logs_wins_and_nothing_is_made_up() -> None:
    logged = RunOnNode(summary(samples_per_s=300.0), health([1.0]), samples_per_rank_step=16)
    assert rendered(logged)["gpud_run_samples_per_second"] == {(): 300.0}
    assert "gpud_run_tokens_per_second" not in rendered(logged)  # no seq_len, none logged
    unknown = RunOnNode(summary(loss=1.0), health([1.0]))  # no batch size in the spec
    assert "gpud_run_samples_per_second" not in rendered(unknown)


def test_a_run_that_does_not_train_now_has_no_throughput() -> None:
    # Seen on an H100: a stopped run kept exporting its last 52k samples/s.
    for state in (RunState.STOPPED, RunState.SUCCEEDED, RunState.QUEUED, RunState.PENDING):
        run = RunOnNode(summary(state, samples_per_s=3.0), health([0.5]), samples_per_rank_step=16)
        assert "gpud_run_samples_per_second" not in rendered(run), state
    stopping = RunOnNode(summary(RunState.STOPPING), health([0.5]), samples_per_rank_step=16)
    assert rendered(stopping)["gpud_run_samples_per_second"] == {(): 32.0}


def test_straggler_and_stalled_flags_are_there_for_every_rank() -> None:
    calm = rendered(RunOnNode(summary(), health([0.1, 0.1, 0.1], slow=2)))
    assert calm["gpud_run_straggler"] == {("rank=0",): 0.0, ("rank=1",): 0.0, ("rank=2",): 1.0}
    assert set(calm["gpud_run_stalled"].values()) == {0.0}
    why = "waits"
    one = Stall(rank=1, stuck_for_s=30, timeout_s=600, countdown_s=570, why=why)
    assert rendered(RunOnNode(summary(), health([0.1, 0.1], stall=one)))["gpud_run_stalled"] == {
        ("rank=0",): 0.0,
        ("rank=1",): 1.0,
    }
    every = Stall(rank=None, stuck_for_s=30, timeout_s=600, countdown_s=570, why=why)
    stuck = rendered(RunOnNode(summary(), health([0.1, 0.1], stall=every)))["gpud_run_stalled"]
    assert set(stuck.values()) == {1.0}


def test_health_judged_from_the_output_is_flagged_beside_the_verdict() -> None:
    plain = health([]).model_copy(update={"judged_from_output": True})
    series = rendered(RunOnNode(summary(), plain))
    assert series["gpud_run_health_from_output"] == {(): 1.0}
    # the state set keeps its five verdicts, so dashboards and rules read it as before
    assert series["gpud_run_health"][("verdict=ok",)] == 1.0
    assert rendered(RunOnNode(summary(), health([0.1])))["gpud_run_health_from_output"] == {(): 0.0}


def test_flops_and_mfu_from_node_0s_health() -> None:
    with_mfu = health([0.5]).model_copy(
        update={"flops": RunFlops(flops_per_second=4e14, mfu=0.404, gpus=1)}
    )
    series = rendered(RunOnNode(summary(), with_mfu))
    assert series["gpud_run_flops_per_second"] == {(): 4e14}
    assert series["gpud_run_mfu"] == {(): 0.404}
    # n/a (a simulated GPU): the FLOP rate without an MFU series, never an MFU of 0.
    simulated = health([0.5]).model_copy(
        update={"flops": RunFlops(flops_per_second=1e9, why_not=SIMULATED, gpus=1)}
    )
    series = rendered(RunOnNode(summary(), simulated))
    assert series["gpud_run_flops_per_second"] == {(): 1e9}
    assert "gpud_run_mfu" not in series
    stopped = rendered(RunOnNode(summary(RunState.STOPPED), with_mfu))
    assert "gpud_run_flops_per_second" not in stopped and "gpud_run_mfu" not in stopped


def test_goodput_and_the_seconds_by_bucket_add_up_to_the_wall_time() -> None:
    clock = GoodputClock(Goodput(until=0.0))
    clock.advance(10.0, "queued", 1)
    clock.advance(20.0, "running", 1)
    clock.stepped(1, 0, 20.0)
    clock.advance(60.0, "running", 1)
    clock.checkpointed(1, 4.0)
    series = rendered(RunOnNode(summary(), goodput=clock.record()))
    assert series["gpud_run_goodput_ratio"] == {(): 0.6}
    seconds = series["gpud_run_seconds"]
    assert seconds[("bucket=queued",)] == 10.0 and seconds[("bucket=starting",)] == 10.0
    assert seconds[("bucket=training",)] == 36.0 and seconds[("bucket=checkpointing",)] == 4.0
    assert sum(seconds.values()) == 60.0 and len(seconds) == 9  # every bucket, 0 or not
    assert "gpud_run_goodput_ratio" not in rendered(RunOnNode(summary()))


def test_an_elastic_attempt_on_fewer_nodes_shows_its_world_and_nodes_beside_the_plan() -> None:
    three = [NodeRef(control=f"tcp://127.0.0.1:{7711 + i}") for i in range(3)]
    shrunk = summary().model_copy(
        update={"nodes": three, "members": [0, 1], "world_size": 2, "planned_nodes": 3}
    )
    series = rendered(RunOnNode(shrunk))
    assert series["gpud_run_world_size"] == {(): 2.0}
    assert series["gpud_run_nodes"] == {(): 2.0}
    assert series["gpud_run_planned_nodes"] == {(): 3.0}
    # Not elastic (every node in every attempt), no attempt yet: the nodes it has, no world.
    plain = rendered(RunOnNode(summary(RunState.QUEUED).model_copy(update={"nodes": three})))
    assert plain["gpud_run_nodes"] == {(): 3.0} and plain["gpud_run_planned_nodes"] == {(): 3.0}
    assert "gpud_run_world_size" not in plain
