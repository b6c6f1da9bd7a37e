"""The model on its own: liveness with a fixed clock, runs folded across nodes, histories,
logs, and what the feed is asked to fetch. No Textual, no sockets."""

from __future__ import annotations

from gpud.model.run import RunState
from gpud.model.snapshot import GpuProcess
from gpud.wire.protocol import RunLogEvent, RunMetricsEvent
from gpud.wire.run_messages import LogChunk, MetricRow, MetricsReply, RunList
from tests.tui import scenes
from tui.model import actions
from tui.model.fleet import FleetModel
from tui.model.nodes import OFFLINE_AFTER_S
from tui.widgets.runs_table import COLUMNS, run_row


def one_node() -> tuple[FleetModel, scenes.FixedClock, str]:
    clock = scenes.FixedClock()
    model = FleetModel([scenes.target(1, "n1")], clock=clock, wall=scenes.FixedClock(scenes.T0))
    return model, clock, "tcp://10.0.0.1:7711"


def hw(seq: int) -> object:
    return scenes.event("hw.n1", scenes.snapshot("n1", [scenes.gpu(0, 50.0, 10.0)], seq=seq), seq)


def test_a_silent_node_is_offline_within_3_s_and_back_with_its_next_event() -> None:
    model, clock, key = one_node()
    assert not model.online(key)  # never heard from
    model.apply_event(key, hw(1))  # type: ignore[arg-type]
    assert model.online(key)
    clock.now += 1.0
    assert model.online(key)  # one interval of silence is normal
    clock.now += OFFLINE_AFTER_S  # 3.5 s after the last event in all
    assert OFFLINE_AFTER_S < 3.0
    assert not model.online(key)
    summary = model.summary()
    assert (summary.online, summary.offline) == (0, 1)
    model.apply_event(key, hw(2))  # type: ignore[arg-type]
    assert model.online(key)


def test_a_slow_daemon_gets_its_interval_before_it_counts_as_offline() -> None:
    model, clock, key = one_node()
    snap = scenes.snapshot("n1", [scenes.gpu(0, 1.0, 1.0)]).model_copy(update={"interval_s": 5.0})
    model.apply_event(key, scenes.event("hw.n1", snap))
    clock.now += 5.5
    assert model.online(key)
    clock.now += 1.5
    assert not model.online(key)


def test_gpu_histories_are_bounded() -> None:
    model, _, key = one_node()
    for seq in range(1, 500):
        model.apply_event(key, hw(seq))  # type: ignore[arg-type]
    history = model.nodes[key].histories[0]
    assert len(history.util) == len(history.memory) == 120
    assert history.util.values()[-1] == 50.0


def test_node_zeros_record_wins_and_shape_counts_every_node() -> None:
    model = scenes.fleet()
    run = model.runs["pretrain-7b-3f9a2c"]
    assert run.summary.node_rank == 0
    assert run.nproc_by_node() == [2, 2]
    assert run.world_size() == 4
    # Node 1 reports a newer state of its own part: the run's state is still node 0's.
    a2 = "tcp://10.0.0.2:7711"
    part = scenes.summary(run.id, [n.control for n in run.summary.nodes], 1, RunState.STOPPING)
    model.apply_runs(a2, RunList(runs=[part]))
    assert run.summary.state is RunState.RUNNING
    assert run.parts[1].state is RunState.STOPPING


def test_history_then_live_points_with_resume_marks() -> None:
    model = scenes.fleet()
    run = model.runs["pretrain-7b-3f9a2c"]
    loss = run.metrics["loss"]
    assert loss.resumed_at() == (700.0,)
    assert loss.last()[:2] == (2, 1181.0)  # type: ignore[index]
    assert run.metric_names()[0] == "loss"
    assert run.history == "loaded"
    # Live points that arrived before the history are kept after it, without duplicates.
    fresh = FleetModel([scenes.target(1)], clock=scenes.FixedClock())
    key = "tcp://10.0.0.1:7711"
    live = RunMetricsEvent(
        run_id="r-1", attempt=1, points=[{"step": 10, "time": 1.0, "values": {"loss": 0.5}}]
    )
    fresh.apply_event(key, scenes.event("run.r-1.metrics", live))
    rows = [
        MetricRow(attempt=1, step=s, time=float(s), values={"loss": 1.0 / (s + 1)})
        for s in range(11)
    ]
    fresh.apply_metrics_history("r-1", MetricsReply(run_id="r-1", rows=rows))
    series = fresh.runs["r-1"].metrics["loss"]
    assert len(series) == 11
    assert series.last() == (1, 10.0, 1.0 / 11)


def test_rate_and_eta_come_from_the_latest_attempt() -> None:
    model = scenes.fleet()
    run = model.runs["pretrain-7b-3f9a2c"]
    rate = run.rate()
    assert rate is not None and rate.unit == "steps/s"
    assert 20 < rate.value < 40
    eta = run.eta_s()
    assert eta is not None and 10 < eta < 60
    stopped = model.runs["cpu-ddp-0a1b2c"]
    assert stopped.rate() is None and stopped.eta_s() is None


