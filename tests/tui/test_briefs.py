"""Node briefs (`sum.<node>`) in the model: the fleet is drawn from them, full snapshots
come only for a node on screen, every event of a run only for a run on screen, and a
daemon that sends no briefs still gets everything. No Textual, no sockets."""

from __future__ import annotations

from gpud.efficiency.mfu import SIMULATED
from gpud.efficiency.model import RunFlops
from gpud.model.run import HealthSummary, RunState
from gpud.wire.brief import RunBrief, sum_topic
from gpud.wire.briefing import node_brief
from gpud.wire.run_messages import RunList
from tests.tui import scenes
from tui.model.fleet import FleetModel
from tui.widgets.run_header import mfu_text
from tui.widgets.runs_table import mfu_cell

KEY = "tcp://10.0.0.1:7711"


def one_node() -> tuple[FleetModel, scenes.FixedClock]:
    clock = scenes.FixedClock()
    model = FleetModel([scenes.target(1, "n1")], clock=clock, wall=scenes.FixedClock(scenes.T0))
    return model, clock


def brief_event(seq: int, runs: list[RunBrief] | None = None, util: float = 50.0) -> object:
    snap = scenes.snapshot("n1", [scenes.gpu(0, util, 10.0), scenes.gpu(1, 5.0, 1.0)], seq=seq)
    brief = node_brief(snap).model_copy(update={"runs": runs or []})
    return scenes.event(sum_topic("n1"), brief, seq)


def hw(seq: int = 1) -> object:
    return scenes.event("hw.n1", scenes.snapshot("n1", [scenes.gpu(0, 9.0, 1.0)], seq), seq)


def line(step: int, state: RunState = RunState.RUNNING, attempt: int = 2) -> RunBrief:
    return RunBrief(id="ddp-1", name="ddp", state=state, attempt=attempt, node_rank=0,
                    last_step=step, max_steps=1800, values={"loss": 0.5, "samples_per_s": 812.0},
                    verdict="degraded")  # fmt: skip


def test_a_brief_draws_the_node_and_the_first_one_ends_its_full_snapshots() -> None:
    model, _ = one_node()
    assert model.topics(KEY) == ("sum.", "node.", "hw.")  # until a brief: snapshots too
    model.apply_event(KEY, hw())  # type: ignore[arg-type]
    node = model.nodes[KEY]
    assert node.snapshot is not None and node.brief is not None  # a brief derived from it
    model.apply_event(KEY, brief_event(2))  # type: ignore[arg-type]
    assert node.brief is not None and [g.activity_pct for g in node.brief.gpus] == [50.0, 5.0]
    assert node.snapshot is None  # not on screen: no snapshot kept, and none subscribed
    assert model.topics(KEY) == ("sum.", "node.")
    assert model.online(KEY) and model.summary().gpus == 2


def test_a_node_on_screen_gets_its_full_snapshots_and_loses_them_when_it_closes() -> None:
    model, _ = one_node()
    model.apply_event(KEY, brief_event(1))  # type: ignore[arg-type]
    model.focus_node(KEY)
    assert model.topics(KEY) == ("sum.", "node.", "hw.")
    (want,) = model.wants(KEY)
    assert want.kind == "hw" and model.wants(KEY) == []  # asked once, not every turn
    model.apply_event(
        KEY, scenes.event("hw.n1", scenes.snapshot("n1", [scenes.gpu(0, 9.0, 1.0)], 3))
    )
    assert model.nodes[KEY].snapshot is not None
    model.unfocus_node(KEY)
    assert model.nodes[KEY].snapshot is None and model.topics(KEY) == ("sum.", "node.")


def test_a_run_on_screen_gets_its_every_event() -> None:
    model, _ = one_node()
    model.apply_event(KEY, brief_event(1))  # type: ignore[arg-type]
    version = model.topics_version
    model.focus("ddp-1")
    assert model.topics(KEY) == ("sum.", "node.", "run.ddp-1.")
    assert model.topics_version > version  # the feed re-subscribes at once
    model.unfocus("ddp-1")
    assert model.topics(KEY) == ("sum.", "node.")


def test_a_daemon_that_sends_no_briefs_gets_everything_after_a_grace() -> None:
    model, clock = one_node()
    model.apply_event(KEY, hw())  # type: ignore[arg-type]
    assert model.topics(KEY) == ("sum.", "node.", "hw.")
    clock.now += 3.5
    model.apply_event(
        KEY, scenes.event("hw.n1", scenes.snapshot("n1", [scenes.gpu(0, 9.0, 1.0)], 4))
    )
    assert model.topics(KEY) == ("",)  # run events, state events: as before briefs
    assert model.nodes[KEY].snapshot is not None  # the fleet is drawn from its snapshots


