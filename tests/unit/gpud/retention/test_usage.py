"""The usage row a removed run leaves: who, how many GPUs, for how long."""

from __future__ import annotations

from gpud.model.run import AttemptRecord, RunEvent, RunRecord, RunState
from gpud.retention.usage import launched_by, usage_of


def attempt(n: int, gpus: list[int], start: float, end: float) -> AttemptRecord:
    return AttemptRecord(
        run_id="r", attempt=n, node_rank=0, state=RunState.FAILED, state_since=end,
        master_addr="127.0.0.1", master_port=1, nproc=len(gpus), attempt_dir="/x",
        gpus=gpus, started_at=start, ended_at=end,
    )  # fmt: skip


def test_usage_sums_gpu_seconds_over_attempts_and_names_the_launcher() -> None:
    run = RunRecord(
        id="r", name="train", created_at=90.0, spec={}, nodes=[], node_rank=0,
        state=RunState.SUCCEEDED, state_since=400.0, attempt=2, run_dir="/x", checkpoint_dir="/y",
    )  # fmt: skip
    events = [
        RunEvent(run_id="r", attempt=1, time=90.0, node="n", kind="launch",
                 message="launched by ada@box on 1 node(s)", data={"by": "ada@box"}),
    ]  # fmt: skip
    usage = usage_of(run, [attempt(1, [0, 1], 100.0, 200.0), attempt(2, [2], 250.0, 400.0)], events)
    assert usage.user == "ada@box" and usage.gpus == 2 and usage.attempts == 2
    assert usage.gpu_seconds == 2 * 100 + 150 and usage.wall_s == 250
    assert (usage.started_at, usage.ended_at) == (100.0, 400.0)


def test_an_older_event_without_data_still_names_who_launched() -> None:
    old = RunEvent(run_id="r", attempt=1, time=1.0, node="n", kind="launch",
                   message="launched by op@host on 2 node(s), queued: busy")  # fmt: skip
    assert launched_by([old]) == "op@host"
