"""A GPU process's Slurm job from its cgroup, as slurmstepd places it (v1 and v2)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpud.slurm.jobs import SlurmJobs, slurm_job_in_cgroup

V1 = """12:memory:/slurm/uid_1000/job_4242/step_0/task_1
11:devices:/slurm/uid_1000/job_4242/step_0
1:name=systemd:/system.slice/slurmd.service
"""
V2 = "0::/system.slice/slurmstepd.scope/job_77/step_batch/user/task_0\n"
V2_AT_JOB = "0::/system.slice/slurmstepd.scope/job_78\n"


@pytest.mark.parametrize(("text", "job"), [(V1, "4242"), (V2, "77"), (V2_AT_JOB, "78")])
def test_the_job_id_comes_from_slurms_cgroup(text: str, job: str) -> None:
    assert slurm_job_in_cgroup(text) == job


@pytest.mark.parametrize(
    "text",
    [
        "0::/user.slice/user-1000.slice/session-3.scope\n",
        "0::/system.slice/docker-job_12.scope\n",  # not a path component of its own
        "0::/kubepods/burstable/pod1/job_x/\n",
        "",
    ],
)
def test_other_cgroups_are_no_job(text: str) -> None:
    assert slurm_job_in_cgroup(text) == ""


def test_a_process_without_slurm_in_its_environment_is_found_by_its_cgroup(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    me = os.getpid()
    (tmp_path / str(me)).mkdir()
    (tmp_path / str(me) / "cgroup").write_text(V2)
    assert SlurmJobs(proc_root=tmp_path).of(me) == "77"
    assert SlurmJobs(proc_root=tmp_path / "nowhere").of(me) == ""  # no cgroup file: no job
