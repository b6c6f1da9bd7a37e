"""Metrics history, backfill, heartbeats and health, on real runs under a real daemon."""

from __future__ import annotations

import glob
import json
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gpud.model.run import HealthSummary
from tests.support.daemons import RunningDaemon, gpuctl
from tests.support.runs import FAST, launch, nothing_left, status, wait_for, wait_for_step
from tests.support.waiting import until

pytestmark = pytest.mark.slow


def metrics(daemon: RunningDaemon, run_id: str, name: str = "loss") -> dict[str, Any]:
    result = gpuctl("--node", daemon.address, "--json", "metrics", run_id, "--name", name)
    assert result.returncode == 0, result.stderr
    reply: dict[str, Any] = json.loads(result.stdout)
    return reply


def steps_by_attempt(reply: dict[str, Any]) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for row in reply["rows"]:
        out.setdefault(row["attempt"], []).append(row["step"])
    return out


def test_metrics_missed_while_gpud_was_down_are_backfilled(
    daemons: Callable[..., RunningDaemon],
) -> None:
    first = daemons(node="n0")
    # Paced steps (FAST: 100 ms or more) so the run outlives the daemon's absence.
    run_id = launch(first, FAST, "training.max_steps=200")
    wait_for_step(first, run_id, 10)
    first.proc.send_signal(signal.SIGKILL)
    first.proc.wait(timeout=10)
    # The trainers go on; what they push meanwhile is dropped, and rank 0's metrics.jsonl
    # (what the next daemon backfills from) has it.
    jsonl = first.state_dir / "runs" / run_id / "metrics.jsonl"
    seen = len(jsonl.read_text().splitlines())
    until(
        "20 steps trained with no daemon",
        lambda: len(jsonl.read_text().splitlines()) >= seen + 20,
        timeout=60,
    )
    second = daemons(
        node="n0",
        state_dir=first.state_dir,
        control_port=int(first.address.rsplit(":", 1)[1]),
        events_port=int(first.events.rsplit(":", 1)[1]),
    )
    wait_for(second, run_id, {"succeeded"}, timeout=240)
    assert steps_by_attempt(metrics(second, run_id)) == {1: list(range(200))}
    nothing_left(run_id)


def _health_events(
    daemon: RunningDaemon,
    run_id: str,
    until: Callable[[HealthSummary], bool],
    timeout: float = 60.0,
) -> list[HealthSummary]:
    seen = []
    with daemon.client() as client, client.subscribe(f"run.{run_id}.health") as sub:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            event = sub.recv(timeout_s=1.0)
            if event is None or not isinstance(event.body, HealthSummary):
                continue
            seen.append(event.body)
            if until(event.body):
                return seen
    raise AssertionError(f"health never matched; last: {seen[-1] if seen else None}")


def test_heartbeats_become_a_health_summary(daemon: RunningDaemon) -> None:
    run_id = launch(daemon, FAST, "training.max_steps=100000")
    wait_for_step(daemon, run_id, 5)
    seen = _health_events(
        daemon,
        run_id,
        lambda h: len(h.ranks) == 2 and all((r.last_step or 0) >= 5 for r in h.ranks),
    )
    assert seen[-1].verdict == "ok", seen[-1].reasons
    health = seen[-1]
    assert (health.backend, health.world_size) == ("gloo", 2)
    assert [r.rank for r in health.ranks] == [0, 1]
    for r in health.ranks:
        assert r.last_step is not None and r.last_step >= 5
        assert r.heartbeat_age_s is not None and r.heartbeat_age_s < 1.5
        assert r.step_time_s is not None and r.step_time_s > 0
        assert r.gpu_index == r.local_rank  # simulated GPUs: one per local rank
        assert (r.node_rank, r.node) == (0, daemon.node)  # what the rank itself reports
    text = gpuctl("--node", daemon.address, "health", run_id).stdout
    assert "verdict   OK" in text and "RANK" in text
    assert gpuctl("--node", daemon.address, "stop", run_id, "--force", timeout=60).returncode == 0


