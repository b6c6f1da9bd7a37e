"""Hangs: a run that health has called stalled for its `restart.hang_timeout_s` is stopped
as hung (a `hang` cause), once per attempt; the gang restarts it where its spec says so.

A run gpud did not start (attached) is never stopped: its health says stalled, no more.
"""

from __future__ import annotations

import logging

from gpud.model.run import CauseKind, FailureCause, RunState
from gpud.runs.health.telemetry import Telemetry
from gpud.runs.multinode.gang import Gang
from gpud.runs.state.book import RunBook

log = logging.getLogger("gpud.runs")


class HangWatch:
    def __init__(self, book: RunBook, telemetry: Telemetry, gang: Gang) -> None:
        self.book = book
        self.telemetry = telemetry
        self.gang = gang
        self._stopped: dict[str, int] = {}  # run → the attempt already stopped as hung

    def forget(self, run_id: str) -> None:
        self._stopped.pop(run_id, None)

    def check(self, now: float) -> None:
        for run in self.book.ticked():
            health = self.telemetry.health.get(run.id)
            if health is None or health.stall is None:
                continue
            run_id, stall = run.id, health.stall
            if self._stopped.get(run_id) == health.attempt:
                continue
            if run.state is not RunState.RUNNING or run.attempt != health.attempt:
                continue
            if run.attached is not None:
                continue  # gpud never stops what it did not start: the health says stalled
            timeout = self.book.spec(run).restart.hang_timeout_s
            if timeout is None or stall.stuck_for_s < timeout:
                continue
            self._stopped[run_id] = health.attempt
            who = f"rank {stall.rank}" if stall.rank is not None else "every rank"
            cause = FailureCause(
                kind=CauseKind.HANG,
                summary=f"stalled for {stall.stuck_for_s:.0f}s"
                f" (restart.hang_timeout_s {timeout:g}): {stall.why}",
                rank=stall.rank,
                source="health",
                attempt=run.attempt,
                time=now,
            )
            log.warning("run %s: %s made no progress: a hang", run_id, who)
            self.gang.hang(run, cause)
