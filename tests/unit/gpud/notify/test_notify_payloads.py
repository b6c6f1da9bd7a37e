"""Webhook config and payloads: what a person may write under `notify:`, how a URL is
shown, and the generic, Slack and Discord bodies made from one alert."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from gpud.model.run import RunState
from gpud.notify.alerts import Alert, AlertCause, AlertGpu, AlertRun
from gpud.notify.payloads import cut, render
from gpud.notify.targets import DEFAULT_EVENTS, EventKind, Webhook, redact, secrets_of

SLACK = "https://hooks.slack.com/services/T0AAA/B0BBB/s3cr3tt0k3n"


def test_a_webhook_defaults_to_trouble_and_json() -> None:
    hook = Webhook(url=SLACK)
    assert hook.format == "json" and tuple(hook.events) == DEFAULT_EVENTS
    assert not hook.wants(EventKind.SUCCEEDED) and hook.wants(EventKind.FAILED)
    assert hook.wants(EventKind.TEST)  # a test always goes
    assert Webhook(url=SLACK, events=["succeeded"]).wants(EventKind.SUCCEEDED)


@pytest.mark.parametrize(
    ("url", "said"),
    [
        ("ftp://example.com/x", "expected an http:// or https:// URL, not ftp"),
        ("hooks.slack.com/services/x", "expected an http:// or https:// URL, not none"),
        ("https:///path-only", "the URL has no host"),
        ("https://example.com:port/x", "not a valid URL"),
        ("https://example.com/a b", "not a valid URL"),
    ],
)
def test_a_bad_url_is_refused_without_repeating_it(url: str, said: str) -> None:
    with pytest.raises(ValidationError) as caught:
        Webhook(url=url)
    message = caught.value.errors()[0]["msg"]
    assert said in message
    assert "/x" not in message and "path-only" not in message


def test_unknown_keys_and_test_as_an_event_are_refused() -> None:
    with pytest.raises(ValidationError, match="formt"):
        Webhook.model_validate({"url": SLACK, "formt": "slack"})
    with pytest.raises(ValidationError, match="gpuctl notify test always sends"):
        Webhook(url=SLACK, events=["test"])
    with pytest.raises(ValidationError):
        Webhook(url=SLACK, format="teams")


def test_a_url_is_shown_as_its_scheme_and_host_only() -> None:
    assert redact(SLACK) == "https://hooks.slack.com/…"
    assert redact("http://user:pw@10.0.0.5:8080/hook?key=abc") == "http://10.0.0.5:8080/…"
    assert redact("https://example.com") == "https://example.com"
    assert redact("http://[::1]:9000/x") == "http://[::1]:9000/…"
    hook = Webhook(url=SLACK)
    assert hook.shown == "https://hooks.slack.com/…"
    assert "s3cr3t" not in repr(hook) and "s3cr3t" not in str(hook)
    assert "/services/T0AAA/B0BBB/s3cr3tt0k3n" in secrets_of(SLACK)


def alert(**changes: object) -> Alert:
    base = Alert(
        event=EventKind.FAILED,
        key="r-1/failed/2",
        severity="critical",
        title="run r-1 (train) failed",
        text="rank 1 on node gpu-b: ValueError: bad shard <17> & more (user code, step 40 of"
        " attempt 2)",
        hint="fix the data loader",
        node="gpu-a",
        time=1_700_000_000.0,
        run=AlertRun(
            id="r-1",
            name="train",
            state=RunState.FAILED,
            attempt=2,
            restarts=1,
            nodes=2,
            last_step=40,
        ),
        cause=AlertCause(
            kind="user",
            label="user code",
            summary="ValueError: bad shard",
            line="rank 1: ValueError: bad shard",
            hint="fix the data loader",
        ),
        look="gpuctl --node gpu-a:7711 status r-1",
    )
    return base.model_copy(update=changes)


def test_json_is_the_alert_as_it_is() -> None:
    body = json.loads(render(alert(), "json"))
    assert body == json.loads(alert().model_dump_json())
    assert body["source"] == "gpud" and body["version"] == 1 and body["event"] == "failed"
    assert body["run"]["state"] == "failed" and body["cause"]["hint"] == "fix the data loader"


def test_slack_has_text_and_blocks_with_markup_escaped() -> None:
    body = json.loads(render(alert(), "slack"))
    assert set(body) == {"text", "blocks"}
    assert body["text"].startswith(":rotating_light: run r-1 (train) failed: rank 1 on node")
    assert "bad shard &lt;17&gt; &amp; more" in body["text"]
    header, section, facts, context = body["blocks"]
    assert header == {
        "type": "header",
        "text": {"type": "plain_text", "text": "run r-1 (train) failed"},
    }
    assert section["text"]["type"] == "mrkdwn"
    assert section["text"]["text"].endswith("\n*Hint:* fix the data loader")
    assert [f["text"] for f in facts["fields"]] == [
        "*Node*\ngpu-a", "*Run*\nr-1 (train)", "*State*\nfailed",
        "*Attempt*\n2, 1 restart(s)", "*Cause*\nuser code",
    ]  # fmt: skip
    assert context["elements"] == [
        {"type": "mrkdwn", "text": "`gpuctl --node gpu-a:7711 status r-1`"}
    ]


def test_discord_has_content_and_one_embed_and_mentions_nobody() -> None:
    body = json.loads(render(alert(text="@everyone look: it failed"), "discord"))
    assert body["content"] == "run r-1 (train) failed" and body["username"] == "gpud"
    assert body["allowed_mentions"] == {"parse": []}
    (embed,) = body["embeds"]
    assert embed["title"] == "run r-1 (train) failed"
    assert embed["description"] == "@everyone look: it failed\n**Hint:** fix the data loader"
    assert embed["color"] == 0xE74C3C
    assert embed["timestamp"] == "2023-11-14T22:13:20+00:00"
    assert embed["fields"][-1] == {
        "name": "Look", "value": "`gpuctl --node gpu-a:7711 status r-1`", "inline": False,
    }  # fmt: skip
    assert embed["footer"]["text"] == "gpud · failed · r-1/failed/2"


def test_a_gpu_alert_names_the_gpu() -> None:
    quarantine = alert(event=EventKind.QUARANTINE, run=None, cause=None,
                       gpu=AlertGpu(index=3, uuid="GPU-abc"))  # fmt: skip
    fields = json.loads(render(quarantine, "discord"))["embeds"][0]["fields"]
    assert {"name": "GPU", "value": "3 (GPU-abc)", "inline": True} in fields
    assert "*GPU*\n3 (GPU-abc)" in [
        f["text"] for f in json.loads(render(quarantine, "slack"))["blocks"][2]["fields"]
    ]


def test_long_texts_are_cut_to_what_each_receiver_takes() -> None:
    huge = alert(title="t" * 5000, text="x" * 50_000, hint="h" * 50_000, node="n" * 5000)
    slack = json.loads(render(huge, "slack"))
    assert len(slack["text"]) <= 3000 and slack["text"].endswith("…")
    assert len(slack["blocks"][0]["text"]["text"]) == 150
    assert len(slack["blocks"][1]["text"]["text"]) == 3000
    assert all(len(f["text"]) <= 2000 for f in slack["blocks"][2]["fields"])
    discord = json.loads(render(huge, "discord"))
    embed = discord["embeds"][0]
    assert len(discord["content"]) <= 2000 and len(embed["title"]) == 256
    size = len(embed["title"]) + len(embed["description"]) + len(embed["footer"]["text"])
    size += sum(len(f["name"]) + len(f["value"]) for f in embed["fields"])
    assert size <= 6000, "Discord refuses an embed over 6,000 characters in all"
    assert cut("abc", 3) == "abc" and cut("abcd", 3) == "ab…"
