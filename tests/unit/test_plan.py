"""The workers' plan (tests/support/plan.py): which work is heavy, from what was measured."""

from __future__ import annotations

import json
from types import SimpleNamespace

from tests.support.plan import (
    ALONE,
    HEAVY_S,
    LIGHT_CPU_S,
    QUIET,
    Cost,
    Plan,
    _cost,
    guess,
    heavy,
)


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


class _Worker:
    """What the plan sees of an xdist worker: it is sent tests, and told to shut down."""

    def __init__(self, name: str) -> None:
        self.gateway = SimpleNamespace(id=name)
        self.shutting_down = False
        self.sent: list[int] = []

    def send_runtest_some(self, indices: list[int]) -> None:
        self.sent.extend(indices)

    def shutdown(self) -> None:
        self.shutting_down = True


def _session(
    collection: list[str], workers: int = 3, known: dict[str, Cost] | None = None
) -> list[tuple[int, str, str]]:
    """The plan driven as xdist's DSession drives it, each worker running one test a
    round and only a test it holds the next one of (or shuts down after): (round, worker,
    test) as each test starts. Two heavy lanes, one waiting lane."""
    options = {"heavy_lanes": 2, "waiting_lanes": 1}
    config = SimpleNamespace(
        getvalue=lambda name: [f"{workers}*popen"], getoption=options.__getitem__
    )
    plan = Plan(config, known=known or {})  # type: ignore[arg-type]
    nodes = [_Worker(f"gw{i}") for i in range(workers)]
    for node in nodes:
        plan.add_node(node)
        plan.add_node_collection(node, collection)
    plan.schedule()
    started: list[tuple[int, str, str]] = []
    running: dict[str, int] = {}
    for tick in range(1, 1000):
        for node in list(plan.nodes):
            pending = plan.node2pending[node]
            if not pending:
                if node.shutting_down:
                    plan.remove_node(node)
                continue
            if len(pending) < 2 and not node.shutting_down:
                continue  # waits for the next one
            index = pending[0]
            if running.get(node.gateway.id) != index:  # starts it; it ends next round
                running[node.gateway.id] = index
                started.append((tick, node.gateway.id, collection[index]))
                continue
            plan.mark_test_complete(node, index)
        if not plan.nodes:
            return started
    raise AssertionError(f"the session never ended: {started}")


def test_alone_tests_run_after_the_others_the_quiet_ones_two_at_a_time() -> None:
    main = [f"tests/unit/t.py::t{i}" for i in range(7)]
    quiet = [f"tests/faults/q.py::q{i}@{QUIET}" for i in range(4)]
    loud = [f"tests/faults/a.py::a{i}@{ALONE}" for i in range(2)]
    started = _session(main + quiet + loud)
    assert sorted(t for _, _, t in started) == sorted(main + quiet + loud)  # each once
    when = {t: (tick, worker) for tick, worker, t in started}
    last_main = max(when[t][0] for t in main)
    assert all(when[t][0] > last_main for t in quiet + loud)
    # The quiet ones on two workers, side by side; the loud ones after them, on one.
    assert len({when[t][1] for t in quiet}) == 2
    assert any(when[a][0] == when[b][0] for a in quiet for b in quiet if a < b)
    assert len({when[t][1] for t in loud}) == 1
    assert min(when[t][0] for t in loud) > max(when[t][0] for t in quiet)


def test_without_quiet_tests_the_alone_ones_run_last_on_one_worker() -> None:
    main = [f"tests/unit/t.py::t{i}" for i in range(5)]
    loud = [f"tests/faults/a.py::a{i}@{ALONE}" for i in range(3)]
    started = _session(main + loud, workers=2)
    when = {t: (tick, worker) for tick, worker, t in started}
    assert len(started) == 8
    assert min(when[t][0] for t in loud) > max(when[t][0] for t in main)
    assert len({when[t][1] for t in loud}) == 1


def test_at_most_two_heavy_pieces_at_once_and_one_that_waits_beside_them() -> None:
    heavy_ = [f"tests/faults/h.py::h{i}" for i in range(4)]
    waits = [f"tests/faults/w.py::w{i}" for i in range(3)]
    light = [f"tests/unit/t.py::t{i}" for i in range(12)]
    known = {t: Cost(40.0, 30.0) for t in heavy_} | {t: Cost(30.0, 3.0) for t in waits}
    started = _session(heavy_ + waits + light, workers=4, known=known)
    assert sorted(t for _, _, t in started) == sorted(heavy_ + waits + light)
    ticks = {tick for tick, _, _ in started}
    at = {tick: [t for s, _, t in started if s == tick] for tick in ticks}
    assert max(sum(t in heavy_ for t in now) for now in at.values()) == 2
    assert max(sum(t in waits for t in now) for now in at.values()) == 1
    # A waiting piece ran beside both heavy lanes, on a worker of its own.
    assert any(sum(t in heavy_ for t in now) == 2 and any(t in waits for t in now)
               for now in at.values())  # fmt: skip
    # The waiting lane takes no heavy piece (a heavy lane may take a waiting one).
    workers = {t: w for _, w, t in started}
    lane = workers[waits[0]]
    assert lane not in {workers[t] for t in heavy_}
