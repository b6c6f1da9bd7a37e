"""Node 0's goodput accounting of its runs (issue 23 §2), fed by the supervisor.

One `GoodputClock` per run this node coordinates: each tick adds the time since the last
to the bucket of the run's state (`gpud.efficiency.goodput`); rank 0's steps, the saves
the trainer reports and health's stalls move time between buckets as they are learnt.
The record rides on the run (`RunRecord.goodput`), stored every `PERSIST_S`, when the run
moves or an attempt takes its first step, and at the run's end, so a restarted daemon
carries on from it and an ended run keeps its figures. The time from the record to this
daemon's start, when no daemon watched the run, is `unwatched`; a run no daemon
accounted (adopted from a release without goodput) has its time before rebuilt from the
metrics the store kept.
"""

from __future__ import annotations

import time

from gpud.efficiency.goodput import Goodput, GoodputClock
from gpud.model.run import HealthSummary, RunRecord
from gpud.runs.state.book import RunBook

#: How often a live run's record is written to the store (and so survives a crash).
PERSIST_S = 10.0


def _state(run: RunRecord) -> str:
    """The run's state as goodput sees it: a launch waiting for its start (its nodes
    joining, its GPUs' preflight) is starting up, not queued."""
    return "starting" if run.awaiting_start else run.state.value


class GoodputKeeper:
    def __init__(
        self, book: RunBook, health: dict[str, HealthSummary], started_at: float | None = None
    ) -> None:
        self.book = book
        #: when this daemon started: a live run's time before it, no daemon watched
        self.started_at = time.time() if started_at is None else started_at
        self.health = health  # node 0's latest health of each run (Telemetry.health)
        self._clocks: dict[str, GoodputClock] = {}
        self._state: dict[str, tuple[str, int]] = {}  # run → (state, attempt) at the last tick
        self._saved: dict[str, float] = {}
        book.on_ended.append(self.ended)

    def _clock(self, run: RunRecord) -> GoodputClock:
        clock = self._clocks.get(run.id)
        if clock is None:
            clock = self._clocks[run.id] = GoodputClock(
                run.goodput or Goodput(until=run.created_at)
            )
            if not run.state.terminal and clock.until < self.started_at:
                # adopted: it went on while no daemon watched; what the store kept of its
                # steps says how far its account can be carried, the rest is unwatched
                span = self.book.store.step_span(run.id, run.attempt, self.started_at)
                if span is not None:
                    clock.before_watched(run.attempt, *span)
                clock.unwatched(run.attempt, self.started_at)
        if not run.state.terminal:
            clock.reopen(run.state_since)  # resumed after it ended
        return clock

    def tick(self, now: float) -> None:
        for run in self.book.ticked():
            if not run.is_coordinator or run.state.terminal:
                continue
            clock = self._clock(run)
            state = (_state(run), run.attempt)
            clock.advance(now, *state, run.next_restart_at is not None)
            moved = self._state.get(run.id) != state
            self._state[run.id] = state
            health = self.health.get(run.id)
            if health is not None and health.stall is not None and health.attempt == run.attempt:
                clock.stall(run.attempt, health.stall.stuck_for_s)
            if moved or now - self._saved.get(run.id, 0.0) >= PERSIST_S:
                self._save(run.id, clock, now)

    def stepped(self, run: RunRecord, attempt: int, step: int, now: float) -> None:
        if not run.is_coordinator or attempt != run.attempt:
            return
        clock = self._clock(run)
        first = clock.first_step(attempt) is None
        clock.stepped(attempt, step, now)
        if first and attempt > 1:
            part = self.book.current_part(run)
            resume = part.record.resume_step if part else None
            if resume is None and part is not None and part.record.resume_from and step > 0:
                # A script that knows nothing of gpud resumed from a checkpoint whose step
                # nobody reported: its first step says where that checkpoint left it.
                resume = step - 1
                self.book.update_part(part, resume_step=resume)
            clock.next_attempt(attempt, resume)
        if first:
            self._save(run.id, clock, now)

    def checkpointed(self, run: RunRecord, attempt: int, seconds: float) -> None:
        if run.is_coordinator and attempt == run.attempt:
            self._clock(run).checkpointed(attempt, seconds)

    def ended(self, run: RunRecord) -> None:
        if not run.is_coordinator:
            return
        clock = self._clock(run)
        state, attempt = self._state.pop(run.id, (_state(run), run.attempt))
        clock.end(run.state_since, state, attempt)
        self._clocks.pop(run.id, None)
        self._saved.pop(run.id, None)
        self.book.update(run.id, goodput=clock.record())

    def forget(self, run_id: str) -> None:
        for held in (self._clocks, self._state, self._saved):
            held.pop(run_id, None)

    def of(self, run: RunRecord, now: float) -> Goodput | None:
        """The run's accounting now: the live clock's, else what the record kept."""
        clock = self._clocks.get(run.id)
        if clock is None:
            return run.goodput
        now_clock = GoodputClock(clock.record())
        state, attempt = self._state.get(run.id, (_state(run), run.attempt))
        now_clock.advance(now, state, attempt, run.next_restart_at is not None)
        return now_clock.record()

    def _save(self, run_id: str, clock: GoodputClock, now: float) -> None:
        self._saved[run_id] = now
        if self.book.get(run_id) is not None:
            self.book.update(run_id, goodput=clock.record())
