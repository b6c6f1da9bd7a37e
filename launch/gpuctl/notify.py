"""`gpuctl notify test`: each daemon sends a test alert to its webhooks (the `notify:` of
its gpud.yaml), or to the one `--url` names, and says what each answered. Operators only;
audited (the URL as scheme://host/… only: it is a secret)."""

from __future__ import annotations

import sys

import click
from click.core import ParameterSource
from pydantic import ValidationError

from gpud.notify.targets import TEST_TIMEOUT_S, Webhook
from gpud.wire.client import Client
from gpud.wire.node_messages import NotifyTestReply, NotifyTestRequest
from gpud.wire.protocol import NOTIFY_TEST
from launch.gpuctl.context import (
    EXIT_FAILED,
    EXIT_USAGE,
    Ctl,
    fail,
    json_option,
    report_errors,
    worst_exit_code,
)
from launch.gpuctl.output import emit_json


@click.group("notify")
def notify_group() -> None:
    """Webhook alerts: the daemons' `notify:` (README, Alerts)."""


@notify_group.command("test")
@click.option(
    "--url",
    metavar="URL",
    help="Send to this webhook instead of the daemons' own (a secret: shown as"
    " scheme://host/… only).",
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["json", "slack", "discord"]),
    default="json",
    show_default=True,
    help="The payload --url reads.",
)
@json_option
@click.pass_context
def test_command(ctx: click.Context, url: str | None, fmt: str) -> None:
    """Each daemon (--node, else every known one) sends a test alert to its webhooks, or to
    --url, and says what each answered. Exit 0 when every one took it, 1 when one did not."""
    ctl: Ctl = ctx.obj
    webhook = None
    if url is not None:
        try:
            webhook = Webhook.model_validate({"url": url, "format": fmt})
        except ValidationError as exc:
            said = exc.errors()[0]["msg"].removeprefix("Value error, ")
            fail(f"--url: {said}", EXIT_USAGE)
    elif ctx.get_parameter_source("fmt") is not ParameterSource.DEFAULT:
        fail("--format goes with --url (the daemons' webhooks have their own)", EXIT_USAGE)
    request = NotifyTestRequest(webhook=webhook)
    # The daemon waits for each webhook's answer (TEST_TIMEOUT_S at most): so does gpuctl.
    patient = Ctl(nodes=ctl.nodes, json=ctl.json, timeout=max(ctl.timeout, TEST_TIMEOUT_S + 5))

    def ask(client: Client) -> NotifyTestReply:
        reply = client.call(NOTIFY_TEST, request)
        assert isinstance(reply, NotifyTestReply)
        return reply

    results = patient.on_every_node(ask)
    refused = any(not a.ok for r in results if r.value is not None for a in r.value.answers)
    if ctl.json:
        emit_json(
            {
                "nodes": [
                    {"address": r.address, "error": str(r.error) if r.error else None,
                     "answers": r.value.answers if r.value is not None else []}
                    for r in results
                ]
            }
        )  # fmt: skip
    else:
        for r in results:
            if r.value is None:
                continue
            for a in r.value.answers:
                if a.ok:
                    said = f"ok, HTTP {a.status} in {a.elapsed_s:.2f}s"
                else:
                    said = f"FAILED: {a.error or f'HTTP {a.status}'} ({a.elapsed_s:.2f}s)"
                click.echo(f"{r.value.node}: {a.target} ({a.format}): {said}")
    report_errors(results)
    code = worst_exit_code(results)
    sys.exit(code or (EXIT_FAILED if refused else 0))
