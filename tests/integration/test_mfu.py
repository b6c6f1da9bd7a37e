"""MFU end to end (issue 23 §1): real daemons, real runs; what `gpuctl status`, its
`--json` and `/metrics` say of achieved FLOP/s and MFU."""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

from gpud.efficiency.mfu import NO_GPU, SIMULATED
from tests.support.daemons import RunningDaemon, free_port, gpuctl
from tests.support.runs import FAST, force_stop, health, launch, script_spec, wait_for_step
from tests.support.waiting import until

Daemons = Callable[..., RunningDaemon]

#: A trainer that logs its throughput and counts no FLOPs: the spec's flops_per_sample is
#: the source. No torch: quick on busy cores.
LOGS_SAMPLES = """
import time
import trainers

run = trainers.init()
print("training", flush=True)  # a run is `running` from its first line of output
for step in range(1_000_000):
    time.sleep(0.05)
    run.log(step, samples_per_s=200.0)
    if run.should_stop():
        run.stopped(checkpoint=None, step=step)
        break
run.finish()
"""


def status_json(daemon: RunningDaemon, run_id: str) -> dict[str, object]:
    result = gpuctl("--node", daemon.address, "--json", "status", run_id)
    assert result.returncode == 0, result.stderr
    found = json.loads(result.stdout)
    assert isinstance(found, dict)
    return found


def flops_when_known(daemon: RunningDaemon, run_id: str) -> dict[str, object]:
    """`gpuctl status --json`'s flops, once it has a FLOP rate."""
    deadline = time.monotonic() + 30
    last: object = None
    while time.monotonic() < deadline:
        last = status_json(daemon, run_id).get("flops")
        if isinstance(last, dict) and last.get("flops_per_second"):
            return last
        time.sleep(0.3)
    raise AssertionError(f"no FLOP rate in gpuctl status --json: {last}")


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
        return str(reply.read().decode())


def test_counted_flops_on_a_simulated_gpu_give_a_rate_and_say_why_no_mfu(
    daemons: Daemons,
) -> None:
    port = free_port()
    daemon = daemons(simulate_gpus=2, extra=("--metrics", f"127.0.0.1:{port}"))
    # The CPU DDP example counts its first step's FLOPs (run.count_flops()); its GPUs are
    # simulated, so the work is the CPU's: a FLOP rate, and no MFU against an H100.
    run_id = launch(daemon, FAST, "training.max_steps=100000", "gpus=[0, 1]")
    try:
        wait_for_step(daemon, run_id, 5)
        found = flops_when_known(daemon, run_id)
        text = gpuctl("--node", daemon.address, "status", run_id).stdout
        metrics = scrape(port)

        def counted_by_rank() -> dict[int, float | None]:
            return {r.rank: r.flops_per_step for r in health(daemon, run_id).ranks}

        # The rate needs one rank's count; rank 0's next beat may come a moment later.
        until("both ranks' counts", lambda: None not in counted_by_rank().values(), timeout=30)
        counted = counted_by_rank()
    finally:
        force_stop(daemon, run_id)
    # What each rank counted is the step's FLOPs: 64 samples (batch 32 × accumulation 2)
    # through Linear 64→128, 2 × 128→128, 128→8: forward 2·MACs, backward 2·MACs for the
    # weights' gradients and 2·MACs for the inputs' (none for the first layer's input).
    macs = 64 * 128 + 2 * 128 * 128 + 128 * 8
    per_step = 64 * (2 * macs + 2 * macs + 2 * (macs - 64 * 128))
    assert counted == {0: per_step, 1: per_step}
    assert found["source"] == "counted"
    assert isinstance(found["flops_per_second"], float) and found["flops_per_second"] > 0
    assert found["mfu"] is None and found["why_not"] == SIMULATED
    assert (found["gpu_model"], found["dtype"], found["gpus"]) == (
        "H100 SXM (simulated)",
        "fp32",
        2,
    )
    assert "flops     " in text and "FLOP/s (counted on the first step" in text
    assert f"mfu       n/a: {SIMULATED}" in text
    assert f'gpud_run_flops_per_second{{run="{run_id}"}}' in metrics
    assert "gpud_run_mfu{" not in metrics  # n/a is absent, never 0


def test_the_specs_flops_per_sample_on_a_cpu_run(daemons: Daemons, tmp_path: Path) -> None:
    daemon = daemons(simulate_gpus=None)
    spec = script_spec(tmp_path, LOGS_SAMPLES, name="logs-samples")
    run_id = launch(daemon, "training.flops_per_sample=1e9", config=spec)
    try:
        wait_for_step(daemon, run_id, 3)
        found = flops_when_known(daemon, run_id)
        text = gpuctl("--node", daemon.address, "status", run_id).stdout
    finally:
        force_stop(daemon, run_id)
    # 200 samples/s × 1e9 FLOPs per sample.
    assert found["source"] == "flops_per_sample"
    assert found["flops_per_second"] == 2e11
    assert found["mfu"] is None and found["why_not"] == NO_GPU and found["gpus"] == 0
    assert "flops     200.0 GFLOP/s (training.flops_per_sample × samples/s)" in text
    assert f"mfu       n/a: {NO_GPU}" in text


#: A script that knows nothing of gpud (issue 32 §4): it prints its step and loss, ~20
#: steps a second, and logs no step time; nanoGPT's size is in the spec.
PRINTS_STEPS = """
import time
for step in range(1_000_000):
    print(f"iter {step}: loss {1 / (step + 1):.4f}", flush=True)
    time.sleep(0.05)
"""


def test_a_plain_scripts_printed_steps_give_its_flop_rate(daemons: Daemons, tmp_path: Path) -> None:
    daemon = daemons(simulate_gpus=None)
    spec = script_spec(tmp_path, PRINTS_STEPS, name="prints-steps")
    spec.write_text(
        spec.read_text()
        + 'metrics: [{pattern: "iter (?P<step>\\\\d+): loss (?P<loss>[\\\\d.]+)"}]\n'
        + "training: {batch_size_per_gpu: 12, seq_len: 1024, model_params: 124000000}\n"
    )
    run_id = launch(daemon, config=spec)
    try:
        wait_for_step(daemon, run_id, 20)
        found = flops_when_known(daemon, run_id)
        text = gpuctl("--node", daemon.address, "status", run_id).stdout
    finally:
        force_stop(daemon, run_id)
    # 12 × 1024 tokens a step, a step every ~50 ms (more on a busy machine), 6 × 124e6
    # FLOPs a token: ~1.8e14 FLOP/s at most (the pace is read from when the daemon saw
    # the lines, a tick at a time: within a fifth)
    assert found["source"] == "model_params"
    rate = found["flops_per_second"]
    assert isinstance(rate, float) and 1e13 < rate <= 12 * 1024 / 0.05 * 6 * 124e6 * 1.2
    assert found["why_not"] == NO_GPU  # a FLOP rate; no MFU on the CPU
    assert "flops     " in text and "(6 × training.model_params × tokens/s)" in text, text
