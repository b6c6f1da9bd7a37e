"""The DeepSpeed, Accelerate and plain examples resume exactly: real launchers, 2 CPU ranks.

Each test trains an uninterrupted run, then a run that gets SIGTERM part-way (as gpud's
stop does: the ranks agree on a step, save, exit 0) and is resumed from its checkpoint;
both must end with bit-identical weights.
"""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest
import torch

from tests.support.daemons import free_port

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "trainers" / "examples"
STEPS = 40
STOP_AFTER = 3  # SIGTERM once this step is logged; the run stops a step or two later
TIMEOUT_S = 120.0
TOY = ["--width", "64", "--depth", "2", "--log-every", "1", "--steps", str(STEPS)]
LOGGED_STEP = re.compile(r"^(?:step|iter) (\d+):? loss", re.MULTILINE)

pytestmark = pytest.mark.slow


@dataclass
class Finished:
    code: int
    output: str


def _signal_all(procs: list[psutil.Process], sig: signal.Signals) -> None:
    for proc in procs:
        try:
            proc.send_signal(sig)
        except psutil.Error:
            continue


def launch(argv: list[str], env: dict[str, str], stop_after: int | None = None) -> Finished:
    """Run a launcher to its end; with `stop_after`, SIGTERM its workers once that step is logged.

    torchrun starts each worker in a session of its own, so the workers are tracked by pid
    and killed explicitly should anything go wrong.
    """
    proc = subprocess.Popen(
        argv,
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    assert proc.stdout is not None
    lines: queue.Queue[str | None] = queue.Queue()

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    launcher = psutil.Process(proc.pid)
    seen: dict[int, psutil.Process] = {}
    output: list[str] = []
    deadline = time.monotonic() + TIMEOUT_S
    signalled = stop_after is None
    try:
        while True:
            try:
                line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"{argv} ran past {TIMEOUT_S}s:\n{''.join(output)}") from None
            if line is None:
                break
            output.append(line)
            try:
                seen.update((p.pid, p) for p in launcher.children(recursive=True))
            except psutil.Error:
                pass
            logged = LOGGED_STEP.match(line)
            if not signalled and logged and int(logged.group(1)) >= (stop_after or 0):
                # The workers only, as gpud's stop reaches them; torchrun itself would
                # exit non-zero on a signal of its own.
                _signal_all(launcher.children(recursive=True), signal.SIGTERM)
                signalled = True
        code = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        _signal_all([p for p in seen.values() if p.is_running()], signal.SIGKILL)
    return Finished(code, "".join(output))


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUD_")}
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", **extra)
    return env


def gpud_env(run_dir: Path, **extra: str) -> dict[str, str]:
    """What gpud gives a rank, less the sockets: the library then only listens for SIGTERM."""
    run_dir.mkdir(parents=True, exist_ok=True)
    return clean_env(
        GPUD_RUN_ID="t",
        GPUD_RUN_DIR=str(run_dir),
        GPUD_CHECKPOINT_DIR=str(run_dir / "ckpt"),
        **extra,
    )


def torchrun(script: str, *args: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node=2",
        str(EXAMPLES / script),
        *args,
    ]


