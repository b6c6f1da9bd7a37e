"""The workers' plan (tests/support/plan.py): which work is heavy, from what was measured."""

from __future__ import annotations

import json

from tests.support.plan import HEAVY_S, LIGHT_CPU_S, Cost, _cost, guess, heavy


def test_durations_hold_seconds_alone_or_seconds_and_cpu() -> None:
    assert _cost(12.5) == Cost(12.5)
    assert _cost([12.5, 3.0]) == Cost(12.5, 3.0)
    assert _cost(json.loads("[100.0, 0.9]")) == Cost(100.0, 0.9)
    assert _cost("12") is None and _cost([1.0]) is None and _cost(None) is None


def test_long_work_is_heavy_unless_it_was_measured_to_cost_little_cpu() -> None:
    assert not heavy([Cost(HEAVY_S - 1)])  # short: light
    assert heavy([Cost(HEAVY_S)])  # long, CPU not measured: heavy, as before
    assert heavy([Cost(40.0, 30.0)])  # real ranks
    assert not heavy([Cost(100.0, 0.9)])  # an idle client waiting 100 s
    # A group: its tests' seconds and CPU add up; one unmeasured test keeps it heavy.
    assert heavy([Cost(5.0, 1.5), Cost(5.0, 1.5)])
    assert not heavy([Cost(5.0, 0.5), Cost(5.0, LIGHT_CPU_S - 1.0)])
    assert heavy([Cost(5.0, 0.5), Cost(5.0)])


def test_an_unmeasured_test_is_guessed_by_its_folder() -> None:
    known = {"tests/unit/x.py::t": Cost(3.0, 1.0)}
    assert guess("tests/unit/x.py::t", known) == Cost(3.0, 1.0)
    assert guess("tests/unit/x.py::t@slurm", known) == Cost(3.0, 1.0)
    assert guess("tests/faults/y.py::t", known).seconds >= HEAVY_S
    assert guess("tests/unit/y.py::t", known).seconds < 1
