"""Launching real runs on real daemons from tests, and watching them end."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import psutil

from gpud.model.run import HealthSummary, RunState
from gpud.runs.process import procs
from gpud.wire.client import Client, Unreachable
from gpud.wire.protocol import RUN_HEALTH, RUN_METRICS, RUN_STATUS, Method, ReplyT, RequestT
from gpud.wire.run_messages import MetricsRequest, RunRef, RunStatus
from tests.support.daemons import RunningDaemon, gpuctl

ROOT = Path(__file__).resolve().parents[2]
CPU_DDP = ROOT / "config" / "examples" / "cpu-ddp.yaml"
#: A small, quick model for tests, paced at 100 ms a step (`--step-ms`, as a GPU's step
#: might take): a run that trains until stopped leaves most of the CPU to the tests beside
#: it (a rank's step took ~13 ms of CPU with the suite running beside it), and no run races
#: past the step a test acts at because the machine happened to be idle.
FAST = "args=[--width, '128', --depth, '2', --log-every, '5', --step-ms, '100']"


#: Ranks that only hold what a run holds (its GPUs, its place in the queue) until stopped:
#: real torchrun, a real process per rank, but no torch in them (a training rank's start
#: costs ~2.4 s of CPU, mostly `import torch`; a holder's ~0.05 s). `{hold}`: until when.
HOLDER = """
import signal, sys, time
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
print("holding", flush=True)
{hold}
"""
HOLD_UNTIL_STOPPED = "while True:\n    time.sleep(0.5)"


def holder_spec(tmp_path: Path, nproc: int = 2, seconds: float | None = None) -> Path:
    """A torchrun run named `holder` whose ranks hold until stopped (`HOLDER`), or, given
    `seconds`, end well that long after they started (`holder-for-N`)."""
    if seconds is None:
        name, hold = "holder", HOLD_UNTIL_STOPPED
    else:
        name, hold = f"holder-for-{seconds:g}", f"time.sleep({seconds})"
    code = HOLDER.format(hold=hold)
    return script_spec(tmp_path, code, name=name, launcher="torchrun", nproc=nproc)


def script_spec(
    tmp_path: Path,
    code: str,
    *,
    name: str = "script",
    launcher: str = "python",
    nproc: int = 1,
    args: tuple[str, ...] = (),
) -> Path:
    """A run spec for a few lines of Python (no training): quick real runs for tests."""
    (tmp_path / f"{name}.py").write_text(code)
    spec = tmp_path / f"{name}.yaml"
    spec.write_text(
        f"name: {name}\nlauncher: {launcher}\nnproc_per_node: {nproc}\nbackend: gloo\n"
        f"workdir: {tmp_path}\nscript: {name}.py\nargs: {json.dumps(list(args))}\n"
        "stop_grace_s: 2\n"
    )
    return spec


def launch(
    daemon: RunningDaemon,
    *sets: str,
    config: Path = CPU_DDP,
    nodes: tuple[str, ...] = (),
    extra: tuple[str, ...] = (),
    preflight: bool = False,
) -> str:
    """`gpuctl launch` (not waiting); returns the run id.

    A run on several nodes skips the collective preflight (a torch process on each node
    before each attempt, ~4 s of CPU) unless `preflight`: the tests about it ask for it."""
    args = [a for node in (nodes or (daemon.address,)) for a in ("--node", node)]
    args += ["--json", "launch", str(config), *extra]
    if len(nodes) > 1 and not preflight:
        sets = (*sets, "preflight=false")
    for s in sets:
        args += ["--set", s]
    result = gpuctl(*args)
    assert result.returncode == 0, result.stderr
    return str(json.loads(result.stdout)["run"]["id"])


def polled(daemon: RunningDaemon, method: Method[RequestT, ReplyT], body: RequestT) -> ReplyT:
    """One call on the daemon's polling client (kept open: tests poll these many times;
    an error reply leaves it as it is, the daemon answered)."""
    try:
        return daemon.polling_client().call(method, body)
    except Unreachable:
        daemon.forget_polling_client()
        raise


def status(daemon: RunningDaemon, run_id: str) -> RunStatus:
    return polled(daemon, RUN_STATUS, RunRef(run=run_id))


def health(daemon: RunningDaemon, run_id: str) -> HealthSummary:
    """What `gpuctl health` reads: the daemon's latest summary."""
    return polled(daemon, RUN_HEALTH, RunRef(run=run_id))


def wait_for(
    daemon: RunningDaemon, run_id: str, states: set[str], timeout: float = 120
) -> RunStatus:
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = status(daemon, run_id)
        if last.run.state.value in states:
            return last
        time.sleep(0.1)
    raise AssertionError(f"run {run_id} did not reach {states}; last: {last}")


def wait_for_part(
    daemon: RunningDaemon, run_id: str, node_rank: int, state: RunState, timeout: float = 30
) -> RunStatus:
    """Wait until the daemon's record of `node_rank`'s part is in `state`."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = status(daemon, run_id)
        if last.parts[node_rank].state is state:
            return last
        time.sleep(0.1)
    raise AssertionError(f"part {node_rank} of {run_id} never became {state.value}; last: {last}")


def wait_for_step(daemon: RunningDaemon, run_id: str, step: int, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        s = status(daemon, run_id).run
        if s.last_step is not None and s.last_step >= step:
            return
        assert not s.state.terminal, f"run ended early: {s.state.value} {s.reason}"
        time.sleep(0.1)
    raise AssertionError(f"run {run_id} did not reach step {step}")


def ranks_of(run_id: str) -> dict[int, psutil.Process]:
    """The live worker processes of a run, by global rank."""
    found = {}
    for proc in procs.tagged(run_id):
        try:
            env = proc.environ()
        except psutil.Error:
            continue
        # torchrun's workers carry TORCHELASTIC_RUN_ID, DeepSpeed launcher's CROSS_RANK; a
        # launcher process itself has neither.
        launched = "TORCHELASTIC_RUN_ID" in env or "CROSS_RANK" in env
        if "RANK" in env and "LOCAL_RANK" in env and launched:
            found[int(env["RANK"])] = proc
    return found


def kill_rank(run_id: str, rank: int, timeout: float = 60) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        workers = ranks_of(run_id)
        if rank in workers:
            workers[rank].send_signal(signal.SIGKILL)
            return workers[rank].pid
        time.sleep(0.1)
    raise AssertionError(f"rank {rank} of {run_id} never showed up")


def force_stop(daemon: RunningDaemon, run_id: str) -> None:
    """`gpuctl stop --force`, then the run has ended and nothing of it is left."""
    result = gpuctl("--node", daemon.address, "stop", run_id, "--force")
    assert result.returncode == 0, (result.stdout, result.stderr)
    wait_for(daemon, run_id, {"stopped", "failed", "succeeded"}, timeout=60)
    nothing_left(run_id)


def nothing_left(run_id: str, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not procs.tagged(run_id):
            return
        time.sleep(0.1)
    left = [(p.pid, p.name()) for p in procs.tagged(run_id)]
    raise AssertionError(f"processes of {run_id} survived: {left}")


def steps_recorded(daemon: RunningDaemon, run_id: str) -> list[int]:
    with Client(daemon.target(), timeout_s=10) as client:
        reply = client.call(RUN_METRICS, MetricsRequest(run=run_id, name="loss", limit=100_000))
    return sorted({row.step for row in reply.rows})


def assert_no_gap(steps: list[int], total: int) -> None:
    missing = sorted(set(range(total)) - set(steps))
    assert not missing, f"metric steps lost: {missing[:20]} ({len(missing)} in all)"
