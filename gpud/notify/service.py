"""The daemon's side of alerts: which events become alerts, to which webhooks, once.

Events come from where the daemon already decides them, through hooks: the run book's
moves (`RunBook.on_moved`: a run that ended failed or succeeded; one that waits to restart
after a hang), node 0's health summaries (`Telemetry.on_health`: stalled for a webhook's
`stalled_after_s`) and the node's own events (a quarantine). Node 0 alone decides a run's
state, so only node 0 alerts about runs; every node alerts about its own GPUs.

Each alert goes to the daemon's webhooks (`gpud serve`'s `notify:`) and to the run's own
(its spec's `notify:`), each once: an alert's key (run, event, attempt; or node, GPU and
time for a quarantine) is remembered per URL, so the same URL in both lists, or a run
settled twice, sends one POST. The memory is bounded and lives as long as the daemon.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import TYPE_CHECKING

from pydantic import ValidationError

from gpud.model.run import HealthSummary, RunRecord, RunState
from gpud.model.snapshot import NodeEvent
from gpud.notify.alerts import (
    Alert,
    hang_restart,
    quarantined,
    run_ended,
    run_key,
    stalled,
    test_alert,
)
from gpud.notify.payloads import render
from gpud.notify.sender import Sender
from gpud.notify.targets import TEST_TIMEOUT_S, EventKind, Webhook
from gpud.security.auth import Caller
from gpud.wire.envelope import ErrorCode, ProtocolError
from gpud.wire.node_messages import NotifyTestReply, NotifyTestRequest, WebhookAnswer

if TYPE_CHECKING:
    from gpud.runs.lifecycle.supervisor import Supervisor

log = logging.getLogger("gpud.notify")

#: Alert keys remembered per URL (a few per run: far more than a node runs at once).
REMEMBERED = 4096


class Notifier:
    def __init__(
        self,
        webhooks: list[Webhook],
        node: str,
        address: str,
        sender: Sender | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """`address`: the control address a person's gpuctl reaches this node at."""
        self.webhooks = list(webhooks)
        self.node = node
        self.address = address
        self.sender = sender or Sender()
        self.clock = clock
        self._supervisor: Supervisor | None = None
        self._sent: OrderedDict[tuple[str, str], None] = OrderedDict()
        self._of_run: dict[str, list[Webhook]] = {}

    def attach(self, supervisor: Supervisor) -> None:
        """Listen where the supervisor decides runs' fates."""
        self._supervisor = supervisor
        supervisor.book.on_moved.append(self.run_moved)
        supervisor.telemetry.on_health.append(self.health)
        supervisor.on_forget.append(self._forget)

    def close(self) -> None:
        self.sender.close()

    def _forget(self, run_id: str) -> None:
        """A run retention removed: its webhooks are not kept for it any more."""
        self._of_run.pop(run_id, None)

    # ------------------------------------------------------------------ to whom, once

    def run_webhooks(self, run: RunRecord) -> list[Webhook]:
        """The run spec's own webhooks (read once per run)."""
        found = self._of_run.get(run.id)
        if found is None:
            found = []
            for entry in run.spec.get("notify") or []:
                try:
                    found.append(Webhook.model_validate(entry))
                except ValidationError:  # gpuctl validated it; an older spec: skip it
                    log.warning("run %s: a notify: entry of its spec is not valid", run.id)
            self._of_run[run.id] = found
        return found

    def targets(self, kind: EventKind, run: RunRecord | None = None) -> list[Webhook]:
        every = self.webhooks + (self.run_webhooks(run) if run is not None else [])
        return [hook for hook in every if hook.wants(kind)]

    def _new(self, hook: Webhook, key: str) -> bool:
        return (hook.url, key) not in self._sent

    def send(self, alert: Alert, targets: list[Webhook]) -> int:
        """Hand the alert to the sender for each target that has not had it; how many."""
        sent = 0
        for hook in targets:
            if not self._new(hook, alert.key):
                continue
            self._sent[(hook.url, alert.key)] = None
            while len(self._sent) > REMEMBERED:
                self._sent.popitem(last=False)
            what = f"{alert.event.value} alert ({alert.key})"
            if self.sender.submit(hook, render(alert, hook.format), what):
                sent += 1
        if sent:
            log.info("%s: alerting %d webhook(s)", alert.title, sent)
        return sent

    # ------------------------------------------------------------------ the events

    def run_moved(self, run: RunRecord) -> None:
        """A run's state moved here: its end, or a restart after a hang (node 0 only)."""
        if not run.is_coordinator or not (self.webhooks or run.spec.get("notify")):
            return
        alert = run_ended(run, self.node, self.address) or hang_restart(
            run, self.node, self.address
        )
        if alert is not None:
            self.send(alert, self.targets(alert.event, run))

    def health(self, run: RunRecord, summary: HealthSummary) -> None:
        """Node 0's health of a running run: stalled for long enough is an alert."""
        stall = summary.stall
        if stall is None or run.state is not RunState.RUNNING or summary.attempt != run.attempt:
            return
        key = run_key(run, EventKind.STALLED)
        due = [
            hook
            for hook in self.targets(EventKind.STALLED, run)
            if stall.stuck_for_s >= hook.stalled_after_s and self._new(hook, key)
        ]
        if due:
            self.send(stalled(run, stall, self.node, self.address, self.clock()), due)

    def node_events(self, events: list[NodeEvent]) -> None:
        """This node's events: a quarantine goes to the daemon's webhooks, and to those of
        each run it stops here."""
        for event in events:
            if event.kind != "quarantine":
                continue
            self.send(quarantined(event, self.address), self.targets(EventKind.QUARANTINE))
            for run in self._runs_on(event):
                hooks = [h for h in self.run_webhooks(run) if h.wants(EventKind.QUARANTINE)]
                if hooks:
                    self.send(quarantined(event, self.address, run), hooks)

    def _runs_on(self, event: NodeEvent) -> list[RunRecord]:
        uuid = event.data.get("uuid")
        if self._supervisor is None or not uuid:
            return []
        return [
            run
            for run, part in self._supervisor.book.parts()
            if uuid in part.record.gpu_uuids and not run.state.terminal
        ]

    # ------------------------------------------------------------------ node.notify.test

    async def test(self, body: NotifyTestRequest, caller: Caller) -> NotifyTestReply:
        """A test alert to one webhook, or to each the daemon has: what each answered
        (one try each, no retry: a person waits for it)."""
        targets = [body.webhook] if body.webhook is not None else self.webhooks
        if not targets:
            raise ProtocolError(
                ErrorCode.CONFLICT,
                f"{self.node} has no webhooks: add `notify:` to its gpud.yaml (README,"
                " Alerts), or name one with gpuctl notify test --url",
            )
        alert = test_alert(self.node, self.address, self.clock())
        pending = [
            asyncio.wrap_future(
                self.sender.test(hook, render(alert, hook.format),
                                 min(hook.timeout_s, TEST_TIMEOUT_S))
            )
            for hook in targets
        ]  # fmt: skip
        answers = await asyncio.gather(*pending)
        log.info(
            "%s sent a test alert: %s",
            caller.name,
            "; ".join(f"{h.shown} {a.describe()}" for h, a in zip(targets, answers, strict=True)),
        )
        return NotifyTestReply(
            node=self.node,
            answers=[
                WebhookAnswer(target=hook.shown, format=hook.format, ok=a.ok, status=a.status,
                              error=a.error, elapsed_s=round(a.elapsed_s, 3))
                for hook, a in zip(targets, answers, strict=True)
            ],
        )  # fmt: skip
