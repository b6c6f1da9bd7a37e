"""Alerts that reach a person (issue 23 §4): a real daemon with `notify:` in its config
file, real runs, and real local HTTP servers that record what arrives — one that answers,
one that answers 500, one that never answers in time. The daemon's control socket is
probed meanwhile from another process, and the webhook URLs' secrets are looked for in
its log and audit log."""

from __future__ import annotations

import itertools
import json
import re
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpud.model.run import RunState
from tests.support.daemons import RunningDaemon, free_port, gpuctl
from tests.support.probe import Prober
from tests.support.runs import FAST, launch, nothing_left, script_spec, wait_for
from tests.support.waiting import until
from tests.support.webhooks import Receiver

pytestmark = pytest.mark.slow
Daemons = Callable[..., RunningDaemon]

FAILS = """
import sys
print("loading shard 17", flush=True)
raise ValueError("bad shard 17")
"""


def _serve_with(tmp_path: Path, daemons: Daemons, hooks: list[dict[str, Any]],
                **kwargs: Any) -> RunningDaemon:  # fmt: skip
    config = tmp_path / "gpud.yaml"
    config.write_text(yaml.safe_dump({"notify": hooks}))
    config.chmod(0o600)
    extra = ("--config", str(config), *kwargs.pop("extra", ()))
    return daemons(extra=extra, **kwargs)


def _no_secret_in(daemon: RunningDaemon, *receivers: Receiver) -> None:
    texts = {"log": daemon.log(), "audit": _audit(daemon)}
    for receiver in receivers:
        for where, text in texts.items():
            assert receiver.secret not in text, f"a webhook's secret is in the daemon's {where}"
            assert receiver.secret.split("/")[-1] not in text, where


def _audit(daemon: RunningDaemon) -> str:
    path = daemon.state_dir / "audit.log"
    return path.read_text() if path.exists() else ""


