"""Real Hugging Face `Trainer` and real Lightning scripts under gpud (issue 32 §2, §3):
unmodified, they show their step and loss with no pattern in the spec; with the one
callback line they get heartbeats from every rank, FLOPs counted on the first step,
checkpoint events and the stop handshake, and resume from the stop's checkpoint.

Each is `tests/support/frameworks/*_plain.py`: a tiny model built from a config, random
tokens, two ranks under torchrun on gloo; nothing is downloaded.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from gpud.checkpoints.whole import broken
from gpud.model.run import RankView
from tests.support.daemons import RunningDaemon, gpuctl
from tests.support.frameworks import script, with_callback
from tests.support.runs import force_stop, health, launch, status, wait_for
from tests.support.waiting import until

pytestmark = pytest.mark.slow

pytest.importorskip("transformers", reason="the dev extra installs transformers")
pytest.importorskip("lightning", reason="the dev extra installs lightning")

#: What each framework calls the checkpoints it writes on its own, and the stop's.
SAVED = {"hf": r"/checkpoint-(\d+)$", "lightning": r"/epoch=0-step=(\d+)\.ckpt$"}
#: The stop's checkpoint. A stop agreed on at a step where Lightning's ModelCheckpoint also
#: saves (every 10th here; it runs after the callback) is saved twice, and the second one,
#: the framework's own of the very same step, is the one reported: either resumes alike.
STOP_SAVED = {"hf": r"/checkpoint-(\d+)$", "lightning": r"/(?:stop-step|epoch=0-step)=(\d+)\.ckpt$"}


def framework_spec(tmp_path: Path, kind: str, text: str, *args: str) -> Path:
    (tmp_path / f"{kind}_train.py").write_text(text)  # (not lightning.py: the package)
    spec = tmp_path / f"{kind}.yaml"
    spec.write_text(
        f"name: {kind}\nlauncher: torchrun\nnproc_per_node: 2\nbackend: gloo\n"
        f"workdir: {tmp_path}\nscript: {kind}_train.py\nargs: {json.dumps(list(args))}\n"
        "stop_grace_s: 30\n"
    )
    return spec


def ps_row(daemon: RunningDaemon, run_id: str) -> dict[str, object]:
    done = gpuctl("--node", daemon.address, "--json", "ps")
    return next(r for r in json.loads(done.stdout)["runs"] if r["id"] == run_id)


def test_a_plain_trainer_script_shows_its_step_and_loss(
    daemon: RunningDaemon, tmp_path: Path
) -> None:
    """A Trainer script as its users write it: its logged loss and the progress bar's step
    reach `ps` while it trains, however torchrun cut its lines."""
    spec = framework_spec(tmp_path, "hf", script("hf"), "--max_steps", "100000",
                          "--logging_steps", "5", "--step_s", "0.05")  # fmt: skip
    run_id = launch(daemon, config=spec)
    try:

        def losses_logged() -> dict[str, object] | None:
            row = ps_row(daemon, run_id)
            values = row.get("last_values") or {}
            step = row.get("last_step")
            assert isinstance(values, dict)
            return row if values.get("loss") and isinstance(step, int) and step >= 14 else None

        row = until("ps shows a loss past step 15", losses_logged, timeout=120)
        logged = gpuctl("--node", daemon.address, "logs", run_id).stdout
        losses = {float(v) for v in re.findall(r"\{'loss': '([\d.]+)'", logged)}
        values = row["last_values"]
        assert isinstance(values, dict) and values["loss"] in losses, (values, losses)
        assert values["epoch"] > 0 and "lr" in values and "grad_norm" in values
        # between two logged losses the bar's rate moves the step: the loss stays shown
        later = until("ps moves on", lambda: (r := ps_row(daemon, run_id))["last_step"]
                      > row["last_step"] and r, timeout=60)  # fmt: skip
        assert "loss" in later["last_values"]
        events = [e.message for e in status(daemon, run_id).events]
        assert "metrics: auto: reading hf-trainer output" in events, events
    finally:
        force_stop(daemon, run_id)


def test_a_plain_lightning_script_shows_its_step_and_loss(
    daemon: RunningDaemon, tmp_path: Path
) -> None:
    """Lightning draws rich's bar where rich is installed (as it is beside gpud), and rich
    prints it only at the end where output is not a terminal: the run's last step and
    loss, read from that line."""
    spec = framework_spec(tmp_path, "lightning", script("lightning"), "--max_steps", "30")
    run_id = launch(daemon, config=spec)
    try:
        done = wait_for(daemon, run_id, {"succeeded", "failed"}, timeout=180)
        assert done.run.state.value == "succeeded", done.run.reason
        row = ps_row(daemon, run_id)
        assert row["last_step"] == 29, row
        values = row["last_values"]
        assert isinstance(values, dict) and 0 < values["loss"] < 10, values
        events = [e.message for e in status(daemon, run_id).events]
        assert "metrics: auto: reading lightning output" in events, events
    finally:
        force_stop(daemon, run_id)


@pytest.mark.parametrize("kind", ["hf", "lightning"])
def test_the_callback_gives_heartbeats_flops_checkpoints_and_a_stop_to_resume_from(
    daemon: RunningDaemon, tmp_path: Path, kind: str
) -> None:
    spec = framework_spec(tmp_path, kind, with_callback(kind), "--max_steps", "100000",
                          "--save_steps", "10", "--step_s", "0.05")  # fmt: skip
    run_id = launch(daemon, config=spec)
    try:
        # every rank beats, and counted its first step's FLOPs
        def both_counted() -> list[RankView] | None:
            ranks = health(daemon, run_id).ranks
            ok = len(ranks) == 2 and all(
                r.last_step is not None and r.last_step >= 10 and r.flops_per_step for r in ranks
            )
            return ranks if ok else None

        ranks = until("heartbeats with FLOPs from both ranks", both_counted, timeout=120)
        assert {r.rank for r in ranks} == {0, 1}
        found = until("a FLOP rate", lambda: (s := status(daemon, run_id)).flops
                      and s.flops.flops_per_second and s, timeout=30)  # fmt: skip
        assert found.flops is not None and found.flops.source == "counted"
        # the framework's own checkpoint, reported with its step
        saved = until("a checkpoint", lambda: status(daemon, run_id).run.last_checkpoint,
                      timeout=60)  # fmt: skip
        number = re.search(SAVED[kind], saved.path)
        assert number, saved.path
        assert saved.step == int(number[1]) - 1 and not broken(Path(saved.path))
        row = ps_row(daemon, run_id)
        assert isinstance(row["last_values"], dict) and "loss" in row["last_values"], row

        stop = gpuctl("--node", daemon.address, "stop", run_id)
        assert stop.returncode == 0, stop.stderr
        stopped = wait_for(daemon, run_id, {"stopped", "failed"}, timeout=90)
        assert stopped.run.state.value == "stopped", stopped.run.reason
        checkpoint = stopped.run.last_checkpoint
        assert checkpoint is not None and checkpoint.step is not None
        number = re.search(STOP_SAVED[kind], checkpoint.path)
        assert number and int(number[1]) == checkpoint.step + 1, checkpoint  # the stop's step
        if kind == "lightning" and "stop-step" not in checkpoint.path:
            assert int(number[1]) % 10 == 0, checkpoint  # ModelCheckpoint's, at the stop's step
        assert not broken(Path(checkpoint.path))
        events = " | ".join(e.message for e in stopped.events)
        assert "SIGKILL" not in events, events  # the ranks left on their own
        at = checkpoint.step
        assert isinstance(at, int) and at >= saved.step

        resume = gpuctl("--node", daemon.address, "resume", run_id)
        assert resume.returncode == 0, resume.stderr

        def resumed() -> int | None:
            s = status(daemon, run_id)
            step = s.run.last_step
            return step if s.run.attempt == 2 and step is not None and step > at else None

        until("attempt 2 trains past the stop's step", resumed, timeout=120)
        attempt_2 = json.loads(gpuctl("--node", daemon.address, "--json", "metrics", run_id,
                                      "--name", "lr").stdout)  # fmt: skip
        firsts = [r["step"] for r in attempt_2["rows"] if r["attempt"] == 2]
        assert firsts and min(firsts) == at + 1, (at, firsts[:5])  # from the stop's step on
    finally:
        force_stop(daemon, run_id)
