"""The daemon's side of retention: one pass now (`node.gc`, `gpuctl gc`) or on a schedule.

A pass reads in the retention thread (the runs, their row counts and run dir sizes, the
node events), chooses with `policy.choose`, and then — unless it is a dry run — removes on
the loop in small timed batches, yielding between them: each removed run's usage row goes
in, its record out (one transaction; it is unknown from then on), then its metrics, events
and attempts, then its files (in the thread, checkpoints kept). Then the finished runs'
old metric points are thinned (`reduce`), node events past their bound go, and free pages
go back to the file system (`compact`). The pass's longest hold of the loop is measured
and reported. The state dir's size is measured in the thread after each pass and every
`SIZE_EVERY_S`, for `/metrics`; a scrape never walks the disk.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from gpud.model.run import TERMINAL
from gpud.node.statedir import StateDir
from gpud.node.store import Store
from gpud.retention import compact, files, reduce, rows
from gpud.retention.policy import FinishedRun, RetentionSettings, choose, show_bytes
from gpud.security.auth import Caller
from gpud.wire.node_messages import GcReply, GcRequest, GcRun

if TYPE_CHECKING:
    from gpud.runs.lifecycle.supervisor import Supervisor

log = logging.getLogger("gpud.retention")

#: The first scheduled pass comes this long after start-up (adoption settles first).
FIRST_PASS_S = 60.0
#: How often the state dir's size is measured for /metrics between passes.
SIZE_EVERY_S = 300.0
#: Finished runs whose metrics one pass thins at most (the rest wait for the next).
THIN_PER_PASS = 100
#: What one step may hold the loop for (issue 22: 50 ms); a step over it is logged.
HOLD_BUDGET_S = 0.050
#: Batches between two checkpoints of the WAL in the retention thread.
CHECKPOINT_EVERY = 16
_TERMINAL = {s.value for s in TERMINAL}
T = TypeVar("T")


@dataclass
class StateSize:
    """The state dir as last measured: bytes by part, for `gpud_state_bytes{part}`."""

    database: int = 0
    runs: int = 0  # run dirs, checkpoints left out
    checkpoints: int = 0  # checkpoints inside the state dir (never removed)
    measured_at: float | None = None

    @property
    def bounded(self) -> int:
        return self.database + self.runs

    def parts(self) -> dict[str, int]:
        """By part; {} until first measured."""
        if self.measured_at is None:
            return {}
        return {"database": self.database, "runs": self.runs, "checkpoints": self.checkpoints}


@dataclass
class _Plan:
    facts: rows.Facts
    dirs: dict[str, files.DirBytes]
    size: StateSize
    removals: list[tuple[rows.RunRow, str, int]] = field(default_factory=list)
    finished_kept: int = 0
    protected: int = 0
    leased: set[str] = field(default_factory=set)


class Retention:
    def __init__(
        self,
        settings: RetentionSettings,
        store: Store,
        state: StateDir,
        supervisor: Supervisor,
        node: str,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings
        self._store = store
        self._state = state
        self._supervisor = supervisor
        self._node = node
        self._clock = clock
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gpud-retention")
        self._reader: sqlite3.Connection | None = None  # the thread's own
        self._sizes = files.Sizes()  # the thread's
        self._writer: sqlite3.Connection | None = None  # the thread's, for checkpoints only
        self._batches = 0
        self._lock: asyncio.Lock | None = None
        self.size = StateSize()
        self._longest_s = 0.0

    # ------------------------------------------------------------------ serving

    async def serve(self) -> None:
        """Measure the state dir now and then; apply retention every `interval_minutes`."""
        await self._measure()
        every = self.settings.interval_minutes * 60.0
        next_pass = time.monotonic() + FIRST_PASS_S
        while True:
            now = time.monotonic()
            if every and now >= next_pass:
                next_pass = now + every
                try:
                    await self.apply(dry_run=False, by="schedule")
                except Exception:  # a failed pass must not stop the daemon: the next tries
                    log.exception("retention: the scheduled pass failed")
            else:
                await self._measure()
            wait = SIZE_EVERY_S if not every else min(SIZE_EVERY_S, next_pass - time.monotonic())
            await asyncio.sleep(max(1.0, wait))

    async def handle(self, body: GcRequest, caller: Caller) -> GcReply:
        """`node.gc` (operator; audited)."""
        return await self.apply(body.dry_run, by=caller.name)

    def close(self) -> None:
        self._executor.shutdown(wait=True, cancel_futures=True)
        for db in (self._reader, self._writer):
            if db is not None:
                db.close()
        self._reader = self._writer = None

    # ------------------------------------------------------------------ a pass

    async def apply(self, dry_run: bool, by: str) -> GcReply:
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:  # one pass at a time: a second waits and sees what is left
            return await self._pass(dry_run, by)

    async def _pass(self, dry_run: bool, by: str) -> GcReply:
        started = time.perf_counter()
        self._longest_s = 0.0
        plan = await self._thread(self._read)
        notes: list[str] = []
        reply = GcReply(node=self._node, dry_run=dry_run, limits=self.settings.describe())
        if not dry_run and plan.facts.pruning:
            await self._finish_journal(plan.facts.pruning)
        with self._holding("choosing"):
            self._choose(plan)
        thin = await self._thread(lambda: self._plan_thinning(plan))
        over_events = (
            max(0, plan.facts.node_events - self.settings.node_events)
            if self.settings.node_events
            else 0
        )
        removed: list[GcRun] = []
        if dry_run:
            removed = [
                self._described(row, why, size, plan.facts.rows_by_run.get(row.id, 0))
                for row, why, size in plan.removals
            ]
            reply = self._reply(reply, plan, removed, thin, over_events, notes, started)
            return reply
        if self._store.waiting:
            notes.append(f"{self._store.full}: nothing is removed from the database until then")
            return self._reply(reply, plan, removed, {}, 0, notes, started)
        for row, why, size in plan.removals:
            done = await self._remove(row, why, size)
            if done is not None:
                removed.append(done)
        points = await self._thin(thin)
        events = await self._drop_node_events(over_events)
        vacuumed = await self._vacuum()
        self.size = await self._thread(self._measure_now)
        result = self._reply(reply, plan, removed, thin, events, notes, started)
        result = result.model_copy(update={"vacuumed_pages": vacuumed, "points_removed": points})
        self._log(result, by)
        return result

    def _reply(
        self,
        reply: GcReply,
        plan: _Plan,
        removed: list[GcRun],
        thin: dict[str, list[tuple[int, str, int]]],
        events: int,
        notes: list[str],
        started: float,
    ) -> GcReply:
        size = self.size if not reply.dry_run else plan.size
        return reply.model_copy(
            update={
                "removed": removed,
                "finished_kept": plan.finished_kept,
                "protected": plan.protected,
                "thinned_runs": len(thin),
                "points_removed": sum(len(p) for p in thin.values()),
                "node_events_removed": events,
                "state_bytes": size.bounded,
                "checkpoint_bytes": size.checkpoints,
                "runs": len(plan.facts.runs) - (0 if reply.dry_run else len(removed)),
                "longest_block_ms": round(self._longest_s * 1000, 2),
                "elapsed_s": round(time.perf_counter() - started, 3),
                "notes": notes,
            }
        )

    def _log(self, reply: GcReply, by: str) -> None:
        did = reply.removed or reply.points_removed or reply.node_events_removed
        level = logging.INFO if did or by != "schedule" else logging.DEBUG
        log.log(
            level,
            "retention (%s): removed %d run(s) (%s), thinned the metrics of %d run(s) (%d"
            " points), removed %d node event(s), gave back %d free page(s); state %s in %d"
            " run(s), checkpoints %s kept; longest hold of the loop %.1f ms, %.2fs in all",
            by, len(reply.removed), show_bytes(sum(r.bytes for r in reply.removed)),
            reply.thinned_runs, reply.points_removed, reply.node_events_removed,
            reply.vacuumed_pages, show_bytes(reply.state_bytes), reply.runs,
            show_bytes(reply.checkpoint_bytes), reply.longest_block_ms, reply.elapsed_s,
        )  # fmt: skip

    # ------------------------------------------------------------------ reading (thread)

    def _read(self) -> _Plan:
        if self._reader is None:
            self._reader = rows.open_reader(self._store.path)
        facts = rows.read_facts(self._reader, self._store.path)
        leased = {str(r) for (r,) in self._reader.execute("SELECT run_id FROM gpu_leases")}
        leased |= {str(r) for (r,) in self._reader.execute("SELECT run_id FROM port_leases")}
        dirs = {}
        now = time.monotonic()
        for run in facts.runs:
            keep = files.keep_paths(run.checkpoint_dir, run.last_checkpoint)
            if files.within(Path(run.run_dir), self._state.runs):
                # A finished run's dir holds still until it is resumed (a new attempt).
                ended = run.state in _TERMINAL
                stamp = (run.state, run.ended_at, run.attempt, *keep) if ended else None
                dirs[run.id] = self._sizes.measure(Path(run.run_dir), keep, stamp, now)
        size = self._size(facts, dirs, now)
        self._sizes.forget_unseen()
        return _Plan(facts=facts, dirs=dirs, size=size, leased=leased)

    def _size(self, facts: rows.Facts, dirs: dict[str, files.DirBytes], now: float) -> StateSize:
        size = StateSize(database=facts.db_files, measured_at=self._clock())
        known = {Path(r.run_dir).name for r in facts.runs if r.id in dirs}
        size.runs = sum(d.removable for d in dirs.values())
        size.checkpoints = sum(d.checkpoints for d in dirs.values())
        try:
            leftovers = [p for p in self._state.runs.iterdir() if p.name not in known]
        except OSError:
            leftovers = []
        for path in leftovers:  # what removed runs left: their checkpoints
            try:
                stamp: object | None = ("left", path.stat().st_mtime_ns)
            except OSError:
                stamp = None
            size.checkpoints += self._sizes.measure(path, [], stamp, now).removable
        return size

    def _measure_now(self) -> StateSize:
        return self._read().size

    async def _measure(self) -> None:
        try:
            self.size = await self._thread(self._measure_now)
        except Exception:  # /metrics keeps the last figure
            log.exception("retention: measuring the state dir failed")

    def _plan_thinning(self, plan: _Plan) -> dict[str, list[tuple[int, str, int]]]:
        """For up to THIN_PER_PASS finished runs kept, the points to remove."""
        assert self._reader is not None
        going = {row.id for row, _, _ in plan.removals}
        todo: dict[str, list[tuple[int, str, int]]] = {}
        looked = 0
        for run in plan.facts.runs:
            if run.id in going or run.state not in _TERMINAL or run.id in plan.leased:
                continue
            if plan.facts.thinned.get(run.id) == run.attempt:
                continue
            if plan.facts.rows_by_run.get(run.id, 0) <= self.settings.full_steps:
                continue
            if looked >= THIN_PER_PASS:
                break
            looked += 1
            found = rows.series(self._reader, run.id)
            last = max((pts[-1][0] for pts in found.values() if pts), default=0)
            cutoff = last - self.settings.full_steps
            drop = [
                (attempt, name, step)
                for (attempt, name), pts in found.items()
                for step in reduce.dropped_steps(pts, cutoff)
            ]
            todo[run.id] = drop
        return todo

    # ------------------------------------------------------------------ choosing (loop)

    def _choose(self, plan: _Plan) -> None:
        facts = plan.facts
        per_row = facts.db_bytes / facts.total_rows if facts.total_rows else 0.0
        finished: list[FinishedRun] = []
        by_id = {}
        for run in facts.runs:
            if run.state not in _TERMINAL or run.id in plan.leased:
                plan.protected += 1
                continue
            if self._supervisor.keeps(run.id) is not None:
                plan.protected += 1
                continue
            dir_bytes = plan.dirs[run.id].removable if run.id in plan.dirs else 0
            size = dir_bytes + int(per_row * (facts.rows_by_run.get(run.id, 0) + 1))
            finished.append(FinishedRun(run.id, run.ended_at, size))
            by_id[run.id] = (run, size)
        removals, _ = choose(finished, self.settings, self._clock())
        plan.removals = [(by_id[r.run_id][0], r.why, by_id[r.run_id][1]) for r in removals]
        plan.finished_kept = len(finished) - len(removals)

    def _described(self, row: rows.RunRow, why: str, size: int, count: int) -> GcRun:
        keep = files.keep_paths(row.checkpoint_dir, row.last_checkpoint)
        notes = []
        if row.run_dir and not files.within(Path(row.run_dir), self._state.runs):
            notes.append(f"its run dir {row.run_dir} is outside the state dir: left in place")
        return GcRun(
            id=row.id, name=row.name, state=row.state, ended_at=row.ended_at, why=why,
            bytes=size, rows=count, kept=[k for k in keep if Path(k).exists()], notes=notes,
        )  # fmt: skip

    # ------------------------------------------------------------------ removing (loop)

    @contextmanager
    def _holding(self, what: str) -> Iterator[None]:
        """Time one stretch of work on the loop (no await inside); one over the budget is
        logged, naming what it was."""
        started = time.perf_counter()
        try:
            yield
        finally:
            took = time.perf_counter() - started
            self._longest_s = max(self._longest_s, took)
            if took > HOLD_BUDGET_S:
                log.warning("retention: %s held the loop %.0f ms", what, took * 1000)

    async def _remove(self, row: rows.RunRow, why: str, size: int) -> GcRun | None:
        db = self._store.db
        with self._holding("a run record"):
            held = self._supervisor.keeps(row.id)
            record = self._store.run(row.id)
            if held is not None or record is None or not record.state.terminal:
                return None  # it came back to life (a resume) since the pass read it
            usage = rows.stored_usage(self._store, record)
            keep = files.keep_paths(record.checkpoint_dir, record.last_checkpoint.path
                                    if record.last_checkpoint else None)  # fmt: skip
            journal: dict[str, object] = {"run_dir": record.run_dir, "keep": keep}
            rows.begin_removal(db, usage, journal)
            self._supervisor.forget(row.id)
        count = await self._remove_rows(row.id)
        done = self._described(row, why, size, count)
        removed = await self._remove_files(row.id, journal)
        kept = ", ".join(removed.kept) or "none"
        log.info(
            "retention: removed run %s (%s %s; %s): %d row(s), %s of files; checkpoints kept: %s%s",
            row.id, row.name, row.state, why, count, show_bytes(removed.bytes), kept,
            "; " + "; ".join(removed.errors) if removed.errors else "",
        )  # fmt: skip
        return done.model_copy(update={"kept": removed.kept, "notes": done.notes + removed.errors})

    async def _remove_rows(self, run_id: str) -> int:
        batches = rows.Batches()
        count = 0
        for table in rows.RUN_TABLES:
            while True:
                with self._holding(f"a batch of {table}"):
                    done = rows.remove_some(self._store.db, table, run_id, batches)
                count += done
                await self._between_batches()
                if not done:
                    break
        return count

    async def _remove_files(self, run_id: str, journal: dict[str, object]) -> files.Removed:
        run_dir, keep = journal.get("run_dir"), journal.get("keep")
        removed = files.Removed()
        if isinstance(run_dir, str) and run_dir:
            keeping = [str(k) for k in keep] if isinstance(keep, list) else []
            removed = await self._thread(
                lambda: files.remove_run_dir(Path(run_dir), self._state.runs, keeping)
            )
        with self._holding("the journal"):
            rows.end_removal(self._store.db, run_id)
        return removed

    async def _finish_journal(self, pruning: list[tuple[str, dict[str, object]]]) -> None:
        """Removals a daemon stopped half-way (killed, or the disk full): finish them."""
        for run_id, journal in pruning:
            count = await self._remove_rows(run_id)
            removed = await self._remove_files(run_id, journal)
            log.info(
                "retention: finished removing run %s: %d row(s), %s of files",
                run_id, count, show_bytes(removed.bytes),
            )  # fmt: skip

    async def _thin(self, todo: dict[str, list[tuple[int, str, int]]]) -> int:
        count = 0
        batches = rows.Batches()
        for run_id, points in todo.items():
            record = self._store.run(run_id)
            if record is None or not record.state.terminal:
                continue
            rest = points
            while rest:
                with self._holding("a batch of metric points"):
                    before = len(rest)
                    rest = rows.remove_points(self._store.db, run_id, rest, batches)
                    count += before - len(rest)
                await self._between_batches()
            with self._holding("marking thinned"):
                rows.mark_thinned(self._store.db, run_id, record.attempt, self._clock())
            if points:
                log.info("retention: thinned run %s's old metrics: %d fewer", run_id, len(points))
        return count

    async def _drop_node_events(self, over: int) -> int:
        batches = rows.Batches()
        count = 0
        while over > count:
            with self._holding("a batch of node events"):
                done = rows.remove_node_events(self._store.db, over - count, batches)
            count += done
            await self._between_batches()
            if not done:
                break
        return count

    async def _vacuum(self) -> int:
        pages, total = 64, 0
        while True:
            with self._holding("a vacuum step"):
                freed, took = compact.vacuum_some(self._store.db, pages)
            total += freed
            if not freed:
                return total
            if took > 0:
                # Its cost per page varies a lot (pages moved, pointer maps): grow slowly.
                wanted = int(pages * rows.TARGET_S / took)
                pages = max(16, min(compact.PAGES, wanted, pages * 2))
            await self._between_batches()

    async def _between_batches(self) -> None:
        """Let the loop serve; now and then checkpoint the WAL in the thread meanwhile."""
        self._batches += 1
        if self._batches % CHECKPOINT_EVERY == 0:
            await self._thread(self._checkpoint)
        else:
            await asyncio.sleep(0)

    def _checkpoint(self) -> None:
        if self._writer is None:
            self._writer = sqlite3.connect(self._store.path, check_same_thread=False)
            self._writer.execute("PRAGMA busy_timeout=100")
        try:
            compact.checkpoint(self._writer)
        except sqlite3.OperationalError as exc:  # busy: the next one catches up
            log.debug("retention: checkpoint skipped: %s", exc)

    async def _thread(self, work: Callable[[], T]) -> T:
        charged = self._supervisor.ledger.charged("retention", work)
        return await asyncio.get_running_loop().run_in_executor(self._executor, charged)