def test_a_hung_rank_is_reported_as_stalled_with_a_countdown(daemon: RunningDaemon) -> None:
    run_id = launch(
        daemon,
        FAST,
        "training.max_steps=100000",
        "nccl.timeout_s=60",
        "env={GPUD_TEST_HANG_RANK: '1', GPUD_TEST_HANG_AT_STEP: '30'}",
    )
    seen = _health_events(daemon, run_id, lambda h: h.verdict == "stalled")
    stalled = seen[-1]
    assert stalled.stall is not None and stalled.stall.rank == 1
    assert stalled.ranks[1].stalled and not stalled.ranks[0].stalled
    # Reported within two heartbeat intervals of the stall threshold (1 s here).
    assert stalled.stall.stuck_for_s <= 2.0 + 0.6, stalled.stall
    assert stalled.stall.timeout_s == 60
    assert 50 < stalled.stall.countdown_s <= 60
    # It hangs after logging index 30: 31 steps done, the 32nd never finishes.
    assert stalled.ranks[1].steps_done == 31
    assert "rank 1 has not finished step 32" in stalled.stall.why
    assert gpuctl("--node", daemon.address, "stop", run_id, "--force", timeout=60).returncode == 0
    nothing_left(run_id)


@pytest.mark.alone  # step times, measured against the machine's load
def test_a_slowed_rank_is_a_straggler(daemon: RunningDaemon) -> None:
    run_id = launch(
        daemon,
        # Unpaced: FAST's floor on a step would hide rank 1's 50 ms under it.
        "args=[--width, '128', --depth, '2', --log-every, '5']",
        "training.max_steps=100000",
        "env={GPUD_TEST_SLOW_RANK: '1', GPUD_TEST_SLOW_S: '0.05'}",
    )
    # Named within a few seconds of both ranks training: a verdict needs the rank to be the
    # slowest in 7 of the last 10 s (stragglers.py), so about 7 s, not a minute.
    _health_events(
        daemon,
        run_id,
        lambda h: len(h.ranks) == 2 and all((r.last_step or 0) >= 1 for r in h.ranks),
    )
    started = time.monotonic()
    seen = _health_events(daemon, run_id, lambda h: h.straggler is not None, timeout=20)
    named_after = time.monotonic() - started
    health = seen[-1]
    assert health.straggler is not None and health.straggler.rank == 1, named_after
    assert health.straggler.ratio >= 1.3
    assert health.verdict == "degraded" and health.ranks[1].straggler
    assert gpuctl("--node", daemon.address, "stop", run_id, "--force", timeout=60).returncode == 0


def test_probe_reports_bus_bandwidth(daemon: RunningDaemon) -> None:
    run_id = launch(daemon, FAST, "training.max_steps=120")
    wait_for(daemon, run_id, {"succeeded"})
    probes = metrics(daemon, run_id, name="busbw_gbps")
    assert [row["step"] for row in probes["rows"]] == [0, 100]
    assert all(row["values"]["busbw_gbps"] > 0 for row in probes["rows"])


def test_flight_recorder_dumps_become_run_events(daemon: RunningDaemon) -> None:
    run_id = launch(daemon, FAST, "training.max_steps=100000")
    wait_for_step(daemon, run_id, 3)
    attempt_dir = Path(status(daemon, run_id).attempts[0].attempt_dir)
    # What PyTorch writes on a collective timeout (TORCH_FR_DUMP_TEMP_FILE + rank).
    (attempt_dir / "nccl_trace_rank_1").write_bytes(b"\x80\x04pickle")
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        kinds = [e.kind for e in status(daemon, run_id).events]
        if "flight_recorder_dump" in kinds:
            break
        time.sleep(0.3)
    assert "flight_recorder_dump" in kinds
    assert gpuctl("--node", daemon.address, "stop", run_id, "--force", timeout=60).returncode == 0


def test_wandb_mirror_in_offline_mode(daemon: RunningDaemon) -> None:
    run_id = launch(
        daemon, FAST, "training.max_steps=40", "wandb={project: gpud-test, mode: offline}"
    )
    wait_for(daemon, run_id, {"succeeded"})
    files = glob.glob(
        str(Path(daemon.state_dir, "runs", run_id, "wandb", "offline-run-*", f"run-{run_id}.wandb"))
    )
    assert len(files) == 1, "rank 0 mirrors to one offline wandb run named after the run"
    data = Path(files[0]).read_bytes()
    assert data.count(b"loss") >= 40  # every step's loss was logged