def test_a_run_moves_with_its_brief_and_asks_for_its_record_when_its_state_moves() -> None:
    model, _ = one_node()
    model.apply_event(KEY, brief_event(1, [line(100)]))  # type: ignore[arg-type]
    assert model.take_needs_runs(KEY) and not model.take_needs_runs(KEY)  # new: once
    model.apply_runs(KEY, RunList(runs=[scenes.summary("ddp-1", [KEY], step=100)]))
    run = model.runs["ddp-1"]
    for seq, step in ((2, 110), (3, 130), (4, 150)):
        model.apply_event(KEY, brief_event(seq, [line(step)]))  # type: ignore[arg-type]
    assert not model.take_needs_runs(KEY)  # same state and attempt: nothing to ask
    assert run.steps_done() == 151 and run.last_value("loss") == 0.5
    rate = run.rate()
    assert rate is not None and (rate.value, rate.unit) == (812.0, "samples/s")
    assert run.verdict() == "degraded"  # no health event: the brief's verdict
    eta = run.eta_s()  # 20 steps a second from the briefs: (1800 - 151) / 20
    assert eta is not None and abs(eta - (1800 - 151) / 20) < 1e-6
    model.apply_event(KEY, brief_event(5, [line(150, RunState.STOPPING)]))  # type: ignore[arg-type]
    assert run.summary.state is RunState.STOPPING and model.take_needs_runs(KEY)
    model.apply_health(
        HealthSummary(run_id="ddp-1", attempt=2, time=scenes.T0 + 9, verdict="stalled")
    )
    assert run.verdict() == "stalled"  # a health event, where one came, wins


def test_a_run_without_heartbeats_reads_no_beats_not_ok() -> None:
    model, _ = one_node()
    plain = line(100).model_copy(update={"verdict": "ok", "judged_from_output": True})
    model.apply_event(KEY, brief_event(1, [plain]))  # type: ignore[arg-type]
    model.apply_runs(KEY, RunList(runs=[scenes.summary("ddp-1", [KEY], step=100)]))
    model.apply_event(KEY, brief_event(2, [plain]))  # type: ignore[arg-type]
    run = model.runs["ddp-1"]
    assert run.verdict() == "no beats"  # from the brief
    live = HealthSummary(run_id="ddp-1", attempt=2, time=scenes.T0 + 9, verdict="ok",
                         judged_from_output=True)  # fmt: skip
    model.apply_health(live)
    assert run.verdict() == "no beats"  # from the health event
    model.apply_health(live.model_copy(update={"verdict": "stalled"}))
    assert run.verdict() == "stalled"  # a stall seen in the output is one


def test_mfu_moves_with_the_brief_and_the_health_says_why_it_is_na() -> None:
    model, _ = one_node()
    model.apply_runs(KEY, RunList(runs=[scenes.summary("ddp-1", [KEY], step=100)]))
    for seq, mfu in ((1, 0.38), (2, 0.40), (3, 0.41), (4, 0.41)):
        flops = line(100 + seq).model_copy(update={"flops_per_second": mfu * 4e15, "mfu": mfu})
        model.apply_event(KEY, brief_event(seq, [flops]))  # type: ignore[arg-type]
    run = model.runs["ddp-1"]
    assert mfu_cell(run).plain == "41%"  # the Runs screen's column, from node 0's brief
    assert run.mfu_history() == [0.38, 0.40, 0.41]  # a repeated round is no new point
    text = mfu_text(run)
    assert text is not None and text.plain.startswith("MFU 41.0% ")
    # Simulated GPUs: a FLOP rate, no MFU; the health (a run on screen) says why.
    simulated = RunFlops(flops_per_second=2.5e9, source="counted", gpus=2, why_not=SIMULATED)
    model.apply_health(
        HealthSummary(run_id="ddp-1", attempt=2, time=scenes.T0 + 9, verdict="ok", flops=simulated)
    )
    assert mfu_cell(run).plain == "n/a"
    text = mfu_text(run)
    assert text is not None
    assert text.plain.startswith("FLOP/s 2.5 GFLOP/s ")
    assert f"MFU n/a ({SIMULATED}) · counted" in text.plain
    model.apply_event(KEY, brief_event(9, [line(120, RunState.STOPPED)]))  # type: ignore[arg-type]
    assert mfu_cell(run).plain == "–" and mfu_text(run) is None  # not training: no rate
