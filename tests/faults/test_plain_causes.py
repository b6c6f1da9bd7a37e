"""The cause of a plain torchrun script's failure is the rank that failed (issue 32 §1).

A script that knows nothing of gpud (torch.distributed on gloo, its metrics from a
pattern), `restart: {max_attempts: 3}`: at step 20 rank 1 raises a ValueError, exits 0,
or is SIGKILLed, while rank 0 goes on into the next all-reduce and fails on the closed
connection. On one node (two ranks) and on two (one rank each), the run's cause names
rank 1 and what it did, never rank 0's `Connection closed by peer`; a user error is not
restarted, a kill is restarted once and then stopped by the same-failure rule.
(Two nodes where rank 1 exits 0: tests/faults/test_early_exit.py.)

Before: the one-node exception read `[rank0]: RuntimeError: … Connection closed by peer`
(network) and ran four attempts, since torch's excepthook puts `[rank1]: ` inside
torchrun's `[default1]:` and the traceback was never found.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from gpud.model.run import CauseKind, RunState
from tests.support.daemons import RunningDaemon, gpuctl
from tests.support.runs import launch, nothing_left, script_spec, wait_for

pytestmark = [pytest.mark.faults, pytest.mark.slow]

SCRIPT = """
import os, signal, time
import torch
import torch.distributed as dist
dist.init_process_group("gloo")
rank = dist.get_rank()
how = os.environ["FAIL_HOW"]
for step in range(100_000):
    t = torch.ones(1024)
    dist.all_reduce(t)
    if rank == 0:
        print(f"step {step} loss {1 / (step + 1):.5f}", flush=True)
    if rank == 1 and step == 20:
        if how == "raise":
            raise ValueError("bad batch on rank 1")
        if how == "exit0":
            os._exit(0)  # not sys.exit: gloo may abort a rank at interpreter exit
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(0.02)
"""

#: (the cause's class, the start of its one line, the attempts that ran); the step as the
#: script numbers it, the last one gpud saw
EXPECTED = {
    "raise": (CauseKind.USER, "ValueError: bad batch on rank 1", 1),
    "exit0": (CauseKind.USER, "rank 1 exited 0 after step 20 while the others were training", 1),
    "kill": (CauseKind.SIGNAL, "killed by SIGKILL", 2),
}


@pytest.mark.parametrize(
    ("nodes", "how"),
    [(1, "raise"), (1, "exit0"), (1, "kill"), (2, "raise"), (2, "kill")],
    ids=["one-node-raise", "one-node-exit0", "one-node-kill", "two-nodes-raise", "two-nodes-kill"],
)
def test_the_cause_is_the_rank_that_failed_not_its_peers_connection_error(
    daemons: Callable[..., RunningDaemon], tmp_path: Path, nodes: int, how: str
) -> None:
    node0 = daemons(node="n0", simulate_gpus=None)
    others = [daemons(node="n1", simulate_gpus=None)] if nodes == 2 else []
    spec = script_spec(tmp_path, SCRIPT, name="plain", launcher="torchrun", nproc=3 - nodes)
    pattern = {"pattern": r"step (?P<step>\d+) loss (?P<loss>[\d.]+)"}
    spec.write_text(spec.read_text() + f"metrics: [{json.dumps(pattern)}]\n")
    run_id = launch(
        node0, "restart.max_attempts=3", "restart.backoff_s=0", f"env.FAIL_HOW={how}",
        config=spec, nodes=tuple(d.address for d in [node0, *others]),
    )  # fmt: skip
    ended = wait_for(node0, run_id, {"failed", "stopped", "succeeded"}, timeout=180)
    run = ended.run
    assert run.state is RunState.FAILED, run.reason
    kind, says, attempts = EXPECTED[how]
    cause = run.cause
    assert cause is not None, run.reason
    where = "n1" if nodes == 2 else "n0"
    assert (cause.kind, cause.rank, cause.node) == (kind, 1, where), cause
    assert cause.summary.startswith(says), cause.summary
    assert (run.reason or "").startswith(f"rank 1 on node {where}: {says}"), run.reason
    assert "Connection closed" not in cause.summary
    assert (run.attempt, len(ended.attempts)) == (attempts, attempts), run.reason
    if attempts == 1:
        assert f"not restarted: {kind.value} is not in restart.on" in (run.reason or "")
    else:
        assert "not restarted: the same error at the same step as attempt 1" in (
            run.reason or ""
        ), run.reason
    shown = gpuctl("--node", node0.address, "status", run_id)
    assert says in shown.stdout, shown.stdout
    nothing_left(run_id)
