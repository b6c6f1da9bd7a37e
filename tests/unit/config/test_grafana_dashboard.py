"""The Grafana dashboard's MFU and goodput panels read series gpud renders, with the labels
they select and group by, for a run on a real GPU: a run on simulated GPUs, the only kind
tests/integration/test_prometheus_server.py can start, has no `gpud_run_mfu` (n/a)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from gpud.efficiency.goodput import Goodput, GoodputClock
from gpud.efficiency.model import RunFlops
from gpud.model.run import HealthSummary, RunState
from gpud.prometheus.series import RunOnNode, run_families
from gpud.wire.run_messages import RunSummary

DASHBOARD = Path(__file__).resolve().parents[3] / "config" / "grafana" / "gpud.json"


def row_exprs(title: str) -> list[str]:
    """The queries of the panels under the row `title`, up to the next row."""
    panels: list[dict[str, Any]] = json.loads(DASHBOARD.read_text())["panels"]
    start = next(i for i, p in enumerate(panels) if p["type"] == "row" and p["title"] == title)
    exprs = []
    for panel in panels[start + 1 :]:
        if panel["type"] == "row":
            break
        exprs += [str(t["expr"]) for t in panel["targets"]]
    return exprs


def exported_on_a_real_gpu() -> dict[str, set[str]]:
    """Each series a training run on an H100 renders on node 0, with its label names."""
    clock = GoodputClock(Goodput(until=0.0))
    clock.advance(10.0, "running", 1)
    clock.stepped(1, 0, 10.0)
    clock.advance(40.0, "running", 1)
    summary = RunSummary(
        id="r-1", name="demo", state=RunState.RUNNING, state_since=0.0, attempt=1,
        created_at=0.0, node_rank=0, nodes=[], launcher="torchrun",
    )  # fmt: skip
    health = HealthSummary(
        run_id="r-1", attempt=1, time=0.0, verdict="ok", world_size=1, ranks=[],
        flops=RunFlops(flops_per_second=4e14, mfu=0.404, gpus=1),
    )  # fmt: skip
    found: dict[str, set[str]] = {}
    for family in run_families([RunOnNode(summary, health, goodput=clock.record())]):
        for sample in family.samples:
            found.setdefault(sample.name, set()).update(sample.labels)
    return found


def test_the_mfu_and_goodput_panels_read_what_a_run_on_a_real_gpu_exports() -> None:
    exported = exported_on_a_real_gpu()
    exprs = row_exprs("MFU and goodput")
    read = {name for expr in exprs for name in re.findall(r"\bgpud_\w+", expr)}
    assert read == {"gpud_run_mfu", "gpud_run_flops_per_second", "gpud_run_goodput_ratio",
                    "gpud_run_seconds"}  # fmt: skip
    for expr in exprs:
        grouped = {g.strip() for by in re.findall(r"by \(([^)]*)\)", expr) for g in by.split(",")}
        for name, selector in re.findall(r"\b(gpud_\w+)\{([^}]*)\}", expr):
            assert name in exported, f"{expr}: gpud does not export {name}"
            labels = set(re.findall(r"(\w+)\s*=~?", selector)) | grouped
            assert labels <= exported[name], f"{expr}: {name} has {exported[name]}"
