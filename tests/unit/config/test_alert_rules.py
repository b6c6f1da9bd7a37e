"""gpud's Prometheus alerting rules (config/prometheus/gpud-alerts.yml): promtool checks
them and runs their unit tests (gpud-alerts.test.yml, synthetic series), every rule is
tested and says what to do, and every series a rule reads is one gpud exports (or will:
goodput and the state dir's bound come with later releases). Skipped, saying why, where
promtool is missing (Debian's `prometheus` package has it; `.ci/run` installs it)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.support.alert_rules import NOT_YET_EXPORTED, RULES, rules

ROOT = Path(__file__).resolve().parents[3]
TESTS = Path(__file__).parent / "gpud-alerts.test.yml"
SERIES = ROOT / "gpud" / "prometheus" / "series.py"
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None,
    reason="promtool is not installed (Debian: apt-get install prometheus)",
)
#: PromQL's words, which the name scan below would otherwise take for series.
PROMQL = {"max", "sum", "by", "and", "unless", "or", "offset", "avg_over_time", "changes",
          "increase", "absent"}  # fmt: skip


@needs_promtool
def test_promtool_finds_the_rules_valid() -> None:
    assert PROMTOOL is not None
    done = subprocess.run([PROMTOOL, "check", "rules", str(RULES)], capture_output=True,
                          text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(rules())} rules found" in done.stdout


@needs_promtool
def test_the_rules_unit_tests_pass() -> None:
    assert PROMTOOL is not None
    done = subprocess.run([PROMTOOL, "test", "rules", TESTS.name], capture_output=True,
                          text=True, timeout=120, cwd=TESTS.parent)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


def test_every_rule_is_tested_and_says_what_to_do() -> None:
    tested = {
        case["alertname"]
        for test in yaml.safe_load(TESTS.read_text())["tests"]
        for case in test.get("alert_rule_test", [])
        if case.get("exp_alerts")  # a test where it fires, not only where it does not
    }
    for rule in rules():
        name = rule["alert"]
        assert name in tested, f"{name} has no promtool test where it fires"
        labels, notes = rule["labels"], rule["annotations"]
        assert isinstance(labels, dict) and isinstance(notes, dict)
        assert labels["severity"] in ("warning", "critical"), name
        assert {"summary", "description", "runbook"} <= set(notes), name


def test_every_series_a_rule_reads_is_exported() -> None:
    source = SERIES.read_text()
    exported = set(re.findall(r'"(gpud_\w+|DCGM_\w+)"', source))
    # prometheus-client writes a counter family's samples with `_total`.
    exported |= {f"{name}_total" for name in exported}
    for rule in rules():
        expr = str(rule["expr"])
        without_labels = re.sub(r"\{[^}]*\}|\"[^\"]*\"|\[[^\]]*\]", "", expr)
        names = set(re.findall(r"\b([A-Za-z_][A-Za-z0-9_]*)\b", without_labels))
        names -= PROMQL | {"instance", "job", "run", "name", "Hostname", "gpu", "UUID", "h", "m"}
        unknown = {n for n in names if n != "up" and n not in exported | NOT_YET_EXPORTED}
        assert not unknown, f"{rule['alert']} reads {unknown}, which gpud does not export"
