"""`metrics: auto` (issue 32 §2): a script that knows nothing of gpud, launched with a spec
that names no pattern, shows its step and loss. Its output is what Hugging Face's Trainer
prints, made by real tqdm the way the Trainer's ProgressCallback makes it: a progress bar
redrawn with `\\r` (on stderr), and every 10 steps the logged dict, written through the
bar (`bar.write(str(logs))`). No torch, no transformers: quick on busy cores."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.daemons import RunningDaemon, gpuctl
from tests.support.runs import force_stop, launch, script_spec, status
from tests.support.waiting import until

pytestmark = pytest.mark.slow

TRAINER_LIKE = """
import sys, time
from tqdm.auto import tqdm
steps = int(sys.argv[1])
bar = tqdm(total=steps, dynamic_ncols=True, mininterval=0)
for step in range(1, steps + 1):
    time.sleep(0.05)
    bar.update(1)
    if step % 10 == 0:
        loss = 6.0 / step
        bar.write(str({"loss": f"{loss:.4f}", "grad_norm": "1.23",
                       "learning_rate": f"{5e-5 * (1 - step / steps):.3e}", "epoch": "0.5"}))
bar.close()
"""


def test_a_trainer_script_with_no_pattern_shows_its_step_and_loss(
    daemon: RunningDaemon, tmp_path: Path
) -> None:
    spec = script_spec(tmp_path, TRAINER_LIKE, name="trainer-like", args=("100000",))
    run_id = launch(daemon, config=spec)
    try:

        def logged_twice() -> dict[str, object] | None:
            done = gpuctl("--node", daemon.address, "--json", "ps")
            row = next(r for r in json.loads(done.stdout)["runs"] if r["id"] == run_id)
            values = row.get("last_values") or {}
            return row if values.get("loss") and values["loss"] <= 6.0 / 20 else None

        row = until("ps shows the second logged loss", logged_twice, timeout=60)
        values = row["last_values"]
        assert isinstance(values, dict) and values["grad_norm"] == 1.23
        assert values["epoch"] == 0.5
        # the loss logged at the bar's step k is 6 / k, and steps count from 0
        logged_at = round(6.0 / values["loss"])
        assert logged_at % 10 == 0 and values["lr"] == pytest.approx(
            5e-5 * (1 - logged_at / 100000), rel=1e-3
        )
        assert isinstance(row["last_step"], int) and row["last_step"] >= logged_at - 1
        text = gpuctl("--node", daemon.address, "ps").stdout
        line = next(line for line in text.splitlines() if run_id in line)
        assert re.search(r" \d+ +0\.\d{4} ", line), line  # STEP and LOSS
        events = [e.message for e in status(daemon, run_id).events]
        assert "metrics: auto: reading hf-trainer output" in events, events
    finally:
        force_stop(daemon, run_id)


def ps_row_past_step(daemon: RunningDaemon, run_id: str, step: int) -> dict[str, object]:
    """The run's row in `gpuctl --json ps`, once it shows a step past `step`."""

    def past() -> dict[str, object] | None:
        done = gpuctl("--node", daemon.address, "--json", "ps")
        row: dict[str, object] = next(
            r for r in json.loads(done.stdout)["runs"] if r["id"] == run_id
        )
        last = row.get("last_step")
        return row if isinstance(last, int) and last >= step else None

    row: dict[str, object] = until(f"ps shows a step past {step}", past, timeout=60)
    return row


