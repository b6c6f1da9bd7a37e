"""From cause to fix (issue 24 §2): a failure everyone hits gets its class and a hint that
says what to do, named with what the node knows; `environment` failures are not restarted.

Real daemons and real small scripts that fail the way they fail in the wild, on this CPU
box: no NCCL, CUDA on a CPU build of torch, a port in use, a missing module, file and
permission, a segfault in C. What needs a GPU to happen (CUDA out of memory, NCCL's watchdog,
a device-side assert) is a FIXTURE: a real script prints torch's own text for it
(tests/support/logs.py) and ends the way torch ends it (an exception, or an abort), and the
daemon, torchrun and gpuctl do the rest for real."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from gpud.model.run import CauseKind, RunState
from gpud.wire.run_messages import RunStatus
from tests.support.daemons import RunningDaemon, gpuctl
from tests.support.logs import (
    CUDA_OOM_MESSAGE,
    DEVICE_ASSERT_KERNEL_LINE,
    DEVICE_ASSERT_MESSAGE,
    NCCL_WATCHDOG_LINES,
)
from tests.support.runs import launch, nothing_left, script_spec, wait_for


def failed_run(
    daemon: RunningDaemon,
    tmp_path: Path,
    code: str,
    *sets: str,
    launcher: str = "python",
    nproc: int = 1,
) -> RunStatus:
    spec = script_spec(tmp_path, code, name="hinted", launcher=launcher, nproc=nproc)
    run_id = launch(daemon, *sets, config=spec)
    s = wait_for(daemon, run_id, {"failed", "succeeded", "stopped"}, timeout=120)
    assert s.run.state is RunState.FAILED, s.run.reason
    nothing_left(run_id)
    return s


def hint_of(s: RunStatus, kind: CauseKind) -> str:
    cause = s.run.cause
    assert cause is not None and cause.kind is kind, cause
    assert cause.hint is not None, cause
    return cause.hint


# --------------------------------------------------------------------------- real failures


def test_nccl_on_a_cpu_torch_is_an_environment_failure_and_not_restarted(
    daemon: RunningDaemon, tmp_path: Path
) -> None:
    """The issue's first example, unmodified: torchrun, two ranks, init_process_group("nccl")
    on torch's CPU build. Restarts are allowed and would fail the same way: none is made."""
    code = "import torch.distributed as dist\ndist.init_process_group('nccl')\n"
    s = failed_run(
        daemon, tmp_path, code, "restart.max_attempts=2", "restart.backoff_s=0.2",
        launcher="torchrun", nproc=2,
    )  # fmt: skip
    assert s.run.cause is not None
    assert s.run.cause.summary == "RuntimeError: Distributed package doesn't have NCCL built in"
    hint = hint_of(s, CauseKind.ENVIRONMENT)
    assert hint.startswith(f"the torch in {sys.executable} is built without NCCL (a CPU build)")
    assert "`backend: gloo`" in hint
    assert (s.run.reason or "").endswith("; not restarted: environment is not in restart.on")
    assert (s.run.attempt, s.run.restarts) == (1, 0)


def test_a_cuda_script_on_a_cpu_torch_says_so_in_every_view(
    daemon: RunningDaemon, tmp_path: Path
) -> None:
    """The issue's second example: torch.cuda.set_device on a CPU build. The hint is the
    last line of `launch --wait`, a `hint` line in `status`, and `cause.hint` in --json;
    the cause line is as it was."""
    spec = script_spec(tmp_path, "import torch\ntorch.cuda.set_device(0)\n", name="on-gpu")
    result = gpuctl("--node", daemon.address, "launch", str(spec), "--wait", timeout=120)
    assert result.returncode == 1, result.stdout + result.stderr
    run_id = result.stdout.split()[1]
    out = result.stdout.strip().splitlines()
    summary = "AttributeError: module 'torch._C' has no attribute '_cuda_setDevice'"
    assert out[-2] == f"{run_id} failed: rank 0 on node node0: {summary} (environment, attempt 1)"
    hint = (
        f"the torch in {sys.executable} is a CPU build and the script uses CUDA: install a CUDA"
        ' build of torch there, or run the script on CPU (device "cpu", backend gloo)'
    )
    assert out[-1] == f"hint: {hint}"
    text = gpuctl("--node", daemon.address, "status", run_id).stdout.splitlines()
    cause = text.index(f"cause     environment, from the traceback: {summary}")
    assert text[cause + 1].startswith("          | ")  # the log lines around it, as before
    assert f"hint      {hint}" in text[cause + 1 :], text
    body = json.loads(gpuctl("--node", daemon.address, "--json", "status", run_id).stdout)
    assert (body["run"]["cause"]["kind"], body["run"]["cause"]["hint"]) == ("environment", hint)


