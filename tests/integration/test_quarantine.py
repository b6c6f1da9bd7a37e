"""Quarantine and drain (issue 21 §1) with a real daemon, real gloo ranks and the XID hook:
a GPU that throws XID 79 under a run is quarantined, the run stops with its checkpoint,
fails with the hardware as its cause and restarts on other GPUs; nothing new is leased on
it, across a daemon restart too, until an operator undrains it. An operator drains the
node (runs there go on, or stop with --stop-runs); a viewer cannot; bad input is one line."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from gpud.model.run import CauseKind, RunState
from gpud.security.auth import authorize
from gpud.security.keys import CLIENT_KEY, load_or_create_keypair
from gpud.security.known_nodes import known_nodes_path
from gpud.security.roles import Role
from tests.support.adversary import audit_records
from tests.support.daemons import RunningDaemon, gpuctl, run_cli
from tests.support.runs import (
    FAST,
    force_stop,
    launch,
    script_spec,
    status,
    wait_for,
    wait_for_step,
)
from tests.support.waiting import until

pytestmark = pytest.mark.slow
Daemons = Callable[..., RunningDaemon]


def hw(daemon: RunningDaemon) -> dict[str, object]:
    done = gpuctl("--node", daemon.address, "--json", "hw")
    assert done.returncode == 0, done.stderr
    node: dict[str, object] = json.loads(done.stdout)["nodes"][0]
    return node


def gpu_hold(daemon: RunningDaemon, index: int) -> dict[str, object] | None:
    gpus = hw(daemon)["gpus"]
    assert isinstance(gpus, list)
    hold: dict[str, object] | None = gpus[index]["hold"]
    return hold


def gpuctl_as_viewer(
    daemon: RunningDaemon, config: Path, *args: str
) -> subprocess.CompletedProcess[str]:
    """gpuctl from a config dir of its own, whose key the daemon knows as a viewer's (as
    `gpuctl keys create`, `keys authorize --role viewer` and `keys trust` would set it up)."""
    if not config.exists():
        keys, _ = load_or_create_keypair(config / "keys", CLIENT_KEY)
        authorize(daemon.state_dir, keys.public_text, Role.VIEWER, "watcher")
        shutil.copy(known_nodes_path(), config / known_nodes_path().name)  # trusts the daemon
    return run_cli("launch.gpuctl", *args, env={"GPUD_CONFIG_DIR": str(config)})


def test_an_xid_79_quarantines_the_gpu_and_the_run_restarts_on_others(
    daemons: Daemons, tmp_path: Path
) -> None:
    xids = tmp_path / "xids"
    state = tmp_path / "state"
    daemon = daemons(simulate_gpus=4, state_dir=state, extra=("--simulate-xid-file", str(xids)))
    run_id = launch(
        daemon, FAST, "training.max_steps=100000", "checkpoint.every_steps=10",
        "restart.max_attempts=2", "restart.backoff_s=0", "gpus=2",
    )  # fmt: skip
    wait_for_step(daemon, run_id, 25)
    # Two GPUs, the closest free pair: simulated GPUs read as equally close, so the lowest.
    assert status(daemon, run_id).attempts[0].gpus == [0, 1]
    xids.write_text("1:79\n")  # the driver says GPU 1 fell off the bus

    until("GPU 1 quarantined", lambda: gpu_hold(daemon, 1) is not None, timeout=10)
    hold = gpu_hold(daemon, 1)
    assert hold is not None and hold["kind"] == "quarantine"
    assert hold["reason"] == "XID 79 (GPU has fallen off the bus)"
    table = gpuctl("--node", daemon.address, "hw").stdout
    assert "quarantined" in table and "GPU 1 quarantined: XID 79" in table
    events = daemon.client().node_events().events
    assert any(e.kind == "quarantine" and e.gpu_index == 1 for e in events)

    # The run: stopped with its checkpoint, failed on the hardware, restarted elsewhere.
    def second_attempt_runs() -> bool:
        s = status(daemon, run_id)
        return s.run.attempt == 2 and s.run.state is RunState.RUNNING

    until("attempt 2 running", second_attempt_runs, timeout=90)
    s = status(daemon, run_id)
    first, second = s.attempts[0], s.attempts[1]
    assert first.state is RunState.FAILED
    # The first attempt's own cause: the run's is its latest failed attempt's, and on a
    # host this busy attempt 2 may fail too, on its MASTER_PORT taken between gpud's lease
    # and the bind by another test's daemon's run (the run then restarts once more).
    assert first.exit is not None
    cause = first.exit.cause
    if s.run.cause != cause:
        assert s.run.cause is not None and "MASTER_PORT" in s.run.cause.summary, s.run.cause
    assert cause is not None and cause.kind is CauseKind.HARDWARE
    uuid = first.gpu_uuids[1]
    assert cause.summary == f"GPU 1 ({uuid}) quarantined: XID 79 (GPU has fallen off the bus)"
    assert 1 not in second.gpus and len(second.gpus) == 2, second.gpus
    assert second.resume_from is not None  # from the checkpoint the stop saved
    assert any(e.kind == "quarantine" for e in s.events)

    # Nothing new lands on GPU 1, and the refusal says why.
    spec = script_spec(tmp_path, "import time; time.sleep(30)", name="wants1")
    refused = gpuctl("--node", daemon.address, "launch", str(spec), "--set", "gpus=[1]")
    assert refused.returncode != 0
    (line,) = refused.stderr.strip().splitlines()
    assert "GPU 1 quarantined: XID 79 (GPU has fallen off the bus)" in line, line

    # The quarantine outlives the daemon.
    force_stop(daemon, run_id)
    daemon.stop()
    again = daemons(
        simulate_gpus=4, state_dir=state, control_port=int(daemon.address.split(":")[1])
    )
    assert gpu_hold(again, 1) is not None

    # An operator puts it back.
    done = gpuctl("--node", again.address, "undrain", again.address, "--gpu", "1")
    assert done.returncode == 0, done.stderr
    assert gpu_hold(again, 1) is None
    ok = gpuctl("--node", again.address, "--json", "launch", str(spec), "--set", "gpus=[1]")
    assert ok.returncode == 0, ok.stderr
    force_stop(again, json.loads(ok.stdout)["run"]["id"])
    undrains = [r for r in audit_records(state) if '"node.undrain"' in r]
    assert len(undrains) == 1 and '"ok":true' in undrains[0]


def test_an_operator_drains_and_undrains_a_node(daemon: RunningDaemon, tmp_path: Path) -> None:
    node = daemon.address
    # It prints: a part is `running` from its first line of output.
    sleeper = script_spec(
        tmp_path, "import time\nprint('up', flush=True)\nfor i in range(600): time.sleep(0.1)"
    )
    running = launch(daemon, config=sleeper)
    wait_for(daemon, running, {"running"})

    drained = gpuctl("--node", node, "drain", node, "--reason", "swap the PSU")
    assert drained.returncode == 0, drained.stderr
    assert f"{running}: goes on until it ends (--stop-runs)" in drained.stdout
    assert "drained by" in drained.stdout and "swap the PSU" in drained.stdout
    assert status(daemon, running).run.state is RunState.RUNNING  # not stopped
    assert "DRAINED by" in gpuctl("--node", node, "hw").stdout

    refused = gpuctl("--node", node, "launch", str(sleeper))
    assert refused.returncode != 0
    (line,) = refused.stderr.strip().splitlines()
    assert "is drained by" in line and "swap the PSU" in line and "gpuctl undrain" in line
    queued = gpuctl("--node", node, "--json", "launch", str(sleeper), "--queue")
    assert queued.returncode == 0, queued.stderr
    waiting = json.loads(queued.stdout)["run"]["id"]
    assert status(daemon, waiting).run.state is RunState.QUEUED

    # Bad input: one line each, nothing changed.
    bad_gpu = gpuctl("--node", node, "drain", node, "--gpu", "9", "--reason", "x")
    assert bad_gpu.returncode == 2
    assert bad_gpu.stderr.strip().splitlines() == [
        "gpuctl: error: node0 has no GPU 9 (its GPUs: 0-7) [invalid_body]"
    ]
    unknown = gpuctl("--node", node, "drain", "no-such-node", "--reason", "x")
    assert unknown.returncode == 2 and len(unknown.stderr.strip().splitlines()) == 1
    # A viewer's key: the daemon refuses the request, so exit 1 (the README's table).
    viewer = tmp_path / "viewer"
    assert gpuctl_as_viewer(daemon, viewer, "--node", node, "hw").returncode == 0  # it reads
    refused = gpuctl_as_viewer(daemon, viewer, "--node", node, "drain", node, "--reason", "mine")
    assert refused.returncode == 1, refused.stderr
    assert refused.stderr.strip().splitlines() == [
        "gpuctl: error: node.drain needs the operator role; your key (watcher) is a viewer"
        " [forbidden]"
    ]
    assert refused.stdout == ""

    # --stop-runs: the runs there are stopped, each through its node 0.
    again = gpuctl("--node", node, "drain", node, "--reason", "now", "--stop-runs")
    assert again.returncode == 0, again.stdout + again.stderr
    assert f"{running}: stopped with its checkpoint" in again.stdout
    assert status(daemon, running).run.state is RunState.STOPPED

    undone = gpuctl("--node", node, "undrain", node)
    assert undone.returncode == 0 and "takes new runs" in undone.stdout, undone.stderr
    wait_for(daemon, waiting, {"running"}, timeout=30)  # the queue moves again
    force_stop(daemon, waiting)
    records = [json.loads(r) for r in audit_records(daemon.state_dir)]
    done = [r["action"] for r in records if r["ok"]]
    assert done.count("node.drain") == 2 and done.count("node.undrain") == 1
    refusals = {(r["action"], r["code"]) for r in records if not r["ok"]}
    assert {("node.drain", "invalid_body"), ("node.drain", "forbidden")} <= refusals


def test_a_queued_launch_waits_on_a_quarantined_gpu_and_starts_once_it_is_undrained(
    daemons: Daemons, tmp_path: Path
) -> None:
    xids = tmp_path / "xids"
    daemon = daemons(simulate_gpus=4, extra=("--simulate-xid-file", str(xids)))
    xids.write_text("2:79\n")  # no run there: the GPU is quarantined all the same
    until("GPU 2 quarantined", lambda: gpu_hold(daemon, 2) is not None, timeout=10)
    spec = script_spec(
        tmp_path, "import time\nprint('up', flush=True)\ntime.sleep(600)", name="all4"
    )
    refused = gpuctl("--node", daemon.address, "launch", str(spec), "--set", "gpus=4")
    assert refused.returncode != 0
    (line,) = refused.stderr.strip().splitlines()
    assert "GPU 2 quarantined: XID 79" in line, line
    queued = gpuctl(
        "--node", daemon.address, "--json", "launch", str(spec), "--set", "gpus=4", "--queue"
    )
    assert queued.returncode == 0, queued.stderr
    run_id = json.loads(queued.stdout)["run"]["id"]
    waiting = status(daemon, run_id).run
    assert waiting.state is RunState.QUEUED and "GPU 2 quarantined" in (waiting.reason or "")
    assert run_id in gpuctl("--node", daemon.address, "ps", "--active").stdout

    done = gpuctl("--node", daemon.address, "undrain", daemon.address, "--gpu", "2")
    assert done.returncode == 0, done.stderr
    wait_for(daemon, run_id, {"running"}, timeout=30)
    assert sorted(status(daemon, run_id).attempts[0].gpus) == [0, 1, 2, 3]
    force_stop(daemon, run_id)
