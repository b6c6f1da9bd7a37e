"""gpud's Prometheus alerting rules (config/prometheus/gpud-alerts.yml), as tests read them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

RULES = Path(__file__).resolve().parents[2] / "config" / "prometheus" / "gpud-alerts.yml"
#: Read by a rule before gpud exports them: they come with the goodput and retention work
#: (the rules file and the README say which gpud they need).
NOT_YET_EXPORTED = {"gpud_state_bytes", "gpud_state_max_bytes"}


def rules() -> list[dict[str, Any]]:
    """Every alerting rule, from every group."""
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"]]