@contextlib.contextmanager
def held_port() -> Iterator[int]:
    """A port another process listens on, as another job's rendezvous would."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


def test_a_port_in_use_names_the_port_and_the_master_port(
    daemon: RunningDaemon, tmp_path: Path
) -> None:
    """The PyTorch DDP tutorial's setup(): it sets MASTER_PORT itself, over gpud's."""
    with held_port() as port:
        code = (
            "import os\nimport torch.distributed as dist\n"
            "os.environ['MASTER_ADDR'] = '127.0.0.1'\n"
            f"os.environ['MASTER_PORT'] = '{port}'\n"
            "dist.init_process_group('gloo', rank=0, world_size=1)\n"
        )
        s = failed_run(daemon, tmp_path, code, "distributed_env=true")
    ours = s.attempts[0].master_port
    assert ours != port
    hint = hint_of(s, CauseKind.NETWORK)
    assert hint.startswith(
        f"port {port} is held by another process, and the script binds it instead of the"
        f" MASTER_PORT gpud leased for this attempt ({ours})"
    ), hint


@pytest.mark.parametrize("own", [True, False], ids=["daemons-python", "spec-python"])
def test_a_missing_module_names_the_interpreter_that_ran(
    daemon: RunningDaemon, tmp_path: Path, own: bool
) -> None:
    sets = () if own else (f"python={sys.executable}",)
    s = failed_run(daemon, tmp_path, "import gpud_hint_no_such_module\n", *sets)
    hint = hint_of(s, CauseKind.IMPORT)
    assert hint.startswith(f"{sys.executable} has no module 'gpud_hint_no_such_module'")
    said = "the spec sets no `python:`, so gpud ran the script with its own interpreter"
    assert (said in hint) is own, hint
    assert "set the spec's `python:` to the interpreter of the venv that has it" in hint


def test_a_checkpoint_that_is_not_there_names_the_path_from_the_workdir(
    daemon: RunningDaemon, tmp_path: Path
) -> None:
    code = "import torch\ntorch.load('out/ckpt.pt')\n"
    s = failed_run(daemon, tmp_path, code, "restart.max_attempts=2", "restart.backoff_s=0.2")
    hint = hint_of(s, CauseKind.USER)
    assert hint.startswith(f"out/ckpt.pt (in the workdir {tmp_path}) does not exist"), hint
    assert hint.endswith("a restart will not make it")
    assert (s.run.attempt, s.run.restarts) == (1, 0)  # user: not in restart.on


@contextlib.contextmanager
def unwritable(path: Path) -> Iterator[str]:
    """A dir its user may not write into: read-only for a user; for root (who may write
    anywhere) immutable (chattr +i), which the kernel refuses root too. Yields how."""
    path.mkdir()
    if os.geteuid() != 0:
        path.chmod(0o555)
        try:
            yield "chmod 555"
        finally:
            path.chmod(0o755)
        return
    chattr = shutil.which("chattr")
    if chattr is None or subprocess.run([chattr, "+i", str(path)], check=False).returncode:
        pytest.skip("root here, and chattr +i cannot make a dir it may not write")
    try:
        yield "chattr +i"
    finally:
        subprocess.run([chattr, "-i", str(path)], check=True)


def test_a_checkpoint_dir_it_may_not_write_is_named(daemon: RunningDaemon, tmp_path: Path) -> None:
    """nanoGPT's save: os.makedirs(out_dir, exist_ok=True), then torch.save into it, whose
    error names no path: the hint names the checkpoint dir."""
    out = tmp_path / "out"
    code = (
        "import os\nimport torch\n"
        f"os.makedirs({str(out)!r}, exist_ok=True)\n"
        f"torch.save({{'iter': 1}}, os.path.join({str(out)!r}, 'ckpt.pt'))\n"
    )
    with unwritable(out) as how:
        s = failed_run(daemon, tmp_path, code, f"checkpoint.dir={out}")
    assert s.run.cause is not None and "open file failed" in s.run.cause.summary, how
    hint = hint_of(s, CauseKind.USER)
    assert f"the checkpoint dir is {out})" in hint and "make the dir writable" in hint, hint


def test_a_segfault_in_c_is_a_signal_with_its_hint(daemon: RunningDaemon, tmp_path: Path) -> None:
    code = "import ctypes\nimport os\nif os.environ['RANK'] == '1':\n    ctypes.string_at(0)\n"
    code += "import time\ntime.sleep(60)\n"
    s = failed_run(daemon, tmp_path, code, launcher="torchrun", nproc=2)
    assert s.run.cause is not None
    assert (s.run.cause.summary, s.run.cause.rank) == ("killed by SIGSEGV", 1)
    hint = hint_of(s, CauseKind.SIGNAL)
    assert hint.startswith("a rank crashed in native code (SIGSEGV)"), hint
    assert sys.executable in hint and "PYTHONFAULTHANDLER" in hint


# --------------------------------------------------------------------------- fixtures


def printing(lines: tuple[str, ...] | list[str]) -> str:
    """Code that writes the lines to stderr, as the failing library does."""
    text = "".join(line + "\n" for line in lines)
    return f"import sys\nsys.stderr.write({text!r})\nsys.stderr.flush()\n"


def test_fixture_cuda_out_of_memory_names_gpuctl_hws_batch(
    daemon: RunningDaemon, tmp_path: Path
) -> None:
    """FIXTURE: torch's OOM text, raised as torch.OutOfMemoryError by a real script."""
    code = f"import torch\nraise torch.OutOfMemoryError({CUDA_OOM_MESSAGE!r})\n"
    s = failed_run(daemon, tmp_path, code, "training.batch_size_per_gpu=96")
    hw = json.loads(gpuctl("--node", daemon.address, "--json", "hw").stdout)
    rec = hw["nodes"][0]["recommendation"]
    hint = hint_of(s, CauseKind.OOM)
    assert (
        f"lower the batch per GPU (this run asks for 96; `gpuctl hw` recommends"
        f" {rec['batch_size_per_gpu']} for this node's {rec['memory_class']} GPUs)"
    ) in hint, hint
    assert "gradient checkpointing" in hint


