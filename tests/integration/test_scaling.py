"""`gpuctl scaling` (issue 13): the CPU example at 1 and 2 gloo processes through a real
daemon, real torchrun and real training. The numbers must be the runs' own: each test
recomputes them from what the daemon holds (`gpuctl metrics`), not from gpuctl's output.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from gpud.efficiency.mfu import SIMULATED
from gpud.efficiency.model import flops_text
from gpud.scaling.arithmetic import ScalingPoint
from gpud.scaling.baselines import baselines_path, load_baselines
from gpud.wire.client import Client
from gpud.wire.protocol import RUN_LIST
from gpud.wire.run_messages import ListRequest, RunList
from tests.support.daemons import RunningDaemon, gpuctl
from tests.support.runs import (
    CPU_DDP,
    FAST,
    force_stop,
    launch,
    nothing_left,
    script_spec,
    status,
)

STEPS, WARMUP = 200, 10
#: Samples each process trains per step in cpu-ddp.yaml: batch 32 × accumulation 2.
PER_RANK_STEP = 64
#: The example's own model (tens of ms a step here), so a run's timed steps last seconds
#: and the heartbeats see them; its step log every 50 steps.
QUIET = "args=[--log-every, '50']"


def metrics_rows(daemon: RunningDaemon, run_id: str) -> list[dict[str, object]]:
    result = gpuctl("--node", daemon.address, "--json", "metrics", run_id)
    assert result.returncode == 0, result.stderr
    rows: list[dict[str, object]] = json.loads(result.stdout)["rows"]
    return rows


def step_rate(daemon: RunningDaemon, run_id: str) -> tuple[int, float]:
    """(steps, steps/s) from the end of warm-up step WARMUP-1 to the end of the last step,
    as rank 0 logged them."""
    rows = metrics_rows(daemon, run_id)
    steps = {int(str(r["step"])): float(str(r["time"])) for r in rows}
    assert max(steps) == STEPS + WARMUP - 1  # the run stopped at warm-up + timed steps
    first, last = WARMUP - 1, STEPS + WARMUP - 1
    return last - first, (last - first) / (steps[last] - steps[first])


def columns(table: str) -> list[dict[str, str]]:
    header, *rows = table.splitlines()
    starts = [header.index(h) for h in header.split("  ") if h]
    names = [h.strip() for h in header.split("  ") if h]
    ends = [*starts[1:], None]
    return [
        {n: row[a:b].strip() for n, a, b in zip(names, starts, ends, strict=True)} for row in rows
    ]


@pytest.mark.slow
def test_scaling_at_1_and_2_processes_reports_the_runs_own_numbers(daemon: RunningDaemon) -> None:
    result = gpuctl(
        "--node", daemon.address, "scaling", str(CPU_DDP), "--procs", "1,2",
        "--steps", str(STEPS), "--warmup", str(WARMUP), "--set", QUIET, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    saved = load_baselines().baselines["cpu-ddp"]
    one, two = saved.points
    assert (one.world, two.world) == (1, 2)
    assert one.state == two.state == "succeeded" and one.run_id != two.run_id

    for point in (one, two):
        assert point.run_id is not None
        steps, rate = step_rate(daemon, point.run_id)
        assert point.steps == steps == STEPS
        assert point.steps_per_s == pytest.approx(rate, rel=1e-9)
        assert point.unit == "samples/s"
        assert point.throughput == pytest.approx(rate * PER_RANK_STEP * point.world, rel=1e-9)
        # Time per step from the heartbeats: compute and collectives make up the step, and
        # it is the step time the metrics show, give or take what sampling sees.
        assert point.heartbeats >= 1
        assert point.step_time_s is not None and point.collective_s is not None
        assert point.compute_s == pytest.approx(point.step_time_s - point.collective_s)
        assert 0.5 < point.step_time_s * rate < 2.0, (point.step_time_s, 1 / rate)
        run = status(daemon, point.run_id).run
        assert run.max_steps == STEPS + WARMUP and run.nproc == point.world
    assert one.throughput is not None and two.throughput is not None
    assert two.speedup == pytest.approx(two.throughput / one.throughput, rel=1e-12)
    assert two.efficiency == pytest.approx(two.throughput / (2 * one.throughput), rel=1e-12)
    assert one.efficiency == 1.0
    assert two.guide_speedup == (1.8, 1.9)
    # Two ranks wait on each other in the gradient all-reduce; one rank hardly waits.
    assert two.collective_s is not None and one.collective_s is not None
    assert two.collective_s > one.collective_s

    head, rows = result.stdout.split("\n\n", 1)
    assert head.startswith(f"cpu-ddp: {STEPS} steps timed after {WARMUP} warm-up, on node0: 8×")
    assert "throughput: step rate × 64 samples per process per step" in head
    table, saved_line = rows.rstrip("\n").rsplit("\n", 1)
    assert saved_line == f"saved as the baseline of cpu-ddp in {baselines_path()}"
    shown = columns(table)
    assert two.efficiency is not None and two.speedup is not None
    assert [r["PROCS"] for r in shown] == ["1", "2"]
    assert [r["RUN"] for r in shown] == [one.run_id, two.run_id]
    assert shown[1]["EFFICIENCY"] == f"{two.efficiency * 100:.0f}%"
    assert shown[1]["SPEEDUP"] == f"{two.speedup:.2f}×"
    assert shown[1]["THROUGHPUT"] == f"{two.throughput:,.0f} samples/s"
    assert shown[1]["GUIDES"] == "1.8–1.9×" and shown[0]["GUIDES"] == "-"
    assert shown[1]["COLLECTIVES"] == f"{two.collective_s * 1000:.1f} ms"
    # MFU per count: the example counts its FLOPs; on simulated GPUs there is no peak.
    for point, row in ((one, shown[0]), (two, shown[1])):
        assert point.flops_per_second is not None and point.flops_per_second > 0
        assert point.mfu is None and point.mfu_why_not == SIMULATED
        assert row["FLOP/S"] == flops_text(point.flops_per_second) and row["MFU"] == "n/a"
    assert f"MFU n/a: {SIMULATED}" in head


@pytest.mark.slow
def test_a_count_whose_gpus_are_held_is_reported_in_its_row(
    daemons: Callable[..., RunningDaemon], tmp_path: Path
) -> None:
    daemon = daemons(simulate_gpus=2)
    holder_spec = script_spec(tmp_path, "import time\ntime.sleep(600)\n", name="holder")
    holder = launch(daemon, "gpus=1", config=holder_spec)
    try:
        result = gpuctl(
            "--node", daemon.address, "--json", "scaling", str(CPU_DDP), "--procs", "1,2",
            "--steps", "20", "--warmup", "5", "--set", FAST, timeout=300,
        )  # fmt: skip
    finally:
        force_stop(daemon, holder)
    assert result.returncode == 1, result.stderr
    reply = json.loads(result.stdout)
    one, two = (ScalingPoint.model_validate(p) for p in reply["scaling"]["points"])
    assert one.measured and one.gpus == "1"  # the GPU the holder left free
    assert two.run_id is None and two.state == "refused" and not two.measured
    assert two.error is not None and f"held by run {holder} (holder)" in two.error
    assert reply["saved_to"] == str(baselines_path())  # what was measured is kept


@pytest.mark.slow
def test_node_counts_run_over_the_first_nodes_of_the_list(
    daemons: Callable[..., RunningDaemon],
) -> None:
    node0 = daemons(node="n0", simulate_gpus=None)
    node1 = daemons(node="n1", simulate_gpus=None)
    result = gpuctl(
        "--node", node0.address, "--node", node1.address, "--json", "scaling", str(CPU_DDP),
        "--nodes", "1,2", "--set", "nproc_per_node=1", "--steps", "30", "--warmup", "5",
        "--set", FAST, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    scaling = json.loads(result.stdout)["scaling"]
    assert [h["node"] for h in scaling["hardware"]] == ["n0", "n1"]
    one, two = (ScalingPoint.model_validate(p) for p in scaling["points"])
    assert (one.nodes, one.world, two.nodes, two.world) == (1, 1, 2, 2)
    assert two.run_id is not None
    # node 0 coordinated it, node 1 ran the other rank; rank 0 logged the steps timed.
    assert [p.node_rank for p in status(node0, two.run_id).parts] == [0, 1]
    assert status(node1, two.run_id).run.state.value == "succeeded"
    steps = {int(str(r["step"])): float(str(r["time"])) for r in metrics_rows(node0, two.run_id)}
    assert two.steps_per_s == pytest.approx(30 / (steps[34] - steps[4]), rel=1e-9)
    assert one.throughput is not None and two.throughput is not None
    assert two.efficiency == pytest.approx(two.throughput / (2 * one.throughput), rel=1e-12)


def running_runs(daemon: RunningDaemon) -> list[str]:
    with Client(daemon.target()) as client:
        runs = client.call(RUN_LIST, ListRequest())
    assert isinstance(runs, RunList)
    return [r.id for r in runs.runs if r.state.value == "running" and (r.last_step or 0) > 5]


@pytest.mark.slow
def test_ctrl_c_stops_the_run_in_flight_and_saves_nothing(daemon: RunningDaemon) -> None:
    command = [sys.executable, "-m", "launch.gpuctl", "--node", daemon.address, "scaling",
               str(CPU_DDP), "--procs", "1,2", "--steps", "100000", "--set", FAST]  # fmt: skip
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not (found := running_runs(daemon)):
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        # gpuctl waits for the stop to end the run: on a busy machine its ranks may still be
        # importing torch, and stop once they reach their first step (or at the kill grace)
        out, err = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
    run_id = found[0]
    assert proc.returncode == 130, err
    assert f"interrupted; stopping {run_id}" in err and "nothing saved" in err
    assert "Traceback" not in err and out == ""
    assert status(daemon, run_id).run.state.value == "stopped"
    nothing_left(run_id)
    with Client(daemon.target()) as client:
        runs = client.call(RUN_LIST, ListRequest())
    assert isinstance(runs, RunList) and [r.id for r in runs.runs] == [run_id]  # 2 never ran
    assert not baselines_path().exists()


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("--procs", "1,x"), "'1,x': expected counts like 1,2,4,8"),
        (("--procs", "0"), "'0': counts are whole numbers from 1"),
        (("--nodes", "1,2"), "--nodes 2: the run has 1 node(s)"),
        (
            ("--procs", "1,2", "--set", "launcher=python", "--set", "nproc_per_node=1"),
            "cpu-ddp at 2 process(es) per node: launcher: python starts one process",
        ),
        (("--set", "nproc_per_node=auto"), "nproc_per_node is auto; give --procs"),
        (("--set", "gpus=[0]", "--procs", "1,2"), "gpus lists 1 GPU(s), too few for 2"),
    ],
)
def test_bad_input_is_one_line_and_exit_2_before_anything_starts(
    args: tuple[str, ...], says: str
) -> None:
    result = gpuctl("scaling", str(CPU_DDP), *args)
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("gpuctl: error: ") and says in result.stderr
    assert result.stderr.count("\n") == 1 and result.stdout == ""
