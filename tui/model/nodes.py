"""What gputop knows about one node: its brief, its GPU histories, events, liveness, and
its full snapshot while a screen shows the node.

A node is online while its events keep coming. Every event counts (briefs arrive each
interval), so a node whose events stop for `offline_after_s` — 2.5 s at the default 1 s
interval — is shown offline, within the 3 s the UI promises, and shows online again with
the first event after it comes back.

Views of many nodes read the node's `brief` (`sum.<node>`, ~1 kB: per GPU its activity,
memory and trouble; the node's health); the full `snapshot` (`hw.<node>`, ~30 kB) comes
only while the node's own screen is open (and from daemons that send no briefs, from
which a brief is derived).
"""

from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass, field

from gpud.model.snapshot import NodeEvent, NodeSnapshot
from gpud.wire.brief import (
    NodeBrief,
    NodeHealthBrief,
    activity_pct,
    gpu_link_errors,
    memory_pct,
    throttle_reasons,
)
from gpud.wire.briefing import node_brief
from gpud.wire.client import NodeTarget
from gpud.wire.node_messages import NodeInfo
from tui.model.series import Recent

#: Silence after which a node is offline, at the default 1 s interval.
OFFLINE_AFTER_S = 2.5
NODE_EVENTS_KEPT = 200
#: How long after a node's first event gputop waits for its first brief before taking it
#: for a daemon without briefs and subscribing to everything it sends.
BRIEF_GRACE_S = 3.0
_TRAILING_NUMBER = re.compile(r"[-_.]?\d+$")

__all__ = [
    "GpuHistory",
    "NodeHealthBrief",
    "NodeLoad",
    "NodeView",
    "activity_pct",
    "gpu_link_errors",
    "group_of",
    "memory_pct",
    "throttle_reasons",
]


@dataclass
class GpuHistory:
    """Recent readings of one GPU, for its sparklines: activity and memory from every
    brief, power and temperature while the node's full snapshots come."""

    util: Recent = field(default_factory=Recent)
    memory: Recent = field(default_factory=Recent)  # percent of total
    power: Recent = field(default_factory=Recent)
    temperature: Recent = field(default_factory=Recent)


@dataclass(frozen=True)
class NodeLoad:
    """Sums over a node's GPUs, for fleet-wide averages without a pass over every GPU."""

    gpus: int = 0
    util_sum: float = 0.0
    util_count: int = 0
    memory_sum: float = 0.0
    memory_count: int = 0


def node_load(brief: NodeBrief | None) -> NodeLoad:
    if brief is None:
        return NodeLoad()
    utils = [g.activity_pct for g in brief.gpus if g.activity_pct is not None]
    mems = [g.memory_pct for g in brief.gpus if g.memory_pct is not None]
    return NodeLoad(len(brief.gpus), sum(utils), len(utils), sum(mems), len(mems))


def group_of(name: str) -> str:
    """`rack1-node07` → `rack1-node`: nodes numbered in a series group together."""
    stem = _TRAILING_NUMBER.sub("", name)
    return stem or name


class NodeView:
    """One node. Mutated by its feed thread under the model's lock; read by the UI."""

    def __init__(self, target: NodeTarget, group: str | None = None) -> None:
        self.target = target
        self.key = target.control
        self.label = target.label
        self.configured_name = target.name
        self.configured_group = group
        self.info: NodeInfo | None = None
        self.snapshot: NodeSnapshot | None = None
        self.brief: NodeBrief | None = None
        self.brief_version = 0  # moves with every brief: what a fleet row is drawn from
        self._history_time = 0.0  # the sample time the histories last took
        self.briefs = False  # its daemon sends briefs (`sum.<node>`)
        self.first_seen: float | None = None  # monotonic time of its first event
        self.needs_runs = False  # a brief named a run whose full record is to be asked for
        self.snapshot_asked = False  # node.hw asked since its screen opened
        self.last_seen: float | None = None  # monotonic time of the last event
        self.interval_s = 1.0
        self.error: str | None = None
        self.histories: dict[int, GpuHistory] = {}
        self.events: deque[NodeEvent] = deque(maxlen=NODE_EVENTS_KEPT)
        self.run_ids: set[str] = set()
        self.version = 0
        self._load: tuple[NodeBrief | None, NodeLoad] = (None, NodeLoad())

    @property
    def name(self) -> str:
        if self.configured_name:
            return self.configured_name
        if self.brief is not None:
            return self.brief.node
        if self.info is not None:
            return self.info.node
        return self.label

    @property
    def group(self) -> str:
        return self.configured_group or group_of(self.name)

    @property
    def simulated(self) -> bool:
        if self.brief is not None:
            return self.brief.simulated
        return bool(self.info and self.info.simulated)

    def offline_after_s(self) -> float:
        # At the default 1 s interval: 2.5 s. A daemon sampling slower gets its interval
        # plus the same margin, so it does not flap between samples.
        return max(OFFLINE_AFTER_S, self.interval_s + 1.5)

    def online(self, now: float) -> bool:
        return self.last_seen is not None and now - self.last_seen <= self.offline_after_s()

    def seen(self, now: float) -> None:
        self.last_seen = now
        if self.first_seen is None:
            self.first_seen = now
        self.error = None

    def quiet_for_briefs(self, now: float) -> bool:
        """Heard from for a while, but no brief came: a daemon that sends none."""
        return self.first_seen is not None and now - self.first_seen > BRIEF_GRACE_S

    def add_snapshot(self, snapshot: NodeSnapshot) -> None:
        if (
            self.snapshot is not None
            and snapshot.seq == self.snapshot.seq
            and (snapshot.time == self.snapshot.time)
        ):
            return  # the same sample again (node.hw after the event)
        self.snapshot = snapshot
        for gpu in snapshot.gpus:
            history = self._history(gpu.index)
            history.power.add(gpu.power_w)
            history.temperature.add(gpu.temperature_c)
        if self.brief is None or snapshot.time >= self.brief.time:
            # From a daemon that sends no briefs, or ahead of this sample's brief: the
            # fleet's view of the node follows the full snapshot (without its runs).
            self.add_brief(node_brief(snapshot))
        self.version += 1

    def add_brief(self, brief: NodeBrief) -> None:
        if self.brief is not None and brief.time < self.brief.time:
            return  # older than what is shown
        if self.brief is not None and brief.time == self.brief.time and brief.runs == []:
            return  # a brief derived from the snapshot this one came with
        self.brief = brief
        self.brief_version += 1
        self.interval_s = brief.interval_s or 1.0
        if brief.time > self._history_time:
            self._history_time = brief.time
            for gpu in brief.gpus:
                history = self._history(gpu.index)
                history.util.add(gpu.activity_pct)
                history.memory.add(gpu.memory_pct)
        self.version += 1

    def _history(self, index: int) -> GpuHistory:
        history = self.histories.get(index)
        if history is None:
            history = self.histories[index] = GpuHistory()
        return history

    def drop_snapshot(self) -> None:
        """Its screen closed: the full snapshot is no longer kept (nor sent)."""
        self.snapshot = None

    def health(self) -> NodeHealthBrief:
        return self.brief.health if self.brief is not None else NodeHealthBrief()

    def load(self) -> NodeLoad:
        brief, load = self._load
        if brief is not self.brief:
            load = node_load(self.brief)
            self._load = (self.brief, load)
        return load
