"""A save cut short by a full disk is never resumed from (issue 32 §5).

A plain script (no trainers library) saves `step_N.pt` every 10 steps into its out dir,
a 3 MB tmpfs of its own (`tests/support/disk.py`): the saves at steps 10 and 20 fit, the
one at 30 runs out of room. torch's zip writer fails mid-archive and leaves a truncated
`step_30.pt`, the newest match of `resume.pattern`. The cause is the full disk, class
`environment`, with its hint; once the disk has room, `gpuctl resume` passes over the
truncated file, saying so, and starts from `step_20.pt`; the run then finishes.
Before: the cause had no hint, and the resume started from the truncated file and failed
with `PytorchStreamReader failed reading zip archive`.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gpud.model.run import CauseKind, RunState
from tests.support.daemons import RunningDaemon, gpuctl
from tests.support.disk import small_disk
from tests.support.runs import launch, nothing_left, script_spec, wait_for

pytestmark = [pytest.mark.faults, pytest.mark.slow]

SAVES = """
import os, sys
import torch
out = sys.argv[1]
start = 0
resume = os.environ.get("GPUD_RESUME_FROM")
if resume:
    start = torch.load(resume)["step"]
    print(f"resumed from {resume} at step {start}", flush=True)
pad = torch.zeros(300_000)  # 1.2 MB a save: two fit on the 3 MB disk, not three
for step in range(start, 40):
    print(f"step {step} loss {1 / (step + 1):.4f}", flush=True)
    if step % 10 == 9:
        torch.save({"step": step + 1, "pad": pad}, f"{out}/step_{step + 1}.pt")
print("done", flush=True)
"""


def test_a_save_cut_short_by_a_full_disk_is_passed_over_on_resume(
    daemon: RunningDaemon, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    with small_disk(out, "3m") as disk:
        spec = script_spec(tmp_path, SAVES, name="saves", args=(str(out),))
        spec.write_text(
            spec.read_text()
            + f"checkpoint: {{dir: {out}}}\n"
            + "resume: {pattern: 'step_*.pt', latest: newest}\n"
            + 'metrics: [{pattern: "step (?P<step>\\\\d+) loss (?P<loss>[\\\\d.]+)"}]\n'
        )
        run_id = launch(daemon, config=spec)
        failed = wait_for(daemon, run_id, {"failed", "succeeded"}, timeout=120)
        assert failed.run.state is RunState.FAILED, failed.run.reason
        cause = failed.run.cause
        assert cause is not None and cause.kind is CauseKind.ENVIRONMENT, cause
        assert cause.hint is not None and cause.hint.startswith(
            f"the disk of {out} is full: free space there"
        ), cause.hint
        truncated = out / "step_30.pt"
        assert truncated.exists() and (out / "step_20.pt").exists()

        disk.grow("20m")  # room again: a bigger volume, or other files deleted
        resumed = gpuctl("--node", daemon.address, "resume", run_id)
        assert resumed.returncode == 0, resumed.stderr
        said = (
            f"passed over {truncated}: cut short: a zip archive without its central"
            f" directory ({truncated.stat().st_size:,} bytes)"
        )
        assert f"from {out / 'step_20.pt'}" in resumed.stdout + resumed.stderr, resumed
        assert said in resumed.stdout + resumed.stderr, resumed
        ended = wait_for(daemon, run_id, {"failed", "succeeded"}, timeout=120)
        assert ended.run.state is RunState.SUCCEEDED, ended.run.reason
        second = ended.attempts[-1]
        assert second.resume_from == str(out / "step_20.pt")
        assert any(said in e.message for e in ended.events), [e.message for e in ended.events]
        log = Path(second.attempt_dir, "output.log").read_text()
        assert f"resumed from {out / 'step_20.pt'} at step 20" in log
        nothing_left(run_id)
