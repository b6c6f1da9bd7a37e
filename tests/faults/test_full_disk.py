"""A full disk (issue 26 §4): the state dir or the checkpoint dir has no room left.

Each disk is a tmpfs of its own (`tests/support/disk.py`, skipped where mounting is not
allowed), filled by a file the test deletes to give the room back, so the kernel, SQLite
and torch answer as they do on a user's full disk. Real daemons, real shims, real ranks.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from gpud.model.run import CauseKind, RunState
from gpud.runs.multinode.gang import QUEUE_RETRY_S
from tests.support.daemons import RunningDaemon, gpuctl
from tests.support.disk import SmallDisk, small_disk
from tests.support.runs import (
    CPU_DDP,
    FAST,
    assert_no_gap,
    health,
    launch,
    script_spec,
    status,
    steps_recorded,
    wait_for,
    wait_for_step,
)
from tests.support.waiting import until

pytestmark = [pytest.mark.faults, pytest.mark.slow]

Daemons = Callable[..., RunningDaemon]

#: ~100 kB/s of numbered lines for `seconds`, and every second a line in a file outside
#: the state dir: the script's own word that it is alive and printing.
PRINTER = """
import sys, time
seconds, beats = float(sys.argv[1]), sys.argv[2]
line = "x" * 1000
end = time.monotonic() + seconds
i = 0
while time.monotonic() < end:
    for _ in range(10):
        print(f"line {i} {line}")
        i += 1
    sys.stdout.flush()
    with open(beats, "a") as f:
        f.write(f"{i}\\n")
    time.sleep(0.1)
