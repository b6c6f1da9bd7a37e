"""Which Slurm job a process on this node belongs to: for `/metrics`' `hpc_job`, and for
naming who holds a busy GPU."""

from __future__ import annotations

import contextlib
import os
import re
from pathlib import Path

import psutil

from gpud.model.snapshot import NodeSnapshot

#: Processes remembered at most (each costs a few bytes; reading one again costs ~50 µs).
MAX_REMEMBERED = 4096
#: Where slurmd and Slurm's commands read their config without `-f` or SLURM_CONF (Debian's,
#: and the default of Slurm's own builds with --sysconfdir=/etc/slurm).
DEFAULT_SLURM_CONF = Path("/etc/slurm/slurm.conf")
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
    """Whether this host is a compute node of the Slurm cluster this daemon belongs to: a
    slurmd runs here that reads the config Slurm's commands read here (SLURM_CONF, else
    the default). A slurmd of another config, such as a test cluster on a developer's box,
    is not this daemon's; one whose config cannot be told counts."""
    ours = os.path.realpath(os.environ.get("SLURM_CONF") or DEFAULT_SLURM_CONF)
    for proc in psutil.process_iter(["name"]):
        if proc.info.get("name") != "slurmd":
            continue
        try:
            conf = slurmd_conf(proc)
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            continue  # gone, or dead and not yet reaped: no slurmd of any cluster
        if conf is None or os.path.realpath(conf) == ours:
            return True
    return False


def slurmd_conf(proc: psutil.Process) -> Path | None:
    """The config a slurmd reads: its `-f`, else its SLURM_CONF, else the default; None
    where that cannot be read (another user's environment). Raises psutil.NoSuchProcess
    for a process that is gone."""
    try:
        args = proc.cmdline()
        for i, arg in enumerate(args[1:], start=1):
            if arg == "-f" and i + 1 < len(args):
                return Path(args[i + 1])
            if arg.startswith("-f") and len(arg) > 2:
                return Path(arg[2:])
        return Path(proc.environ().get("SLURM_CONF") or DEFAULT_SLURM_CONF)
    except psutil.AccessDenied:
        return None
