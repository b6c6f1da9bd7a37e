"""Delivering alerts: HTTP POSTs off the daemon's loop, retried with backoff, bounded.

The loop only hands a request body over (`Sender.submit`: a lock held for a heap push,
never for I/O). A few worker threads do the POSTs, each with a timeout, so a receiver that
is slow, silent or down costs the daemon threads that wait, never its loop. A POST that
fails for a reason that may pass (no connection, a timeout, HTTP 5xx, 408, 429) is tried
again after 1 s, 2 s, 4 s (± a fifth, and at least what a 429's Retry-After asks), then
given up; any other answer (a 4xx: a wrong URL or a refused payload) is given up at
once. At most `max_pending` bodies wait; past that a new one is dropped. Sent, given up,
dropped and retried are counted (`/metrics`: `gpud_notify_deliveries_total`).

A URL is a secret (Slack's and Discord's carry their token): logs and answers show
`redact(url)` only, and an error's text is scrubbed of the URL's path, query and user.
"""

from __future__ import annotations

import heapq
import http.client
import itertools
import logging
import random
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from email.message import Message

from gpud import __version__
from gpud.notify.targets import DELIVERY_RESULTS, Webhook, secrets_of
from gpud.security.bursts import ThrottledLog

log = logging.getLogger("gpud.notify")
_warn = ThrottledLog(log)

WORKERS = 4
MAX_PENDING = 256
ATTEMPTS = 4
BACKOFF_S = 1.0
BACKOFF_MAX_S = 60.0
#: What a receiver's answer may add to an error line (Slack says `invalid_payload`).
ANSWER_CHARS = 200


@dataclass(frozen=True)
class Answer:
    """What one POST came to."""

    ok: bool
    status: int | None = None  # the HTTP status, when one came
    error: str | None = None  # one line, free of the URL's secrets
    elapsed_s: float = 0.0
    retry: bool = False  # worth another try
    retry_after_s: float | None = None

    def describe(self) -> str:
        took = f"in {self.elapsed_s:.2f}s"
        if self.ok:
            return f"HTTP {self.status} {took}"
        return f"{self.error or f'HTTP {self.status}'} ({took})"


Post = Callable[[str, bytes, float], Answer]


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    """A webhook that redirects is misconfigured: report the 3xx, never follow it with
    the body re-sent (or dropped) elsewhere."""

    def redirect_request(self, *args: object, **kwargs: object) -> None:
        return None


def scrub(text: str, url: str) -> str:
    """`text` with every secret part of `url` replaced by `…`."""
    for secret in secrets_of(url):
        text = text.replace(secret, "…")
    return text


def _retry_after(headers: Message | None) -> float | None:
    value = headers.get("Retry-After") if headers is not None else None
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None  # an HTTP date: the backoff decides


def http_post(url: str, body: bytes, timeout_s: float) -> Answer:
    """POST `body` as JSON; never raises. (urllib: it honours the usual *_proxy
    variables, which GPU boxes behind a proxy need to reach Slack or Discord.)"""
    started = time.monotonic()
    request = urllib.request.Request(
        url,
        data=body,
        method="POST",
        headers={"Content-Type": "application/json", "User-Agent": f"gpud/{__version__}"},
    )
    opener = urllib.request.build_opener(_NoRedirects)
    try:
        with opener.open(request, timeout=timeout_s) as reply:
            reply.read(65536)
            status = int(reply.status)
        return Answer(ok=200 <= status < 300, status=status,
                      elapsed_s=time.monotonic() - started)  # fmt: skip
    except urllib.error.HTTPError as exc:
        try:
            said = exc.read(ANSWER_CHARS).decode(errors="replace").strip().splitlines()
        except (OSError, http.client.HTTPException):
            said = []
        detail = f"HTTP {exc.code}" + (f": {scrub(said[0], url)[:ANSWER_CHARS]}" if said else "")
        retry = exc.code in (408, 429) or exc.code >= 500
        return Answer(ok=False, status=exc.code, error=detail, retry=retry,
                      elapsed_s=time.monotonic() - started,
                      retry_after_s=_retry_after(exc.headers))  # fmt: skip
    except TimeoutError:
        error = f"no answer within {timeout_s:g}s"
    except urllib.error.URLError as exc:
        reason = exc.reason
        if isinstance(reason, TimeoutError):
            error = f"no answer within {timeout_s:g}s"
        else:
            error = scrub(str(getattr(reason, "strerror", None) or reason), url)
    except (OSError, http.client.HTTPException, ValueError) as exc:
        error = scrub(f"{type(exc).__name__}: {exc}".splitlines()[0], url)
    return Answer(ok=False, error=error, retry=True, elapsed_s=time.monotonic() - started)