def assert_same_weights(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    differ = [name for name in a if not torch.equal(a[name], b[name])]
    assert not differ, f"weights differ after resume: {differ}"


def first_logged_step(output: str) -> int:
    logged = LOGGED_STEP.search(output)
    assert logged, output
    return int(logged.group(1))


def stop_and_resume_library_example(tmp_path: Path, argv: list[str], **extra_env: str) -> None:
    """An uninterrupted run vs one stopped by SIGTERM and resumed: the same final weights."""
    whole = launch(argv, gpud_env(tmp_path / "whole", **extra_env))
    assert whole.code == 0, whole.output
    assert f"done: {STEPS} steps" in whole.output

    parted = tmp_path / "parted"
    stopped = launch(argv, gpud_env(parted, **extra_env), stop_after=STOP_AFTER)
    assert stopped.code == 0, stopped.output
    said = re.search(r"stopped at step (\d+): SIGTERM; checkpoint (\S+)", stopped.output)
    assert said, f"no stop (did the run end first?):\n{stopped.output}"
    step, checkpoint = int(said.group(1)), said.group(2)
    assert STOP_AFTER <= step < STEPS - 1
    assert Path(checkpoint).exists() and not (parted / "final.pt").exists()

    resumed = launch(argv, gpud_env(parted, GPUD_RESUME_FROM=checkpoint, **extra_env))
    assert resumed.code == 0, resumed.output
    assert f"resumed from {checkpoint} at step {step + 1}" in resumed.output
    assert first_logged_step(resumed.output) == step + 1

    assert_same_weights(
        torch.load(tmp_path / "whole" / "final.pt"), torch.load(parted / "final.pt")
    )


@pytest.mark.parametrize("offload", [False, True], ids=["script-config", "gpud-json-offload"])
def test_deepspeed_zero2_resumes_exactly(tmp_path: Path, offload: bool) -> None:
    extra: dict[str, str] = {}
    if offload:
        # As gpud writes it for a spec with `offload_optimizer: true` (no optimizer section).
        config = {
            "train_micro_batch_size_per_gpu": 16,
            "gradient_accumulation_steps": 2,
            "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}},
            "gradient_clipping": 1.0,
            "steps_per_print": 10**9,
        }
        path = tmp_path / "deepspeed.json"
        path.write_text(json.dumps(config))
        extra["GPUD_DEEPSPEED_CONFIG"] = str(path)
    argv = torchrun("deepspeed_zero2.py", *TOY, "--grad-accum", "2")
    stop_and_resume_library_example(tmp_path, argv, **extra)


def test_accelerate_resumes_exactly(tmp_path: Path) -> None:
    argv = [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--multi_gpu",
        "--num_machines=1",
        "--num_processes=2",
        "--mixed_precision=no",
        "--dynamo_backend=no",
        f"--main_process_port={free_port()}",
        str(EXAMPLES / "accelerate_train.py"),
        *TOY,
        "--grad-accum",
        "2",
    ]
    stop_and_resume_library_example(tmp_path, argv, ACCELERATE_USE_CPU="1")


def test_plain_script_resumes_exactly(tmp_path: Path) -> None:
    flags = [
        f"--max_iters={STEPS}",
        "--n_embd=64",
        "--n_layer=2",
        "--dropout=0.1",  # dropout draws from each rank's RNG: it must be restored too
        "--gradient_accumulation_steps=2",
        "--eval_interval=10",
        "--log_interval=1",
    ]
    whole = launch(
        torchrun("plain_train.py", *flags, f"--out_dir={tmp_path / 'whole'}"), clean_env()
    )
    assert whole.code == 0, whole.output
    assert f"done: {STEPS} iters" in whole.output

    parted = torchrun("plain_train.py", *flags, f"--out_dir={tmp_path / 'parted'}")
    stopped = launch(parted, clean_env(), stop_after=STOP_AFTER)
    assert stopped.code == 0, stopped.output
    said = re.search(r"stopping after iter (\d+) \(SIGTERM\)", stopped.output)
    assert said, f"no stop (did the run end first?):\n{stopped.output}"
    step = int(said.group(1))
    assert STOP_AFTER <= step < STEPS - 1

    resumed = launch([*parted, "--init_from=resume"], clean_env())
    assert resumed.code == 0, resumed.output
    assert f"at iter {step + 1}" in resumed.output
    assert first_logged_step(resumed.output) == step + 1

    def weights(run: str) -> dict[str, torch.Tensor]:
        saved = torch.load(tmp_path / run / "ckpt.pt", weights_only=False)
        assert saved["iter_num"] == STEPS - 1
        model: dict[str, torch.Tensor] = saved["model"]
        return model

    assert_same_weights(weights("whole"), weights("parted"))


@pytest.mark.parametrize("example", ["ddp", "accelerate"])
def test_a_resume_from_the_last_steps_checkpoint_ends_at_once(tmp_path: Path, example: str) -> None:
    """A run stopped just as it finished (Slurm's time-limit signal on the last step) is
    resumed from its last step's checkpoint: nothing is left to train, and it succeeds."""
    if example == "ddp":
        argv, extra = torchrun("ddp.py", *TOY), {}
    else:
        argv = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu",
                "--num_machines=1", "--num_processes=2", "--mixed_precision=no",
                "--dynamo_backend=no", f"--main_process_port={free_port()}",
                str(EXAMPLES / "accelerate_train.py"), *TOY]  # fmt: skip
        extra = {"ACCELERATE_USE_CPU": "1"}
    whole = launch(argv, gpud_env(tmp_path, GPUD_CHECKPOINT_EVERY="20", **extra))
    assert whole.code == 0, whole.output
    last = tmp_path / "ckpt" / f"step_{STEPS - 1:08d}.pt"
    assert last.exists(), sorted(p.name for p in (tmp_path / "ckpt").iterdir())
    (tmp_path / "final.pt").unlink()
    resumed = launch(argv, gpud_env(tmp_path, GPUD_RESUME_FROM=str(last), **extra))
    assert resumed.code == 0, resumed.output
    assert f"resumed from {last} at step {STEPS}" in resumed.output
    assert f"done: {STEPS} steps" in resumed.output and "none left to train" in resumed.output
    assert LOGGED_STEP.search(resumed.output) is None, "it trained a step past its last"
    assert (tmp_path / "final.pt").exists()
