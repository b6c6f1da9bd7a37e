"""The hints table: each known signature gets its class and one line of what to do, written
from what the node knows. Each failure is found the way a node finds it (find_cause over the
log a real run leaves); the texts are torch's own, captured on this CPU box where torch can
fail that way here, else torch's wording for a GPU failure (tests/support/logs.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpud.model.run import CauseKind, ExitInfo, FailureCause
from gpud.runs.diagnosis.causes import find_cause, full_disk
from gpud.runs.diagnosis.hints import HINTS, HintFacts, for_run, hint_for, matching
from launch.autotune import recommend
from tests.support.logs import (
    CUDA_OOM_MESSAGE,
    DEVICE_ASSERT_KERNEL_LINE,
    DEVICE_ASSERT_MESSAGE,
    NCCL_WATCHDOG_LINES,
)

GIB = 1 << 30
PYTHON = "/srv/venv/bin/python"
FACTS = HintFacts(
    python=PYTHON,
    python_is_gpuds=True,
    master_port=29512,
    workdir="/srv/job",
    checkpoint_dir="/srv/job/out",
    batch_per_gpu=48,
    recommendation=recommend(8, 24 * GIB, (8, 9), cpu_cores=64),
    cuda_version="12.4",
)


def traceback_log(exception: str, rank: int | None = None) -> str:
    """The log a script that raised leaves (torchrun's prefix when `rank` is given)."""
    lines = [
        "Traceback (most recent call last):",
        '  File "/srv/job/train.py", line 41, in <module>',
        "    main()",
        *exception.splitlines(),
    ]
    prefix = f"[default{rank}]:" if rank is not None else ""
    return "".join(f"{prefix}{line}\n" for line in lines)


def cause_of(log: str, tmp_path: Path, exit: ExitInfo | None = None) -> FailureCause:
    return find_cause(tmp_path, log, exit or ExitInfo(exit_code=1), node_rank=0, nproc=1)


#: (signature, the exception line torch printed, its class, words the hint must say)
EXCEPTIONS = [
    # captured here: init_process_group("nccl") under torchrun on CPU torch 2.13
    ("no-nccl", "RuntimeError: Distributed package doesn't have NCCL built in",
     CauseKind.ENVIRONMENT, [f"the torch in {PYTHON} is built without NCCL", "backend: gloo"]),
    # captured here: torch.cuda.set_device(0), and .cuda(), on CPU torch 2.13
    ("cpu-torch", "AttributeError: module 'torch._C' has no attribute '_cuda_setDevice'",
     CauseKind.ENVIRONMENT, [f"the torch in {PYTHON} is a CPU build", "CUDA 12.4 or older"]),
    ("cpu-torch", "AssertionError: Torch not compiled with CUDA enabled",
     CauseKind.ENVIRONMENT, ["is a CPU build and the script uses CUDA"]),
    # torch's wording (torch/cuda/__init__.py) on a node whose driver is too old
    ("cuda-driver", "RuntimeError: The NVIDIA driver on your system is too old (found version"
     " 11040). Please update your GPU driver by downloading and installing a new version",
     CauseKind.ENVIRONMENT, ["supports CUDA 12.4 at most"]),
    # fixture: torch's OOM message (a GPU is needed to make it)
    ("cuda-oom", f"torch.OutOfMemoryError: {CUDA_OOM_MESSAGE}", CauseKind.OOM,
     ["(this run asks for 48; `gpuctl hw` recommends 16 for this node's 20–40 GB GPUs)",
      "gradient checkpointing"]),
    # captured here: a script that sets MASTER_PORT to a port another process holds
    ("address-in-use", "torch.distributed.DistNetworkError: The server socket has failed to"
     " listen on any local network address. port: 36121, useIpv6: false, code: -98, name:"
     " EADDRINUSE, message: address already in use", CauseKind.NETWORK,
     ["port 36121 is held by another process", "MASTER_PORT gpud leased for this attempt (29512)"]),
    ("module-missing", "ModuleNotFoundError: No module named 'flash_attn.ops'", CauseKind.IMPORT,
     [f"{PYTHON} has no module 'flash_attn' (the spec sets no `python:`, so gpud ran",
      "or set the spec's `python:` to the interpreter of the venv that has it"]),
    ("module-missing", "ImportError: cannot import name 'LlamaConfig' from 'transformers'"
     " (/srv/venv/lib/python3.11/site-packages/transformers/__init__.py)", CauseKind.IMPORT,
     [f"{PYTHON} has a version of transformers without 'LlamaConfig'"]),
    # fixture: torch's device-side assert (a GPU is needed to make it)
    ("device-assert", "RuntimeError: " + DEVICE_ASSERT_MESSAGE, CauseKind.USER,
     ["CUDA_LAUNCH_BLOCKING: '1'", "index out of range"]),
    # captured here: torch.load of a checkpoint that is not there
    ("file-missing", "FileNotFoundError: [Errno 2] No such file or directory: 'out/ckpt.pt'",
     CauseKind.USER, ["out/ckpt.pt (in the workdir /srv/job) does not exist"]),
    ("file-missing", "RuntimeError: Parent directory /srv/job/gone does not exist.",
     CauseKind.USER, ["torch.save's directory /srv/job/gone does not exist"]),
    # captured here: os.makedirs, and torch.save, into a dir the user may not write
    ("no-permission", "PermissionError: [Errno 13] Permission denied: '/srv/job/out/ckpt.pt'",
     CauseKind.USER, ["may not write /srv/job/out/ckpt.pt"]),
    ("no-permission", "RuntimeError: [enforce fail at inline_container.cc:747] . open file"
     " failed with strerror: Operation not permitted", CauseKind.USER,
     ["the checkpoint dir is /srv/job/out"]),
]  # fmt: skip


@pytest.mark.parametrize(("name", "exception", "kind", "says"), EXCEPTIONS)
def test_each_signature_has_its_class_and_hint(
    name: str, exception: str, kind: CauseKind, says: list[str], tmp_path: Path
) -> None:
    cause = cause_of(traceback_log(exception), tmp_path)
    assert cause.kind is kind, cause
    found = matching(cause)
    assert found is not None and found[0].name == name
    hint = hint_for(cause, FACTS)
    assert hint is not None and "\n" not in hint
    for words in says:
        assert words in hint, hint


def test_a_segfault_and_the_oom_killer_are_found_by_their_signal(tmp_path: Path) -> None:
    # A lone process killed by SIGSEGV prints nothing: the shim saw the signal.
    segv = cause_of("", tmp_path, ExitInfo(signal=11))
    assert (segv.kind, segv.summary) == (CauseKind.SIGNAL, "killed by SIGSEGV")
    assert "crashed in native code (SIGSEGV)" in (hint_for(segv, FACTS) or "")
    assert "PYTHONFAULTHANDLER" in (hint_for(segv, FACTS) or "")
    killed = find_cause(tmp_path, "", ExitInfo(signal=9), node_rank=0, nproc=1, oom_killed=True)
    assert killed.kind is CauseKind.OOM
    assert "host memory ran out, not GPU memory" in (hint_for(killed, FACTS) or "")
    assert "recommends 3 per GPU" in (hint_for(killed, FACTS) or "")
    # Another signal has no hint: nothing is known of it.
    assert hint_for(cause_of("", tmp_path, ExitInfo(signal=9)), FACTS) is None


def torchrun_abort(lines: tuple[str, ...], local_rank: int) -> str:
    """A rank that printed `lines` and aborted, and torchrun's summary naming it."""
    prefix = f"[default{local_rank}]:"
    return (
        "[default0]:step 40 loss 2.31\n"
        + "".join(f"{prefix}{line}\n" for line in lines)
        + "Root Cause (first observed failure):\n[0]:\n"
        "  time      : 2026-11-25_10:21:09\n  host      : gpu7\n"
        f"  rank      : {local_rank} (local_rank: {local_rank})\n"
        "  exitcode  : -6 (pid: 31337)\n  error_file: <N/A>\n"
        "  traceback : Signal 6 (SIGABRT) received by PID 31337\n"
    )


def test_an_nccl_watchdog_abort_is_an_nccl_timeout_not_just_a_signal(tmp_path: Path) -> None:
    """Fixture: the watchdog's lines (a GPU is needed to make them). Its abort (SIGABRT) is
    how C++ ends the rank: the line before it says why."""
    cause = cause_of(torchrun_abort(NCCL_WATCHDOG_LINES, 1), tmp_path)
    assert (cause.kind, cause.rank, cause.source) == (CauseKind.NCCL, 1, "log")
    assert "Watchdog caught collective operation timeout" in cause.summary
    hint = hint_for(cause, FACTS) or ""
    assert "the flight recorder found nothing" in hint and "`nccl.debug: INFO`" in hint
    # Node 0 writes it again with the findings of every part.
    finding = "collective #812 (all_reduce) never entered by rank 3 at /srv/job/train.py:77"
    run = for_run(cause.model_copy(update={"hint": hint, "flight_recorder": [finding]}))
    assert f"the flight recorder found: {finding}" in (run.hint or "")
    # An abort with nothing known before it stays a signal.
    plain = cause_of(torchrun_abort(("step 41 loss 2.30",), 1), tmp_path)
    assert (plain.kind, plain.summary) == (CauseKind.SIGNAL, "killed by SIGABRT")


def test_a_device_side_assert_that_aborts_is_the_users(tmp_path: Path) -> None:
    """Fixture: torch's wording. The kernel's line, then `terminate called` (SIGABRT)."""
    lines = (
        DEVICE_ASSERT_KERNEL_LINE,
        "terminate called after throwing an instance of 'c10::Error'",
        "  what():  " + DEVICE_ASSERT_MESSAGE.splitlines()[0],
    )
    cause = cause_of(torchrun_abort(lines, 0), tmp_path)
    assert cause.kind is CauseKind.USER and "device-side assert triggered" in cause.summary
    assert "CUDA_LAUNCH_BLOCKING" in (hint_for(cause, FACTS) or "")


def test_a_hint_needs_its_class_too() -> None:
    """A signature in another class's words gets no hint: a NCCL error that mentions a
    missing file is still NCCL's."""
    nccl = FailureCause(kind=CauseKind.NCCL, summary="NCCL error: No such file or directory")
    assert "NCCL failed" in (hint_for(nccl) or "")
    user = FailureCause(kind=CauseKind.USER, summary="ValueError: bad shard 17")
    assert hint_for(user, FACTS) is None and for_run(user).hint is None


def test_without_facts_the_hints_still_read() -> None:
    """A cause from an older peer, or the Slurm runner: no node facts, still one line."""
    oom = FailureCause(kind=CauseKind.OOM, summary=f"torch.OutOfMemoryError: {CUDA_OOM_MESSAGE}")
    assert for_run(oom).hint == hint_for(oom)
    assert "`gpuctl hw` recommends one for the node's GPUs" in (hint_for(oom) or "")
    missing = FailureCause(
        kind=CauseKind.IMPORT, summary="ModuleNotFoundError: No module named 'x'"
    )
    assert (hint_for(missing) or "").startswith("the interpreter that ran it has no module 'x'")


def test_address_in_use_names_the_ports_it_knows() -> None:
    line = (
        "torch.distributed.DistNetworkError: The server socket has failed to listen on any"
        " local network address. port: {}, useIpv6: false, code: -98, name: EADDRINUSE"
    )
    ours = FailureCause(kind=CauseKind.NETWORK, summary=line.format(29512))
    assert "took MASTER_PORT 29512" in (hint_for(ours, FACTS) or "")
    lone = FailureCause(kind=CauseKind.NETWORK, summary=line.format(12355))
    assert "`ss -ltnp | grep :12355`" in (hint_for(lone) or "")


def test_every_row_has_a_distinct_name_and_a_class() -> None:
    names = [hint.name for hint in HINTS]
    assert len(names) == len(set(names))
    assert CauseKind.ENVIRONMENT in {hint.signature.kind for hint in HINTS}


def test_a_class_this_code_does_not_know_reads_as_unknown() -> None:
    newer = FailureCause.model_validate({"kind": "quantum", "summary": "?", "hint": "wait"})
    assert newer.kind is CauseKind.UNKNOWN and newer.hint == "wait"
    older = FailureCause.model_validate({"kind": "user", "summary": "ValueError: x"})
    assert older.hint is None


def test_a_full_disk_hint_names_the_dir_and_the_cure_for_each(tmp_path: Path) -> None:
    """The two messages gpud's full-disk paths write: a shim that died on a full state dir
    (the part runner's cause), and a checkpoint that did not fit (the trainers library's
    CheckpointSpaceError, in the rank's traceback). Each hint names its dir, and only the
    checkpoint dir's suggests moving checkpoint.dir: the state dir is gpud's own."""
    from trainers.checkpoint import CheckpointSpaceError  # imports torch: only here

    full = full_disk(Path("/var/lib/gpud/runs/r-1/attempt-1"), "the state dir /var/lib/gpud",
                     free_of=lambda _: 40_000)  # fmt: skip
    assert full == "the state dir /var/lib/gpud is full (ENOSPC: 0.0 MB free)"
    died = FailureCause(  # as gpud.runs.state.part writes it
        kind=CauseKind.ENVIRONMENT, summary=f"the shim process died: {full}; its part was killed"
    )
    found = matching(died)
    assert found is not None and found[0].name == "disk-full"
    state = hint_for(died, FACTS) or ""
    assert state.startswith("the disk of the state dir /var/lib/gpud is full:"), state
    assert "`df -h /var/lib/gpud`" in state and "/var/lib/gpud/runs" in state, state
    assert "point checkpoint.dir" not in state and "keep_last" not in state, state

    error = CheckpointSpaceError(Path("/mnt/ckpt"), 49, 3_000_000, 100_000)
    saved = cause_of(traceback_log(f"trainers.checkpoint.CheckpointSpaceError: {error}"), tmp_path)
    assert saved.kind is CauseKind.ENVIRONMENT, saved
    found = matching(saved)
    assert found is not None and found[0].name == "disk-full"
    ckpt = hint_for(saved, FACTS) or ""  # FACTS' checkpoint.dir is another: the message wins
    assert ckpt.startswith("the disk of the checkpoint dir /mnt/ckpt is full:"), ckpt
    assert "`df -h /mnt/ckpt`" in ckpt and "checkpoint.keep_last" in ckpt, ckpt
    assert "point checkpoint.dir at a disk with room" in ckpt and "state dir" not in ckpt
