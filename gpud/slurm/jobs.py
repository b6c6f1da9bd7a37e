"""Which Slurm job a process on this node belongs to: for `/metrics`' `hpc_job`, and for
naming who holds a busy GPU."""

from __future__ import annotations

import contextlib
import re
from pathlib import Path

import psutil

from gpud.snapshot import NodeSnapshot

#: Processes remembered at most (each costs a few bytes; reading one again costs ~50 µs).
MAX_REMEMBERED = 4096
#: A Slurm job's cgroup, v1 (`/slurm/uid_1000/job_1234/step_0`) or v2
#: (`/system.slice/slurmstepd.scope/job_1234/step_0/user/task_0`).
SLURM_CGROUP = re.compile(r"/job_(\d+)(?:/|$)")


def slurm_job_in_cgroup(text: str) -> str:
    """The Slurm job id in a `/proc/PID/cgroup` file's text, else ""."""
    for line in text.splitlines():
        found = SLURM_CGROUP.search(line.rpartition(":")[2])
        if found:
            return found[1]
    return ""


class SlurmJobs:
    """The Slurm job of each process on a GPU: its environment's `SLURM_JOB_ID`, else its
    cgroup (readable for another user's process, whose environment is not). Read once per
    process: a scrape costs no more for it after the first."""

    def __init__(self, proc_root: Path = Path("/proc")) -> None:
        self._known: dict[tuple[int, float], str] = {}
        self._proc = proc_root

    def of(self, pid: int) -> str:
        try:
            proc = psutil.Process(pid)
            key = (pid, proc.create_time())
        except psutil.Error:  # gone
            return ""
        if key not in self._known:
            if len(self._known) >= MAX_REMEMBERED:
                self._known.clear()  # a long-lived daemon sees many processes come and go
            job = ""
            with contextlib.suppress(psutil.Error):  # another user's: no environment
                job = proc.environ().get("SLURM_JOB_ID", "")
            if not job:
                with contextlib.suppress(OSError):
                    job = slurm_job_in_cgroup((self._proc / str(pid) / "cgroup").read_text())
            self._known[key] = job
        return self._known[key]

    def by_gpu(self, snapshot: NodeSnapshot) -> dict[int, str]:
        found: dict[int, str] = {}
        live: set[int] = set()
        for gpu in snapshot.gpus:
            for proc in gpu.processes or []:
                live.add(proc.pid)
                job = self.of(proc.pid)
                if job:
                    found.setdefault(gpu.index, job)
        self._known = {k: v for k, v in self._known.items() if k[0] in live}
        return found


def slurm_compute_node() -> bool:
    """Whether this host is a Slurm compute node: a slurmd runs here."""
    return any(proc.info.get("name") == "slurmd" for proc in psutil.process_iter(["name"]))
