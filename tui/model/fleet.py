"""The root of gputop's model: every node and every run, behind one lock.

Feed threads (see `feed.py`) call the `apply_*` methods as events and replies arrive; the
UI reads under `lock` on its own timer and redraws when `version` moved. That hand-off
coalesces by construction: a hundred events between two frames cost one redraw. Nothing
here imports Textual, so the model is tested and benchmarked on its own, with an injected
clock.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from gpud.efficiency.goodput import Goodput
from gpud.model.endpoints import canonical_endpoint
from gpud.model.run import AttemptRecord, HealthSummary, RunEvent
from gpud.model.snapshot import NodeEvent, NodeSnapshot
from gpud.scaling.arithmetic import LiveEfficiency, live_efficiency
from gpud.wire.brief import NodeBrief
from gpud.wire.envelope import Event
from gpud.wire.node_messages import NodeEventsReply, NodeInfo
from gpud.wire.protocol import RunLogEvent, RunMetricsEvent
from gpud.wire.run_messages import LogChunk, MetricsReply, RunList, RunSummary
from tui.model.baselines import BaselineBook
from tui.model.nodes import NodeView
from tui.model.runs import RunView
from tui.model.targets import Target

Clock = Callable[[], float]
BRIEF_PREFIX = "sum."
NODE_EVENTS_PREFIX = "node."
HW_PREFIX = "hw."


@dataclass(frozen=True)
class Want:
    """Something a node's feed thread should fetch for a run the UI shows in detail."""

    kind: str  # "metrics", "logs", "health", or "hw" (a node's full snapshot)
    run_id: str
    node_rank: int = 0
    attempt: int | None = None


@dataclass(frozen=True)
class FleetSummary:
    nodes: int
    online: int
    offline: int
    simulated: int
    gpus: int
    util_pct: float | None
    memory_pct: float | None
    xid: int
    throttled: int
    link_errors: int
    runs: int
    running: int


@dataclass(frozen=True)
class ProcessOwner:
    run_id: str
    rank: int | None
    local_rank: int | None
    how: str  # "health" (pid matched) or "simulated" (local rank → GPU index)