print(f"done after {i} lines", flush=True)
"""


def beats(path: Path) -> int:
    """How many lines the printer says it has printed (0 before its first beat)."""
    try:
        return int(path.read_text().split()[-1])
    except (OSError, IndexError, ValueError):
        return 0


def stored_attempts(state_dir: Path, run_id: str) -> list[str]:
    """The attempts' states as the daemon's database holds them on disk (not in memory)."""
    db = sqlite3.connect(f"file:{state_dir / 'gpud.db'}?mode=ro", uri=True)
    try:
        rows = db.execute(
            "SELECT state FROM attempts WHERE run_id = ? ORDER BY attempt", (run_id,)
        ).fetchall()
    finally:
        db.close()
    return [state for (state,) in rows]


def full_lines(daemon: RunningDaemon) -> list[str]:
    return [line for line in daemon.log().splitlines() if "is full" in line]


@pytest.fixture
def state_disk(tmp_path: Path) -> Iterator[SmallDisk]:
    with small_disk(tmp_path / "state", "12m") as disk:
        yield disk


def test_a_full_state_dir_stops_no_run_and_the_daemon_catches_up(
    daemons: Daemons, tmp_path: Path, state_disk: SmallDisk
) -> None:
    """The run goes on printing while the state dir has no room; the daemon answers, logs
    the full disk a few times (not a traceback a tick), and once there is room it records
    the run's true end, with a line in the log saying how much output was dropped. Output
    the shim drops is not silence: a hang timeout shorter than the full spell calls no hang
    (issue 33 §9: the run was stopped as hung, "no output and no new step")."""
    daemon = daemons(node="n0", simulate_gpus=1, state_dir=state_disk.path)
    alive = tmp_path / "beats"
    spec = script_spec(tmp_path, PRINTER, name="printer", args=("14", str(alive)))
    spec.write_text(spec.read_text() + "restart: {hang_timeout_s: 5}\n")
    run_id = launch(daemon, config=spec)
    until("the printer prints", lambda: beats(alive) > 50, timeout=30)
    state_disk.fill()
    full_at = time.monotonic()
    printed = beats(alive)
    # Full for 7 s, past the hang timeout: the script goes on, the daemon answers and still
    # calls the run running.
    slowest = 0.0
    with daemon.client() as client:
        while time.monotonic() - full_at < 7.0:
            asked = time.monotonic()
            assert client.node_info().node == "n0"
            slowest = max(slowest, time.monotonic() - asked)
            time.sleep(0.1)
    assert state_disk.free_bytes < 64 << 10, "the disk was not full"
    assert beats(alive) > printed + 200, "the printer stopped on the full disk"
    s = status(daemon, run_id)
    assert s.run.state is RunState.RUNNING, s.run.reason
    assert health(daemon, run_id).stall is None, "the full disk's dropped output read as silence"
    refused = gpuctl("--node", daemon.address, "launch", str(spec))
    assert refused.returncode != 0
    assert "is full" in refused.stderr, refused.stderr
    print(refused.stderr.strip())
    hw = gpuctl("--node", daemon.address, "hw")
    assert hw.returncode == 0 and "STATE DIR FULL: the state dir " in hw.stdout, hw.stdout
    told = [e for e in daemon.client().node_events().events if e.kind == "state_dir"]
    assert [e.severity for e in told] == ["critical"], told
    assert told[0].message.startswith("state dir full: ") and "new launches are refused" in (
        told[0].message
    )
    full_for = time.monotonic() - full_at
    state_disk.make_room()
    roomy_at = time.monotonic()
    until("the daemon writes again", lambda: "has room again" in daemon.log(), timeout=10)
    until(
        "the node event that the state dir has room",
        lambda: any(
            e.kind == "state_dir" and e.severity == "info"
            for e in daemon.client().node_events().events
        ),
        timeout=10,
    )
    assert "STATE DIR FULL" not in gpuctl("--node", daemon.address, "hw").stdout
    print(
        f"state dir full for {full_for:.1f}s: the printer printed {beats(alive) - printed}"
        f" lines meanwhile; slowest node.info {slowest * 1000:.0f} ms; the daemon wrote its"
        f" backlog {time.monotonic() - roomy_at:.1f}s after the room came back"
    )
    s = wait_for(daemon, run_id, {"succeeded", "failed", "stopped"}, timeout=60)
    assert s.run.state is RunState.SUCCEEDED, s.run.reason
    assert [a.state for a in s.attempts] == [RunState.SUCCEEDED]
    assert stored_attempts(state_disk.path, run_id) == ["succeeded"]
    log_text = (state_disk.path / "runs" / run_id / "attempt-1" / "output.log").read_text()
    assert "of output were dropped: the disk of" in log_text
    print(next(line for line in log_text.splitlines() if "were dropped" in line))
    assert "done after" in log_text  # what came after the full disk is all there
    assert any(e.kind == "output_dropped" for e in s.events), [e.kind for e in s.events]
    # Logged when it filled, maybe once more, and when it had room: never a tick's traceback.
    assert 1 <= len(full_lines(daemon)) <= 3, full_lines(daemon)
    assert "Traceback" not in daemon.log()
    assert "has room again" in daemon.log()


#: Runs until a file appears, then kills itself (a `signal` failure: restarted by default).
DIES_ON_CUE = """
import os, signal, sys, time
cue = sys.argv[1]
print("up", flush=True)
while not os.path.exists(cue):
    time.sleep(0.1)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_restart_the_full_disk_refuses_waits_and_starts_once_there_is_room(
    daemons: Daemons, tmp_path: Path, state_disk: SmallDisk
) -> None:
    """Issue 33 §9: a restart whose part could not be started on the full state dir sat
    `pending … restarting in 10s` for good, after room came back too, with `ps` at attempt
    2 and `status` listing attempt 1 only. It waits in the queue for room, saying so once
    (not "waiting for GPUs", not a line a second), the record stays at the attempt that
    ran, and it starts once there is room. (Where the daemon's check passes and only the
    part's own files find no room, `Gang._undo_attempt` keeps the same promise.)"""
    daemon = daemons(node="n0", simulate_gpus=1, state_dir=state_disk.path)
    cue = tmp_path / "die-now"  # not on the small disk
    spec = script_spec(tmp_path, DIES_ON_CUE, name="dies", args=(str(cue),))
    spec.write_text(spec.read_text() + "restart: {max_attempts: 1, backoff_s: 0.5}\n")
    run_id = launch(daemon, config=spec)
    until("attempt 1 runs", lambda: status(daemon, run_id).run.state is RunState.RUNNING, 30)
    state_disk.fill()
    cue.write_text("")
    until(
        "the restart waits for room",
        lambda: "waiting for room: " in (status(daemon, run_id).run.reason or ""),
        timeout=60,
    )
    cue.unlink()  # attempt 2 runs until told
    # A window for what must not happen: the queue tries it again every QUEUE_RETRY_S,
    # and the log must not say so each time (it did, once a second).
    time.sleep(3 * QUEUE_RETRY_S)
    s = status(daemon, run_id)
    assert s.run.state is RunState.QUEUED, s.run
    assert f"the state dir {state_disk.path} is full" in (s.run.reason or ""), s.run.reason
    assert s.run.attempt == 1 and [a.attempt for a in s.attempts] == [1], s
    listed = json.loads(gpuctl("--node", daemon.address, "--json", "ps").stdout)["runs"]
    assert [(r["attempt"], r["state"]) for r in listed if r["id"] == run_id] == [(1, "queued")]
    said = [line for line in daemon.log().splitlines() if "queued — waiting for room" in line]
    assert len(said) == 1, said
    state_disk.make_room()
    until(
        "attempt 2 runs once there is room",
        lambda: (r := status(daemon, run_id).run).attempt == 2 and r.state is RunState.RUNNING,
        timeout=60,
    )
    s = status(daemon, run_id)
    assert [a.attempt for a in s.attempts] == [1, 2] and s.run.restarts == 1, s
    cue.write_text("")  # attempt 2 fails too: no restart is left
    ended = wait_for(daemon, run_id, {"failed"}, timeout=60)
    assert ended.run.attempt == 2 and len(ended.attempts) == 2, ended


