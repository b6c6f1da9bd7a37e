"""The batch script `gpuctl launch --slurm` renders: sbatch directives from the spec's
`slurm:` section, signals turned into gpud's stop, and nothing unquoted from the spec."""

from __future__ import annotations

import pytest

from launch.sections import SpecError
from launch.slurm import SlurmScriptError, render
from launch.spec import RunSpec, parse_spec

BASE = {"name": "llm", "script": "train.py", "workdir": "/shared/llm", "gpus": 8}


def spec(**slurm: object) -> RunSpec:
    return parse_spec({**BASE, "slurm": slurm})


def sbatch_flags(script: str) -> list[str]:
    return [line.removeprefix("#SBATCH ") for line in script.splitlines() if "#SBATCH" in line]


def test_the_allocation_comes_from_the_slurm_section() -> None:
    script = render(
        spec(partition="gpu", account="proj-1", qos="high", time="1-00:00", nodes=4,
             cpus_per_task=32, mem="512G", constraint="h100&ib", exclusive=True,
             extra=["--reservation=maint"], requeue=True, signal_before_s=300),
        "llm-abc123", "/shared/llm/gpud-runs/llm-abc123", "/opt/venv/bin/python",
    )  # fmt: skip
    assert sbatch_flags(script) == [
        "--job-name=llm", "--nodes=4", "--ntasks-per-node=1", "--gpus-per-node=8",
        "--cpus-per-task=32", "--partition=gpu", "--account=proj-1", "--qos=high",
        "--time=1-00:00", "--mem=512G", "--constraint=h100&ib", "--exclusive",
        "--signal=B:USR1@300", "--requeue", "--open-mode=append",
        "--output=/shared/llm/gpud-runs/llm-abc123/slurm-%j.out", "--reservation=maint",
    ]  # fmt: skip
    assert script.startswith("#!/bin/bash\n")
    assert "srun --ntasks-per-node=1 --kill-on-bad-exit=1 /opt/venv/bin/python -m " in script
    assert "scontrol requeue" in script


def test_defaults_ask_for_one_node_and_the_specs_gpus_and_never_requeue() -> None:
    flags = sbatch_flags(render(spec(), "llm-1", "/shared/r", "/usr/bin/python3"))
    assert "--nodes=1" in flags and "--gpus-per-node=8" in flags
    assert "--no-requeue" in flags and "--signal=B:USR1@120" in flags


@pytest.mark.parametrize(
    ("slurm", "error"),
    [
        ({"time": "2h"}, "is not a Slurm time"),
        ({"partition": "gpu; rm -rf /"}, "slurm.partition"),
        ({"extra": ["--x=1\n#SBATCH --y"]}, "one `--flag[=value]`"),
        ({"extra": ["-p gpu"]}, "one `--flag[=value]`"),
        ({"mem": "lots"}, "slurm.mem"),
        ({"nodes": 0}, "slurm.nodes"),
    ],
)
def test_bad_slurm_settings_are_refused_with_what_to_fix(
    slurm: dict[str, object], error: str
) -> None:
    with pytest.raises(SpecError) as refused:
        spec(**slurm)
    assert error in str(refused.value)


def test_paths_that_a_shell_would_split_are_refused() -> None:
    with pytest.raises(SlurmScriptError, match="absolute path without spaces"):
        render(spec(), "llm-1", "/shared/my runs/x", "/usr/bin/python3")
    with pytest.raises(SlurmScriptError, match="absolute path without spaces"):
        render(spec(), "llm-1", "relative/x", "/usr/bin/python3")
