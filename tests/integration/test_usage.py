"""`gpuctl usage` (issue 23 §3): GPU-hours by user, run and node, across two daemons, from
their own records, and still after retention removed a run.

Two daemons with 8 simulated GPUs each; three real runs: one on 2 GPUs by the local
operator, one on 4 GPUs launched with a second operator key named `alice`, and one
2-node torchrun run on a GPU per node. Node 0 keeps one finished run, so `gpuctl gc`
removes the two older ones; what they used is still counted.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Callable
from pathlib import Path

import pytest

from gpud.security.roles import Role
from gpud.wire.protocol import RUN_LAUNCH
from gpud.wire.run_messages import LaunchReply, LaunchRequest, NodeRefIn, RunStatus
from tests.support.adversary import authorized_keys
from tests.support.daemons import RunningDaemon, gpuctl
from tests.support.runs import launch, script_spec, status, wait_for

pytestmark = pytest.mark.slow

SHORT = "import time\nprint('step 0 loss 1.0', flush=True)\ntime.sleep(2)\n"


def gpu_seconds(s: RunStatus) -> float:
    """GPUs × seconds over the run's attempts on the node that answered."""
    return sum(
        len(a.gpus) * (a.ended_at - a.started_at)
        for a in s.attempts
        if a.started_at is not None and a.ended_at is not None
    )


def usage(*args: str, nodes: tuple[str, ...]) -> dict[str, object]:
    where = [a for node in nodes for a in ("--node", node)]
    result = gpuctl(*where, "--json", "usage", *args)
    assert result.returncode == 0, result.stderr
    found = json.loads(result.stdout)
    assert isinstance(found, dict)
    return found


def rows_by(found: dict[str, object], by: str) -> dict[str, dict[str, float]]:
    rows = found["rows"]
    assert isinstance(rows, list)
    return {row[by]: row for row in rows}


def test_gpu_hours_by_user_run_and_node_outlive_retention(
    daemons: Callable[..., RunningDaemon], tmp_path: Path
) -> None:
    node0 = daemons(node="n0", extra=("--retention-max-runs", "1"))
    node1 = daemons(node="n1")
    nodes = (node0.address, node1.address)
    spec = script_spec(tmp_path, SHORT, name="short")
    mine = launch(node0, "gpus=2", config=spec)
    alice = authorized_keys(node0, Role.OPERATOR, "alice")
    target = node0.target()
    with node0.client(keys=alice, timeout_s=30) as client:
        reply = client.call(
            RUN_LAUNCH,
            LaunchRequest(
                spec={"name": "hers", "launcher": "python", "nproc_per_node": 1, "gpus": 4,
                      "workdir": str(tmp_path), "script": "short.py"},
                nodes=[NodeRefIn(control=target.control,
                                 server_key=target.server_key.decode() if target.server_key
                                 else None)],
            ),
        )  # fmt: skip
    assert isinstance(reply, LaunchReply)
    hers = reply.run.id
    code = "import time\nimport torch.distributed as dist\ndist.init_process_group('gloo')\n"
    code += "print('step 0 loss 1.0', flush=True)\ntime.sleep(2)\ndist.barrier()\n"
    gang_spec = script_spec(tmp_path, code, name="gang", launcher="torchrun")
    gang = launch(node0, "gpus=1", config=gang_spec, nodes=nodes)
    ended = {r: wait_for(node0, r, {"succeeded", "failed"}, timeout=120) for r in (mine, hers)}
    ended[gang] = wait_for(node0, gang, {"succeeded", "failed"}, timeout=120)
    assert all(s.run.state.value == "succeeded" for s in ended.values()), ended
    wait_for(node1, gang, {"succeeded", "failed"}, timeout=30)
    used = {r: gpu_seconds(s) for r, s in ended.items()}
    used[gang] += gpu_seconds(status(node1, gang))
    goodput = {
        r: s.goodput.ratio
        for r, s in ended.items()
        if s.goodput is not None and s.goodput.ratio is not None
    }
    assert set(goodput) == set(used) and all(0 < g <= 1 for g in goodput.values()), goodput
    # The 2-node launch waited for its nodes to join and for run.start: start-up, not queue.
    gang_goodput = ended[gang].goodput
    assert gang_goodput is not None and gang_goodput.seconds["queued"] == 0, gang_goodput
    assert gang_goodput.seconds["starting"] > 0, gang_goodput
    me = next(e.data["by"] for e in ended[mine].events if e.kind == "launch")

    def check(found: dict[str, object]) -> None:
        by_run = rows_by(found, "run")
        assert set(by_run) == set(used), by_run
        for run_id, seconds in used.items():
            row = by_run[run_id]
            assert row["gpu_hours"] == pytest.approx(seconds / 3600, rel=0.01, abs=1e-4), run_id
            useful = seconds * goodput[run_id] / 3600
            assert row["useful_gpu_hours"] == pytest.approx(useful, rel=0.02, abs=1e-4), run_id
        assert by_run[hers]["gpu_hours"] > 1.5 * by_run[mine]["gpu_hours"]  # 4 GPUs, not 2

    check(usage("--by", "run", nodes=nodes))
    by_user = rows_by(usage("--by", "user", nodes=nodes), "user")
    assert set(by_user) == {me, "alice"}, by_user
    assert by_user["alice"]["runs"] == 1 and by_user[me]["runs"] == 2
    assert by_user["alice"]["gpu_hours"] == pytest.approx(used[hers] / 3600, rel=0.01)
    by_node = rows_by(usage("--by", "node", nodes=nodes), "node")
    assert by_node["n1"]["runs"] == 1 and by_node["n0"]["runs"] == 3, by_node

    # Retention removes the two older runs on node 0; their use is still counted.
    gc = gpuctl("--node", node0.address, "gc")
    assert gc.returncode == 0 and "removed 2 finished run(s)" in gc.stdout, gc.stdout
    check(usage("--by", "run", nodes=nodes))

    table = gpuctl("--node", node0.address, "--node", node1.address, "usage", "--by", "user")
    assert table.returncode == 0, table.stderr
    assert "GPU-hours since" in table.stdout and "alice" in table.stdout, table.stdout
    sheet = gpuctl("--node", node0.address, "--node", node1.address, "usage", "--csv")
    lines = list(csv.DictReader(io.StringIO(sheet.stdout)))
    assert {row["user"] for row in lines} == {me, "alice"}, sheet.stdout
    total = sum(float(row["gpu_hours"]) for row in lines)
    assert total == pytest.approx(sum(used.values()) / 3600, rel=0.01)

    assert usage("--since", "1s", nodes=(node0.address,))["rows"] == []
    bad = gpuctl("--node", node0.address, "usage", "--since", "yesterday")
    assert bad.returncode == 2 and "write a duration (90m, 12h, 7d, 2w) or a date" in bad.stderr
    assert "Traceback" not in bad.stderr
