"""What gputop knows about one run, gathered from every node it has a part on.

Each node reports its own part (its `RunSummary` carries its `node_rank`); node 0's record
is the gang's, so it wins for state, step and attempt. Node 0 also publishes the run's
metrics and health. Metric histories are fetched once with `run.metrics` and then grow
from live events; attempts after the first are where resumes happened, and the plots mark
them.
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

from gpud.efficiency.goodput import Goodput
from gpud.efficiency.model import RunFlops
from gpud.model.run import (
    SAMPLES_PER_S_NAMES,
    TOKENS_PER_S_NAMES,
    FailureCause,
    HealthSummary,
    RunEvent,
    RunState,
    completed_steps,
    gpus_by_node_text,
    verdict_word,
)
from gpud.wire.brief import RunBrief
from gpud.wire.run_messages import MetricsReply, RunSummary
from tui.model.logs import LogBuffer
from tui.model.series import MetricSeries

History = Literal["none", "loading", "loaded", "unavailable"]
THROUGHPUT_NAMES = SAMPLES_PER_S_NAMES + TOKENS_PER_S_NAMES
RATE_WINDOW = 64
RUN_EVENTS_KEPT = 200
ACTIVE = frozenset(
    {RunState.PENDING, RunState.QUEUED, RunState.STARTING, RunState.RUNNING, RunState.STOPPING}
)


@dataclass(frozen=True)
class Ending:
    """How an ended run ended: its label ("ENDED: succeeded", "ENDED: stopped", "FAILED")
    and the run's reason."""

    state: RunState
    reason: str | None
    cause: FailureCause | None = None

    @property
    def label(self) -> str:
        return "FAILED" if self.state is RunState.FAILED else f"ENDED: {self.state.value}"


@dataclass(frozen=True)
class Rate:
    value: float
    unit: str  # "samples/s", "tokens/s" or "steps/s"


