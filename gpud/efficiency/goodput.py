"""Goodput (issue 23 §2): where every second of a run's wall time went.

Node 0 keeps one `Goodput` record per run. Each tick adds the seconds since the last one
to the bucket the run is in now (`bucket_of`), so the buckets add up to the wall time by
construction, from the run's creation to its end. Two kinds of time are only known after
the fact, and are moved out of `training` when they are:

- **checkpointing**: the trainer reports how long a save took (`checkpoint_saved`);
- **stalled**: health says a run has made no progress for N seconds; those N seconds,
  counted as training while they passed, move to `stalled`, and it stays there until a
  step comes again (or the hang is stopped);
- **lost**: after a restart from a checkpoint older than the attempt's last step, the
  steps done again: (last step − resume step) × that attempt's seconds per step.

A daemon that starts while its runs go on (an upgrade, a restart, a crash) carries the
account on from its record, as far as the steps the store kept go (training to the last
of them; a run no daemon accounted, from a release without goodput, starting up to its
first: `GoodputClock.before_watched`); the rest, to the daemon's start, is
**unwatched**, its own bucket.

Goodput is `training` (less all of the above) over the wall time, per run and per
attempt. Pure: the daemon's `gpud.runs.health.goodput` feeds it; nothing here does I/O.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from enum import Enum

from pydantic import Field

from gpud.model.snapshot import Reading


class Bucket(str, Enum):
    QUEUED = "queued"
    STARTING = "starting"  # launch through the first step, preflight included
    TRAINING = "training"
    CHECKPOINTING = "checkpointing"
    STALLED = "stalled"  # no progress: stalled or hung
    STOPPING = "stopping"
    RESTARTING = "restarting"  # a failure to the next attempt's first step
    LOST = "lost"  # steps done again after a restart from an older checkpoint
    # no daemon watched the run (gpud was stopped, upgraded or crashed while it ran on
    # under its shim): nothing says how that time went
    UNWATCHED = "unwatched"


#: The order the buckets are shown in.
BUCKETS = tuple(Bucket)


class AttemptGoodput(Reading):
    """One attempt's seconds by bucket, and the steps it made."""

    attempt: int = Field(ge=1)
    seconds: dict[str, float] = Field(default_factory=dict, description="bucket → seconds")
    first_step: int | None = Field(None, description="the first step it finished")
    last_step: int | None = Field(None, description="the last step it finished")
    first_step_at: float | None = Field(None, description="when it finished its first step")
    resume_step: int | None = Field(None, description="the checkpoint step it resumed from")
    running_unstepped_s: float = Field(
        0.0, description="seconds it was running before its first step (or with none)"
    )
    unstepped: bool = Field(
        False,
        description="it ended with no step seen (a script without the trainers library or"
        " metrics patterns): its running time was counted as training",
    )

    @property
    def wall_s(self) -> float:
        return sum(self.seconds.values())

    @property
    def ratio(self) -> float | None:
        wall = self.wall_s
        return self.seconds.get(Bucket.TRAINING.value, 0.0) / wall if wall > 0 else None


class Goodput(Reading):
    """A run's accounted time (node 0's), up to `until`."""

    until: float = Field(description="unix time accounted up to")
    attempts: list[AttemptGoodput] = Field(default_factory=list)
    stalled: bool = Field(False, description="the time now passing is stalled time")
    ended: bool = Field(False, description="the run ended: nothing more is added")

    @property
    def seconds(self) -> dict[str, float]:
        """Seconds by bucket over every attempt, every bucket present, in `BUCKETS` order."""
        total = {b.value: 0.0 for b in BUCKETS}
        for a in self.attempts:
            for name, s in a.seconds.items():
                total[name] = total.get(name, 0.0) + s
        return total

    @property
    def wall_s(self) -> float:
        return sum(a.wall_s for a in self.attempts)

    @property
    def ratio(self) -> float | None:
        """Training time (less lost work) over wall time; None before any time passed."""
        wall = self.wall_s
        return self.seconds[Bucket.TRAINING.value] / wall if wall > 0 else None

    def carried_to(self, now: float, state: str, attempt: int, stepped: bool) -> Goodput:
        """This account carried on to `now` while the run is in `state`, as node 0 will
        count it: a viewer's live reading between the records node 0 stores (when the run
        moves, at each attempt's first step). `stepped`: the attempt has made a step."""
        if self.ended or now <= self.until:
            return self
        last = self.attempts[-1] if self.attempts else None
        current = last if last is not None and last.attempt == attempt else None
        stepped = stepped or (current is not None and current.first_step is not None)
        bucket = bucket_of(state, attempt, stepped, self.stalled)
        if bucket is None:
            return self
        seconds = dict(current.seconds) if current is not None else {}
        seconds[bucket.value] = seconds.get(bucket.value, 0.0) + (now - self.until)
        if current is not None:
            attempts = [*self.attempts[:-1], current.model_copy(update={"seconds": seconds})]
        else:
            attempts = [*self.attempts, AttemptGoodput(attempt=attempt, seconds=seconds)]
        return self.model_copy(update={"until": now, "attempts": attempts})

    def line(self, width: int = 20) -> str:
        """`goodput 72% [███▒▒░░…] training 7m12s · starting 41s · …` for `gpuctl status`."""
        ratio = self.ratio
        if ratio is None:
            return "n/a (no time accounted yet)"
        seconds = self.seconds
        wall = self.wall_s
        shown = [(b, seconds[b.value]) for b in BUCKETS if seconds[b.value] >= 0.05]
        bar = "".join(
            _GLYPH[b] * round(s / wall * width) for b, s in shown if round(s / wall * width)
        )
        parts = " · ".join(f"{b.value} {duration(s)}" for b, s in shown)
        line = f"{ratio * 100:.0f}% [{bar[:width]:<{width}}] {parts} (wall {duration(wall)})"
        if any(a.unstepped for a in self.attempts):
            line += "; no steps seen: running counted as training"
        return line


