"""The bodies of the node's own methods: who the daemon is (`NodeInfo`), its events and
their acknowledgement, drains, garbage collection and usage, and the webhook test.

Pure models; `gpud.wire.protocol` pairs each with its method and role.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, model_validator

from gpud.model.snapshot import Backend, Hold, NodeEvent, Reading, known_node_events
from gpud.notify.targets import Format, Webhook
from gpud.retention.usage import RunUsage
from gpud.security.roles import Role
from gpud.wire.envelope import Message

# --------------------------------------------------------------------------- bodies


class Empty(Message):
    """A request or reply without fields."""


class NodeInfo(Reading):
    """Reply to `node.info`: who the daemon is and how to reach its events."""

    node: str
    version: str = Field(description="the daemon's gpud release (gpud.__version__)")
    protocol: int = Field(description="the newest protocol it speaks")
    min_protocol: int = Field(1, description="the oldest protocol it still serves")
    store_schema: int | None = Field(
        None, description="its store's schema version (PRAGMA user_version)"
    )
    skipped_messages: int = Field(
        0,
        description="trainer messages of a kind this daemon does not know (a newer trainers"
        " library), skipped since it started",
    )
    pid: int
    started_at: float
    uptime_s: float
    control: str
    events: str
    backend: Backend
    simulated: bool
    gpu_count: int
    gpu_name: str | None = Field(None, description="the GPU model, or 'mixed'")
    secure: bool = Field(description="false when started with --insecure")
    role: Role = Field(description="the role of the key that asked")
    cpu_seconds: float | None = Field(None, description="the daemon's CPU time since it started")
    cpu_by_component: dict[str, float] = Field(
        default_factory=dict,
        description="of that, what each periodic part of the daemon spent (gpud.node.ledger)",
    )


class NodeEventsRequest(Message):
    limit: int = Field(100, ge=1, le=1000)
    since: float | None = Field(None, description="only events after this unix time")


class NodeEventsReply(Reading):
    events: list[NodeEvent]
    skipped: int = Field(
        0, description="events of a kind this reader does not know (a newer daemon): left out"
    )

    @model_validator(mode="before")
    @classmethod
    def _skip_unknown_kinds(cls, data: Any) -> Any:
        # One event of a kind added later must not cost the reader the whole reply.
        if isinstance(data, dict) and isinstance(data.get("events"), list):
            known = known_node_events(data["events"])
            left_out = len(data["events"]) - len(known)
            if left_out:
                skipped = int(data.get("skipped") or 0) + left_out
                data = {**data, "events": known, "skipped": skipped}
        return data


class AckEventsRequest(Message):
    gpu_index: int | None = Field(None, ge=0, description="one GPU, or all when omitted")


class AckEventsReply(Reading):
    acknowledged: int = Field(description="how many unacknowledged XID events were cleared")


class DrainRequest(Message):
    gpus: list[int] | None = Field(
        None, max_length=64, description="GPU indices; omitted: the whole node"
    )
    reason: str = Field(min_length=1, max_length=300, description="why, for the people after")


class UndrainRequest(Message):
    gpus: list[int] | None = Field(
        None, max_length=64, description="GPU indices; omitted: the node's drain"
    )


class HeldGpu(Reading):
    index: int
    uuid: str
    hold: Hold


class DrainReply(Reading):
    """The node's holds after a drain or undrain, and what it touched."""

    node: str
    drained: Hold | None = Field(None, description="the node's own drain")
    gpus: list[HeldGpu] = Field(default_factory=list, description="every GPU still held")
    runs: list[str] = Field(
        default_factory=list, description="runs with a part on what was drained (not stopped)"
    )
    notes: list[str] = Field(default_factory=list)


class GcRequest(Message):
    """Apply retention now (`gpuctl gc`); with `dry_run`, only say what it would remove."""

    dry_run: bool = False


class UsageRequest(Message):
    """Every run's use of this node since `since` (unix time): `gpuctl usage`."""

    since: float = Field(0.0, ge=0, description="runs that ended before this are left out")


class UsageReply(Reading):
    node: str
    now: float = Field(description="the daemon's clock when it answered")
    runs: list[RunUsage] = Field(
        default_factory=list,
        description="runs with a part here, live or ended since `since`, and the rows"
        " retention left of removed ones",
    )


class GcRun(Reading):
    """A finished run retention removed (or, in a dry run, would remove)."""

    id: str
    name: str
    state: str
    ended_at: float
    why: str = Field(description="the bound it is over")
    bytes: int = Field(description="its run dir (checkpoints left out), its database rows")
    rows: int = Field(description="its metric points and events")
    kept: list[str] = Field(default_factory=list, description="checkpoints left in place")
    notes: list[str] = Field(default_factory=list)


class GcReply(Reading):
    """What one pass of retention did on a node (or, dry, would do)."""

    node: str
    dry_run: bool
    limits: str = Field(description="the bounds, in one line")
    removed: list[GcRun] = Field(default_factory=list)
    finished_kept: int = Field(0, description="finished runs kept")
    protected: int = Field(0, description="runs retention leaves alone now (active, queued...)")
    thinned_runs: int = Field(0, description="finished runs whose old metric points thinned")
    points_removed: int = 0
    node_events_removed: int = 0
    state_bytes: int = Field(0, description="the database and run dirs after the pass")
    checkpoint_bytes: int = Field(0, description="checkpoints in the state dir (never removed)")
    runs: int = Field(0, description="run records after the pass")
    vacuumed_pages: int = 0
    longest_block_ms: float = Field(0.0, description="the longest the pass held the loop")
    elapsed_s: float = 0.0
    notes: list[str] = Field(default_factory=list)


class NotifyTestRequest(Message):
    """Send a test alert to this webhook, or (omitted) to every webhook the daemon has."""

    webhook: Webhook | None = None

    def audited(self) -> dict[str, Any]:
        body = super().audited()
        if self.webhook is not None:
            body["webhook"] = {**body["webhook"], "url": self.webhook.shown}
        return body


class WebhookAnswer(Reading):
    """What one webhook answered a test alert."""

    target: str = Field(description="the URL as logs show it: scheme://host/…")
    format: Format
    ok: bool
    status: int | None = Field(None, description="the HTTP status, when one came")
    error: str | None = None
    elapsed_s: float


class NotifyTestReply(Reading):
    node: str
    answers: list[WebhookAnswer]
