"""The audit log: accepted actions always, refusal bursts summarized, bounded by rotation."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gpud.audit import KEEP, AuditLog
from tests.support.clock import ManualClock

NOT_FOUND = "not_found"


def _records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_refusal_bursts_become_one_summary_and_accepted_actions_stay(tmp_path: Path) -> None:
    clock = ManualClock(100.0)
    path = tmp_path / "audit.log"
    audit = AuditLog(path, interval_s=10.0, clock=clock, wall=clock)
    for i in range(5000):
        audit.record(
            "op@host", "operator", "run.stop", {"run": "x"}, False, "no run x", "not_found"
        )
        if i % 1000 == 0:
            audit.record("op@host", "operator", "node.events.ack", {}, True)
    audit.record("op@host", "operator", "run.resume", {"run": "x"}, False, "no run", "not_found")
    clock.now += 10.0
    audit.flush()
    records = _records(path)
    accepted = [r for r in records if r["ok"]]
    assert len(accepted) == 5  # every accepted action, individually
    refusals = [r for r in records if not r["ok"]]
    assert [(r["action"], r["count"]) for r in refusals] == [
        ("run.stop", 1),  # the first in full, with its body and reason
        ("run.resume", 1),
        ("run.stop", 4999),
    ]
    assert refusals[0]["body"] == {"run": "x"} and refusals[0]["detail"] == "no run x"
    summary = refusals[-1]
    assert summary["code"] == "not_found" and summary["since"] == 100.0
    assert (
        summary["detail"] == "4999 more refused run.stop from op@host in the last 10 s: not_found"
    )
    assert path.stat().st_size < 3000
    audit.close()


def test_the_log_is_rotated_under_its_bound(tmp_path: Path) -> None:
    path = tmp_path / "audit.log"
    bound = 64 * 1024
    audit = AuditLog(path, max_bytes=bound)
    for i in range(2000):
        audit.record("op@host", "operator", "run.launch", {"n": i, "pad": "x" * 100}, True)
    audit.close()
    files = sorted(tmp_path.iterdir())
    assert [f.name for f in files] == ["audit.log"] + [f"audit.log.{n}" for n in range(1, KEEP + 1)]
    assert sum(f.stat().st_size for f in files) <= bound
    newest = _records(path)
    assert newest[-1]["body"]["n"] == 1999  # the newest is kept, the oldest went first
    oldest = _records(tmp_path / f"audit.log.{KEEP}")
    assert oldest[0]["body"]["n"] > 0


def test_a_reopened_log_appends(tmp_path: Path) -> None:
    path = tmp_path / "audit.log"
    for n in range(2):
        audit = AuditLog(path)
        audit.record("a", "operator", "run.stop", {"n": n}, True)
        audit.close()
    assert [r["body"] for r in _records(path)] == [{"n": 0}, {"n": 1}]