class RunView:
    """One run. Mutated by feed threads under the model's lock; read by the UI."""

    def __init__(self, run_id: str) -> None:
        self.id = run_id
        self.parts: dict[int, RunSummary] = {}  # node_rank → that node's record
        self.part_nodes: dict[int, str] = {}  # node_rank → key of the node that told us
        self.metrics: dict[str, MetricSeries] = {}
        # (time, step) of the latest attempt's newest points: the rate and ETA come from it.
        self.progress: deque[tuple[float, float]] = deque(maxlen=RATE_WINDOW)
        self.progress_attempt = 0
        self.health: HealthSummary | None = None
        self.events: deque[RunEvent] = deque(maxlen=RUN_EVENTS_KEPT)
        self.logs = LogBuffer()
        self.history: History = "none"
        self.history_error: str | None = None
        self.health_asked = False
        #: node 0's brief's verdict in a word (`verdict_word`), when no health came
        self.brief_verdict: str | None = None
        self.metrics_version = 0
        self.version = 0
        self.worlds: dict[int, int] = {}  # attempt → its world size (elastic runs change it)
        #: node 0's latest (FLOP/s, MFU) of the run (its brief's or its health's), and
        #: their recent values for the sparkline
        self.last_flops: tuple[float | None, float | None] = (None, None)
        self.flops_history: deque[tuple[float, float | None]] = deque(maxlen=RATE_WINDOW)
        #: node 0's goodput as `run.status` gave it when the run was opened
        self.fetched_goodput: Goodput | None = None

    # ------------------------------------------------------------ the gang's record

    @property
    def summary(self) -> RunSummary:
        return self.parts[min(self.parts)]

    @property
    def known(self) -> bool:
        return bool(self.parts)

    @property
    def coordinator_known(self) -> bool:
        return 0 in self.parts

    @property
    def active(self) -> bool:
        return self.known and self.summary.state in ACTIVE

    def add_summary(self, node_key: str, summary: RunSummary) -> None:
        old = self.parts.get(summary.node_rank)
        if old == summary:
            return
        self.parts[summary.node_rank] = summary
        self.part_nodes[summary.node_rank] = node_key
        if summary.node_rank == 0 and summary.world_size is not None:
            self.worlds[summary.attempt] = summary.world_size
        self.version += 1

    def add_brief(self, node_key: str, brief: RunBrief, when: float) -> bool:
        """A run's line in a node's brief (`gpud.wire.brief`): its state, step and values move
        with it; returns whether that node's full record must be asked for (the run is
        new here, or its state or attempt moved, and with them its reason)."""
        part = self.parts.get(brief.node_rank)
        if part is None:
            self.part_nodes.setdefault(brief.node_rank, node_key)
            return True
        stale = part.state is not brief.state or part.attempt != brief.attempt
        step = brief.last_step if brief.last_step is not None else part.last_step
        values = {**part.last_values, **brief.values}
        if stale or step != part.last_step or values != part.last_values:
            self.parts[brief.node_rank] = part.model_copy(
                update={"state": brief.state, "attempt": brief.attempt, "last_step": step,
                        "last_values": values}
            )  # fmt: skip
            self.version += 1
        if brief.node_rank == min(self.parts):
            verdict, from_output = brief.verdict, brief.judged_from_output
            word = None if verdict is None else verdict_word(verdict, from_output)
            if word != self.brief_verdict:
                self.brief_verdict = word
                self.version += 1
            if brief.last_step is not None:
                self._progressed(brief.attempt, when, float(brief.last_step))
            self._flops_moved(brief.flops_per_second, brief.mfu)
        return stale

    def set_health(self, health: HealthSummary) -> None:
        self.health = health
        found = health.flops
        self._flops_moved(found.flops_per_second if found else None, found.mfu if found else None)
        self.version += 1

    def _flops_moved(self, flops: float | None, mfu: float | None) -> None:
        if (flops, mfu) == self.last_flops:
            return  # briefs and health both carry node 0's latest round: once each
        self.last_flops = (flops, mfu)
        if flops is not None:
            self.flops_history.append((flops, mfu))
        self.version += 1

    # ------------------------------------------------------------ FLOPs and MFU

    def flops(self) -> RunFlops | None:
        """Node 0's full record of the run's FLOP rate and MFU, while the run trains and
        its health is here (a run on screen)."""
        if not self.active or self.health is None:
            return None
        return self.health.flops

    def mfu(self) -> tuple[float | None, float | None]:
        """(FLOP/s, MFU) now: the health's where it came, else node 0's brief's."""
        if not self.active:
            return None, None
        full = self.flops()
        if full is not None:
            return full.flops_per_second, full.mfu
        return self.last_flops

    def goodput(self, now: float | None = None) -> Goodput | None:
        """Node 0's account of the run's wall time (the newer of its record's and the one
        fetched with its status), carried on to `now` in the bucket the run is in: node 0
        stores it only when the run moves, so a training run's would read as it started."""
        stored = self.parts[0].goodput if 0 in self.parts else None
        fetched = self.fetched_goodput
        account = stored
        if stored is None or (fetched is not None and fetched.until >= stored.until):
            account = fetched
        if account is None or not self.active:
            return account
        s = self.summary
        progressed = self.progress_attempt == s.attempt and len(self.progress) > 1
        stepped = progressed and self.progress[-1][1] > self.progress[0][1]
        when = time.time() if now is None else now
        return account.carried_to(when, s.state.value, s.attempt, stepped)

    def mfu_history(self) -> list[float]:
        """Recent MFU, oldest first; the FLOP rate where MFU is n/a (a simulated GPU)."""
        points = list(self.flops_history)
        if points and all(mfu is not None for _, mfu in points):
            return [mfu for _, mfu in points if mfu is not None]
        return [flops for flops, _ in points]

    def _progressed(self, attempt: int, when: float, step: float) -> None:
        if attempt < self.progress_attempt:
            return
        if attempt > self.progress_attempt:
            self.progress.clear()  # a resume: the pause is not part of the rate
            self.progress_attempt = attempt
        if self.progress and self.progress[-1][1] == step:
            return  # no step since: a brief repeats the same step every second
        self.progress.append((when, step))

    def gpus_text(self) -> str:
        """The GPUs it holds on each node, as every view writes them (`n0:0-3 n1:4-7`)."""
        return gpus_by_node_text({rank: part.gpus for rank, part in self.parts.items()})

    def parts_hold_gpus(self) -> bool:
        return any(part.gpus for part in self.parts.values())

    def nproc_by_node(self) -> list[int | None]:
        """Processes per node of the current attempt's nodes, in node-rank order (None:
        not known yet); an elastic attempt may use fewer nodes than the run has."""
        if not self.parts:
            return []
        s = self.summary
        members = s.members if s.members is not None else range(s.planned_nodes or len(s.nodes))
        fallback = s.nproc
        return [
            (self.parts[r].nproc if r in self.parts and self.parts[r].nproc else fallback)
            for r in members
        ]

    def world_size(self) -> int | None:
        if self.health is not None and self.health.world_size:
            return self.health.world_size
        counts = self.nproc_by_node()
        if not counts or any(c is None for c in counts):
            return None
        return sum(c for c in counts if c is not None)

    def nproc_of(self, node_rank: int) -> int | None:
        counts = self.nproc_by_node()
        return counts[node_rank] if node_rank < len(counts) else None

    def backend(self) -> str | None:
        return self.health.backend if self.health is not None else None

    # ------------------------------------------------------------ metrics

    def add_points(self, attempt: int, points: Iterable[dict[str, Any]]) -> None:
        changed = False
        for point in points:
            step = point.get("step")
            values = point.get("values") or {}
            if not isinstance(step, int) or not isinstance(values, dict):
                continue
            for name, value in values.items():
                if isinstance(value, (int, float)):
                    series = self.metrics.get(name)
                    if series is None:
                        series = self.metrics[name] = MetricSeries()
                    changed |= series.append(attempt, float(step), float(value))
            when = point.get("time")
            if isinstance(when, (int, float)):
                self._progressed(attempt, float(when), float(step))
        if changed:
            self.metrics_version += 1
            self.version += 1

    def add_history(self, reply: MetricsReply) -> None:
        """The whole history from node 0; live points already here are kept after it."""
        live = {name: list(series.points()) for name, series in self.metrics.items()}
        self.metrics = {}
        self.progress.clear()
        self.progress_attempt = 0
        for row in reply.rows:
            self.add_points(
                row.attempt, [{"step": row.step, "time": row.time, "values": row.values}]
            )
        for name, points in live.items():
            series = self.metrics.setdefault(name, MetricSeries())
            for attempt, step, value in points:
                series.append(attempt, step, value)
        self.history = "loaded"
        self.metrics_version += 1
        self.version += 1

    def metric_names(self) -> list[str]:
        """Loss first, then the rest alphabetically."""
        names = sorted(self.metrics)
        if "loss" in names:
            names.remove("loss")
            names.insert(0, "loss")
        return names

    def last_value(self, name: str) -> float | None:
        """The newest value of `name`: from its series while the run's screen keeps it
        live, else from the summary (briefs), whichever saw the later step."""
        series = self.metrics.get(name)
        last = series.last() if series is not None else None
        summary = self.summary if self.parts else None
        if summary is not None and name in summary.last_values:
            newer = last is None or (summary.attempt, summary.last_step or -1) > (last[0], last[1])
            if newer:
                return summary.last_values[name]
        return last[2] if last is not None else None

    def steps_done(self) -> int | None:
        """Steps done (`completed_steps`): the newest step index seen in a metric or the
        summary, + 1 — what every view shows, as done/max_steps."""
        steps = [int(last[1]) for s in self.metrics.values() if (last := s.last()) is not None]
        summary_step = self.summary.last_step if self.parts else None
        candidates = [s for s in (max(steps) if steps else None, summary_step) if s is not None]
        return completed_steps(max(candidates)) if candidates else None

    def rate(self) -> Rate | None:
        """Throughput while the run is active: the trainer's own figure if it reports one,
        else steps per second over the latest attempt's recent points."""
        if not self.active:
            return None
        for name in THROUGHPUT_NAMES:
            value = self.last_value(name)
            if value is not None:
                unit = "tokens/s" if name in TOKENS_PER_S_NAMES else "samples/s"
                return Rate(value, unit)
        if len(self.progress) < 2:
            return None
        (t0, s0), (t1, s1) = self.progress[0], self.progress[-1]
        if t1 <= t0 or s1 < s0:
            return None
        return Rate((s1 - s0) / (t1 - t0), "steps/s")

    def rate_history(self) -> list[float]:
        """Recent throughput, oldest first: the trainer's metric, else steps per second."""
        for name in THROUGHPUT_NAMES:
            series = self.metrics.get(name)
            if series is not None and len(series):
                return list(series.segments[-1].values[-RATE_WINDOW:])
        points = list(self.progress)
        return [
            (s1 - s0) / (t1 - t0)
            for (t0, s0), (t1, s1) in itertools.pairwise(points)
            if t1 > t0 and s1 >= s0
        ]

    def recent(self, name: str, count: int = RATE_WINDOW) -> list[float]:
        series = self.metrics.get(name)
        if series is None or not series.segments:
            return []
        return list(series.segments[-1].values[-count:])

    def eta_s(self) -> float | None:
        if not self.active or not self.parts:
            return None
        summary = self.summary
        done = self.steps_done()
        if summary.max_steps is None or done is None or len(self.progress) < 2:
            return None
        (t0, s0), (t1, s1) = self.progress[0], self.progress[-1]
        if t1 <= t0 or s1 <= s0:
            return None
        return max(0.0, (summary.max_steps - done) / ((s1 - s0) / (t1 - t0)))

    def verdict(self) -> str | None:
        """The live verdict in a word (`verdict_word`: `no beats` for an `ok` judged from
        output alone), None once the run ended."""
        if self.parts and self.summary.state.terminal:
            return None  # the last verdict of an ended run says nothing now
        if self.health is None:
            return self.brief_verdict
        return verdict_word(self.health.verdict, self.health.judged_from_output)

    def ending(self) -> Ending | None:
        """How the run ended, for views that would otherwise show its last live health.
        None while it has not ended (or nothing is known of it yet)."""
        if not self.parts or not self.summary.state.terminal:
            return None
        s = self.summary
        return Ending(s.state, s.reason, s.cause if s.state is RunState.FAILED else None)
