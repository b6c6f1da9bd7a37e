"""Where alerts go: the webhook model a person writes under `notify:` (in the daemon's
`gpud.yaml` and in a run spec), the events it may ask for, and how a URL is shown.

Pure: pydantic and the standard library's URL parsing, no I/O. A webhook URL usually
carries its secret (Slack's and Discord's tokens are in the path), so nothing outside the
sender ever shows more of it than `redact()` does: the scheme and the host.
"""

from __future__ import annotations

from enum import Enum
from typing import Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator


class EventKind(str, Enum):
    """What a webhook can be told."""

    FAILED = "failed"  # a run ended failed (node 0 decides: one alert per run)
    SUCCEEDED = "succeeded"  # a run ended succeeded (opt-in)
    STALLED = "stalled"  # a run's health has said stalled for `stalled_after_s`
    HANG = "hang"  # a run was stopped as hung and restarts (restart.hang_timeout_s)
    QUARANTINE = "quarantine"  # gpud quarantined a GPU of this node
    TEST = "test"  # `gpuctl notify test`: always sent, whatever `events` says


#: What a webhook gets unless its `events` says otherwise: trouble, not good news.
DEFAULT_EVENTS = (EventKind.FAILED, EventKind.STALLED, EventKind.HANG, EventKind.QUARANTINE)

Format = Literal["json", "slack", "discord"]
MAX_URL_CHARS = 2048
#: A test alert (`gpuctl notify test`) waits at most this long for each webhook.
TEST_TIMEOUT_S = 10.0
#: What became of each alert handed to the sender (`gpud_notify_deliveries_total{result}`):
#: sent; failed (given up after its retries, or refused with a 4xx); dropped (too many
#: waiting, or the daemon stopped first); retried (an attempt that failed and is retried).
DELIVERY_RESULTS = ("sent", "failed", "dropped", "retried")


class Webhook(BaseModel):
    """One receiver of alerts: a URL gpud POSTs JSON to, in the format it reads."""

    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)

    url: str = Field(
        max_length=MAX_URL_CHARS,
        repr=False,  # a secret: never in a repr, a log line or a traceback's message
        description="http(s) URL to POST to; treated as a secret: logs show only scheme://host/…",
    )
    format: Format = Field(
        "json",
        description="json: gpud's alert as JSON; slack: a Slack incoming webhook (text +"
        " blocks); discord: a Discord webhook (content + embeds)",
    )
    events: list[EventKind] = Field(
        default_factory=lambda: list(DEFAULT_EVENTS),
        description="what to send: failed, succeeded, stalled, hang, quarantine (default:"
        " all but succeeded)",
    )
    stalled_after_s: float = Field(
        300.0,
        ge=1,
        le=86400,
        description="`stalled` fires once a run's health has said stalled this long",
    )
    timeout_s: float = Field(
        5.0, gt=0, le=60, description="each POST gives up after this long (then retries)"
    )

    @field_validator("url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        # The message never repeats the URL: it may hold a token.
        try:
            parts = urlsplit(value)
            port = parts.port  # raises on a port that is not a number
        except ValueError:
            raise ValueError("not a valid URL (expected https://host/path)") from None
        if parts.scheme not in ("http", "https"):
            raise ValueError(f"expected an http:// or https:// URL, not {parts.scheme or 'none'}")
        if not parts.hostname:
            raise ValueError("the URL has no host (expected https://host/path)")
        if port == 0 or any(c in value for c in "\r\n\t "):
            raise ValueError("not a valid URL (expected https://host/path)")
        return value

    @field_validator("events")
    @classmethod
    def _events(cls, value: list[EventKind]) -> list[EventKind]:
        if EventKind.TEST in value:
            raise ValueError("`test` is not an event to ask for: gpuctl notify test always sends")
        return list(dict.fromkeys(value))

    def wants(self, kind: EventKind) -> bool:
        return kind is EventKind.TEST or kind in self.events

    @property
    def shown(self) -> str:
        """The URL as logs and replies show it (`redact`)."""
        return redact(self.url)


def redact(url: str) -> str:
    """`https://hooks.slack.com/services/T0/B0/secret` → `https://hooks.slack.com/…`: the
    scheme, host and port; never a user, password, path or query."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or "?"
        port = parts.port
    except ValueError:
        return "(an invalid URL)"
    if ":" in host:
        host = f"[{host}]"
    netloc = f"{host}:{port}" if port is not None else host
    rest = "/…" if (parts.path not in ("", "/") or parts.query or parts.username) else ""
    return f"{parts.scheme}://{netloc}{rest}"


def secrets_of(url: str) -> list[str]:
    """The parts of a URL that must not reach a log: its path, query, user and password
    (for scrubbing an error text that might quote them)."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return [url]
    path = parts.path.strip("/")
    found = [url, parts.path, path, parts.query, parts.username or "", parts.password or ""]
    found += [piece for piece in path.split("/") if len(piece) >= 6]  # a token on its own
    return sorted({s for s in found if len(s) > 1}, key=len, reverse=True)