_GLYPH = {
    Bucket.TRAINING: "█",
    Bucket.CHECKPOINTING: "▓",
    Bucket.QUEUED: "·",
    Bucket.STARTING: "░",
    Bucket.RESTARTING: "▒",
    Bucket.STALLED: "!",
    Bucket.STOPPING: "-",
    Bucket.LOST: "x",
    Bucket.UNWATCHED: "?",
}


def duration(seconds: float) -> str:
    """12.3s, 7m12s, 3h05m."""
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, s = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m{s:02d}s"
    hours, m = divmod(minutes, 60)
    return f"{hours}h{m:02d}m"


def bucket_of(
    state: str, attempt: int, stepped: bool, stalled: bool, restart_due: bool = False
) -> Bucket | None:
    """The bucket a run in `state` is in now (None: ended, nothing to add).

    `stepped`: the attempt has finished a step; `stalled`: health says it makes no
    progress; `restart_due`: it failed and waits for its next attempt. Before the first
    step, attempt 1 is starting and any later one restarting."""
    first = Bucket.STARTING if attempt <= 1 else Bucket.RESTARTING
    if state == "queued":
        return Bucket.QUEUED
    if state == "pending":
        return Bucket.RESTARTING if restart_due else first
    if state == "starting":
        return first
    if state == "running":
        if not stepped:
            return first
        return Bucket.STALLED if stalled else Bucket.TRAINING
    if state == "stopping":
        return Bucket.STOPPING
    return None


@dataclass
class _Attempt:
    attempt: int
    seconds: dict[str, float] = field(default_factory=dict)
    first_step: int | None = None
    last_step: int | None = None
    first_step_at: float | None = None
    resume_step: int | None = None
    running_unstepped_s: float = 0.0
    unstepped: bool = False


