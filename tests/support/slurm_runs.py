"""Slurm runs from tests: a spec for the CPU DDP example, submitting it with gpuctl, and
reading it back from `gpuctl ps` (tests/integration/test_slurm_*.py)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from launch.gpuctl import slurm_jobs
from launch.gpuctl.slurm_verbs import summaries
from tests.support.daemons import gpuctl

ROOT = Path(__file__).parents[2]
#: The least time a step of these runs takes.
STEP_MS = 100


def write_spec(tmp_path: Path, name: str, *, steps: int, **slurm: Any) -> Path:
    spec = tmp_path / f"{name}.yaml"
    settings = {"nodes": 2, "time": "00:10:00", **slurm}
    spec.write_text(
        json.dumps(  # YAML is a superset of JSON
            {
                "name": name,
                "launcher": "torchrun",
                "nproc_per_node": 1,
                "backend": "gloo",
                "workdir": str(tmp_path),
                "script": str(ROOT / "trainers" / "examples" / "ddp.py"),
                # Paced at 100 ms a step (tests/support/runs.py's FAST): 10 steps a second
                # whatever else the machine runs.
                "args": [
                    *("--width", "128", "--depth", "2"),
                    *("--log-every", "20", "--step-ms", str(STEP_MS)),
                ],
                "training": {"max_steps": steps, "batch_size_per_gpu": 32},
                "checkpoint": {"every_steps": 20},
                "slurm": settings,
            }
        )
    )
    return spec


def submit(spec: Path) -> tuple[str, str]:
    done = gpuctl("--json", "launch", str(spec))
    assert done.returncode == 0, done.stderr
    run = json.loads(done.stdout)["run"]
    return str(run["id"]), str(run["slurm_job"])


def ps(run_id: str) -> dict[str, Any]:
    done = gpuctl("--json", "ps")
    assert done.returncode == 0, done.stderr
    return next(r for r in json.loads(done.stdout)["runs"] if r["id"] == run_id)


def wait_until(
    run_id: str, test: Callable[[dict[str, Any]], bool], timeout: float = 120
) -> dict[str, Any]:
    """`gpuctl ps`'s row of the run once `test` holds for it. Watched in this process with
    the code `gpuctl ps` runs (every 0.1 s; a gpuctl process costs ~0.7 s of CPU), then
    read from a real `gpuctl --json ps`."""
    deadline = time.monotonic() + timeout
    row: dict[str, Any] = {}
    while time.monotonic() < deadline:
        slurm_jobs.accounting.cache_clear()  # what one gpuctl call asks once, as gpuctl does
        seen = [r for r in summaries(active=False) if r.id == run_id]
        row = seen[0].model_dump(mode="json") if seen else row
        if row and test(row) and test(row := ps(run_id)):
            return row
        time.sleep(0.1)
    raise AssertionError(f"{run_id} never got there: {row}")


def run_dir(tmp_path: Path, run_id: str) -> Path:
    return tmp_path / "gpud-runs" / run_id


def job_output(tmp_path: Path, run_id: str, tail: int = 3000) -> str:
    """The end of the job's output (every run of it: the file is appended to), and how each
    run ended by its batch script, for a failing test's message."""
    found = sorted(run_dir(tmp_path, run_id).glob("slurm-*.out"))
    text = found[-1].read_text(errors="replace")[-tail:] if found else "(no slurm-*.out)"
    ends = run_dir(tmp_path, run_id) / "ends.jsonl"
    return text + "\nends: " + (ends.read_text() if ends.exists() else "(none)")


def with_slurm(**options: Any) -> pytest.MarkDecorator:
    """The test's `slurm` (and `cluster`) with these LocalSlurm options: accounting=True,
    min_job_age_s=2 (slurmctld forgets an ended job within seconds)."""
    label = ",".join(f"{k}={v}" for k, v in options.items())
    return pytest.mark.parametrize("slurm", [options], indirect=True, ids=[label])
