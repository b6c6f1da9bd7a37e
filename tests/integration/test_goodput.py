"""Goodput (issue 23 §2): the CPU DDP example with a hang and a kill under a restart policy.

Real daemon, real torchrun and gloo ranks. Attempt 1 hangs at step 34 (rank 1 stops making
progress; health stops it after `restart.hang_timeout_s`), attempt 2 resumes from step 29
and has rank 1 SIGKILLed past step 50, attempt 3 resumes from step 49 and finishes. Every
second of the run's wall time is in one bucket, and each bucket holds what happened.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from gpud.model.run import RunState
from tests.support.daemons import RunningDaemon, gpuctl
from tests.support.runs import FAST, kill_rank, launch, script_spec, status, wait_for
from tests.support.waiting import until

pytestmark = [pytest.mark.slow]


# A 5 s hang timeout: on a machine loaded by other tests, a slow step reads as a hang.
@pytest.mark.alone
def test_a_hang_and_a_kill_are_where_the_wall_time_went(daemon: RunningDaemon) -> None:
    run_id = launch(
        daemon,
        FAST,
        "training.max_steps=100",
        "checkpoint.every_steps=10",
        "env.GPUD_TEST_SLOW_RANK=0",  # 50 ms more a step: a kill lands between two saves
        "env.GPUD_TEST_SLOW_S=0.05",
        "env.GPUD_TEST_HANG_RANK=1",
        "env.GPUD_TEST_HANG_AT_STEP=34",
        "env.GPUD_TEST_ONLY_ATTEMPTS=1",
        "restart.max_attempts=2",
        "restart.backoff_s=0.5",
        "restart.hang_timeout_s=5",
    )

    def attempt_2_past_step_52() -> bool:
        run = status(daemon, run_id).run
        return run.attempt == 2 and run.last_step is not None and run.last_step >= 52

    until("attempt 2 past step 52", attempt_2_past_step_52, timeout=180)
    kill_rank(run_id, 1)
    s = wait_for(daemon, run_id, {"succeeded", "failed", "stopped"}, timeout=240)
    assert s.run.state is RunState.SUCCEEDED, s.run.reason
    assert (s.run.attempt, s.run.restarts) == (3, 2)
    g = s.goodput
    assert g is not None and g.ended
    wall = s.run.state_since - s.run.created_at
    b = g.seconds
    print(f"wall {wall:.1f}s: {g.line()}")
    assert abs(sum(b.values()) - wall) <= 0.01 * wall, (b, wall)
    assert abs(g.wall_s - wall) <= 0.01 * wall
    # The hang: health saw no progress for the 5 s timeout, then its flight-recorder
    # dumps and the stop; the kill and the hang each cost a restart.
    assert b["stalled"] >= 5.0, b
    assert b["stopping"] > 0 and b["restarting"] > 0 and b["starting"] > 0, b
    # Attempt 1 reached step 33 or 34 and attempt 2 resumed from 29; attempt 2 was killed past
    # step 52 and attempt 3 resumed from its newest save: both did steps again.
    first, second, third = g.attempts
    assert second.resume_step == 29 and (first.last_step or 0) >= 33, g.attempts
    assert third.resume_step is not None and third.resume_step >= 49, g.attempts
    assert first.seconds.get("lost", 0) > 0, g.attempts
    assert second.last_step is not None and second.last_step > third.resume_step
    assert second.seconds.get("lost", 0) > 0, g.attempts
    assert b["checkpointing"] > 0, b  # each save's time, as the trainer reported it
    assert b["training"] > 0 and g.ratio is not None and 0 < g.ratio < 1
    assert third.ratio is not None and third.ratio > (first.ratio or 0.0)

    text = gpuctl("--node", daemon.address, "status", run_id).stdout
    line = next(x for x in text.splitlines() if x.startswith("goodput   "))
    assert f"{g.ratio * 100:.0f}% [" in line and "stalled " in line and "lost " in line, line
    shown = json.loads(gpuctl("--node", daemon.address, "--json", "status", run_id).stdout)
    assert shown["goodput"]["attempts"][2]["resume_step"] == third.resume_step


#: A script that knows nothing of gpud (issue 32 §6): it saves its step in a file every 10
#: steps and resumes from GPUD_RESUME_FROM; in attempt 1 it raises after step 37. No torch.
SAVES_STEPS = """
import os, sys, time
out = sys.argv[1]
start = int(open(os.environ["GPUD_RESUME_FROM"]).read()) if "GPUD_RESUME_FROM" in os.environ else 0
for step in range(start, 60):
    print(f"iter {step}: loss {1 / (step + 1):.4f}", flush=True)
    time.sleep(0.05)
    if step % 10 == 9:
        with open(f"{out}/ckpt_{step + 1}.txt", "w") as f:
            f.write(str(step + 1))
    if step == 37 and os.environ["GPUD_ATTEMPT"] == "1":
        raise ValueError("bad batch at step 37")
"""


def test_a_scripts_resume_through_its_pattern_loses_only_the_steps_redone(
    daemons: Callable[..., RunningDaemon], tmp_path: Path
) -> None:
    daemon = daemons(simulate_gpus=None)
    out = tmp_path / "out"
    out.mkdir()
    spec = script_spec(tmp_path, SAVES_STEPS, name="saves-steps", args=(str(out),))
    spec.write_text(
        spec.read_text()
        + f"checkpoint: {{dir: {out}}}\n"
        + "resume: {pattern: 'ckpt_*.txt', latest: newest}\n"
        + 'metrics: [{pattern: "iter (?P<step>\\\\d+): loss (?P<loss>[\\\\d.]+)"}]\n'
        + "restart: {max_attempts: 1, backoff_s: 0, on: [user]}\n"
    )
    run_id = launch(daemon, config=spec)
    s = wait_for(daemon, run_id, {"succeeded", "failed", "stopped"}, timeout=120)
    assert s.run.state is RunState.SUCCEEDED, s.run.reason
    second = s.attempts[1]
    assert second.resume_from == str(out / "ckpt_30.txt")
    # its first step, 30, says where the checkpoint left it: nobody reported the step
    assert second.resume_step == 29
    g = s.goodput
    assert g is not None and g.ended
    first = g.attempts[0]
    assert (first.first_step, first.last_step) == (0, 37)
    assert g.attempts[1].resume_step == 29
    # steps 30–37 were done again: 8 of attempt 1's 38 steps, about a fifth of its
    # training; before, resume_step was unknown and all of it went to `lost`
    lost, trained = first.seconds["lost"], first.seconds["training"]
    assert 0.1 < lost / (lost + trained) < 0.35, first.seconds