class GoodputClock:
    """The accounting of one run: `advance` each tick, `stepped`, `checkpointed`,
    `stall`, `next_attempt` as they happen; `record()` is the `Goodput` so far."""

    def __init__(self, record: Goodput) -> None:
        self.until = record.until
        self.stalled = record.stalled
        self.ended = record.ended
        self._attempts = [_Attempt(**a.model_dump()) for a in record.attempts]

    def record(self) -> Goodput:
        return Goodput(
            until=self.until,
            attempts=[AttemptGoodput(**asdict(a)) for a in self._attempts],
            stalled=self.stalled,
            ended=self.ended,
        )

    def _attempt(self, attempt: int) -> _Attempt:
        for a in reversed(self._attempts):
            if a.attempt == attempt:
                return a
        for a in self._attempts:  # the attempts before it are over
            if not a.unstepped:
                self._close(a)
        found = _Attempt(attempt=attempt)
        self._attempts.append(found)
        return found

    def unwatched(self, attempt: int, until: float) -> None:
        """No daemon watched the run from the record's end to `until` (this daemon's
        start): that time is its own bucket."""
        if self.ended or until <= self.until:
            return
        a = self._attempt(attempt)
        a.seconds[Bucket.UNWATCHED.value] = (
            a.seconds.get(Bucket.UNWATCHED.value, 0.0) + until - self.until
        )
        self.until = until

    def before_watched(
        self, attempt: int, first: tuple[int, float], last: tuple[int, float]
    ) -> None:
        """Steps the store kept of the attempt from before this daemon watched it, from
        `first` to `last` ((step, time)): a run no daemon accounted (a release without
        goodput) was starting (or restarting) up to its first step, and training from
        its first step (or the record's end) to its last."""
        if self.ended:
            return
        a = self._attempt(attempt)
        if a.first_step is None:
            if first[1] > self.until:
                self.advance(first[1], "running", attempt)
            self.stepped(attempt, first[0], first[1])
        if last[1] > self.until:
            self.advance(last[1], "running", attempt)
        self.stepped(attempt, last[0], last[1])

    def first_step(self, attempt: int) -> int | None:
        return self._attempt(attempt).first_step

    def advance(self, now: float, state: str, attempt: int, restart_due: bool = False) -> None:
        """Add the seconds since the last call to the bucket of `state` now."""
        if self.ended:
            return
        elapsed = now - self.until
        if elapsed <= 0:
            return
        a = self._attempt(attempt)
        stepped = a.first_step is not None
        if state == "running" and not stepped:
            a.running_unstepped_s += elapsed
        bucket = bucket_of(state, attempt, stepped, self.stalled, restart_due)
        if bucket is not None:
            a.seconds[bucket.value] = a.seconds.get(bucket.value, 0.0) + elapsed
        self.until = now

    def end(self, at: float, state: str, attempt: int) -> None:
        """The run ended at `at`, having been in `state` until then."""
        self.advance(at, state, attempt)
        self._close(self._attempt(attempt))
        self.ended = True
        self.stalled = False

    def reopen(self, at: float) -> None:
        """An ended run was resumed at `at`: its time counts again from there (the time
        it lay ended is no one's)."""
        if self.ended:
            self.ended, self.until = False, max(self.until, at)

    def _close(self, a: _Attempt) -> None:
        """An attempt that ran and never reported a step: nothing tells its start-up from
        its training, so its running time is counted as training (and it says so)."""
        if a.first_step is not None or a.running_unstepped_s <= 0:
            return
        a.unstepped = True
        first = Bucket.STARTING if a.attempt <= 1 else Bucket.RESTARTING
        _move(a, first, Bucket.TRAINING, a.running_unstepped_s)

    def stepped(self, attempt: int, step: int, now: float) -> None:
        a = self._attempt(attempt)
        if a.first_step is None:
            a.first_step, a.first_step_at = step, now
        if a.last_step is None or step > a.last_step:
            a.last_step = step
            self.stalled = False  # progress: a stall is over

    def checkpointed(self, attempt: int, seconds: float) -> None:
        """A save took `seconds`: out of training, into checkpointing."""
        _move(self._attempt(attempt), Bucket.TRAINING, Bucket.CHECKPOINTING, seconds)

    def stall(self, attempt: int, stuck_for_s: float) -> None:
        """Health says no progress for `stuck_for_s`: that time was stalled, and so is
        what follows until the next step."""
        if self.stalled:
            return
        self.stalled = True
        _move(self._attempt(attempt), Bucket.TRAINING, Bucket.STALLED, stuck_for_s)

    def next_attempt(self, attempt: int, resume_step: int | None) -> None:
        """Attempt `attempt` trains, from `resume_step` (None: from scratch): the earlier
        attempt's steps past it are done again, and its time for them is lost."""
        new = self._attempt(attempt)
        if new.resume_step is not None:
            return  # told already
        new.resume_step = resume_step
        earlier = [a for a in self._attempts if a.attempt < attempt and a.last_step is not None]
        if not earlier:
            return
        last = earlier[-1]
        assert last.last_step is not None and last.first_step is not None
        done_from = last.resume_step if last.resume_step is not None else last.first_step - 1
        steps = last.last_step - done_from
        redone = last.last_step - (resume_step if resume_step is not None else -1)
        training = last.seconds.get(Bucket.TRAINING.value, 0.0)
        if steps <= 0 or redone <= 0 or training <= 0:
            return
        _move(last, Bucket.TRAINING, Bucket.LOST, training * min(1.0, redone / steps))


def _move(a: _Attempt, src: Bucket, dst: Bucket, seconds: float) -> None:
    moved = min(max(seconds, 0.0), a.seconds.get(src.value, 0.0))
    if moved <= 0:
        return
    a.seconds[src.value] = a.seconds.get(src.value, 0.0) - moved
    a.seconds[dst.value] = a.seconds.get(dst.value, 0.0) + moved
