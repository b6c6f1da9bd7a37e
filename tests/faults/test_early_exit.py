"""A rank that exits 0 while its peers train is the cause (issue 26 §3).

A plain torch.distributed script (no trainers library) on two nodes, one rank each, its
metrics from a pattern; rank 1 returns 0 after step 100. Rank 0 then fails on gloo's
`Read error` (or `Connection closed`): before, that echo was the run's cause, class
`network`, restarted (and gloo's wording differed between attempts, so a restart was
wasted before the same-failure rule stopped the retries). Now the cause is rank 1's early
exit, class `user`, which `restart.on` does not list: one attempt, and every view says so.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

import pytest

from gpud.model.run import CauseKind, RunState
from tests.support.daemons import RunningDaemon, gpuctl
from tests.support.runs import launch, nothing_left, script_spec, wait_for

pytestmark = [pytest.mark.faults, pytest.mark.slow]

EARLY = """
import os, time
import torch
import torch.distributed as dist
dist.init_process_group("gloo")
rank = dist.get_rank()
for step in range(100_000):
    t = torch.ones(1024)
    dist.all_reduce(t)
    if rank == 0:
        print(f"step {step} loss {1 / (step + 1):.5f}", flush=True)
    if rank == 1 and step == 100:
        # The script's own logic ends this rank early, with 0. os._exit: gloo sometimes
        # aborts a rank at interpreter exit (SIGABRT), which is another test's failure.
        os._exit(0)
    time.sleep(0.02)
"""


def test_a_rank_that_exits_0_early_is_the_cause_not_its_peers_connection_error(
    daemons: Callable[..., RunningDaemon], tmp_path: Path
) -> None:
    node0 = daemons(node="n0", simulate_gpus=None)
    node1 = daemons(node="n1", simulate_gpus=None)
    spec = script_spec(tmp_path, EARLY, name="early", launcher="torchrun", nproc=1)
    pattern = {"pattern": r"step (?P<step>\d+) loss (?P<loss>[\d.]+)"}
    spec.write_text(spec.read_text() + f"metrics: [{json.dumps(pattern)}]\n")
    run_id = launch(
        node0, "restart.max_attempts=3", "restart.backoff_s=0", config=spec,
        nodes=(node0.address, node1.address),
    )  # fmt: skip
    ended = wait_for(node0, run_id, {"failed", "stopped", "succeeded"}, timeout=120)
    run = ended.run
    assert run.state is RunState.FAILED, run.reason
    cause = run.cause
    assert cause is not None and cause.kind is CauseKind.USER, cause
    assert cause.rank == 1 and cause.node == "n1", cause
    reason = run.reason or ""
    found = re.search(r"rank 1 exited 0 after step (\d+) while the others were training", reason)
    assert found and 95 <= int(found.group(1)) <= 105, run.reason
    assert "(the script ended early on one rank)" in (run.reason or "")
    assert "not restarted: user is not in restart.on" in (run.reason or ""), run.reason
    assert run.attempt == 1 and len(ended.attempts) == 1
    # The two ways `decide.early_exit` knows (both seen here): node 1's part found it
    # itself (torchrun waited at its exit barrier and node 1's tick saw the rank gone
    # meanwhile), or node 0's part failed first, the barrier let go, and node 1's part just
    # ended with exit 0 before its next tick. The run's cause is the same either way.
    part = ended.parts[1]
    if part.cause is not None:
        assert part.cause.summary.startswith("rank 1 exited 0 while the others"), part
    else:
        assert part.state is RunState.SUCCEEDED and part.reason == "exit 0", part
    shown = gpuctl("--node", node0.address, "status", run_id)
    assert "rank 1 exited 0 after step" in shown.stdout, shown.stdout
    nothing_left(run_id)
