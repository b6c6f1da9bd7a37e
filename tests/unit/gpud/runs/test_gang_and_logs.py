"""Pure pieces of supervision: gang state, log parsing, log tails, port leases."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from gpud.model.run import AttemptRecord, RunRecord, RunState
from gpud.patterns.extract import MetricExtractor
from gpud.runs.diagnosis.logparse import classify, root_cause, split_rank
from gpud.runs.diagnosis.logread import read_chunk
from gpud.runs.multinode.decide import gang_state
from gpud.runs.placement.ports import NoFreePort, pick_port
from gpud.wire.run_messages import LogsRequest
from tests.support.logs import TORCHRUN_FAILURE

P, S, R, X, OK, F, STOP = (
    RunState.PENDING,
    RunState.STARTING,
    RunState.RUNNING,
    RunState.STOPPING,
    RunState.SUCCEEDED,
    RunState.FAILED,
    RunState.STOPPED,
)


@pytest.mark.parametrize(
    ("parts", "user_stop", "expected"),
    [
        ([None, None], False, P),
        ([S, None], False, S),
        ([R, S], False, R),
        ([R, R], False, R),
        ([OK, R], False, R),
        ([OK, OK], False, OK),
        ([F, R], False, F),  # one part failed: the run failed (others get stopped)
        ([OK, F], False, F),
        ([R, R], True, X),
        ([STOP, R], True, X),
        ([STOP, STOP], True, STOP),
        ([STOP, F], True, STOP),  # a part killed during a requested stop is still a stop
        ([STOP, OK], False, STOP),  # a part stopped by hand on its node
    ],
)
def test_gang_state(parts: list[RunState | None], user_stop: bool, expected: RunState) -> None:
    assert gang_state(parts, user_stop) is expected


def test_root_cause_names_the_first_failed_rank() -> None:
    cause = root_cause(TORCHRUN_FAILURE)
    assert cause is not None
    assert (cause.rank, cause.local_rank, cause.exitcode, cause.signal_name) == (
        3,
        1,
        -9,
        "SIGKILL",
    )
    assert root_cause("all fine\n") is None
    exited = root_cause(TORCHRUN_FAILURE.replace("-9 (pid: 10402)  (SIGKILL)", "1 (pid: 7)"))
    assert exited is not None and (exited.exitcode, exited.signal_name) == (1, None)


@pytest.mark.parametrize(
    ("line", "kind"),
    [
        ("NCCL WARN NET/IB : Got async event : port error", "nccl_warn"),
        (
            "[Rank 1] Watchdog caught collective operation timeout: WorkNCCL(...)",
            "collective_timeout",
        ),
        ("ncclUnhandledCudaError: ... unhandled system error", "nccl_system_error"),
        ("NCCL error: remote process exited or there was a network error", "nccl_remote_error"),
        ("NCCL INFO NET/Socket : Using [0]eth0:10.0.0.2<0>", "nccl_socket_fallback"),
        ("RuntimeError: [../gloo/transport/tcp/pair.cc] Connection closed by peer", "gloo_error"),
        ("step 10 loss 1.0", None),
    ],
)
def test_trouble_lines_are_recognised(line: str, kind: str | None) -> None:
    found = classify(line)
    assert (found.kind if found else None) == kind


def test_rank_prefix_and_metric_regexes() -> None:
    assert split_rank("[default3]:hello") == (3, "hello")
    assert split_rank("no prefix") == (None, "no prefix")
    # torch's excepthook inside torchrun's prefix, and alone (its rank is global, not local)
    assert split_rank("[default1]:[rank1]: Traceback (x)") == (1, "Traceback (x)")
    assert split_rank("[rank3]: KeyError: 17") == (None, "KeyError: 17")
    assert split_rank("[default0]:[rank3]:") == (0, "")
    extract = MetricExtractor(
        [r"iter (?P<step>\d+): loss (?P<loss>[0-9.]+), time (?P<ms>[0-9.]+)ms"]
    )
    assert extract.extract("iter 120: loss 2.3121, time 41.2ms") == (
        120,
        {"loss": 2.3121, "ms": 41.2},
    )
    assert extract.extract("something else") == (None, {})


def _records(tmp_path: Path, state: RunState) -> tuple[RunRecord, AttemptRecord]:
    run = RunRecord(
        id="r",
        name="r",
        created_at=0,
        spec={},
        nodes=[],
        node_rank=0,
        state=state,
        state_since=0,
        run_dir=str(tmp_path),
        checkpoint_dir=str(tmp_path),
    )
    attempt = AttemptRecord(
        run_id="r",
        attempt=1,
        node_rank=0,
        state=state,
        state_since=0,
        master_addr="x",
        master_port=1,
        nproc=2,
        attempt_dir=str(tmp_path),
    )
    return run, attempt


def test_log_chunks_tail_filter_and_never_split_lines(tmp_path: Path) -> None:
    lines = [f"[default{i % 2}]:line {i}" for i in range(100)]
    (tmp_path / "output.log").write_text("\n".join(lines) + "\n[default0]:partial")
    run, attempt = _records(tmp_path, RunState.RUNNING)
    tail = read_chunk(run, attempt, "n", LogsRequest(run="r", tail_lines=3), None)
    assert tail.lines == lines[-3:]  # the unfinished line is held back while running
    ranked = read_chunk(run, attempt, "n", LogsRequest(run="r"), 1)
    assert ranked.lines == [line for line in lines if line.startswith("[default1]")]
    small = read_chunk(run, attempt, "n", LogsRequest(run="r", max_bytes=50), None)
    assert small.lines == lines[:2] and small.next_offset < small.size
    rest = read_chunk(run, attempt, "n", LogsRequest(run="r", offset=small.next_offset), None)
    assert rest.lines[0] == lines[2] and not rest.ended
    run, ended = _records(tmp_path, RunState.SUCCEEDED)
    final = read_chunk(run, ended, "n", LogsRequest(run="r", offset=rest.next_offset), None)
    assert final.lines == ["[default0]:partial"] and final.ended


def test_a_rank_tail_is_that_ranks_last_lines_however_far_back(tmp_path: Path) -> None:
    """`logs --rank 1 --tail 3`: the filter applies before the tail is cut."""
    rank1 = [f"[default1]:early {i}" for i in range(5)]
    chatter = [f"[default0]:{'x' * 100} {i}" for i in range(3000)]  # ~300 kB: many blocks
    huge = "[default0]:" + "#" * 200_000  # one very long line
    (tmp_path / "output.log").write_text("\n".join([*rank1, *chatter, huge, ""]))
    run, attempt = _records(tmp_path, RunState.SUCCEEDED)
    request = LogsRequest(run="r", tail_lines=3, max_bytes=4 * 1024 * 1024)
    tail = read_chunk(run, attempt, "n", request, 1)
    assert tail.lines == rank1[-3:]
    assert (
        read_chunk(run, attempt, "n", request.model_copy(update={"tail_lines": 50}), 1).lines
        == rank1
    )
    assert read_chunk(run, attempt, "n", request, 0).lines[-1] == huge
    assert read_chunk(run, attempt, "n", request, 2).lines == []
    # While the attempt runs, an unfinished last line of the rank is held back.
    with (tmp_path / "output.log").open("a") as f:
        f.write("[default1]:late\n[default1]:unfinis")
    run, running = _records(tmp_path, RunState.RUNNING)
    assert read_chunk(run, running, "n", request, 1).lines == [*rank1[-2:], "[default1]:late"]


def test_ports_skip_leased_and_bound_ones() -> None:
    with socket.socket() as busy:
        busy.bind(("0.0.0.0", 0))
        taken = busy.getsockname()[1]
        from gpud.runs.placement import ports

        original = ports.PORT_RANGE
        try:
            ports.PORT_RANGE = range(taken, taken + 3)
            assert pick_port(leased=[taken + 1]) == taken + 2
            with pytest.raises(NoFreePort):
                pick_port(leased=[taken + 1, taken + 2])
        finally:
            ports.PORT_RANGE = original
