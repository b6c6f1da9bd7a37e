"""An alert as each kind of receiver reads it: `json` (gpud's `Alert` as it is), `slack`
(an incoming webhook's `text` plus Block Kit `blocks`) and `discord` (a webhook's
`content` plus one embed). Pure: an alert in, the request body out.

Both chat formats have limits a long log line can pass (Slack: 150 characters for a
header, 3,000 for a section; Discord: 256 for a title, 6,000 for an embed in all), so every
text is cut to fit with an ellipsis rather than have the receiver refuse the whole alert.
Slack reads `&`, `<` and `>` as markup, so they are escaped; Discord is told to mention
nobody, so a log line with `@everyone` in it pings no one.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

from gpud.notify.alerts import Alert
from gpud.notify.targets import Format

#: Discord embed colours (0xRRGGBB) by severity.
COLORS = {"info": 0x2ECC71, "warning": 0xF1C40F, "critical": 0xE74C3C}
SLACK_ICONS = {"info": ":white_check_mark:", "warning": ":warning:", "critical": ":rotating_light:"}


def cut(text: str, limit: int) -> str:
    """`text`, at most `limit` characters: cut with an ellipsis when longer."""
    return text if len(text) <= limit else text[: max(0, limit - 1)] + "…"


def generic(alert: Alert) -> dict[str, Any]:
    return alert.model_dump(mode="json")


def _facts(alert: Alert) -> list[tuple[str, str]]:
    """The alert's particulars as (name, value) pairs, for chat fields."""
    facts = [("Node", alert.node)]
    if alert.run is not None:
        run = alert.run
        facts += [("Run", f"{run.id} ({run.name})"), ("State", run.state.value)]
        facts.append(("Attempt", f"{run.attempt}" + (f", {run.restarts} restart(s)"
                                                   if run.restarts else "")))  # fmt: skip
    if alert.cause is not None:
        facts.append(("Cause", alert.cause.label))
    if alert.gpu is not None:
        facts.append(("GPU", f"{alert.gpu.index}" + (f" ({alert.gpu.uuid})" if alert.gpu.uuid
                                                     else "")))  # fmt: skip
    return facts


def _slack_escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def slack(alert: Alert) -> dict[str, Any]:
    icon = SLACK_ICONS[alert.severity]
    body = _slack_escape(alert.text)
    if alert.hint:
        body += f"\n*Hint:* {_slack_escape(alert.hint)}"
    fields = [
        {"type": "mrkdwn", "text": cut(f"*{name}*\n{_slack_escape(value)}", 2000)}
        for name, value in _facts(alert)[:10]
    ]
    blocks: list[dict[str, Any]] = [
        {"type": "header", "text": {"type": "plain_text", "text": cut(alert.title, 150)}},
        {"type": "section", "text": {"type": "mrkdwn", "text": cut(body, 3000)}},
        {"type": "section", "fields": fields},
        {
            "type": "context",
            "elements": [{"type": "mrkdwn", "text": cut(f"`{_slack_escape(alert.look)}`", 3000)}],
        },
    ]
    text = f"{icon} {_slack_escape(alert.title)}: {_slack_escape(alert.text)}"
    return {"text": cut(text, 3000), "blocks": blocks}


def discord(alert: Alert) -> dict[str, Any]:
    description = alert.text
    if alert.hint:
        description += f"\n**Hint:** {alert.hint}"
    fields = [
        {"name": name, "value": cut(value, 500), "inline": True} for name, value in _facts(alert)
    ]
    fields.append({"name": "Look", "value": cut(f"`{alert.look}`", 500), "inline": False})
    embed = {
        "title": cut(alert.title, 256),
        "description": cut(description, 2500),
        "color": COLORS[alert.severity],
        "timestamp": datetime.fromtimestamp(alert.time, timezone.utc).isoformat(),
        "fields": fields[:25],
        "footer": {"text": f"gpud · {alert.event.value} · {alert.key}"[:2048]},
    }
    return {
        "username": "gpud",
        "content": cut(alert.title, 2000),
        "embeds": [embed],
        "allowed_mentions": {"parse": []},
    }


BUILDERS: dict[str, Callable[[Alert], dict[str, Any]]] = {
    "json": generic,
    "slack": slack,
    "discord": discord,
}


def render(alert: Alert, format: Format) -> bytes:
    """The request body for a webhook of that format."""
    return json.dumps(BUILDERS[format](alert), ensure_ascii=False).encode()