@dataclass
class Delivery:
    """One body on its way to one webhook."""

    target: Webhook
    body: bytes
    what: str  # for logs: which alert, never the URL
    tries: int = 0
    #: A test (`gpuctl notify test`): tried once, its answer returned, not counted.
    answer: Future[Answer] | None = None
    timeout_s: float | None = None


@dataclass(order=True)
class _Due:
    at: float
    seq: int
    delivery: Delivery = field(compare=False)


class Sender:
    """Worker threads that POST what the daemon hands them; see the module docstring."""

    def __init__(
        self,
        post: Post = http_post,
        *,
        workers: int = WORKERS,
        max_pending: int = MAX_PENDING,
        attempts: int = ATTEMPTS,
        backoff_s: float = BACKOFF_S,
        backoff_max_s: float = BACKOFF_MAX_S,
        clock: Callable[[], float] = time.monotonic,
        rand: random.Random | None = None,
    ) -> None:
        self._post = post
        self._workers_wanted = workers
        self.max_pending = max_pending
        self.attempts = attempts
        self.backoff_s = backoff_s
        self.backoff_max_s = backoff_max_s
        self._clock = clock
        self._rand = rand or random.Random()
        self._due: list[_Due] = []
        self._seq = itertools.count()
        self._cond = threading.Condition()
        self._threads: list[threading.Thread] = []
        self._closing_until: float | None = None
        self.counts = dict.fromkeys(DELIVERY_RESULTS, 0)

    # ------------------------------------------------------------------ the loop's side

    def submit(self, target: Webhook, body: bytes, what: str) -> bool:
        """Queue a body for a webhook; False when it was dropped (too many waiting)."""
        return self._queue(Delivery(target, body, what))

    def test(self, target: Webhook, body: bytes, timeout_s: float) -> Future[Answer]:
        """One POST, no retry, ahead of nothing: its answer comes back in the future."""
        answer: Future[Answer] = Future()
        if not self._queue(Delivery(target, body, "test alert", answer=answer,
                                    timeout_s=timeout_s)):  # fmt: skip
            answer.set_result(Answer(ok=False, error="not sent: too many alerts waiting"))
        return answer

    def pending(self) -> int:
        with self._cond:
            return len(self._due)

    def snapshot(self) -> dict[str, int]:
        with self._cond:
            return dict(self.counts)

    def _queue(self, delivery: Delivery) -> bool:
        with self._cond:
            if self._closing_until is not None:
                return False
            if len(self._due) >= self.max_pending:
                if delivery.answer is None:
                    self.counts["dropped"] += 1
                    _warn.warning(
                        ("dropped", delivery.target.shown),
                        f"dropped a {delivery.what} for {delivery.target.shown}:"
                        f" {self.max_pending} alerts already wait (a slow or failing receiver)",
                    )
                return False
            heapq.heappush(self._due, _Due(self._clock(), next(self._seq), delivery))
            self._start_workers()
            self._cond.notify()
            return True

    def _start_workers(self) -> None:
        """Threads start with the first alert: a daemon without webhooks has none."""
        while len(self._threads) < self._workers_wanted:
            thread = threading.Thread(
                target=self._work, name=f"gpud-notify-{len(self._threads)}", daemon=True
            )
            self._threads.append(thread)
            thread.start()

    # ------------------------------------------------------------------ the workers' side

    def _next(self) -> Delivery | None:
        """The next delivery that is due, waiting for it; None: stop."""
        with self._cond:
            while True:
                now = self._clock()
                closing = self._closing_until
                if closing is not None and (not self._due or self._due[0].at > closing):
                    return None
                if self._due and self._due[0].at <= now:
                    return heapq.heappop(self._due).delivery
                wait = self._due[0].at - now if self._due else None
                if closing is not None:
                    wait = max(0.0, closing - now if wait is None else min(wait, closing - now))
                self._cond.wait(wait)

    def _work(self) -> None:
        while (delivery := self._next()) is not None:
            timeout = delivery.timeout_s or delivery.target.timeout_s
            try:
                answer = self._post(delivery.target.url, delivery.body, timeout)
            except Exception as exc:  # the edge must not kill a worker; scrubbed all the same
                message = scrub(f"{type(exc).__name__}: {exc}", delivery.target.url)
                answer = Answer(ok=False, error=message.splitlines()[0], retry=True)
            self._settle(delivery, answer)

    def _settle(self, delivery: Delivery, answer: Answer) -> None:
        shown = delivery.target.shown
        if delivery.answer is not None:
            delivery.answer.set_result(answer)
            return
        delivery.tries += 1
        with self._cond:
            if answer.ok:
                self.counts["sent"] += 1
            elif answer.retry and delivery.tries < self.attempts:
                self.counts["retried"] += 1
                delay = self.delay(delivery.tries, answer.retry_after_s)
                heapq.heappush(self._due, _Due(self._clock() + delay, next(self._seq), delivery))
                self._cond.notify()
            else:
                self.counts["failed"] += 1
        if answer.ok:
            log.debug("%s sent to %s: %s", delivery.what, shown, answer.describe())
        elif answer.retry and delivery.tries < self.attempts:
            _warn.warning(
                ("retry", shown),
                f"{delivery.what} to {shown} failed: {answer.describe()}; trying again"
                f" (attempt {delivery.tries + 1} of {self.attempts})",
            )
        else:
            tried = f"after {delivery.tries} attempt(s)" if answer.retry else "(not retried)"
            _warn.warning(
                ("failed", shown),
                f"gave up on a {delivery.what} to {shown} {tried}: {answer.describe()}",
            )

    def delay(self, tries: int, retry_after_s: float | None = None) -> float:
        """Seconds before try `tries + 1`: 1, 2, 4, ... × a random 0.8 to 1.2 (so that
        daemons that failed together do not retry together), at least a Retry-After."""
        base = min(self.backoff_max_s, self.backoff_s * 2.0 ** (tries - 1))
        wait = base * self._rand.uniform(0.8, 1.2)
        if retry_after_s is not None:
            wait = max(wait, min(retry_after_s, self.backoff_max_s))
        return wait

    # ------------------------------------------------------------------ shutdown

    def close(self, grace_s: float = 2.0) -> int:
        """Send what is due within `grace_s`, then stop; returns how many were left."""
        with self._cond:
            self._closing_until = self._clock() + grace_s
            self._cond.notify_all()
            threads = list(self._threads)
        deadline = time.monotonic() + grace_s + 0.5
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        with self._cond:
            left = [d.delivery for d in self._due if d.delivery.answer is None]
            for due in self._due:
                if due.delivery.answer is not None:
                    due.delivery.answer.set_result(Answer(ok=False, error="the daemon stopped"))
            self._due.clear()
            self.counts["dropped"] += len(left)
        if left:
            log.warning("%d alert(s) not delivered: the daemon stopped first", len(left))
        return len(left)
