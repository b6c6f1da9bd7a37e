"""The DeepSpeed, Accelerate and unmodified examples, run by gpud on 2 CPU processes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.daemons import RunningDaemon, gpuctl
from tests.support.runs import ROOT, health, launch, nothing_left, status, wait_for, wait_for_step

pytestmark = pytest.mark.slow
EXAMPLES = ROOT / "config" / "examples"
SMALL = "args=[--width, '64', --depth, '2']"


def loss_steps(daemon: RunningDaemon, run_id: str) -> dict[int, list[int]]:
    reply = json.loads(
        gpuctl("--node", daemon.address, "--json", "metrics", run_id, "--name", "loss").stdout
    )
    out: dict[int, list[int]] = {}
    for row in reply["rows"]:
        out.setdefault(row["attempt"], []).append(row["step"])
    return out


def step_flops(samples: int) -> int:
    """FLOPs of a step of `samples` through SMALL's Linear 64→64, 2 × 64→64, 64→8: forward
    2·MACs, backward 2·MACs for the weights' gradients and 2·MACs for the inputs' (none for
    the first layer's input)."""
    macs = 64 * 64 + 2 * 64 * 64 + 64 * 8
    return samples * (2 * macs + 2 * macs + 2 * (macs - 64 * 64))


# Samples per step: batch 16 × accumulation 2 (DeepSpeed's), 16 × 1 (Accelerate's).
@pytest.mark.parametrize(
    ("example", "samples"), [("cpu-deepspeed-zero2.yaml", 32), ("cpu-accelerate.yaml", 16)]
)
def test_engine_examples_run_under_gpud(daemon: RunningDaemon, example: str, samples: int) -> None:
    result = gpuctl(
        "--node",
        daemon.address,
        "launch",
        str(EXAMPLES / example),
        "--wait",
        "--set",
        SMALL,
        "--set",
        "training.max_steps=30",
        timeout=300,
    )
    assert result.returncode == 0, result.stderr + result.stdout
    run_id = result.stdout.split()[1]
    s = status(daemon, run_id)
    assert s.run.state.value == "succeeded" and s.attempts[0].nproc == 2
    assert loss_steps(daemon, run_id) == {1: list(range(30))}
    # Each rank counted its first step's FLOPs through the engine (run.count_flops()), and
    # its heartbeats carried them: gpud's MFU.
    counted = {r.rank: r.flops_per_step for r in health(daemon, run_id).ranks}
    assert counted == {0: step_flops(samples), 1: step_flops(samples)}
    nothing_left(run_id)


def test_unmodified_script_gets_regex_metrics_sigterm_stop_and_resume_args(
    daemon: RunningDaemon, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    run_id = launch(
        daemon,
        f"args=['--max_iters=600', '--out_dir={out}', '--n_embd=64', '--n_layer=2']",
        f"checkpoint.dir={out}",
        config=EXAMPLES / "unmodified-script.yaml",
    )
    wait_for_step(daemon, run_id, 50)  # the step comes from its log lines, by regex
    assert gpuctl("--node", daemon.address, "stop", run_id, timeout=120).returncode == 0
    stopped = status(daemon, run_id)
    assert stopped.run.state.value == "stopped"
    assert (out / "ckpt.pt").exists()
    # Without the library nobody listens for the handshake: the signal went out at once.
    assert any("SIGTERM" in e.message for e in stopped.events if e.kind == "stop")
    assert gpuctl("--node", daemon.address, "resume", run_id).returncode == 0
    wait_for(daemon, run_id, {"succeeded"}, timeout=240)
    s = status(daemon, run_id)
    assert s.attempts[1].resume_from == str(out / "ckpt.pt")
    logs = gpuctl("--node", daemon.address, "logs", run_id, "--rank", "0").stdout
    assert "resuming from" in logs  # --init_from=resume reached the script
    steps = loss_steps(daemon, run_id)
    first, second = steps[1], steps[2]
    assert first == list(range(0, first[-1] + 1, 10))  # every log_interval (10) iters
    assert second[0] > first[-1] and second[-1] == 590
    nothing_left(run_id)