def test_a_shim_that_dies_on_a_full_state_dir_names_the_disk(
    daemons: Daemons, tmp_path: Path, state_disk: SmallDisk
) -> None:
    """The shim killed while the disk is full: the cause says the state dir is full (not
    only "the shim died"), and the attempt's record ends failed once there is room."""
    daemon = daemons(node="n0", simulate_gpus=1, state_dir=state_disk.path)
    alive = tmp_path / "beats"
    spec = script_spec(tmp_path, PRINTER, name="printer", args=("600", str(alive)))
    run_id = launch(daemon, config=spec)
    until("the printer prints", lambda: beats(alive) > 20, timeout=30)
    shim = status(daemon, run_id).attempts[-1].shim_pid
    assert shim is not None
    state_disk.fill()
    os.kill(shim, signal.SIGKILL)
    s = wait_for(daemon, run_id, {"failed", "succeeded", "stopped"}, timeout=30)
    reason = s.run.reason or ""
    assert s.run.state is RunState.FAILED, reason
    assert f"the state dir {state_disk.path} is full (ENOSPC" in reason, reason
    assert s.run.cause is not None and s.run.cause.kind is CauseKind.ENVIRONMENT, s.run.cause
    state_disk.make_room()
    assert [a.state for a in s.attempts] == [RunState.FAILED]  # the daemon's word...
    until(  # ...and its database's, once it can write again
        "the attempt's end is on disk",
        lambda: stored_attempts(state_disk.path, run_id) == ["failed"],
        timeout=15,
    )


#: Long enough to still train once there is room again: the example saves its final model
#: into the run dir, which a full disk refuses. FAST paces a step at 100 ms or more, so
#: these take 30 s however idle the box is; the disk is full for 30 steps from step 20.
DDP_STEPS = 300


def slow_ddp(daemon: RunningDaemon, tmp_path: Path) -> str:
    """A CPU DDP run of DDP_STEPS, checkpoints outside the state dir, past its 20th step."""
    run_id = launch(
        daemon, FAST, f"training.max_steps={DDP_STEPS}", f"checkpoint.dir={tmp_path / 'ckpt'}"
    )
    wait_for_step(daemon, run_id, 20)
    return run_id


def trains_on(daemon: RunningDaemon, run_id: str, steps: int = 30) -> None:
    """The run trains `steps` more steps (the disk is full meanwhile), still running."""
    before = status(daemon, run_id).run.last_step or 0
    until(
        f"{steps} steps more on a full disk",
        lambda: (status(daemon, run_id).run.last_step or 0) - before >= steps,
        timeout=60,
    )
    s = status(daemon, run_id)
    assert s.run.state is RunState.RUNNING, s.run.reason


def test_a_ddp_run_trains_on_through_a_full_state_dir_and_loses_no_metric(
    daemons: Daemons, tmp_path: Path, state_disk: SmallDisk
) -> None:
    """torchrun's ranks write their output into the state dir (torchrun's --tee files) and
    rank 0 its metrics.jsonl: with no room, they train on, and once there is room the
    daemon has every step's metrics."""
    daemon = daemons(node="n0", simulate_gpus=None, state_dir=state_disk.path)
    run_id = slow_ddp(daemon, tmp_path)
    state_disk.fill()
    trains_on(daemon, run_id)
    state_disk.make_room()
    s = wait_for(daemon, run_id, {"succeeded", "failed", "stopped"}, timeout=180)
    assert s.run.state is RunState.SUCCEEDED, s.run.reason
    assert_no_gap(steps_recorded(daemon, run_id), DDP_STEPS)