class FleetModel:
    def __init__(
        self,
        targets: Iterable[Target],
        clock: Clock = time.monotonic,
        wall: Clock = time.time,
        baselines: BaselineBook | None = None,
    ) -> None:
        self.lock = threading.RLock()
        self.clock = clock
        self.wall = wall
        self.baselines = baselines or BaselineBook(clock=clock)
        self.nodes: dict[str, NodeView] = {}
        for target in targets:
            view = NodeView(target.node, target.group)
            self.nodes.setdefault(view.key, view)
        self.runs: dict[str, RunView] = {}
        self.focused: Counter[str] = Counter()  # run id → screens showing it
        self.focused_nodes: Counter[str] = Counter()  # node key → screens showing it
        #: Moves when what the feed should subscribe to may have changed.
        self.topics_version = 0
        self.version = 0
        self.events_seen = 0
        # Called (outside the lock) after every change a subscriber may want at once;
        # the benchmark uses it to time values into the model. None in the app.
        self.on_metrics: Callable[[str, RunMetricsEvent, float], None] | None = None

    # ================================================================ feed side

    def _node(self, key: str) -> NodeView:
        return self.nodes[key]

    def _run(self, run_id: str) -> RunView:
        run = self.runs.get(run_id)
        if run is None:
            run = self.runs[run_id] = RunView(run_id)
        return run

    def _changed(self) -> None:
        self.version += 1

    def apply_events(self, key: str, events: Iterable[Event]) -> None:
        """A batch of events from one node: one lock, one version bump."""
        metrics: list[RunMetricsEvent] = []
        with self.lock:
            node = self._node(key)
            node.seen(self.clock())
            for event in events:
                self.events_seen += 1
                self._apply(node, event, metrics)
            self._changed()
        if self.on_metrics is not None:
            now = self.wall()
            for m in metrics:
                self.on_metrics(key, m, now)

    def apply_event(self, key: str, event: Event) -> None:
        self.apply_events(key, (event,))

    def _apply(self, node: NodeView, event: Event, metrics: list[RunMetricsEvent]) -> None:
        body = event.body
        if isinstance(body, NodeBrief):
            self._brief(node, body)
        elif isinstance(body, NodeSnapshot):
            self._snapshot(node, body)
        elif isinstance(body, NodeEvent):
            node.events.append(body)
            node.version += 1
        elif isinstance(body, RunSummary):
            self._summary(node, body)
        elif isinstance(body, RunMetricsEvent):
            self._run(body.run_id).add_points(body.attempt, body.points)
            metrics.append(body)
        elif isinstance(body, RunLogEvent):
            # The topic is `run.<id>.log`; ids may hold dots, so cut both ends.
            if not (event.topic.startswith("run.") and event.topic.endswith(".log")):
                return
            run_id = event.topic[len("run.") : -len(".log")]
            run = self._run(run_id)
            run.logs.add_live(
                body.node,
                body.node_rank,
                body.attempt,
                run.nproc_of(body.node_rank) if run.known else None,
                body.lines,
                body.offset,
            )
            run.version += 1
        elif isinstance(body, HealthSummary):
            self._run(body.run_id).set_health(body)
        elif isinstance(body, RunEvent):
            run = self._run(body.run_id)
            run.events.append(body)
            run.version += 1

    def _snapshot(self, node: NodeView, snapshot: NodeSnapshot) -> None:
        if node.briefs and node.key not in self.focused_nodes:
            return  # late, from before its screen closed: its brief shows the node
        node.add_snapshot(snapshot)

    def _brief(self, node: NodeView, brief: NodeBrief) -> None:
        if not node.briefs:
            node.briefs = True
            self.topics_version += 1  # a daemon that sends briefs: no need for everything
            if node.key not in self.focused_nodes:
                node.drop_snapshot()  # briefs from now on, snapshots only on its screen
        node.add_brief(brief)
        for line in brief.runs:
            if self._run(line.id).add_brief(node.key, line, brief.time):
                node.needs_runs = True
            node.run_ids.add(line.id)

    def _summary(self, node: NodeView, summary: RunSummary) -> None:
        self._run(summary.id).add_summary(node.key, summary)
        node.run_ids.add(summary.id)

    def apply_info(self, key: str, info: NodeInfo) -> None:
        with self.lock:
            self._node(key).info = info
            self._changed()

    def apply_snapshot(self, key: str, snapshot: NodeSnapshot) -> None:
        """A snapshot from `node.hw` (not an event: it does not prove liveness)."""
        with self.lock:
            self._snapshot(self._node(key), snapshot)
            self._changed()

    def apply_runs(self, key: str, runs: RunList) -> None:
        with self.lock:
            node = self._node(key)
            for summary in runs.runs:
                self._summary(node, summary)
            self._changed()

    def apply_node_events(self, key: str, reply: NodeEventsReply) -> None:
        with self.lock:
            node = self._node(key)
            known = {(e.time, e.kind, e.gpu_index) for e in node.events}
            for event in reply.events:
                if (event.time, event.kind, event.gpu_index) not in known:
                    node.events.append(event)
            ordered = sorted(node.events, key=lambda e: e.time)
            node.events.clear()
            node.events.extend(ordered)
            node.version += 1
            self._changed()

    def apply_metrics_history(self, run_id: str, reply: MetricsReply) -> None:
        with self.lock:
            self._run(run_id).add_history(reply)
            self._changed()

    def apply_attempts(
        self, run_id: str, attempts: list[AttemptRecord], goodput: Goodput | None = None
    ) -> None:
        """Node 0's attempts: what each started on (its world size); and its goodput."""
        with self.lock:
            run = self._run(run_id)
            if goodput is not None:
                run.fetched_goodput = goodput
            for a in attempts:
                if a.world_size is not None:
                    run.worlds[a.attempt] = a.world_size
            run.version += 1
            self._changed()

    def metrics_unavailable(self, run_id: str, why: str) -> None:
        with self.lock:
            run = self._run(run_id)
            run.history = "unavailable"
            run.history_error = why
            run.version += 1
            self._changed()

    def apply_log_chunk(self, chunk: LogChunk) -> None:
        with self.lock:
            run = self._run(chunk.run_id)
            run.logs.add_tail(
                chunk.node,
                chunk.node_rank,
                chunk.attempt,
                run.nproc_of(chunk.node_rank) if run.known else None,
                chunk.lines,
                chunk.next_offset,
            )
            run.version += 1
            self._changed()

    def logs_unavailable(self, run_id: str, node_rank: int, attempt: int) -> None:
        with self.lock:
            self._run(run_id).logs.tails_loaded.add((node_rank, attempt))

    def apply_health(self, health: HealthSummary) -> None:
        with self.lock:
            run = self._run(health.run_id)
            if run.health is None or run.health.time <= health.time:
                run.set_health(health)
            run.version += 1
            self._changed()

    def note_error(self, key: str, message: str) -> None:
        with self.lock:
            node = self._node(key)
            if node.error != message:
                node.error = message
                self._changed()

    def wants(self, key: str) -> list[Want]:
        """What the feed of node `key` should fetch now; handed out once each."""
        found: list[Want] = []
        if not self.focused and not self.focused_nodes:
            return found  # the common case, without taking the lock
        with self.lock:
            node = self.nodes[key]
            if key in self.focused_nodes and not node.snapshot_asked:
                node.snapshot_asked = True
                found.append(Want("hw", ""))
            for run_id in list(self.focused):
                run = self.runs.get(run_id)
                if run is None or not run.known:
                    continue
                for node_rank, node_key in run.part_nodes.items():
                    if node_key != key:
                        continue
                    attempt = run.parts[node_rank].attempt
                    if (node_rank, attempt) not in run.logs.tails_loaded:
                        run.logs.tails_loaded.add((node_rank, attempt))
                        found.append(Want("logs", run_id, node_rank, attempt))
                    if node_rank != 0:
                        continue
                    if run.history == "none":
                        run.history = "loading"
                        found.append(Want("metrics", run_id))
                    if not run.health_asked:
                        run.health_asked = True
                        found.append(Want("health", run_id))
        return found

    def retry_want(self, want: Want, key: str) -> None:
        """A fetch from node `key` that could not reach it: hand it out again later."""
        with self.lock:
            if want.kind == "hw":
                self.nodes[key].snapshot_asked = False
                return
            run = self.runs.get(want.run_id)
            if run is None:
                return
            if want.kind == "metrics":
                run.history = "none"
            elif want.kind == "logs" and want.attempt is not None:
                run.logs.tails_loaded.discard((want.node_rank, want.attempt))
            elif want.kind == "health":
                run.health_asked = False

    # ================================================================ UI side

    def focus(self, run_id: str) -> None:
        """A screen shows this run in detail: fetch its history, logs and health, and
        subscribe to its every event."""
        with self.lock:
            self.focused[run_id] += 1
            self.topics_version += 1

    def unfocus(self, run_id: str) -> None:
        """No screen shows it any more: its own topics stop, so what was fetched for it
        (history, log tails, health) goes stale and is fetched again when it shows."""
        with self.lock:
            self.focused[run_id] -= 1
            if self.focused[run_id] <= 0:
                del self.focused[run_id]
                run = self.runs.get(run_id)
                if run is not None:
                    run.history = "none" if run.history == "loaded" else run.history
                    run.logs.tails_loaded.clear()
                    run.health_asked = False
            self.topics_version += 1

    def focus_node(self, key: str) -> None:
        """A screen shows this node: its full snapshots, as long as it does."""
        with self.lock:
            self.focused_nodes[key] += 1
            self.topics_version += 1

    def unfocus_node(self, key: str) -> None:
        with self.lock:
            self.focused_nodes[key] -= 1
            if self.focused_nodes[key] <= 0:
                del self.focused_nodes[key]
                node = self.nodes[key]
                node.drop_snapshot()
                node.snapshot_asked = False
            self.topics_version += 1

    def topics(self, key: str) -> tuple[str, ...]:
        """What the feed subscribes to on node `key`: briefs and hardware events always;
        full snapshots of a node on screen; every event of a run on screen. A daemon that
        sends no briefs (an older gpud) gets everything, as before briefs existed."""
        node = self.nodes[key]
        if not node.briefs and node.quiet_for_briefs(self.clock()):
            return ("",)
        wanted = [BRIEF_PREFIX, NODE_EVENTS_PREFIX]
        if key in self.focused_nodes or not node.briefs:
            wanted.append(HW_PREFIX)  # until its first brief, snapshots say it is alive
        wanted += [f"run.{run_id}." for run_id in sorted(self.focused)]
        return tuple(wanted)

    def take_needs_runs(self, key: str) -> bool:
        """Whether a brief showed a run this node should list again (once each)."""
        with self.lock:
            node = self.nodes[key]
            needed, node.needs_runs = node.needs_runs, False
            return needed

    def node(self, key: str) -> NodeView | None:
        return self.nodes.get(key)

    def node_by_name(self, name: str) -> NodeView | None:
        wanted = name.strip()
        for node in self.nodes.values():
            if wanted in (node.name, node.label, node.key):
                return node
        return None

    def find_run(self, ref: str) -> str | None:
        """A run by id, by a unique id prefix, or by name (its newest run)."""
        with self.lock:
            runs = self.sorted_runs()
            if any(run.id == ref for run in runs):
                return ref
            prefixed = [r.id for r in runs if r.id.startswith(ref)]
            if len(prefixed) == 1:
                return prefixed[0]
            named = [r for r in runs if r.summary.name == ref]
            return max(named, key=lambda r: r.summary.created_at).id if named else None

    def key_of(self, control: str) -> str | None:
        """Our node key for a control address a run names (spellings may differ)."""
        wanted = canonical_endpoint(control)
        for key in self.nodes:
            if canonical_endpoint(key) == wanted:
                return key
        return None

    def efficiency(self, run: RunView) -> LiveEfficiency | None:
        """A live run's throughput against linear scaling of its spec's baseline (`gpuctl
        scaling`), noting when that was measured on other hardware; None without one."""
        rate = run.rate()
        world = run.world_size()
        if not run.known or rate is None or not world:
            return None
        baseline = self.baselines.get(run.summary.name)
        if baseline is None:
            return None
        value = live_efficiency(baseline, rate.value, rate.unit, world)
        if value is None:
            return None
        kinds = [
            (info.gpu_name if info.gpu_count else None, info.simulated)
            for key in run.part_nodes.values()
            if (info := self.nodes[key].info) is not None
        ]
        same = all(any(h.same_kind(*kind) for h in baseline.hardware) for kind in kinds)
        other = None if same else "; ".join(h.describe() for h in baseline.hardware)
        return LiveEfficiency(value, world, baseline, other)

    def online(self, key: str) -> bool:
        return self.nodes[key].online(self.clock())

    def sorted_runs(self) -> list[RunView]:
        """Active runs first, newest first."""
        known = [r for r in self.runs.values() if r.known]
        return sorted(known, key=lambda r: (not r.active, -r.summary.created_at))

    def runs_on(self, key: str) -> list[RunView]:
        node = self.nodes[key]
        return [self.runs[r] for r in sorted(node.run_ids) if r in self.runs and self.runs[r].known]

    def summary(self) -> FleetSummary:
        now = self.clock()
        online = [n for n in self.nodes.values() if n.online(now)]
        util_sum = mem_sum = 0.0
        util_n = mem_n = gpus = xid = throttled = links = 0
        for node in online:
            load = node.load()
            gpus += load.gpus
            util_sum += load.util_sum
            util_n += load.util_count
            mem_sum += load.memory_sum
            mem_n += load.memory_count
            health = node.health()
            xid += health.xid
            throttled += len(health.throttled)
            links += health.link_errors
        runs = [r for r in self.runs.values() if r.known]
        return FleetSummary(
            nodes=len(self.nodes),
            online=len(online),
            offline=len(self.nodes) - len(online),
            simulated=sum(1 for n in online if n.simulated),
            gpus=gpus,
            util_pct=util_sum / util_n if util_n else None,
            memory_pct=mem_sum / mem_n if mem_n else None,
            xid=xid,
            throttled=throttled,
            link_errors=links,
            runs=len(runs),
            running=sum(1 for r in runs if r.active),
        )

    def gpu_holder(self, key: str, gpu_index: int) -> tuple[RunView, int] | None:
        """The run whose part on node `key` leases that GPU, and that part's node rank."""
        for run in self.runs_on(key):
            for node_rank, node_key in run.part_nodes.items():
                part = run.parts.get(node_rank)
                if node_key == key and part is not None and gpu_index in part.gpus:
                    return run, node_rank
        return None

    def process_owner(self, key: str, gpu_index: int, pid: int) -> ProcessOwner | None:
        """Which run and rank a process on a GPU of node `key` belongs to."""
        node = self.nodes[key]
        for run in self.runs_on(key):
            health = run.health
            if health is None:
                continue
            for rank in health.ranks:
                if rank.pid == pid and self._rank_on(run, rank.node_rank, key):
                    return ProcessOwner(run.id, rank.rank, rank.local_rank, "health")
        # Simulated GPUs carry a running rank as load on the GPU its local rank was given
        # (CUDA_VISIBLE_DEVICES[LOCAL_RANK], gpud/runs/placement/simload.py): the lease maps it
        # back.
        if not node.simulated:
            return None
        held = self.gpu_holder(key, gpu_index)
        if held is None:
            return None
        run, node_rank = held
        local = run.parts[node_rank].gpus.index(gpu_index)
        nproc = run.nproc_of(node_rank)
        if nproc and local < nproc:
            return ProcessOwner(run.id, node_rank * nproc + local, local, "simulated")
        return None

    def _rank_on(self, run: RunView, node_rank: int, key: str) -> bool:
        if not run.known or node_rank >= len(run.summary.nodes):
            return False
        return self.key_of(run.summary.nodes[node_rank].control) == key or (
            run.part_nodes.get(node_rank) == key
        )