def test_logs_merge_fetched_tail_and_live_lines_with_ranks() -> None:
    model = scenes.fleet()
    logs = model.runs["pretrain-7b-3f9a2c"].logs
    lines = logs.lines()
    assert [ln.rank for ln in lines] == [0, 0, 1, 3, 0]
    assert lines[3].text == "step 1171 slow data loader (rank 3)"
    assert [ln.text for ln in logs.lines(rank=3)] == ["step 1171 slow data loader (rank 3)"]
    assert len(logs.lines(node_rank=1)) == 1
    assert [ln.rank for ln in logs.lines(search="NCCL")] == [1]
    assert logs.lines(node_rank=5) == []


def test_a_fetched_tail_replaces_the_live_lines_it_covers() -> None:
    model, _, key = one_node()
    live = RunLogEvent(node="n1", node_rank=0, attempt=1, offset=20, lines=["[default0]:b"])
    model.apply_event(key, scenes.event("run.r-2.log", live))
    later = RunLogEvent(node="n1", node_rank=0, attempt=1, offset=40, lines=["[default0]:c"])
    model.apply_event(key, scenes.event("run.r-2.log", later))
    chunk = LogChunk(
        run_id="r-2",
        node="n1",
        node_rank=0,
        attempt=1,
        offset=0,
        next_offset=20,
        size=40,
        lines=["[default0]:a", "[default0]:b"],
        ended=False,
    )
    model.apply_log_chunk(chunk)
    assert [ln.text for ln in model.runs["r-2"].logs.lines()] == ["a", "b", "c"]


def test_the_mark_where_a_bounded_log_dropped_lines_shows_whatever_the_rank() -> None:
    model, _, _ = one_node()
    mark = (
        "[gpud] ---- 39,518 line(s) (2.45 MB) dropped here, printed between 01:26:39 and"
        " 01:26:42 (logs.max_bytes 200 kB) ----"
    )
    chunk = LogChunk(
        run_id="r-2", node="n1", node_rank=0, attempt=1, offset=0, next_offset=300, size=300,
        lines=["[default0]:head", "[default1]:head", mark, "[default1]:tail"], ended=False,
    )  # fmt: skip
    model.apply_log_chunk(chunk)
    logs = model.runs["r-2"].logs
    assert [ln.text for ln in logs.lines(rank=1)] == ["head", mark, "tail"]


def test_wants_are_handed_out_once_for_focused_runs_only() -> None:
    model = scenes.fleet()
    run_id = "pretrain-7b-3f9a2c"
    run = model.runs[run_id]
    run.history = "none"
    a1, a2 = "tcp://10.0.0.1:7711", "tcp://10.0.0.2:7711"
    assert model.wants(a1) == []
    model.focus(run_id)
    # Node 0's log tail is already here (the scene fetched it); node 1's is not.
    assert sorted(w.kind for w in model.wants(a1)) == ["health", "metrics"]
    assert model.wants(a1) == []
    wanted = model.wants(a2)
    assert [(w.kind, w.node_rank, w.attempt) for w in wanted] == [("logs", 1, 2)]
    assert model.wants(a2) == []
    model.unfocus(run_id)
    assert run_id not in model.focused


def test_processes_are_mapped_to_run_and_rank() -> None:
    model = scenes.fleet()
    owner = model.process_owner("tcp://10.0.0.1:7711", 1, 4101)
    assert owner is not None
    assert (owner.run_id, owner.rank, owner.local_rank, owner.how) == (
        "pretrain-7b-3f9a2c",
        1,
        1,
        "health",
    )
    assert model.process_owner("tcp://10.0.0.1:7711", 0, 999) is None


def test_simulated_gpus_map_by_local_rank_without_health() -> None:
    model, _, key = one_node()
    proc = GpuProcess(pid=77, name="python")
    gpus = [
        scenes.gpu(i, 50.0, 1.0, simulated=True, procs=[proc] if i == 1 else []) for i in range(2)
    ]
    model.apply_event(key, scenes.event("hw.n1", scenes.snapshot("n1", gpus, simulated=True)))
    model.apply_runs(key, RunList(runs=[scenes.summary("sim-1", [key], 0)]))
    owner = model.process_owner(key, 1, 77)
    assert owner is not None and (owner.rank, owner.how) == (1, "simulated")


def test_fleet_summary_and_node_health() -> None:
    model = scenes.fleet()
    s = model.summary()
    assert (s.nodes, s.online, s.offline, s.gpus) == (3, 2, 1, 16)
    assert (s.xid, s.throttled, s.runs, s.running) == (1, 1, 2, 1)
    health = model.nodes["tcp://10.0.0.2:7711"].health()
    assert health.xid == 1 and health.throttled == [0] and health.lost == [7]
    assert model.nodes["tcp://10.0.0.1:7711"].health().ok


