"""`gpuctl usage [--since 7d] [--by user|run|node] [--json|--csv]`: who used how many
GPU-hours, and how many of them were useful.

Each daemon (--node, else every known one) says what each run used of it (`node.usage`):
its leased GPUs × the seconds its attempts ran there, live runs up to now, and the rows
retention kept of runs it removed. A run's GPU-seconds are clipped to the window, in
proportion to the part of its life inside it; its useful share is node 0's goodput of it
(none known: it counts in GPU-hours, and its useful hours are left out and said so).
"""

from __future__ import annotations

import csv
import re
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timezone

import click

from gpud.retention.usage import RunUsage
from gpud.wire.client import Client
from gpud.wire.node_messages import UsageReply, UsageRequest
from gpud.wire.protocol import NODE_USAGE
from launch.gpuctl.context import Ctl, json_option, report_errors, worst_exit_code
from launch.gpuctl.output import emit_json, table

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_DURATION = re.compile(r"^(\d+(?:\.\d+)?)([smhdw])$")
BY = ("user", "run", "node")


def parse_since(text: str, now: float) -> float:
    """`7d`, `12h`, `30m`, `2w` (that long ago) or a date, `2026-11-01` or ISO with a time
    (UTC unless it says): the unix time the window starts. ValueError says what to write."""
    found = _DURATION.match(text.strip())
    if found:
        return now - float(found.group(1)) * _UNITS[found.group(2)]
    try:
        when = datetime.fromisoformat(text.strip())
    except ValueError:
        raise ValueError(
            f"--since {text!r}: write a duration (90m, 12h, 7d, 2w) or a date (2026-11-01)"
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return when.timestamp()


@dataclass
class Share:
    """One row of the report: a user, a run or a node."""

    key: str
    runs: set[str] = field(default_factory=set)
    gpu_s: float = 0.0
    useful_s: float = 0.0
    unknown_s: float = 0.0  # GPU-seconds of runs whose goodput is not known

    @property
    def goodput(self) -> float | None:
        known = self.gpu_s - self.unknown_s
        return self.useful_s / known if known > 0 else None

    def as_dict(self, by: str) -> dict[str, object]:
        return {
            by: self.key,
            "runs": len(self.runs),
            "gpu_hours": round(self.gpu_s / 3600, 6),
            "useful_gpu_hours": round(self.useful_s / 3600, 6),
            "goodput": None if self.goodput is None else round(self.goodput, 4),
            "gpu_hours_goodput_unknown": round(self.unknown_s / 3600, 6),
        }


def in_window(row: RunUsage, since: float, now: float) -> float:
    """The share of the row's GPU-seconds that fell at or after `since`."""
    start = row.started_at
    if start is None:
        return 0.0
    end = row.ended_at if row.ended_at is not None else now
    if end <= since:
        return 0.0
    if start >= since or end <= start:
        return 1.0
    return (end - since) / (end - start)


def report(
    replies: Iterable[UsageReply], since: float, now: float, by: str
) -> tuple[list[Share], Share]:
    """The rows, most GPU-hours first, and their total."""
    rows = [(reply.node, row) for reply in replies for row in reply.runs]
    goodput = {row.run_id: row.goodput for _, row in rows if row.goodput is not None}
    users = {row.run_id: row.user for _, row in rows if row.user}
    shares: dict[str, Share] = {}
    total = Share("total")
    for node, row in rows:
        gpu_s = row.gpu_seconds * in_window(row, since, now)
        if gpu_s <= 0:
            continue
        key = {"user": users.get(row.run_id) or "unknown", "run": row.run_id, "node": node}[by]
        for share in (shares.setdefault(key, Share(key)), total):
            share.runs.add(row.run_id)
            share.gpu_s += gpu_s
            ratio = goodput.get(row.run_id)
            if ratio is None:
                share.unknown_s += gpu_s
            else:
                share.useful_s += gpu_s * ratio
    return sorted(shares.values(), key=lambda s: (-s.gpu_s, s.key)), total


def _hours(seconds: float) -> str:
    return f"{seconds / 3600:.2f}"


def _goodput(share: Share) -> str:
    return "–" if share.goodput is None else f"{share.goodput * 100:.0f}%"


@click.command("usage")
@click.option(
    "--since", default="7d", show_default=True, help="A duration back (12h, 7d, 2w) or a date."
)
@click.option("--by", type=click.Choice(BY), default="user", show_default=True)
@click.option("--csv", "as_csv", is_flag=True, help="CSV on stdout (for a spreadsheet).")
@json_option
@click.pass_obj
def usage_command(ctl: Ctl, since: str, by: str, as_csv: bool) -> None:
    """GPU-hours (leased GPUs × wall time) and useful GPU-hours (× the run's goodput) by
    user, run or node, across every known node (--node: those), since --since."""
    now = time.time()
    try:
        start = parse_since(since, now)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None

    def ask(client: Client) -> UsageReply:
        reply = client.call(NODE_USAGE, UsageRequest(since=start))
        assert isinstance(reply, UsageReply)
        return reply

    results = ctl.on_every_node(ask)
    replies = [r.value for r in results if r.value is not None]
    shares, total = report(replies, start, now, by)
    if ctl.json:
        emit_json(
            {
                "since": start,
                "until": now,
                "by": by,
                "rows": [s.as_dict(by) for s in shares],
                "total": total.as_dict(by),
                "nodes": [
                    {"address": r.address, "node": r.value.node if r.value else None,
                     "error": str(r.error) if r.error else None}
                    for r in results
                ],
            }
        )  # fmt: skip
    elif as_csv:
        out = csv.writer(sys.stdout, lineterminator="\n")
        out.writerow(list(total.as_dict(by)))
        for share in shares:
            out.writerow(["" if v is None else v for v in share.as_dict(by).values()])
    else:
        _print(shares, total, by, start, now)
    report_errors(results)
    sys.exit(worst_exit_code(results))


def _print(shares: list[Share], total: Share, by: str, start: float, now: float) -> None:
    when = datetime.fromtimestamp(start, tz=timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    if not shares:
        click.echo(f"no GPU time used since {when}")
        return
    rows = [
        [s.key, str(len(s.runs)), _hours(s.gpu_s), _hours(s.useful_s), _goodput(s)] for s in shares
    ]
    rows.append(["total", str(len(total.runs)), _hours(total.gpu_s), _hours(total.useful_s),
                 _goodput(total)])  # fmt: skip
    click.echo(f"GPU-hours since {when}, by {by}:")
    click.echo(table([by.upper(), "RUNS", "GPU-HOURS", "USEFUL", "GOODPUT"], rows))
    if total.unknown_s > 0:
        click.echo(
            f"{_hours(total.unknown_s)} GPU-hour(s) of runs whose goodput is unknown (an"
            " older gpud, or node 0 not asked) count in GPU-HOURS, not in USEFUL"
        )
