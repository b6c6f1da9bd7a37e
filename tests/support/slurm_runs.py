"""Slurm runs from tests: a spec for the CPU DDP example, submitting it with gpuctl, and
reading it back from `gpuctl ps` (tests/integration/test_slurm_*.py)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.support.daemons import gpuctl

ROOT = Path(__file__).parents[2]


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
                "args": ["--width", "128", "--depth", "2", "--log-every", "20"],
                "training": {"max_steps": steps, "batch_size_per_gpu": 32},
                "checkpoint": {"every_steps": 50},
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
    deadline = time.monotonic() + timeout
    row = ps(run_id)
    while time.monotonic() < deadline:
        row = ps(run_id)
        if test(row):
            return row
        time.sleep(1.0)
    raise AssertionError(f"{run_id} never got there: {row}")


def run_dir(tmp_path: Path, run_id: str) -> Path:
    return tmp_path / "gpud-runs" / run_id


def with_slurm(**options: Any) -> pytest.MarkDecorator:
    """The test's `slurm` (and `cluster`) with these LocalSlurm options: accounting=True,
    min_job_age_s=2 (slurmctld forgets an ended job within seconds)."""
    label = ",".join(f"{k}={v}" for k, v in options.items())
    return pytest.mark.parametrize("slurm", [options], indirect=True, ids=[label])
