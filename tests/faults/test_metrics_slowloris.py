"""`/metrics` under a reconnecting slowloris (issue 25 §3).

A real daemon serving `--metrics`; `tests/support/slowloris.py` in a process of its own
holds 200 connections that never finish their request head and reopen each one 0.2 s
after the daemon closes it. Beside it, a scraper does what Prometheus does — a plain GET
of /metrics every 0.5 s with a 10 s timeout — for 30 s, and a control client asks
`node.info` every 20 ms. The scraper gets its scrapes and the control plane is unaffected.

Before the endpoint answered complete requests ahead of partial ones, 16 slow clients
filled every slot for 5 s at a time and the scraper got 8% of its scrapes.
"""

from __future__ import annotations

import http.client
import json
import subprocess
import sys
import time
from collections.abc import Callable

import pytest

from tests.support.adversary import MB, rss
from tests.support.daemons import RunningDaemon, free_port
from tests.support.probe import Prober

# Latencies measured against the machine's load: run alone (quiet: 0.1 of a core, slowloris
# included; it may run beside another quiet test).
pytestmark = [pytest.mark.faults, pytest.mark.alone, pytest.mark.quiet]

SLOW_CLIENTS = 200
SCRAPE_EVERY_S = 0.5
SCRAPING_S = 30.0


def _scrape(port: int) -> str | None:
    """One scrape as Prometheus makes it; None when it failed, with why."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", "/metrics")
        reply = conn.getresponse()
        body = reply.read()
    except (OSError, http.client.HTTPException) as exc:
        return f"{type(exc).__name__}: {exc}"
    finally:
        conn.close()
    if reply.status != 200 or b"DCGM_FI_DEV_GPU_UTIL" not in body:
        return f"HTTP {reply.status}, {len(body)} bytes"
    return None


def test_a_scraper_gets_its_scrapes_under_a_reconnecting_slowloris(
    daemons: Callable[..., RunningDaemon],
) -> None:
    port = free_port()
    daemon = daemons(simulate_gpus=8, extra=("--metrics", f"127.0.0.1:{port}"))
    assert _scrape(port) is None
    baseline = rss(daemon)
    slow = subprocess.Popen(
        [sys.executable, "-m", "tests.support.slowloris", "127.0.0.1", str(port),
         str(SLOW_CLIENTS), str(SCRAPING_S + 8)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    failures: list[str] = []
    took: list[float] = []
    try:
        time.sleep(5.0)  # every slow connection open, and cut at least once
        with Prober(daemon) as prober:
            end = time.monotonic() + SCRAPING_S
            while time.monotonic() < end:
                began = time.monotonic()
                failed = _scrape(port)
                took.append(time.monotonic() - began)
                if failed is not None:
                    failures.append(failed)
                time.sleep(max(0.0, SCRAPE_EVERY_S - (time.monotonic() - began)))
        peak = rss(daemon)
        out, _ = slow.communicate(timeout=30)
    finally:
        slow.kill()
    counts = json.loads(out)
    scrapes = len(took)
    success = (scrapes - len(failures)) / scrapes
    print(
        f"slowloris of {SLOW_CLIENTS} ({counts}): {scrapes - len(failures)}/{scrapes} scrapes "
        f"({success:.0%}), slowest {max(took) * 1000:.0f} ms; {prober.summary()}; RSS "
        f"{baseline / MB:.1f} → {peak / MB:.1f} MB; failures: {sorted(set(failures))[:3]}"
    )
    assert counts["closed"] > SLOW_CLIENTS, "the slow clients were never cut: no pressure"
    assert success >= 0.95
    assert prober.failed == []
    assert prober.worst_s < 1.0, prober.summary()
