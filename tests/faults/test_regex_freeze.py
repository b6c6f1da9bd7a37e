"""One run's metric patterns never freeze the daemon (issue 24 §1).

A real daemon supervises two runs: a real 2-rank gloo DDP run, and a plain script whose
spec has the classic catastrophic pattern `^(?P<loss>(a+)+)$` (Python's re backtracks for
minutes on each of its lines), a pattern that is slow even on RE2 (seconds on one 64 kB
line), and a good one. The script prints 10,000 catastrophic lines, the 64 kB line and
some metrics. Throughout, a client process asks `node.info` every 20 ms: the daemon answers
promptly, the DDP run keeps training with its health, the slow pattern is disabled with
one warning event that names it, and the good pattern's metrics arrive.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from gpud.wire.run_messages import MetricRow
from tests.support.daemons import RunningDaemon
from tests.support.probe import Prober
from tests.support.runs import (
    FAST,
    force_stop,
    launch,
    script_spec,
    status,
    wait_for,
    wait_for_step,
)

# Latencies and step times measured against the machine's load: run alone.
pytestmark = [pytest.mark.faults, pytest.mark.alone]

CATASTROPHIC = r"^(?P<loss>(a+)+)$"
SLOW_ON_RE2 = r"(?P<tokens>[ab]{1,1000}[ab]{1,1000}c)"
GOOD = r"step (?P<step>\d+) loss (?P<loss>[\d.]+)"

GREEDY = """
import sys, time
time.sleep(1)
bad = "a" * 34 + "b"
for i in range(10_000):
    print(bad)
    if i % 2000 == 0:
        print(f"step {i // 2000} loss {1.0 / (i + 1):.6f}", flush=True)
print("ab" * 32768, flush=True)  # a 64 kB line for the pattern that is slow on RE2
for i in range(5, 10):
    print(f"step {i} loss 0.5", flush=True)
    time.sleep(0.5)
"""


def test_a_catastrophic_pattern_never_freezes_the_daemon(
    daemon: RunningDaemon, tmp_path: Path
) -> None:
    ddp = launch(daemon, FAST, "training.max_steps=100000")
    try:
        wait_for_step(daemon, ddp, 10)
        spec = script_spec(tmp_path, GREEDY, name="greedy")
        patterns = [{"pattern": p} for p in (CATASTROPHIC, SLOW_ON_RE2, GOOD)]
        spec.write_text(spec.read_text() + f"metrics: {json.dumps(patterns)}\n")
        with Prober(daemon) as prober:
            greedy = launch(daemon, config=spec)
            step_before = status(daemon, ddp).run.last_step or 0
            verdicts = []
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                verdicts.append(daemon.client().run_health(ddp).verdict)
                if status(daemon, greedy).run.state.terminal:
                    break
                time.sleep(0.5)
            wait_for(daemon, greedy, {"succeeded"}, timeout=30)
            # The slow pattern's one line holds up that run's pattern thread (not the daemon)
            # for a second or more before it is disabled; the metrics behind it follow.
            warnings: list[str] = []
            rows: list[MetricRow] = []
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and (not warnings or len(rows) < 10):
                time.sleep(0.5)
                events = status(daemon, greedy).events
                warnings = [e.message for e in events if e.kind == "metrics_pattern"]
                rows = daemon.client().run_metrics(greedy, name="loss").rows
        print(prober.summary())
        assert prober.failed == [] and prober.asked > 100
        # The target is 100 ms throughout (bench/pattern_engines.py measures it on a quiet
        # machine). Here two cores are shared with two DDP ranks training flat out, a script
        # printing 10,000 lines and whatever else runs: a few answers (2% of about 200) may
        # wait for a core, none for long. Measured on two loaded cores: p99 55-116 ms,
        # slowest 103-155 ms. Before RE2 and the pattern threads, it did not answer for hours.
        assert prober.percentile(0.98) < 0.1 and prober.worst_s < 1.0, prober.summary()

        ddp_now = status(daemon, ddp).run
        assert ddp_now.state.value == "running" and (ddp_now.last_step or 0) > step_before
        assert "ok" in verdicts and not {"stalled", "failed"} & set(verdicts), verdicts

        assert len(warnings) == 1, warnings
        assert SLOW_ON_RE2 in warnings[0] and "disabled for this run" in warnings[0]
        assert sorted(r.step for r in rows) == list(range(10))
        assert all(r.values["loss"] <= 1.0 for r in rows)  # never the catastrophic group's text
    finally:
        force_stop(daemon, ddp)