#: What nanoGPT's and torchtitan's train.py print each `log_interval` steps (the latter in
#: colour), and the DeepSpeed engine's own log line, here from a loop that only prints.
PRINTS_LIKE = {
    "nanogpt": """
import sys, time
for it in range(int(sys.argv[1])):
    time.sleep(0.05)
    print(f"iter {it}: loss {6.0 / (it + 1):.4f}, time 50.12ms, mfu 31.50%", flush=True)
""",
    "torchtitan": """
import sys, time
for step in range(1, int(sys.argv[1]) + 1):
    time.sleep(0.05)
    print(f"\\x1b[31mstep: {step:2}  \\x1b[32mloss: {6.0 / step:7.4f}  \\x1b[33mmemory: 1.20GiB"
          f"(1.51%)  \\x1b[34mtps: 1,234  \\x1b[35mtflops: 56.78  \\x1b[36mmfu: 12.30%\\x1b[39m",
          flush=True)
""",
    "deepspeed": """
import sys, time
for step in range(1, int(sys.argv[1]) + 1):
    time.sleep(0.05)
    print(f"[2026-11-29 02:00:00,000] [INFO] [logging.py:128:log_dist] [Rank 0] steps: {step}"
          f" loss: {6.0 / step:.4f} iter time (s): 0.050 samples/sec: 640.000", flush=True)
""",
}


@pytest.mark.parametrize("framework", sorted(PRINTS_LIKE))
def test_nanogpt_torchtitan_and_deepspeed_output_shows_its_step_and_loss_with_no_pattern(
    daemon: RunningDaemon, tmp_path: Path, framework: str
) -> None:
    spec = script_spec(tmp_path, PRINTS_LIKE[framework], name=framework, args=("100000",))
    run_id = launch(daemon, config=spec)
    try:
        row = ps_row_past_step(daemon, run_id, 20)
        step, values = row["last_step"], row["last_values"]
        assert isinstance(step, int) and isinstance(values, dict)
        # gpud counts from 0: nanoGPT's `iter N` is step N, the others' `step: N` is N - 1;
        # the loss printed at the script's own number k is 6 / (k + 1) or 6 / k.
        own = step if framework == "nanogpt" else step + 1
        assert values["loss"] == pytest.approx(6.0 / (own + (framework == "nanogpt")), abs=1e-4)
        text = gpuctl("--node", daemon.address, "ps").stdout
        line = next(line for line in text.splitlines() if run_id in line)
        assert re.search(r" \d+ +0\.\d{4} ", line), line  # STEP and LOSS
        events = [e.message for e in status(daemon, run_id).events]
        assert f"metrics: auto: reading {framework} output" in events, events
    finally:
        force_stop(daemon, run_id)


ACCELERATE_LIKE = """
import sys, time
from tqdm.auto import tqdm
for step in tqdm(range(int(sys.argv[1])), desc="train"):
    time.sleep(0.05)
"""


def test_a_bare_progress_bar_gives_the_step_and_its_rate_with_no_pattern(
    daemon: RunningDaemon, tmp_path: Path
) -> None:
    """An accelerate script's (or any loop's) tqdm bar: no loss to read, but the step is
    the bar's count and the rate its steps per second."""
    spec = script_spec(tmp_path, ACCELERATE_LIKE, name="accelerate-like", args=("100000",))
    run_id = launch(daemon, config=spec)
    try:
        row = ps_row_past_step(daemon, run_id, 20)
        values = row["last_values"]
        assert isinstance(values, dict) and 2 <= values["steps_per_s"] <= 25, values  # ~20/s
        events = [e.message for e in status(daemon, run_id).events]
        assert "metrics: auto: reading tqdm output" in events, events
    finally:
        force_stop(daemon, run_id)


def test_gpud_attach_with_no_pattern_recognizes_the_output_too(tmp_path: Path) -> None:
    (tmp_path / "trainer_like.py").write_text(TRAINER_LIKE)
    env = {**os.environ, "GPUD_ATTACH": str(tmp_path / "no-daemon-here")}
    for name in ("GPUD_RUN_ID", "GPUD_INGEST", "RANK"):
        env.pop(name, None)
    runs = tmp_path / "runs"
    done = subprocess.run(
        [sys.executable, "-m", "gpud", "attach", "--run-id", "auto-1", "--run-dir", str(runs),
         "--", sys.executable, "trainer_like.py", "30"],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    rows = [json.loads(line) for line in (runs / "metrics.jsonl").read_text().splitlines()]
    logged = [(r["step"], r["values"]["loss"]) for r in rows if "loss" in r["values"]]
    assert logged == [(9, 0.6), (19, 0.3), (29, 0.2)], rows  # steps from 0
