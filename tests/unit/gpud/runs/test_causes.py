"""Why an attempt failed, from the evidence a node keeps: error files, torchrun's summary,
tracebacks and known lines in the log. Real file layouts and real log lines."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from gpud.model.run import EARLY_EXIT, EARLY_EXIT_SOURCE, CauseKind, ExitInfo
from gpud.model.snapshot import GpuSample, XidRecord, XidSummary
from gpud.runs.diagnosis.causes import (
    find_cause,
    hardware_cause,
    kind_of,
    last_traceback,
    oom_kills,
)
from tests.support.logs import TORCHRUN_EARLY_EXIT, TORCHRUN_FAILURE, TORCHRUN_RAISED

SIGKILLED = TORCHRUN_FAILURE

TRACEBACK = """\
[default1]:step 3 loss 0.5
[default1]:Traceback (most recent call last):
[default1]:  File "/srv/train.py", line 40, in <module>
[default1]:    main()
[default1]:  File "/srv/train.py", line 31, in main
[default1]:    batch = shards[17]
[default1]:KeyError: 17
[default0]:Traceback (most recent call last):
[default0]:  File "/srv/train.py", line 33, in main
[default0]:    dist.all_reduce(t)
[default0]:RuntimeError: [gloo/transport/tcp/pair.cc:534] Connection closed by peer [::1]:5012
"""


def error_file(
    path: Path, message: str, stack: str = "", when: float | None = None, step: int | None = None
) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    extra: dict[str, object] = {"py_callstack": stack, "timestamp": "1763767049"}
    if step is not None:
        extra["gpud_step"] = step  # the trainers library's addition
    body = {"message": {"message": message, "extraInfo": extra}}
    path.write_text(json.dumps(body))
    if when is not None:
        os.utime(path, (when, when))


def torchrun_error(attempt: Path, local_rank: int) -> Path:
    return attempt / "ranks" / "r-1_abc" / "attempt_0" / str(local_rank) / "error.json"


@pytest.mark.parametrize(
    ("line", "kind"),
    [
        ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", CauseKind.OOM),
        ("[Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=812)",
         CauseKind.NCCL),
        ("torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970, "
         "unhandled system error, NCCL version 2.21.5 ncclSystemError", CauseKind.NCCL),
        ("RuntimeError: The server socket has failed to listen on any local network address. "
         "port: 29500, useIpv6: 0, code: -98, name: EADDRINUSE, message: address already in use",
         CauseKind.NETWORK),
        ("RuntimeError: [gloo/transport/tcp/pair.cc:534] Connection closed by peer",
         CauseKind.NETWORK),
        ("ModuleNotFoundError: No module named 'flash_attn'", CauseKind.IMPORT),
        ("RuntimeError: Distributed package doesn't have NCCL built in", CauseKind.ENVIRONMENT),
        ("AttributeError: module 'torch._C' has no attribute '_cuda_setDevice'",
         CauseKind.ENVIRONMENT),
        ("AssertionError: Torch not compiled with CUDA enabled", CauseKind.ENVIRONMENT),
        ("RuntimeError: CUDA error: device-side assert triggered", CauseKind.USER),
        ("python: can't open file '/srv/train.py': [Errno 2] No such file or directory",
         CauseKind.USER),
        ("PermissionError: [Errno 13] Permission denied: '/data/out'", CauseKind.USER),
        ("ValueError: bad shard 17", None),
    ],
)  # fmt: skip
def test_the_pattern_table(line: str, kind: CauseKind | None) -> None:
    assert kind_of(line) is kind


def test_the_earliest_error_file_names_the_rank_that_started_it(tmp_path: Path) -> None:
    # rank 3 (node 1, local 1) raised first; rank 2 saw its peer go and raised after.
    error_file(torchrun_error(tmp_path, 1), "ValueError: bad shard 17",
               'Traceback (most recent call last):\n  File "t.py"\nValueError: bad shard 17\n',
               when=1000.0)  # fmt: skip
    error_file(torchrun_error(tmp_path, 0), "RuntimeError: Connection closed by peer", when=1000.4)
    cause = find_cause(tmp_path, "", ExitInfo(exit_code=1), node_rank=1, nproc=2)
    assert (cause.kind, cause.rank, cause.summary) == (
        CauseKind.USER,
        3,
        "ValueError: bad shard 17",
    )
    assert cause.source == "error file" and cause.lines[-1] == "ValueError: bad shard 17"


def test_gpuds_own_error_dir_names_global_ranks(tmp_path: Path) -> None:
    error_file(tmp_path / "errors" / "rank-6.json", "torch.OutOfMemoryError: CUDA out of memory.")
    cause = find_cause(tmp_path, "", ExitInfo(exit_code=1), node_rank=1, nproc=4)
    assert (cause.kind, cause.rank) == (CauseKind.OOM, 6)


def test_a_rank_killed_by_a_signal_beats_the_connection_error_it_caused(tmp_path: Path) -> None:
    error_file(torchrun_error(tmp_path, 0), "RuntimeError: Connection closed by peer")
    cause = find_cause(tmp_path, SIGKILLED, ExitInfo(exit_code=1), node_rank=1, nproc=2)
    assert (cause.kind, cause.rank, cause.summary) == (CauseKind.SIGNAL, 3, "killed by SIGKILL")
    oom = find_cause(tmp_path, SIGKILLED, ExitInfo(exit_code=1), node_rank=1, nproc=2,
                     oom_killed=True)  # fmt: skip
    assert oom.kind is CauseKind.OOM and "OOM killer" in oom.summary


TORCHRUN_ROOT_IS_WRONG = """\
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
trainers/examples/ddp.py FAILED
------------------------------------------------------------
Failures:
[0]:
  time      : 2026-11-23_22:16:47
  host      : localhost
  rank      : 1 (local_rank: 1)
  exitcode  : -9 (pid: 23158)  (SIGKILL)
  error_file: <N/A>
  traceback : Signal 9 (SIGKILL) received by PID 23158
