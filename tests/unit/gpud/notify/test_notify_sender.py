"""The webhook sender against real local HTTP servers (tests/support/webhooks.py): what is
retried and how soon, what is given up at once, what a full queue drops, that handing an
alert over never waits for the receiver, and that no error text carries the URL's secret.
Backoff is shortened here (50 ms); the integration test runs the real one."""

from __future__ import annotations

import itertools
import logging
import random
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from gpud.notify.sender import Answer, Sender, http_post, scrub
from gpud.notify.targets import Webhook
from tests.support.webhooks import Receiver

FAST = 0.05


@pytest.fixture
def sender() -> Iterator[Sender]:
    made = Sender(backoff_s=FAST, rand=random.Random(1))
    yield made
    made.close(grace_s=0.0)


def until(check: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.01)
    raise AssertionError("not in time")


def test_a_post_that_works_is_sent_once(sender: Sender) -> None:
    with Receiver() as hook:
        assert sender.submit(Webhook(url=hook.url), b'{"a": 1}', "failed alert (r/failed/1)")
        (got,) = hook.wait_for(1)
        assert got.body == {"a": 1} and got.headers["Content-Type"] == "application/json"
        assert got.headers["User-Agent"].startswith("gpud/")
        until(lambda: sender.snapshot()["sent"] == 1)
        time.sleep(0.2)
        assert hook.count() == 1
        assert sender.snapshot() == {"sent": 1, "failed": 0, "dropped": 0, "retried": 0}


def test_a_500_is_retried_with_doubling_waits_then_given_up(
    sender: Sender, caplog: pytest.LogCaptureFixture
) -> None:
    with Receiver(status=500, answer=b"oops") as hook, caplog.at_level(logging.WARNING):
        sender.submit(Webhook(url=hook.url), b"{}", "failed alert (r/failed/1)")
        posts = hook.wait_for(4)
        until(lambda: sender.snapshot()["failed"] == 1)
        gaps = [b.at - a.at for a, b in itertools.pairwise(posts)]
        for gap, base in zip(gaps, (FAST, 2 * FAST, 4 * FAST), strict=True):
            assert 0.8 * base - 0.01 <= gap <= 1.2 * base + 0.2, gaps
        time.sleep(0.5)
        assert hook.count() == 4
    assert sender.snapshot() == {"sent": 0, "failed": 1, "dropped": 0, "retried": 3}
    text = caplog.text
    assert (
        f"gave up on a failed alert (r/failed/1) to http://127.0.0.1:{hook.port}/… after 4" in text
    )
    assert "HTTP 500: oops" in text and hook.secret not in text


@pytest.mark.parametrize("status", [400, 404, 410])
def test_a_4xx_is_given_up_at_once(sender: Sender, status: int) -> None:
    with Receiver(status=status, answer=b"no_service") as hook:
        sender.submit(Webhook(url=hook.url), b"{}", "failed alert")
        hook.wait_for(1)
        until(lambda: sender.snapshot()["failed"] == 1)
        time.sleep(0.3)
        assert hook.count() == 1 and sender.snapshot()["retried"] == 0


def test_a_429_waits_what_retry_after_asks() -> None:
    hits: list[float] = []

    class Limited(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"]))
            hits.append(time.monotonic())
            first = len(hits) == 1
            self.send_response(429 if first else 204)
            if first:
                self.send_header("Retry-After", "0.6")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Limited)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    sender = Sender(backoff_s=FAST)
    try:
        sender.submit(Webhook(url=f"http://127.0.0.1:{server.server_address[1]}/x"), b"{}", "a")
        until(lambda: sender.snapshot()["sent"] == 1)
        assert len(hits) == 2 and hits[1] - hits[0] >= 0.55
    finally:
        sender.close(grace_s=0.0)
        server.shutdown()
        server.server_close()


def test_a_receiver_that_never_answers_times_out_and_submit_never_waits() -> None:
    sender = Sender(backoff_s=FAST, attempts=2)
    try:
        with Receiver(delay_s=30.0) as silent:
            hook = Webhook(url=silent.url, timeout_s=0.3)
            started = time.perf_counter()
            for _ in range(12):
                sender.submit(hook, b"{}", "failed alert")
            handed = time.perf_counter() - started
            # One that waited would take the 0.3 s timeout; 12 would take seconds. (Not
            # 0.05: on a loaded machine a time slice lost to another process is that long.)
            assert handed < 0.25, f"handing 12 alerts over took {handed:.3f}s"
            until(lambda: sender.snapshot()["failed"] == 12, timeout=30)
            assert sender.snapshot()["retried"] == 12 and silent.count() == 24
    finally:
        sender.close(grace_s=0.0)


def test_past_the_bound_alerts_are_dropped_and_counted() -> None:
    sender = Sender(backoff_s=FAST, max_pending=3, workers=1)
    with Receiver(delay_s=30.0) as slow:
        hook = Webhook(url=slow.url, timeout_s=5)
        results = [sender.submit(hook, b"{}", "a") for _ in range(6)]
        slow.wait_for(1)  # the worker holds one; at most three wait; the others were dropped
        dropped = results.count(False)
        assert dropped in (2, 3), results  # 3 if the worker took its first after them
        assert sender.snapshot()["dropped"] == dropped
        assert sender.pending() == 5 - dropped
        # The worker is still waiting for its answer: those waiting are not sent.
        assert sender.close(grace_s=0.0) == 5 - dropped
        assert sender.snapshot()["dropped"] == 5


def test_close_sends_what_is_due_within_its_grace() -> None:
    sender = Sender(backoff_s=FAST)
    with Receiver() as hook:
        for _ in range(5):
            sender.submit(Webhook(url=hook.url), b"{}", "a")
        assert sender.close(grace_s=2.0) == 0
        assert hook.count() == 5 and sender.snapshot()["sent"] == 5
        assert not sender.submit(Webhook(url=hook.url), b"{}", "late")


def test_a_test_is_tried_once_and_answered() -> None:
    sender = Sender(backoff_s=FAST)
    try:
        with Receiver(status=503, answer=b"maintenance") as hook:
            answer = sender.test(Webhook(url=hook.url), b"{}", 5.0).result(timeout=10)
            assert answer == Answer(ok=False, status=503, error="HTTP 503: maintenance",
                                    elapsed_s=answer.elapsed_s, retry=True)  # fmt: skip
            time.sleep(0.3)
            assert hook.count() == 1
            assert sender.snapshot() == {"sent": 0, "failed": 0, "dropped": 0, "retried": 0}
    finally:
        sender.close(grace_s=0.0)


def test_errors_never_carry_the_urls_secret() -> None:
    secret = "T0/B0/zzzsecretzzz"
    refused = http_post(f"http://127.0.0.1:1/{secret}", b"{}", 1.0)
    assert not refused.ok and refused.retry and refused.status is None
    assert "refused" in (refused.error or "").lower() and "zzzsecretzzz" not in str(refused)
    url = f"https://user:pw@example.invalid/{secret}?token=abc"
    assert scrub(f"failed to open {url} (token=abc, {secret})", url) == ("failed to open … (…, …)")