def _deliveries(port: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
        text = reply.read().decode()
    found = re.findall(r'^gpud_notify_deliveries_total\{result="(\w+)"\} (\S+)$', text, re.M)
    return {result: float(value) for result, value in found}


def test_a_failed_run_posts_one_alert_per_webhook_with_its_cause(
    tmp_path: Path, daemons: Daemons
) -> None:
    with Receiver() as plain, Receiver() as slack, Receiver(status=204, answer=b"") as discord:
        port = free_port()
        daemon = _serve_with(
            tmp_path, daemons,
            [{"url": plain.url}, {"url": slack.url, "format": "slack"},
             {"url": discord.url, "format": "discord", "events": ["failed", "succeeded"]}],
            extra=("--metrics", f"127.0.0.1:{port}"),
        )  # fmt: skip
        spec = script_spec(tmp_path, FAILS, name="shards")
        # The run's own notify: names the daemon's first webhook again: one POST, not two.
        spec.write_text(spec.read_text() + f"notify: [{{url: '{plain.url}'}}]\n")
        launched = gpuctl("--node", daemon.address, "--json", "launch", str(spec))
        assert launched.returncode == 0, launched.stderr
        run_id = json.loads(launched.stdout)["run"]["id"]
        ended = wait_for(daemon, run_id, {"failed", "succeeded", "stopped"}, timeout=60)
        assert ended.run.state is RunState.FAILED

        alert = plain.wait_for(1)[0].body
        assert alert["event"] == "failed" and alert["severity"] == "critical"
        assert alert["run"]["id"] == run_id and alert["run"]["name"] == "shards"
        assert alert["run"]["state"] == "failed" and alert["node"] == "node0"
        assert alert["cause"]["summary"] == "ValueError: bad shard 17"
        assert alert["cause"]["kind"] == "user" and alert["text"] == alert["cause"]["line"]
        assert alert["look"] == f"gpuctl --node {daemon.address} status {run_id}"
        assert alert["key"] == f"{run_id}/failed/1"

        shown = slack.wait_for(1)[0].body
        assert set(shown) == {"text", "blocks"}
        assert f"run {run_id} (shards) failed" in shown["text"]
        assert "ValueError: bad shard 17" in shown["text"]
        kinds = [block["type"] for block in shown["blocks"]]
        assert kinds == ["header", "section", "section", "context"]
        assert shown["blocks"][0]["text"] == {
            "type": "plain_text", "text": f"run {run_id} (shards) failed",
        }  # fmt: skip
        fields = [f["text"] for f in shown["blocks"][2]["fields"]]
        assert "*Node*\nnode0" in fields and "*Cause*\nuser code" in fields
        assert alert["look"] in shown["blocks"][3]["elements"][0]["text"]

        told = discord.wait_for(1)[0].body
        assert told["content"] == f"run {run_id} (shards) failed"
        assert told["allowed_mentions"] == {"parse": []}
        (embed,) = told["embeds"]
        assert embed["color"] == 0xE74C3C and "ValueError: bad shard 17" in embed["description"]
        assert {"name": "Node", "value": "node0", "inline": True} in embed["fields"]
        assert embed["timestamp"].endswith("+00:00")

        time.sleep(2.0)  # nothing more comes: one POST per webhook, the run's own deduplicated
        assert (plain.count(), slack.count(), discord.count()) == (1, 1, 1)
        assert plain.received[0].headers["Content-Type"] == "application/json"
        assert plain.received[0].path == f"/hooks/{plain.secret}"
        assert _deliveries(port) == {"sent": 3.0, "failed": 0.0, "dropped": 0.0, "retried": 0.0}
        _no_secret_in(daemon, plain, slack, discord)


def test_only_node_0_alerts_about_a_run_of_two_nodes(tmp_path: Path, daemons: Daemons) -> None:
    with Receiver() as hook:
        config = tmp_path / "gpud.yaml"
        config.write_text(yaml.safe_dump({"notify": [{"url": hook.url}]}))
        node0 = daemons(node="n0", simulate_gpus=None, extra=("--config", str(config)))
        node1 = daemons(node="n1", simulate_gpus=None, extra=("--config", str(config)))
        run_id = launch(
            node0, FAST, "training.max_steps=100000", "nproc_per_node=1",
            "env.GPUD_TEST_RAISE_RANK=1",
            "env.GPUD_TEST_RAISE_AT_STEP=4", "env.GPUD_TEST_RAISE_MESSAGE='bad shard 17'",
            nodes=(node0.address, node1.address),
        )  # fmt: skip
        wait_for(node0, run_id, {"failed"}, timeout=120)
        wait_for(node1, run_id, {"failed", "stopped"}, timeout=60)
        (got,) = hook.wait_for(1)
        time.sleep(2.0)
        assert hook.count() == 1, hook.bodies()
        alert = got.body
        assert alert["node"] == "n0" and alert["run"]["nodes"] == 2
        assert alert["text"].startswith("rank 1 on node n1: ValueError: bad shard 17"), alert
        assert alert["look"] == f"gpuctl --node {node0.address} status {run_id}"
        nothing_left(run_id)


def test_succeeded_is_sent_only_where_asked(tmp_path: Path, daemons: Daemons) -> None:
    with Receiver() as default, Receiver() as opted:
        daemon = _serve_with(
            tmp_path, daemons, [{"url": default.url}, {"url": opted.url, "events": ["succeeded"]}]
        )
        spec = script_spec(tmp_path, "print('done')\n", name="fine")
        launched = gpuctl("--node", daemon.address, "--json", "launch", str(spec))
        assert launched.returncode == 0, launched.stderr
        run_id = json.loads(launched.stdout)["run"]["id"]
        wait_for(daemon, run_id, {"succeeded"}, timeout=60)
        (got,) = opted.wait_for(1)
        assert got.body["event"] == "succeeded" and got.body["severity"] == "info"
        assert got.body["cause"] is None and got.body["run"]["state"] == "succeeded"
        time.sleep(1.0)
        assert default.count() == 0


@pytest.mark.parametrize(
    ("status", "delay_s"), [(500, 0.0), (200, 30.0)], ids=["answers-500", "times-out"]
)
@pytest.mark.alone  # the control plane's latency, measured against the machine's load
@pytest.mark.quiet  # an idle daemon and a failing receiver: it may run beside another quiet test
def test_a_failing_receiver_is_retried_with_backoff_then_given_up_and_the_daemon_unaffected(
    tmp_path: Path, daemons: Daemons, status: int, delay_s: float
) -> None:
    with Receiver(status=status, delay_s=delay_s, answer=b"boom") as bad:
        port = free_port()
        daemon = _serve_with(
            tmp_path, daemons, [{"url": bad.url, "format": "slack", "timeout_s": 1}],
            extra=("--metrics", f"127.0.0.1:{port}"),
        )  # fmt: skip
        spec = script_spec(tmp_path, FAILS, name="shards")
        with Prober(daemon) as prober:
            launched = gpuctl("--node", daemon.address, "--json", "launch", str(spec))
            assert launched.returncode == 0, launched.stderr
            posts = bad.wait_for(4, timeout=30)  # 1 + 3 retries
            until("the alert given up", lambda: _deliveries(port).get("failed") == 1.0,
                  timeout=10)  # fmt: skip
        # Backoff: about 1 s, 2 s, 4 s between the tries (each ± a fifth), plus for the
        # receiver that times out the 1 s each try waited for it.
        gaps = [b.at - a.at for a, b in itertools.pairwise(posts)]
        waited = 1.0 if delay_s else 0.0
        for gap, backoff in zip(gaps, (1.0, 2.0, 4.0), strict=True):
            assert 0.8 * backoff + waited - 0.1 <= gap <= 1.2 * backoff + waited + 1.0, gaps
        time.sleep(1.5)
        assert bad.count() == 4, "given up after 4 tries"
        assert _deliveries(port) == {"sent": 0.0, "failed": 1.0, "dropped": 0.0, "retried": 3.0}
        # Meanwhile the control socket answered as ever.
        assert not prober.failed, prober.failed
        assert prober.worst_s < 1.0, prober.summary()
        log = daemon.log()
        why = "HTTP 500: boom" if status == 500 else "no answer within 1s"
        assert f"gave up on a failed alert ({bad_key(log)}) to http://127.0.0.1:{bad.port}/…" in log
        assert why in log
        _no_secret_in(daemon, bad)


def bad_key(log: str) -> str:
    found = re.search(r"gave up on a failed alert \(([^)]+)\)", log)
    assert found, log
    return found.group(1)


HANGS = """
import os, sys, time
print("step 1", flush=True)
if os.environ["GPUD_ATTEMPT"] == "1":
    time.sleep(3600)
print("done", flush=True)
"""


def test_a_stall_and_the_hang_restart_are_alerted_once_each(
    tmp_path: Path, daemons: Daemons
) -> None:
    with Receiver() as hook:
        daemon = _serve_with(tmp_path, daemons, [{"url": hook.url, "stalled_after_s": 1}])
        spec = script_spec(tmp_path, HANGS, name="hangs")
        spec.write_text(
            spec.read_text() + "restart: {max_attempts: 1, hang_timeout_s: 5, backoff_s: 0.5}\n"
        )
        launched = gpuctl("--node", daemon.address, "--json", "launch", str(spec))
        assert launched.returncode == 0, launched.stderr
        run_id = json.loads(launched.stdout)["run"]["id"]
        ended = wait_for(daemon, run_id, {"succeeded", "failed"}, timeout=90)
        assert ended.run.state is RunState.SUCCEEDED, ended.run.reason
        posts = hook.wait_for(2)
        time.sleep(1.0)
        events = [p.body["event"] for p in hook.received]
        assert events == ["stalled", "hang"], events
        stall, hang = (p.body for p in posts[:2])
        assert stall["title"].startswith(f"run {run_id} (hangs) stalled for ")
        assert "no output and no new step" in stall["text"]
        assert stall["hint"] == "gpud stops it as a hang at 5s (restart.hang_timeout_s)"
        assert stall["look"] == f"gpuctl --node {daemon.address} health {run_id}"
        assert hang["title"] == f"run {run_id} (hangs) hung; restarting"
        assert hang["cause"]["kind"] == "hang" and hang["run"]["state"] == "pending"
        assert "restarting in 0.5s (restart 1 of 1)" in hang["text"]
        assert hang["key"] == f"{run_id}/hang/1"


def test_a_quarantine_is_alerted_by_its_node(tmp_path: Path, daemons: Daemons) -> None:
    xids = tmp_path / "xids"
    with Receiver(status=204, answer=b"") as hook:
        daemon = _serve_with(
            tmp_path, daemons, [{"url": hook.url, "format": "discord"}],
            extra=("--simulate-xid-file", str(xids)),
        )  # fmt: skip
        xids.write_text("2:79\n")
        (got,) = hook.wait_for(1)
        embed = got.body["embeds"][0]
        assert got.body["content"] == "node0: GPU 2 quarantined"
        assert "XID 79" in embed["description"], embed
        assert "gpuctl undrain node0 --gpu 2" in embed["description"]
        assert {"name": "Look", "value": f"`gpuctl --node {daemon.address} hw`",
                "inline": False} in embed["fields"]  # fmt: skip
        time.sleep(1.5)
        assert hook.count() == 1


def test_gpuctl_notify_test_reports_what_each_webhook_answered(
    tmp_path: Path, daemons: Daemons
) -> None:
    with Receiver() as good, Receiver(status=500, answer=b"down for maintenance") as bad:
        daemon = _serve_with(
            tmp_path, daemons, [{"url": good.url, "format": "slack"}, {"url": bad.url}]
        )
        result = gpuctl("--node", daemon.address, "notify", "test")
        assert result.returncode == 1, (result.stdout, result.stderr)
        lines = result.stdout.splitlines()
        assert re.fullmatch(
            rf"node0: http://127\.0\.0\.1:{good.port}/… \(slack\): ok, HTTP 200 in \d+\.\d\ds",
            lines[0],
        ), lines
        assert lines[1].startswith(
            f"node0: http://127.0.0.1:{bad.port}/… (json): FAILED: HTTP 500: down for maintenance"
        ), lines
        assert good.wait_for(1)[0].body["blocks"][0]["text"]["text"] == (
            "node0: a test alert from gpud"
        )
        assert bad.wait_for(1)[0].body["event"] == "test"
        time.sleep(1.0)
        assert bad.count() == 1, "a test is tried once"

        with Receiver() as other:
            alone = gpuctl(
                "--node", daemon.address, "--json", "notify", "test", "--url", other.url,
                "--format", "discord",
            )  # fmt: skip
            assert alone.returncode == 0, alone.stderr
            (node,) = json.loads(alone.stdout)["nodes"]
            (answer,) = node["answers"]
            assert answer["ok"] and answer["status"] == 200 and answer["format"] == "discord"
            assert answer["target"] == f"http://127.0.0.1:{other.port}/…"
            assert (
                other.wait_for(1)[0].body["embeds"][0]["title"] == "node0: a test alert from gpud"
            )
            assert other.secret not in alone.stdout
            _no_secret_in(daemon, good, bad, other)
        assert f'"url":"http://127.0.0.1:{other.port}/…"' in _audit(daemon)  # audited, redacted

        wrong = gpuctl("--node", daemon.address, "notify", "test", "--url", "ftp://x/y")
        assert wrong.returncode == 2
        assert wrong.stderr.strip() == (
            "gpuctl: error: --url: expected an http:// or https:// URL, not ftp"
        )


def test_gpuctl_notify_test_without_webhooks_says_what_to_do(daemon: RunningDaemon) -> None:
    result = gpuctl("--node", daemon.address, "notify", "test")
    assert result.returncode == 1
    assert result.stderr.strip() == (
        f"gpuctl: error: {daemon.address}: node0 has no webhooks: add `notify:` to its"
        " gpud.yaml (README, Alerts), or name one with gpuctl notify test --url [conflict]"
    )