def test_the_confirmation_names_the_run_its_nodes_and_processes() -> None:
    model = scenes.fleet()
    plan = actions.plan(model, "stop", "pretrain-7b-3f9a2c")
    assert "pretrain-7b-3f9a2c" in plan.question
    assert "on 2 nodes: gpu-a01 (10.0.0.1:7711) × 2 processes" in plan.question
    assert "gpu-a02 (10.0.0.2:7711) × 2 processes — 4 ranks in all" in plan.question
    assert plan.target.control == "tcp://10.0.0.1:7711"
    resume = actions.plan(model, "resume", "cpu-ddp-0a1b2c")
    assert "as attempt 2" in resume.question and "× 2 processes" in resume.question
    for verb, run_id in (("stop", "cpu-ddp-0a1b2c"), ("resume", "pretrain-7b-3f9a2c")):
        try:
            actions.plan(model, verb, run_id)
        except actions.ActionRefused as exc:
            assert run_id in str(exc)
        else:
            raise AssertionError(f"{verb} {run_id} should be refused")


def test_jump_commands_and_finding_runs() -> None:
    from tui.screens.jump import parse_jump

    assert parse_jump(":run cpu-ddp ") == ("run", "cpu-ddp")
    assert parse_jump("ps") == ("runs", "")
    assert parse_jump("q!") == ("quit", "")
    assert parse_jump("") == ("", "")
    model = scenes.fleet()
    assert model.find_run("pretrain-7b-3f9a2c") == "pretrain-7b-3f9a2c"
    assert model.find_run("pre") == "pretrain-7b-3f9a2c"  # a unique prefix
    assert model.find_run("cpu-ddp") == "cpu-ddp-0a1b2c"  # a name: its newest run
    assert model.find_run("nope") is None


def test_simulated_gpus_map_to_runs_by_their_leases() -> None:
    model, _, key = one_node()
    procs = {i: [GpuProcess(pid=100 + i, name="python")] for i in (1, 6)}
    gpus = [scenes.gpu(i, 50.0, 1.0, simulated=True, procs=procs.get(i, [])) for i in range(8)]
    model.apply_event(key, scenes.event("hw.n1", scenes.snapshot("n1", gpus, simulated=True)))
    leased = scenes.summary("late-1", [key], 0, nproc=4).model_copy(update={"gpus": [4, 5, 6, 7]})
    queued = scenes.summary("wait-2", [key], 0, RunState.QUEUED, queue_position=1)
    model.apply_runs(key, RunList(runs=[leased, queued]))
    owner = model.process_owner(key, 6, 106)
    assert owner is not None and (owner.run_id, owner.rank, owner.local_rank) == ("late-1", 2, 2)
    assert model.process_owner(key, 1, 101) is None  # GPU 1 is leased to nobody
    held = model.gpu_holder(key, 5)
    assert held is not None and held[0].id == "late-1"
    assert model.gpu_holder(key, 3) is None
    rows = {run.id: run_row(run, scenes.T0) for run in model.sorted_runs()}
    gpus_at = next(i for i, (label, _, _) in enumerate(COLUMNS) if label == "GPUS")
    assert str(rows["late-1"][1][gpus_at]) == "4-7"
    assert str(rows["wait-2"][1][1]) == "queued #1" and str(rows["wait-2"][1][gpus_at]) == "-"


def test_a_pods_processes_are_named_by_their_pod_on_the_node_screen() -> None:
    """On Kubernetes a process no run of gpud's owns is named by its pod: by name where
    the kubelet gave the GPU to that pod, else by the UID its cgroup says."""
    from gpud.model.snapshot import PodRef
    from tui.widgets.gpu_detail import processes_text

    model, _, key = one_node()
    uid, other = "0e3f4a52-7b1c-4f7e-9a3d-2c1b5e6f7a80", "9b8a7c6d-0000-4000-8000-00000000abcd"
    procs = [
        GpuProcess(pid=101, name="python", used_memory_bytes=1 << 30, pod_uid=uid),
        GpuProcess(pid=202, name="python", used_memory_bytes=1 << 30, pod_uid=other),
        GpuProcess(pid=303, name="nvidia-smi", used_memory_bytes=1 << 20),
    ]
    pod = PodRef(name="trainer-0", namespace="ml", container="pytorch", uid=uid)
    gpu = scenes.gpu(0, 50.0, 10.0, procs=procs).model_copy(update={"pod": pod})
    model.apply_event(key, scenes.event("hw.n1", scenes.snapshot("n1", [gpu])))
    lines = processes_text(model, model.nodes[key], gpu).plain.splitlines()
    assert lines[0].endswith("→ pod ml/trainer-0 (pytorch)")
    assert lines[1].endswith(f"→ pod uid {other}")
    assert lines[2].endswith("· no known run")