# --------------------------------------------------------------------------- checkpoints

#: A model whose checkpoint (weights and AdamW's two moments) is ~6 MB: more than 3 MB.
WIDE = "args=[--width, '512', --depth, '2', --log-every, '5']"


def temporaries(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.endswith(".tmp"))


def test_a_checkpoint_that_does_not_fit_names_the_disk_and_leaves_nothing_behind(
    daemon: RunningDaemon, tmp_path: Path
) -> None:
    """The first save does not fit in a 3 MB checkpoint dir: the cause names the dir and
    the room (not torch's "unexpected pos" as user code), no partial file keeps the disk
    full, and a partial file a killed save left is removed when the resume starts."""
    with small_disk(tmp_path / "ckpt", "3m") as disk:
        run_id = launch(
            daemon, WIDE, "training.max_steps=30", "checkpoint.every_steps=10",
            f"checkpoint.dir={disk.path}",
        )  # fmt: skip
        s = wait_for(daemon, run_id, {"failed", "succeeded", "stopped"}, timeout=180)
        reason = s.run.reason or ""
        print(f"the save that did not fit: {reason}")
        assert s.run.state is RunState.FAILED, reason
        assert s.run.cause is not None and s.run.cause.kind is CauseKind.ENVIRONMENT, s.run.cause
        assert f"no space left on {disk.path} (checkpoint step 9 needs ~" in reason, reason
        assert "unexpected pos" not in reason
        assert temporaries(disk.path) == []
        assert disk.free_bytes > 2_900_000  # nothing of the failed save holds the disk
        # A save killed half-way (no exception, no clean-up) left its temporary file.
        abandoned = disk.path / ".step_00000003.pt.tmp"
        abandoned.write_bytes(b"\0" * (1 << 20))
        disk.grow("40m")
        resumed = gpuctl("--node", daemon.address, "resume", run_id)
        assert resumed.returncode == 0, resumed.stderr
        s = wait_for(daemon, run_id, {"failed", "succeeded", "stopped"}, timeout=180)
        assert s.run.state is RunState.SUCCEEDED, s.run.reason
        assert temporaries(disk.path) == []
        saved = sorted(p.name for p in disk.path.iterdir())
        print("saved:", [(p.name, p.stat().st_size) for p in disk.path.iterdir()])
        assert saved and all(name.startswith("step_") for name in saved), saved
        log_text = (Path(s.attempts[-1].attempt_dir) / "output.log").read_text()
        assert f"removed {abandoned}: a save that never finished left it" in log_text


def test_run_dirs_on_a_disk_of_their_own_that_fills_lose_no_metric(
    daemons: Daemons, tmp_path: Path
) -> None:
    """The state dir's `runs/` on a disk of its own (as operators mount a big one there):
    it fills while a DDP run trains. The run trains on, the daemon refuses launches naming
    that disk and says so in `gpuctl hw`; once there is room it has every step's metrics,
    read again from what rank 0 wrote to its run dir."""
    state = tmp_path / "state"
    (state / "runs").mkdir(parents=True)
    with small_disk(state / "runs", "12m") as runs_disk:
        daemon = daemons(node="n0", simulate_gpus=None, state_dir=state)
        run_id = slow_ddp(daemon, tmp_path)
        runs_disk.fill()
        refused = gpuctl("--node", daemon.address, "launch", str(CPU_DDP))
        assert refused.returncode != 0, refused.stdout
        assert f"the run dirs' disk {state / 'runs'} is full" in refused.stderr, refused.stderr
        until(
            "gpuctl hw says so",
            lambda: (
                "STATE DIR FULL: the run dirs' disk"
                in gpuctl("--node", daemon.address, "hw").stdout
            ),
            timeout=10,
        )
        trains_on(daemon, run_id)
        runs_disk.make_room()
        s = wait_for(daemon, run_id, {"succeeded", "failed", "stopped"}, timeout=180)
        assert s.run.state is RunState.SUCCEEDED, s.run.reason
        assert_no_gap(steps_recorded(daemon, run_id), DDP_STEPS)
        daemon.stop()
