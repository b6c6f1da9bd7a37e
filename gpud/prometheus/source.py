"""What a scrape reads from the daemon: the latest snapshot, this node's runs (their
summaries, node 0's health, which rank runs on which GPU here) and the daemon itself."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import psutil
from prometheus_client.core import Metric

from gpud.prometheus.series import (
    DaemonStats,
    RunOnNode,
    gpu_families,
    host_families,
    run_families,
)
from gpud.snapshot import NodeSnapshot

if TYPE_CHECKING:
    from gpud.runs.supervisor import Supervisor


def runs_on_node(supervisor: Supervisor) -> list[RunOnNode]:
    """Every run this node knows; node 0's with their health, each with its ranks' GPUs."""
    book, telemetry = supervisor.book, supervisor.telemetry
    found = []
    for run in book.runs():
        part = book.current_part(run)
        live = part is not None and not part.record.state.terminal
        ranks: dict[str, int] = {}
        leased = list(part.record.gpu_uuids) if live and part else []
        if live:
            for rank in telemetry.part_health(run, part).ranks:
                # The GPU a rank reported, else the one its local rank indexes in the
                # lease (CUDA_VISIBLE_DEVICES order: cuda:LOCAL_RANK), as torch would use.
                uuid = rank.gpu_uuid
                if not uuid and 0 <= rank.local_rank < len(leased):
                    uuid = leased[rank.local_rank]
                if uuid:
                    ranks.setdefault(uuid, rank.rank)
        training = run.spec.get("training") or {}
        batch = training.get("batch_size_per_gpu")
        found.append(
            RunOnNode(
                summary=book.summary(run),
                health=telemetry.health.get(run.id) if run.is_coordinator else None,
                ranks_by_gpu=ranks,
                gpus=tuple(leased),
                samples_per_rank_step=(
                    batch * (training.get("gradient_accumulation") or 1) if batch else None
                ),
                tokens_per_sample=training.get("seq_len"),
            )
        )
    return found


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


class ScrapeSource:
    """Builds the metric families of one scrape (on the daemon's loop)."""

    def __init__(
        self,
        supervisor: Supervisor,
        snapshot: Callable[[], NodeSnapshot],
        stats: Callable[[], DaemonStats],
    ) -> None:
        self._supervisor = supervisor
        self._snapshot = snapshot
        self._stats = stats
        self._jobs = SlurmJobs()

    def __call__(self) -> Iterator[Metric]:
        snapshot = self._snapshot()
        runs = runs_on_node(self._supervisor)
        yield from gpu_families(snapshot, runs, self._jobs.by_gpu(snapshot))
        yield from run_families(runs)
        yield from host_families(snapshot.host, self._stats())


class DaemonProcess:
    """The daemon's own CPU and memory, for `gpud_daemon_*`."""

    def __init__(self) -> None:
        self._me = psutil.Process()

    def usage(self) -> tuple[float, int]:
        times = self._me.cpu_times()
        return times.user + times.system, self._me.memory_info().rss


__all__ = ["DaemonProcess", "DaemonStats", "ScrapeSource", "runs_on_node"]
