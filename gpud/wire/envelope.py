"""The envelopes every message travels in, and what the protocol says about itself.

The protocol's versions (`PROTOCOL_VERSION`, `MIN_PROTOCOL`), the frame size bound, the
error codes and `ProtocolError`, and the request, reply and event envelopes with the base
of every message body (`Message`: read leniently, checked). `gpud.wire.protocol` declares
the methods on top of these; the bodies are `gpud.wire.node_messages` and
`gpud.wire.run_messages`.
"""

from __future__ import annotations

from enum import Enum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from gpud import __version__
from gpud.model.snapshot import Reading
from gpud.notify.targets import redact

#: The protocol this code speaks, and the oldest it still serves: a request whose `v` is
#: outside is refused with one line naming both. 1: gpud 0.1.0. 2: gpud 0.2.0 — lenient
#: request bodies; `run.start`, `LaunchRequest.start_by_call` and `JoinRequest.hold` (a
#: client checks the daemon speaks 2 before it sends them).
PROTOCOL_VERSION = 2
MIN_PROTOCOL = 1
#: The protocol that brought `run.start`, `start_by_call` and `hold`.
PROTOCOL_START_BY_CALL = 2
#: The largest request: a client refuses to send a larger one, and a daemon answers one a
#: little larger (up to READ_FRAME_BYTES) with an error naming this limit, and logs it.
MAX_FRAME_BYTES = 4 * 1024 * 1024
#: What the control socket reads at most (ZMQ_MAXMSGSIZE): past it the socket itself drops
#: the connection, reading nothing.
READ_FRAME_BYTES = MAX_FRAME_BYTES + 1024 * 1024


def too_large(size: int, method: str | None = None) -> str:
    """The one line for a request over MAX_FRAME_BYTES (`method`: where it is known)."""
    what = f"the {method} request is" if method else "a request of"
    line = (
        f"{what} {size / 2**20:.1f} MiB; a gpud takes at most {MAX_FRAME_BYTES // 2**20}"
        " MiB a request"
    )
    if method in ("run.launch", "run.join"):
        line += ": make the spec smaller (a large DeepSpeed config, env or args belong in a"
        line += " file the script reads)"
    return line


class ErrorCode(str, Enum):
    BAD_FRAME = "bad_frame"  # not JSON, or not a request envelope
    UNSUPPORTED_VERSION = "unsupported_version"
    UNKNOWN_TYPE = "unknown_type"
    INVALID_BODY = "invalid_body"
    FORBIDDEN = "forbidden"
    NOT_FOUND = "not_found"
    CONFLICT = "conflict"
    UNAVAILABLE = "unavailable"
    INTERNAL = "internal"


class ProtocolError(Exception):
    """A request that cannot be served; becomes an error reply with `code`."""

    def __init__(self, code: ErrorCode, message: str, request_id: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.request_id = request_id


# --------------------------------------------------------------------------- envelopes


def speaks(low: int = MIN_PROTOCOL, high: int = PROTOCOL_VERSION) -> str:
    """A range of protocol versions as messages write it: `1–2`, or `2`."""
    return str(high) if low == high else f"{low}–{high}"


def unsupported_version(version: int, low: int = MIN_PROTOCOL, high: int = PROTOCOL_VERSION) -> str:
    """The one line a daemon refuses a request of another protocol with: both versions."""
    return (
        f"protocol version {version} is not supported: this daemon (gpud {__version__})"
        f" speaks {speaks(low, high)}"
    )


class Message(BaseModel):
    """Base of every request body. Lenient (unknown fields ignored), so a client or peer of
    a later version is served; what each field holds (type, size, pattern) stays checked."""

    model_config = ConfigDict(extra="ignore", frozen=True, defer_build=True)

    def audited(self) -> dict[str, Any]:
        """The body as the audit log keeps it: what holds a secret (a webhook URL) is
        shown as `redact` shows it."""
        return self.model_dump(mode="json")


def _redact_hook(hook: Any) -> Any:
    """One `notify:` entry as the audit log keeps it, whatever shape a person gave it."""
    if isinstance(hook, dict):
        return {**hook, "url": redact(str(hook["url"]))} if "url" in hook else hook
    return redact(hook) if isinstance(hook, str) else "…"


def _redact_spec(body: dict[str, Any]) -> dict[str, Any]:
    """A launch or join body with the spec's webhook URLs redacted (also in a spec the
    daemon refuses: the audit log keeps refusals too)."""
    spec = body.get("spec")
    if isinstance(spec, dict) and "notify" in spec:
        hooks = spec["notify"]
        shown = [_redact_hook(h) for h in hooks] if isinstance(hooks, list) else _redact_hook(hooks)
        body = {**body, "spec": {**spec, "notify": shown}}
    return body


class Request(Message):
    v: int
    id: str = Field(min_length=1, max_length=128)
    type: str = Field(min_length=1, max_length=64)
    body: dict[str, Any] = Field(default_factory=dict)


class ErrorInfo(Reading):
    code: str
    message: str


class Reply(Reading):
    v: int
    id: str | None
    ok: bool
    body: Any = None
    error: ErrorInfo | None = None


class Event(Reading):
    v: int
    topic: str
    seq: int
    time: float
    body: Any