def test_fixture_an_nccl_watchdog_abort_is_an_nccl_timeout(
    daemon: RunningDaemon, tmp_path: Path
) -> None:
    """FIXTURE: rank 1 prints what NCCL's watchdog prints and aborts (SIGABRT), as the
    watchdog does; torchrun, its summary and the abort are real."""
    code = (
        "import os\nimport time\n"
        "if os.environ['RANK'] == '1':\n"
        + "".join(f"    {line}\n" for line in printing(NCCL_WATCHDOG_LINES).splitlines())
        + "    os.abort()\n"
        "time.sleep(60)\n"
    )
    s = failed_run(daemon, tmp_path, code, launcher="torchrun", nproc=2)
    cause = s.run.cause
    assert cause is not None and (cause.rank, cause.source) == (1, "log")
    assert "Watchdog caught collective operation timeout" in cause.summary
    hint = hint_of(s, CauseKind.NCCL)
    assert hint.startswith("a collective waited past its timeout, so a rank was stuck or gone")
    assert "`nccl.debug: INFO` (NCCL_DEBUG=INFO)" in hint


def test_fixture_a_device_side_assert_asks_for_cuda_launch_blocking(
    daemon: RunningDaemon, tmp_path: Path
) -> None:
    """FIXTURE: the kernel's assert line and torch's RuntimeError, from a real script."""
    code = (
        printing([DEVICE_ASSERT_KERNEL_LINE]) + f"raise RuntimeError({DEVICE_ASSERT_MESSAGE!r})\n"
    )
    s = failed_run(daemon, tmp_path, code, "restart.max_attempts=1", "restart.backoff_s=0.2")
    assert s.run.cause is not None
    assert s.run.cause.summary == "RuntimeError: CUDA error: device-side assert triggered"
    hint = hint_of(s, CauseKind.USER)
    assert "`env: {CUDA_LAUNCH_BLOCKING: '1'}`" in hint and "index out of range" in hint
    assert s.run.restarts == 0


def test_a_failure_with_no_known_signature_has_no_hint(
    daemons: Callable[..., RunningDaemon], tmp_path: Path
) -> None:
    s = failed_run(daemons(), tmp_path, "raise ValueError('bad shard 17')\n")
    assert s.run.cause is not None and s.run.cause.kind is CauseKind.USER
    assert s.run.cause.hint is None
