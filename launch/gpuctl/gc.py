"""`gpuctl gc [--dry-run]`: each daemon (--node, else every known one) applies its
retention now — finished runs over `max_runs`, `max_age_days` or `max_bytes` go (records,
events, metrics, run dirs; never a checkpoint), old metric points are thinned, node events
past their bound go — and says what it removed, or with --dry-run what it would remove.
Operators only; audited."""

from __future__ import annotations

import sys
import time

import click

from gpud.wire.client import Client
from gpud.wire.node_messages import GcReply, GcRequest
from gpud.wire.protocol import NODE_GC
from launch.gpuctl.context import Ctl, json_option, report_errors, worst_exit_code
from launch.gpuctl.output import emit_json, human_bytes, human_duration, table

#: A pass over many runs takes a while (it yields to the daemon's other work throughout).
GC_TIMEOUT_S = 600.0


def render(reply: GcReply, now: float) -> list[str]:
    verb = "would remove" if reply.dry_run else "removed"
    lines = [
        f"{reply.node}: {verb} {len(reply.removed)} finished run(s), kept"
        f" {reply.finished_kept} ({reply.limits}); {reply.protected} active or in use"
    ]
    if reply.removed:
        rows = [
            (r.id, r.state, f"ended {human_duration(now - r.ended_at)} ago",
             human_bytes(r.bytes), r.why)
            for r in reply.removed
        ]  # fmt: skip
        lines += ["  " + line for line in table(["RUN", "STATE", "ENDED", "SIZE", "WHY"], rows)
                  .splitlines()]  # fmt: skip
        for r in reply.removed:
            lines += [f"  {r.id}: checkpoints kept: {path}" for path in r.kept]
            lines += [f"  {r.id}: {note}" for note in r.notes]
    thinned = "would thin" if reply.dry_run else "thinned"
    events = "would remove" if reply.dry_run else "removed"
    lines.append(
        f"{reply.node}: {thinned} the old metrics of {reply.thinned_runs} run(s)"
        f" ({reply.points_removed} point(s)); {events} {reply.node_events_removed} node event(s)"
    )
    state = (
        f"{reply.node}: state {human_bytes(reply.state_bytes)} in {reply.runs} run record(s)"
        f" (checkpoints {human_bytes(reply.checkpoint_bytes)}, never removed)"
    )
    if not reply.dry_run:
        state += (
            f"; {reply.vacuumed_pages} free page(s) given back; longest hold of the daemon's"
            f" loop {reply.longest_block_ms:.1f} ms; {reply.elapsed_s:.2f}s"
        )
    lines.append(state)
    lines += [f"{reply.node}: note: {note}" for note in reply.notes]
    return lines


@click.command("gc")
@click.option("--dry-run", is_flag=True, help="Only say what would be removed.")
@json_option
@click.pass_obj
def gc_command(ctl: Ctl, dry_run: bool) -> None:
    """Apply each daemon's retention now (--node, else every known one) and say what went;
    with --dry-run, what would go. Checkpoints are never removed. Operators only; audited."""
    patient = Ctl(nodes=ctl.nodes, json=ctl.json, timeout=max(ctl.timeout, GC_TIMEOUT_S))

    def ask(client: Client) -> GcReply:
        reply = client.call(NODE_GC, GcRequest(dry_run=dry_run))
        assert isinstance(reply, GcReply)
        return reply

    results = patient.on_every_node(ask)
    if ctl.json:
        emit_json(
            {
                "nodes": [
                    {"address": r.address, "error": str(r.error) if r.error else None,
                     "gc": r.value}
                    for r in results
                ]
            }
        )  # fmt: skip
    else:
        now = time.time()
        for r in results:
            if r.value is not None:
                for line in render(r.value, now):
                    click.echo(line)
    report_errors(results)
    sys.exit(worst_exit_code(results))
