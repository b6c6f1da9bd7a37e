"""The audit log: accepted actions always, refusals apart (bodies never kept, bursts
summarized), every record small, both bounded by rotation to the byte."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from gpud.security.audit import KEEP, REFUSED_LOG, AuditLog
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
    accepted = _records(path)
    assert len(accepted) == 5 and all(r["ok"] for r in accepted)  # each individually
    refusals = _records(tmp_path / REFUSED_LOG)
    assert [(r["action"], r["count"]) for r in refusals] == [
        ("run.stop", 1),  # the first with its reason; its body as size and digest
        ("run.resume", 1),
        ("run.stop", 4999),
    ]
    body = b'{"run":"x"}'
    assert refusals[0]["detail"] == "no run x" and refusals[0]["body"] == {}
    assert refusals[0]["body_bytes"] == len(body)
    assert refusals[0]["body_sha256"] == hashlib.sha256(body).hexdigest()
    summary = refusals[-1]
    assert summary["code"] == "not_found" and summary["since"] == 100.0
    assert (
        summary["detail"] == "4999 more refused run.stop from op@host in the last 10 s: not_found"
    )
    assert path.stat().st_size + (tmp_path / REFUSED_LOG).stat().st_size < 3000
    audit.close()


def test_the_log_is_rotated_under_its_bound(tmp_path: Path) -> None:
    path = tmp_path / "audit.log"
    bound = 64 * 1024
    audit = AuditLog(path, max_bytes=bound)
    for i in range(2000):
        audit.record("op@host", "operator", "run.launch", {"n": i, "pad": "x" * 100}, True)
    audit.close()
    files = sorted(tmp_path.glob("audit.log*"))
    assert [f.name for f in files] == ["audit.log"] + [f"audit.log.{n}" for n in range(1, KEEP + 1)]
    assert sum(f.stat().st_size for f in files) <= bound * 3 // 4  # the accepted share
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


def test_a_viewers_refused_floods_cannot_push_an_accepted_action_out(tmp_path: Path) -> None:
    """Issue 33 §1, the attack: a viewer key sends a refused `run.launch` with a 3.9 MB
    spec every 10.5 s (each the first of its kind again). Each refusal was written whole
    (+10.5 MB in 33 s) and rotation pushed the operator's records out. Now: a refusal is
    a small record in its own file, and the bound holds to the byte."""
    clock = ManualClock(100.0)
    path = tmp_path / "audit.log"
    bound = 8 * 2**20
    audit = AuditLog(path, max_bytes=bound, interval_s=10.0, clock=clock, wall=clock)
    audit.record("op@host", "local", "keys.authorize", {"key": "k" * 40, "role": "viewer"}, True)
    audit.record("op@host", "operator", "run.launch", {"spec": {"name": "real"}}, True)
    huge = {"spec": {"name": "x", "args": ["y" * 1000] * 3900}}  # 3.9 MB as JSON
    for _ in range(40):  # 7 minutes of the attack: 156 MB of bodies, the bound 8 MB
        audit.record("viewer@laptop", "viewer", "run.launch", huge, False,
                     "run.launch needs the operator role", "forbidden")  # fmt: skip
        clock.now += 10.5
        audit.flush()
    audit.record("op@host", "operator", "run.stop", {"run": "real"}, True)
    audit.close()
    kept = _records(path)
    assert [r["action"] for r in kept] == ["keys.authorize", "run.launch", "run.stop"]
    files = list(tmp_path.iterdir())
    assert sum(f.stat().st_size for f in files) <= bound
    refused = [r for f in sorted(tmp_path.glob(f"{REFUSED_LOG}*")) for r in _records(f)]
    assert refused and max(len(json.dumps(r)) for r in refused) < 1024
    assert refused[-1]["body_bytes"] > 3_900_000 and refused[-1]["body"] == {}


def test_an_accepted_body_over_the_bound_is_kept_as_its_size_and_digest(
    tmp_path: Path,
) -> None:
    path = tmp_path / "audit.log"
    audit = AuditLog(path)
    big = {"spec": {"args": ["z" * 1000] * 100}}
    audit.record("op@host", "operator", "run.launch", big, True, "d" * 5000)
    audit.record("op@host", "operator", "run.stop", {"run": "r"}, True)
    audit.close()
    first, second = _records(path)
    assert first["body"] == {} and first["body_bytes"] > 100_000 and first["body_sha256"]
    assert len(first["detail"]) == 1024
    assert second["body"] == {"run": "r"} and second["body_bytes"] is None
