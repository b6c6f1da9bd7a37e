"""What this node's runs say: their parts' output and their trainers' messages.

- Output: each tick the supervisor has `follow_log` read what a part printed since the last
  one, a slice at a time, yielding to the loop between slices. A part's first line moves
  it (and a run still starting) to running; every line is published on the run's `log`
  topic; lines that read as trouble (NCCL errors, OOM, tracebacks: `logparse.classify`)
  become health and run events; rank 0's lines go to the run's metrics patterns, on a
  thread of their own (`gpud.patterns.follower`), whose points come back on the loop.
- Trainer messages (the ingest, `gpud.wire.ingest`): heartbeats and probes to the telemetry,
  metrics to the store and the `metrics` topic, checkpoints to the run record, and the
  step and save times to goodput.

Everything here runs on the daemon's event loop.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from gpud.model.run import CheckpointRef, MetricPoint, RunRecord, RunState
from gpud.model.trainer_messages import HeartbeatMessage, ProbeMessage, TrainerMessage
from gpud.node.ledger import CpuLedger
from gpud.node.store import Store
from gpud.patterns.extract import MetricExtractor
from gpud.patterns.follower import Found, PatternThread
from gpud.patterns.frameworks import Recognizers
from gpud.runs.diagnosis.logparse import classify, split_rank
from gpud.runs.health.goodput import GoodputKeeper
from gpud.runs.health.telemetry import Telemetry
from gpud.runs.state.book import RunBook
from gpud.runs.state.part import Part
from gpud.wire.protocol import RunLogEvent, RunMetricsEvent, run_topic

#: How much of a part's output is read between two yields to the loop, and per tick.
SLICE_BYTES = 64 * 1024
READ_PER_TICK = 1 << 20
#: What a settling part's log may still hold: a leftover writing on must not keep us here.
READ_AT_SETTLE = 256 << 20

log = logging.getLogger("gpud.runs")


class Intake:
    def __init__(
        self,
        node: str,
        book: RunBook,
        store: Store,
        telemetry: Telemetry,
        goodput: GoodputKeeper,
        ledger: CpuLedger,
        clock: Callable[[], float],
    ) -> None:
        self.node = node
        self.book = book
        self.store = store
        self.telemetry = telemetry
        self.goodput = goodput
        self.ledger = ledger
        self.clock = clock
        self._patterns: dict[str, PatternThread] = {}
        self._recognized: dict[str, str] = {}  # run → the framework `metrics: auto` named
        # A thread finishing an ended run's last lines still delivers them.
        book.on_ended.append(lambda run: self.forget(run.id))

    def forget(self, run_id: str) -> None:
        """Let go of the run's metrics patterns (their thread ends once it is idle)."""
        self._patterns.pop(run_id, None)
        self._recognized.pop(run_id, None)

    # ================================================================== trainers

    def on_trainer_message(self, kind: str, message: TrainerMessage) -> None:
        run = self.book.get(message.run)
        part = self.book.part(message.run)
        if run is None or part is None or message.attempt != part.record.attempt:
            return  # a late message from an earlier attempt, or a stranger
        if isinstance(message, HeartbeatMessage):
            self.telemetry.heartbeat(run, message)
            if message.step is not None:  # progress between the logged steps (goodput)
                with self.ledger.charge("goodput"):
                    self.goodput.stepped(run, message.attempt, message.step, self.clock())
        elif isinstance(message, ProbeMessage):
            self.telemetry.probe(run, message)
        elif kind == "hello":
            if not part.record.library:
                self.book.update_part(part, library=True)
        elif kind == "metrics":
            point = MetricPoint(
                run_id=run.id,
                attempt=message.attempt,
                step=message.step,  # type: ignore[attr-defined]
                time=message.time,
                values=message.values,  # type: ignore[attr-defined]
            )
            self.record_metrics(run, [point])
        elif kind in ("checkpoint", "stopped"):
            path = getattr(message, "path", None) or getattr(message, "checkpoint", None)
            step = getattr(message, "step", None)
            if path:
                ref = CheckpointRef(path=path, step=step, time=message.time)
                self.book.update(run.id, last_checkpoint=ref)
            took = getattr(message, "seconds", None)
            if took:  # what the save took was training time no more
                with self.ledger.charge("goodput"):
                    self.goodput.checkpointed(run, message.attempt, took)
            if kind == "stopped":
                self.book.event(run, "checkpoint", f"stopped at step {step}; checkpoint {path}")
        elif kind == "finished":
            finished = getattr(message, "exit_code", 1) == 0
            if finished and not part.record.finished:  # every rank says so; record it once
                self.book.update_part(part, finished=True)

    def record_metrics(self, run: RunRecord, points: list[MetricPoint]) -> None:
        self.store.add_metrics(points)
        newest = max(points, key=lambda p: p.step)
        oldest = min(points, key=lambda p: p.step)
        self.book.note_step(run.id, newest.step)
        self.telemetry.stepped(run, newest.attempt, newest.step)
        with self.ledger.charge("goodput"):
            now = self.clock()
            if oldest.step != newest.step:  # an attempt's first step is its first, not the
                self.goodput.stepped(run, oldest.attempt, oldest.step, now)  # batch's last
            self.goodput.stepped(run, newest.attempt, newest.step, now)
        self.book.publish(run_topic(run.id, "metrics"), metrics_event(run.id, points))

    # ================================================================== output

    async def follow_log(self, run: RunRecord, part: Part, *, to_end: bool = False) -> int:
        """Read what the part printed since the last tick, a slice at a time, yielding to
        the loop between slices: a run printing megabytes a second never holds up a
        control reply for longer than one slice takes. Up to READ_PER_TICK a tick, or
        what is left (`to_end`, as the part settles; READ_AT_SETTLE at most). Returns how
        far the log's offset moved."""
        read = 0
        while read < (READ_AT_SETTLE if to_end else READ_PER_TICK):
            before = part.record.log_offset
            lines = part.read_lines(SLICE_BYTES)
            moved = part.record.log_offset - before
            if lines:
                self._take_lines(self.book.get(run.id) or run, part, lines)
            if not moved:
                # Looked at after lines were read too, so a quiet tick compares with then.
                touched = part.touched()
                if not read and touched and not part.record.state.terminal:
                    # Output the shim dropped on a full disk: the run is not silent.
                    self.telemetry.output(self.book.get(run.id) or run, part.record.attempt)
                return read
            read += min(moved, SLICE_BYTES)  # more: it passed where a bounded log dropped
            await asyncio.sleep(0)
            if self.book.part(run.id) is not part:
                return read  # the part was replaced (a new attempt) while we yielded
        return read

    def _take_lines(self, run: RunRecord, part: Part, lines: list[str]) -> None:
        record = part.record
        if record.state is RunState.STARTING:
            part.update(state=RunState.RUNNING, state_since=self.clock())
            current = self.book.get(run.id) or run
            if current.state in (RunState.STARTING, RunState.PENDING):
                run = self.book.move(run.id, RunState.RUNNING, f"attempt {record.attempt}")
        self.store.put_attempt(part.record)
        self.telemetry.output(run, record.attempt)
        self.book.publish(run_topic(run.id, "log"), log_event(self.node, run, part, lines))
        rank0: list[str] = []
        for line in lines:
            local, text = split_rank(line)
            trouble = classify(text)
            if trouble is not None:
                self.telemetry.trouble(run, record.attempt, trouble.kind, text.strip())
                rank = None if local is None else run.node_rank * record.nproc + local
                self.book.event(
                    run,
                    trouble.kind,
                    f"{trouble.meaning}: {text.strip()[:300]}",
                    trouble.severity,
                    rank=rank,
                )
            if local in (None, 0):
                rank0.append(text)
        if run.node_rank == 0 and rank0:
            # Never on the loop: a user's pattern may be slow (gpud.patterns.follower).
            thread = self._pattern_thread(run)
            if not (record.library and isinstance(thread.extractor, Recognizers)):
                # (a script with the trainers library sends its metrics itself: its output,
                # a progress bar say, must not add a second account of its steps)
                thread.feed(record.attempt, rank0, self.clock())

    def _pattern_thread(self, run: RunRecord) -> PatternThread:
        """The run's metric patterns (one thread, kept across attempts, so a pattern
        disabled for the run stays disabled); made on first use, so an adopted or
        attached run has them too."""
        thread = self._patterns.get(run.id)
        if thread is None:
            spec = self.book.spec(run)
            extractor: MetricExtractor | Recognizers = (
                Recognizers() if spec.auto_metrics else MetricExtractor(spec.metric_patterns)
            )
            loop = asyncio.get_running_loop()
            run_id = run.id

            def deliver(found: Found) -> None:
                loop.call_soon_threadsafe(self._on_found, run_id, found)

            thread = PatternThread(run.id, extractor, deliver)
            self._patterns[run.id] = thread
            refused = extractor.take_disabled()
            if refused:
                self._on_found(run.id, Found(disabled=refused))
        return thread

    def _say_recognized(self, run: RunRecord) -> None:
        """`metrics: auto`: one event when the recognizers know the run's framework (again
        if a framework's own lines name it better than its progress bar did)."""
        thread = self._patterns.get(run.id)
        extractor = thread.extractor if thread is not None else None
        if not isinstance(extractor, Recognizers) or extractor.matched is None:
            return
        if self._recognized.get(run.id) == extractor.matched:
            return
        self._recognized[run.id] = extractor.matched
        self.book.event(
            run, "metrics_pattern", f"metrics: auto: reading {extractor.matched} output"
        )

    def _on_found(self, run_id: str, found: Found) -> None:
        """On the loop: what a run's pattern thread found."""
        run = self.book.get(run_id)
        if run is None:
            return
        for disabled in found.disabled:
            log.warning("run %s: %s", run_id, disabled.line())
            self.book.event(run, "metrics_pattern", disabled.line(), "warning")
        if found.dropped:
            self.book.event(
                run, "metrics_pattern", f"{found.dropped} output line(s) came faster than the"
                " metrics patterns could match them and were not examined", "warning",
            )  # fmt: skip
        points = [
            MetricPoint(run_id=run_id, attempt=p.attempt, step=p.step, time=p.time,
                        values=p.values)
            for p in found.points
        ]  # fmt: skip
        if points:
            self._say_recognized(run)
            self.record_metrics(run, points)


def metrics_event(run_id: str, points: list[MetricPoint]) -> RunMetricsEvent:
    return RunMetricsEvent(
        run_id=run_id,
        attempt=points[-1].attempt,
        points=[{"step": p.step, "time": p.time, "values": p.values} for p in points],
    )


def log_event(node: str, run: RunRecord, part: Part, lines: list[str]) -> RunLogEvent:
    return RunLogEvent(
        node=node,
        node_rank=run.node_rank,
        attempt=part.record.attempt,
        offset=part.record.log_offset,
        lines=lines,
    )
