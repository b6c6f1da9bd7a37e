"""What a scrape reads from the daemon: the latest snapshot, this node's runs (their
summaries, node 0's health, which rank runs on which GPU here) and the daemon itself."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import psutil
from prometheus_client.core import Metric

from gpud.model.run import samples_per_rank_step
from gpud.model.snapshot import NodeSnapshot
from gpud.prometheus.series import (
    DaemonStats,
    RunOnNode,
    gpu_families,
    hold_families,
    host_families,
    run_families,
)
from gpud.slurm.jobs import SlurmJobs

if TYPE_CHECKING:
    from gpud.runs.lifecycle.supervisor import Supervisor


def runs_on_node(supervisor: Supervisor) -> list[RunOnNode]:
    """Every run this node knows; node 0's with their health, each with its ranks' GPUs."""
    book, telemetry = supervisor.book, supervisor.telemetry
    now = book.clock()
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
        found.append(
            RunOnNode(
                summary=book.summary(run),
                health=telemetry.health.get(run.id) if run.is_coordinator else None,
                ranks_by_gpu=ranks,
                gpus=tuple(leased),
                samples_per_rank_step=samples_per_rank_step(training),
                tokens_per_sample=training.get("seq_len"),
                goodput=supervisor.goodput.of(run, now) if run.is_coordinator else None,
            )
        )
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
        yield from hold_families(snapshot)
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