------------------------------------------------------------
Root Cause (first observed failure):
[1]:
  time      : 2026-11-23_22:16:46
  host      : localhost
  rank      : 0 (local_rank: 0)
  exitcode  : -15 (pid: 23156)  (SIGTERM)
  error_file: /srv/runs/r/attempt-1/ranks/none_dl/attempt_0/0/error.json
  traceback : Traceback (most recent call last):
"""


def test_a_killed_rank_in_torchruns_failures_beats_its_root_cause_guess(tmp_path: Path) -> None:
    # As seen in a real run: rank 1 was SIGKILLed, rank 0 then failed on the connection
    # and was SIGTERMed by torchrun, and torchrun named rank 0 the root cause.
    error_file(torchrun_error(tmp_path, 0), "RuntimeError: Connection closed by peer")
    cause = find_cause(tmp_path, TORCHRUN_ROOT_IS_WRONG, ExitInfo(exit_code=1), node_rank=0,
                       nproc=2)  # fmt: skip
    assert (cause.kind, cause.rank, cause.summary) == (CauseKind.SIGNAL, 1, "killed by SIGKILL")


#: What torchrun's agent logs once it has ended the others, before its summary (copied
#: from a real run's output).
AGENT_SAW_THE_KILL = (
    "E1129 04:09:54.789000 6828 .venv/lib/python3.11/site-packages/torch/distributed/elastic/"
    "multiprocessing/api.py:1002] failed (exitcode: -9) local_rank: 1 (pid: 6842) of binary:"
    " /work/main/.venv/bin/python3\n"
)


def test_the_agents_own_line_names_a_killed_rank_where_the_summary_is_missing(
    tmp_path: Path,
) -> None:
    # The summary never reached the log (the agent killed while it printed it, the log
    # cut): rank 0's connection error is still the echo of rank 1's SIGKILL.
    error_file(torchrun_error(tmp_path, 0), "RuntimeError: Connection closed by peer")
    cause = find_cause(tmp_path, TRACEBACK.replace("[default1]", "[x]") + AGENT_SAW_THE_KILL,
                       ExitInfo(exit_code=1), node_rank=0, nproc=2)  # fmt: skip
    assert (cause.kind, cause.rank, cause.summary) == (CauseKind.SIGNAL, 1, "killed by SIGKILL")
    # Without the line, the error file is all there is.
    alone = find_cause(tmp_path, "", ExitInfo(exit_code=1), node_rank=0, nproc=2)
    assert (alone.kind, alone.rank) == (CauseKind.NETWORK, 0)


def test_an_unmodified_script_gets_the_last_traceback_of_the_failed_rank(tmp_path: Path) -> None:
    summary = SIGKILLED.replace("-9 (pid: 10402)  (SIGKILL)", "1 (pid: 10402)")
    cause = find_cause(tmp_path, TRACEBACK + summary, ExitInfo(exit_code=1), node_rank=1, nproc=2)
    assert (cause.kind, cause.rank, cause.summary) == (CauseKind.USER, 3, "KeyError: 17")
    assert cause.lines[0] == "Traceback (most recent call last):"
    # Without torchrun's summary: the rank that raised, not its peer's connection error
    # (which comes last in the log), whoever printed them (issue 32 §1).
    plain = find_cause(tmp_path, TRACEBACK, ExitInfo(exit_code=1), node_rank=0, nproc=2)
    assert (plain.kind, plain.rank, plain.summary) == (CauseKind.USER, 1, "KeyError: 17")


def test_a_single_process_traceback_and_a_known_line_and_nothing_at_all(tmp_path: Path) -> None:
    log = (
        'loading\nTraceback (most recent call last):\n  File "x.py", line 1, in <module>\n'
        "    import flash_attn\nModuleNotFoundError: No module named 'flash_attn'\n"
    )
    cause = find_cause(tmp_path, log, ExitInfo(exit_code=1), node_rank=0, nproc=1)
    assert (cause.kind, cause.rank) == (CauseKind.IMPORT, 0)
    assert cause.summary == "ModuleNotFoundError: No module named 'flash_attn'"
    busy = "starting\n[W socket.cpp:464] [c10d] address already in use\n"
    known = find_cause(tmp_path, busy, ExitInfo(exit_code=1), node_rank=0, nproc=1)
    assert (known.kind, known.source) == (CauseKind.NETWORK, "log")
    silent = find_cause(tmp_path, "step 1\n", ExitInfo(exit_code=3), node_rank=0, nproc=1)
    assert (silent.kind, silent.summary, silent.lines) == (
        CauseKind.UNKNOWN,
        "exit code 3",
        ["step 1"],
    )
    killed = find_cause(tmp_path, "", ExitInfo(signal=11), node_rank=0, nproc=1)
    assert (killed.kind, killed.summary) == (CauseKind.SIGNAL, "killed by SIGSEGV")


def test_a_chained_traceback_ends_at_the_last_exception() -> None:
    log = (
        "Traceback (most recent call last):\n  File \"a.py\"\nKeyError: 'lr'\n\n"
        "During handling of the above exception, another exception occurred:\n\n"
        'Traceback (most recent call last):\n  File "a.py"\nRuntimeError: config broken\n'
    )
    trace = last_traceback(log)
    assert trace is not None and trace.summary == "RuntimeError: config broken"


def test_the_oom_kill_count_of_the_daemons_cgroup_v1_and_v2(tmp_path: Path) -> None:
    membership = tmp_path / "cgroup"
    membership.write_text("4:memory:/ci/job\n0::/\n")  # cgroup v1, memory controller
    v1 = tmp_path / "fs" / "memory" / "ci" / "job"
    v1.mkdir(parents=True)
    (v1 / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 2\n")
    assert oom_kills(tmp_path / "fs", membership) == 2
    membership.write_text("0::/system.slice/gpud.service\n")  # cgroup v2
    v2 = tmp_path / "fs" / "system.slice" / "gpud.service"
    v2.mkdir(parents=True)
    (v2 / "memory.events").write_text("low 0\nhigh 0\nmax 2\noom 1\noom_kill 4\n")
    assert oom_kills(tmp_path / "fs", membership) == 4
    assert oom_kills(tmp_path / "nowhere", membership) is None


def gpu(index: int, *xids: tuple[int, float], lost: bool = False) -> GpuSample:
    return GpuSample(
        index=index,
        name="NVIDIA H100 80GB HBM3",
        uuid=f"GPU-{index}",
        lost=lost,
        xid=XidSummary(
            total=len(xids), recent=[XidRecord(code=code, time=when) for code, when in xids]
        ),
    )


def test_an_xid_on_the_parts_gpus_just_before_the_failure_is_the_cause() -> None:
    gpus = [gpu(0), gpu(1, (79, 995.0)), gpu(2, (48, 999.0))]
    cause = hardware_cause(gpus, ["GPU-0", "GPU-1"], started=900.0, ended=1000.0)
    assert cause is not None and cause.kind is CauseKind.HARDWARE
    assert cause.summary == (
        "XID 79 on GPU 1 (GPU has fallen off the bus), 5s before the failure"
    ), cause.summary
    # Another run's GPU, an XID before the attempt started, or long before: not ours.
    assert hardware_cause(gpus, ["GPU-0"], started=900.0, ended=1000.0) is None
    assert hardware_cause(gpus, ["GPU-1"], started=996.0, ended=1000.0) is None
    assert hardware_cause(gpus, ["GPU-1"], started=None, ended=995.0 + 61) is None
    lost = hardware_cause([gpu(3, lost=True)], ["GPU-3"], started=None, ended=10.0)
    assert lost is not None and lost.summary.startswith("GPU 3 (GPU-3) is lost")


# --------------------------------------------------------------------------- torch's prefixes
# Issue 32 §1: real torchrun output of a script that knows nothing of gpud.


def test_a_rank_that_raised_is_the_cause_not_its_peers_connection_error(tmp_path: Path) -> None:
    cause = find_cause(tmp_path, TORCHRUN_RAISED, ExitInfo(exit_code=1), node_rank=0, nproc=2)
    assert (cause.kind, cause.rank, cause.source) == (CauseKind.USER, 1, "traceback")
    assert cause.summary == "ValueError: bad batch on rank 1"
    assert cause.lines[0] == "Traceback (most recent call last):"  # both prefixes taken off
    assert cause.lines[-1] == "ValueError: bad batch on rank 1"
    # torchrun's "first observed" is only as good as whole-second clocks: naming rank 0
    # (whose error is the connection) changes nothing
    swapped = (
        TORCHRUN_RAISED.replace("rank      : 1 (local_rank: 1)", "rank      : X")
        .replace("rank      : 0 (local_rank: 0)", "rank      : 1 (local_rank: 1)")
        .replace("rank      : X", "rank      : 0 (local_rank: 0)")
    )
    again = find_cause(tmp_path, swapped, ExitInfo(exit_code=1), node_rank=0, nproc=2)
    assert (again.kind, again.rank, again.summary) == (
        CauseKind.USER, 1, "ValueError: bad batch on rank 1",
    )  # fmt: skip


@pytest.mark.parametrize("signal", ["SIGABRT", "SIGSEGV"])
def test_a_rank_that_raised_then_aborted_at_teardown_failed_by_its_exception(
    tmp_path: Path, signal: str
) -> None:
    number = {"SIGABRT": 6, "SIGSEGV": 11}[signal]
    aborted = TORCHRUN_RAISED.replace(
        "exitcode  : 1 (pid: 23305) ", f"exitcode  : -{number} (pid: 23305)  ({signal})"
    )
    assert f"({signal})" in aborted
    cause = find_cause(tmp_path, aborted, ExitInfo(exit_code=1), node_rank=0, nproc=2)
    assert (cause.kind, cause.rank, cause.summary) == (
        CauseKind.USER, 1, "ValueError: bad batch on rank 1",
    )  # fmt: skip


def test_a_rank_that_exited_0_while_its_peer_trained_is_the_cause(tmp_path: Path) -> None:
    cause = find_cause(tmp_path, TORCHRUN_EARLY_EXIT, ExitInfo(exit_code=1), node_rank=0, nproc=2)
    assert (cause.kind, cause.rank, cause.source) == (CauseKind.USER, 1, EARLY_EXIT_SOURCE)
    assert cause.summary == f"rank 1 {EARLY_EXIT}"
    assert cause.lines[0].startswith("the others saw: RuntimeError: [")
    assert "Connection closed by peer" in cause.lines[0]
    # on the node's second part of a two-node run the same rank is global rank 3
    second = find_cause(tmp_path, TORCHRUN_EARLY_EXIT, ExitInfo(exit_code=1), node_rank=1, nproc=2)
    assert second.rank == 3 and second.summary == f"rank 3 {EARLY_EXIT}"


def test_a_log_without_torchruns_prefix_keeps_the_ranks_of_torchs_apart(tmp_path: Path) -> None:
    # DeepSpeed's launcher and a lone process print no `[defaultN]:`; torch's excepthook
    # still says the global rank, and two ranks' tracebacks may interleave
    log = (
        "[rank3]: Traceback (most recent call last):\n"
        "[rank2]: Traceback (most recent call last):\n"
        '[rank3]:   File "/srv/train.py", line 9, in <module>\n'
        '[rank2]:   File "/srv/train.py", line 7, in <module>\n'
        "[rank3]: KeyError: 17\n"
        "[rank2]: RuntimeError: Connection closed by peer [10.0.0.2]:4100\n"
    )
    cause = find_cause(tmp_path, log, ExitInfo(exit_code=1), node_rank=1, nproc=2)
    assert (cause.kind, cause.rank, cause.summary) == (CauseKind.USER, 3, "KeyError: 17")
    assert cause.lines == [
        "Traceback (most recent call last):",
        '  File "/srv/train.py", line 9, in <module>',
        "KeyError: 17",
    ]
