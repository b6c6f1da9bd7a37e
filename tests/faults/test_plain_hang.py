"""restart.hang_timeout_s for a script that knows nothing of gpud (issue 26 §2).

A plain torch.distributed script under torchrun, its metrics from a pattern, with
`restart: {max_attempts: 1, hang_timeout_s: 5}`. In attempt 1, rank 1 sleeps for good
before an all_reduce at step 50. No rank sends heartbeats, so before, health said `OK`
with no ranks and the run sat `running` for minutes. Now its health is judged from its
output and says so in place of OK, calls the quiet a stall, and the hang restarts it:
attempt 2 finishes.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpud.model.run import NO_HEARTBEATS, RunState
from tests.support.daemons import RunningDaemon, gpuctl
from tests.support.runs import health, nothing_left, script_spec, wait_for
from tests.support.waiting import until

# A 5 s hang timeout: on a machine loaded by other tests, a quiet start reads as a hang.
pytestmark = [pytest.mark.faults, pytest.mark.slow, pytest.mark.alone]

HANGS = """
import os, time
import torch
import torch.distributed as dist
dist.init_process_group("gloo")
rank = dist.get_rank()
first = os.environ.get("GPUD_ATTEMPT") == "1"
for step in range(120):
    if rank == 1 and step == 50 and first:
        time.sleep(10**6)  # stuck for good before the all_reduce
    t = torch.ones(16)
    dist.all_reduce(t)
    if rank == 0:
        print(f"step {step} loss {1 / (step + 1):.4f}", flush=True)
    time.sleep(0.03)
dist.barrier()
dist.destroy_process_group()
os._exit(0)
"""


def test_a_plain_script_that_hangs_is_restarted_from_its_output(
    daemon: RunningDaemon, tmp_path: Path
) -> None:
    spec = script_spec(tmp_path, HANGS, name="hangs", launcher="torchrun", nproc=2)
    pattern = {"pattern": r"step (?P<step>\d+) loss (?P<loss>[\d.]+)"}
    spec.write_text(
        spec.read_text()
        + f"metrics: [{json.dumps(pattern)}]\n"
        + "restart: {max_attempts: 1, hang_timeout_s: 5, backoff_s: 0}\n"
    )
    launched = gpuctl("--node", daemon.address, "--json", "launch", str(spec))
    assert launched.returncode == 0, launched.stderr
    # gpuctl said what health a script without the library gets
    assert "hangs.py does not import the trainers library" in launched.stderr
    assert "a hang after 5s without output" in launched.stderr
    run_id = json.loads(launched.stdout)["run"]["id"]

    live = until(
        "health judged from the output",
        lambda: (h := health(daemon, run_id)).reasons and h.ok_from_output and h,
        timeout=60,
    )
    assert live.reasons[0].startswith(NO_HEARTBEATS), live.reasons
    assert live.world_size == 2 and live.ranks == []

    def verdict_line() -> str:
        shown = gpuctl("--node", daemon.address, "health", run_id)
        assert shown.returncode == 0, shown.stderr
        return next(line for line in shown.stdout.splitlines() if line.startswith("verdict"))

    # gpuctl health says so in place of OK (polled: on a slow box the hang may come first,
    # and attempt 2 says it)
    said = until(
        "gpuctl health says no heartbeats",
        lambda: (
            (line := verdict_line()).startswith(f"verdict   {NO_HEARTBEATS}; last output") and line
        ),
        timeout=60,
    )
    assert "OK" not in said, said

    ended = wait_for(daemon, run_id, {"succeeded", "failed", "stopped"}, timeout=120)
    assert ended.run.state is RunState.SUCCEEDED, ended.run.reason
    first, second = ended.attempts
    assert first.state is RunState.FAILED and second.state is RunState.SUCCEEDED
    why = first.reason or ""
    assert "(hang, " in why and "no output and no new step for" in why, why
    # called at 5 s of quiet (give or take a health round), not minutes later
    quiet = float(why.split("stalled for ")[1].split("s")[0])
    assert 5 <= quiet <= 8, why
    print("attempt 1:", why)
    assert ended.run.last_step == 119
    nothing_left(run_id)
