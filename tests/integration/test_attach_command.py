"""`gpud attach -- COMMAND`: a training command gpud did not launch reports to the node's
daemon — a real daemon with --attach, the real CPU DDP example under a real torchrun typed
as a user would (or as a pod's command line), its stop by SIGTERM, a failing script's
cause, and a pod claim the kernel does not bear out."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from gpud.model.run import HealthSummary
from gpud.wire.client import Client
from gpud.wire.protocol import RUN_HEALTH, RUN_STATUS
from gpud.wire.run_messages import RunRef, RunStatus
from tests.support.daemons import RunningDaemon
from tests.support.waiting import until

pytestmark = pytest.mark.slow
ROOT = Path(__file__).parents[2]
Daemons = Callable[..., RunningDaemon]
DDP = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
       str(ROOT / "trainers" / "examples" / "ddp.py"), "--width", "128", "--depth", "2",
       "--log-every", "5"]  # fmt: skip


@pytest.fixture
def box(daemons: Daemons) -> Iterator[tuple[RunningDaemon, dict[str, str]]]:
    attach = Path(tempfile.mkdtemp(prefix="gpud-attach-"))  # a unix socket path is short
    daemon = daemons(extra=("--attach", str(attach)))
    env = {**os.environ, "GPUD_ATTACH": str(attach), "OMP_NUM_THREADS": "1"}
    for name in ("GPUD_RUN_ID", "GPUD_INGEST", "KUBERNETES_SERVICE_HOST", "POD_UID"):
        env.pop(name, None)
    yield daemon, env
    shutil.rmtree(attach, ignore_errors=True)


def attach(env: dict[str, str], cwd: Path, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "gpud", "attach", *args], env=env, cwd=cwd, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip


def status(daemon: RunningDaemon, run_id: str) -> RunStatus | None:
    with Client(daemon.target(), timeout_s=10) as client:
        if not any(r.id == run_id for r in client.runs().runs):
            return None
        return client.call(RUN_STATUS, RunRef(run=run_id))


def test_a_hand_typed_torchrun_reports_to_the_daemon_and_a_sigterm_stops_it(
    box: tuple[RunningDaemon, dict[str, str]], tmp_path: Path
) -> None:
    daemon, env = box
    proc = attach(env, tmp_path, "--run-id", "by-hand-1", "--nproc", "2", "--",
                  *DDP, "--steps", "100000")  # fmt: skip
    try:
        seen = until(
            "the run training on the daemon",
            lambda: (s := status(daemon, "by-hand-1")) and (s.run.last_step or 0) >= 20 and s,
        )
        assert seen.run.attached is not None and seen.run.attached.scheduler == "manual"
        assert seen.run.state.value == "running" and seen.run.launcher == "torchrun"
        assert 0 < seen.run.last_values["loss"] < 10

        def both() -> HealthSummary | None:
            with Client(daemon.target(), timeout_s=10) as client:
                found = client.call(RUN_HEALTH, RunRef(run="by-hand-1"))
            beating = [r for r in found.ranks if r.heartbeat_age_s is not None]
            return found if len(beating) == 2 else None

        health = until("both ranks' heartbeats", both, timeout=30)
        assert health.world_size == 2
    finally:
        proc.send_signal(signal.SIGTERM)  # as Kubernetes stops a pod, or ^C at a terminal
        out, err = proc.communicate(timeout=120)
    assert "[gpud] by-hand-1: reporting to gpud on node0" in err
    ended = until("the end on the daemon", lambda: (s := status(daemon, "by-hand-1"))
                  and s.run.state.terminal and s)  # fmt: skip
    assert ended.run.state.value == "stopped", ended.run
    assert "SIGTERM to gpud attach" in (ended.run.reason or "")
    # The trainers checkpointed on the stop: it is in the run dir, and in the daemon.
    assert ended.run.last_checkpoint is not None
    assert Path(ended.run.last_checkpoint.path).exists()
    assert "rank 0 of 2" in out  # the command's own output passed through
    logged = tmp_path / "gpud-runs" / "by-hand-1" / "attempt-1" / "node-0" / "output.log"
    assert "rank 0 of 2" in logged.read_text()


def test_a_failing_command_fails_with_its_cause_and_its_exit_code(
    box: tuple[RunningDaemon, dict[str, str]], tmp_path: Path
) -> None:
    daemon, env = box
    script = tmp_path / "bad.py"
    script.write_text("import trainers\ntrainers.init()\nraise ValueError('bad shard 17')\n")
    proc = attach(env, tmp_path, "--run-id", "bad-1", "--", sys.executable, str(script))
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 1, err
    assert "ValueError: bad shard 17" in err + out  # passed through
    ended = until("the failure on the daemon", lambda: (s := status(daemon, "bad-1"))
                  and s.run.state.terminal and s)  # fmt: skip
    assert ended.run.state.value == "failed"
    assert ended.run.cause is not None and "ValueError: bad shard 17" in ended.run.cause.summary
    assert ended.run.launcher == "python"


def test_a_pod_claim_the_kernel_does_not_bear_out_is_refused_and_the_command_runs(
    box: tuple[RunningDaemon, dict[str, str]], tmp_path: Path
) -> None:
    daemon, env = box
    pod = str(uuid.uuid4())
    env = {**env, "KUBERNETES_SERVICE_HOST": "10.0.0.1", "POD_UID": pod, "NODE_NAME": "n7"}
    proc = attach(env, tmp_path, "--run-id", "pod-1", "--", sys.executable, "-c", "print(42)")
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0 and out.strip() == "42"
    assert f"is not in pod {pod} (it is in no pod gpud can see)" in err, err
    assert "metrics go to metrics.jsonl only" in err
    assert status(daemon, "pod-1") is None


def test_running_the_same_run_id_again_is_its_next_attempt(
    box: tuple[RunningDaemon, dict[str, str]], tmp_path: Path
) -> None:
    daemon, env = box
    for _ in range(2):  # a pod restarted, a command typed again
        proc = attach(env, tmp_path, "--run-id", "twice-1", "--", sys.executable, "-c", "1")
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
    ended = until("attempt 2 ended", lambda: (s := status(daemon, "twice-1"))
                  and s.run.attempt == 2 and s.run.state.terminal and s)  # fmt: skip
    assert ended.run.state.value == "succeeded"
    assert [a.attempt for a in ended.attempts] == [1, 2]
    assert (tmp_path / "gpud-runs" / "twice-1" / "attempt-2" / "node-0" / "output.log").exists()
