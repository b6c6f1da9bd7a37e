"""Decoding events in one pass: the envelope and its body validated together.

`gpud.wire.protocol.decode_event` validates the envelope with an untyped body, then the body
again from Python objects; for a node snapshot (30 kB of JSON with 8 GPUs and their
NVLinks) that is twice the work, and snapshots are most of what gputop decodes. Here each
topic kind has a typed envelope, so the JSON is validated straight into its model; any
other topic falls back to `decode_event`. The result is the same `Event`.
"""

from __future__ import annotations

from gpud.model.run import HealthSummary, RunEvent
from gpud.model.snapshot import NodeSnapshot
from gpud.wire.brief import NodeBrief
from gpud.wire.envelope import Event
from gpud.wire.protocol import RunLogEvent, RunMetricsEvent, decode_event
from gpud.wire.run_messages import RunSummary


class _HwEvent(Event):
    body: NodeSnapshot


class _BriefEvent(Event):
    body: NodeBrief


class _StateEvent(Event):
    body: RunSummary


class _LogEvent(Event):
    body: RunLogEvent


class _MetricsEvent(Event):
    body: RunMetricsEvent


class _RunEventEvent(Event):
    body: RunEvent


class _HealthEvent(Event):
    body: HealthSummary


_RUN_KINDS: dict[bytes, type[Event]] = {
    b"state": _StateEvent,
    b"log": _LogEvent,
    b"metrics": _MetricsEvent,
    b"event": _RunEventEvent,
    b"health": _HealthEvent,
}


def _envelope(topic: bytes) -> type[Event] | None:
    if topic.startswith(b"sum."):
        return _BriefEvent
    if topic.startswith(b"hw."):
        return _HwEvent
    if topic.startswith(b"node.") and topic.endswith(b".event"):
        # Rare, and of a kind a newer daemon may add: `decode_event` skips those
        # (UnknownKind) rather than call the event garbage.
        return None
    if topic.startswith(b"run."):
        return _RUN_KINDS.get(topic.rsplit(b".", 1)[-1])
    return None


def decode(frames: list[bytes]) -> Event:
    """Like `gpud.wire.protocol.decode_event`; raises ValidationError or ValueError on garbage."""
    if len(frames) != 2:
        raise ValueError(f"an event has 2 frames, got {len(frames)}")
    envelope = _envelope(frames[0])
    if envelope is None:
        return decode_event(frames)
    event = envelope.model_validate_json(frames[1])
    if event.topic != frames[0].decode(errors="replace"):
        raise ValueError("event topic frame and envelope disagree")
    return event
