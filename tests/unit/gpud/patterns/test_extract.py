"""Metric extraction on a budget: a pattern that costs too much is disabled, once, by name,
and the run's other patterns go on. The clocks (wall and the thread's CPU) are injected:
each call moves them by what a match is made to "take"."""

from __future__ import annotations

import itertools
import threading

from gpud.patterns.extract import Budget, MetricExtractor
from gpud.patterns.follower import Found, PatternThread

LOSS = r"iter (?P<step>\d+): loss (?P<loss>[\d.]+)"
LR = r"lr (?P<lr>[\d.e-]+)"


class SteppingClock:
    """perf_counter stand-in: a match (two calls) takes `cost_s`, and `idle_s` passes
    between matches. Binary fractions keep the sums exact."""

    def __init__(self, cost_s: float, idle_s: float = 0.0) -> None:
        self.now = 0.0
        self.cost_s = cost_s
        self.idle_s = idle_s
        self._calls = itertools.count()

    def __call__(self) -> float:
        self.now += self.idle_s if next(self._calls) % 2 == 0 else self.cost_s
        return self.now


def clocks(cost_s: float, idle_s: float = 0.0) -> dict[str, SteppingClock]:
    """A match that takes `cost_s` of wall time and of CPU alike."""
    return {"clock": SteppingClock(cost_s, idle_s), "cpu": SteppingClock(cost_s, idle_s)}


def test_every_pattern_adds_its_groups_and_step_is_the_step() -> None:
    extract = MetricExtractor([LOSS, LR])
    assert extract.extract("iter 120: loss 2.3121 lr 3e-4") == (120, {"loss": 2.3121, "lr": 3e-4})
    assert extract.extract("iter 5: loss nan-ish") == (None, {})
    fractional = MetricExtractor([r"epoch (?P<step>[\d.]+) loss (?P<loss>\d+)"])
    assert fractional.extract("epoch 1.5 loss 2") == (None, {"loss": 2.0})  # no such step
    assert extract.extract("something else") == (None, {})


def test_a_slow_line_disables_its_pattern_once_and_the_others_go_on() -> None:
    extract = MetricExtractor([LOSS, LR], Budget(line_s=0.05), **clocks(0.2))
    assert extract.extract("iter 1: loss 2.0 lr 0.1") == (1, {"loss": 2.0, "lr": 0.1})
    disabled = extract.take_disabled()
    assert [d.source for d in disabled] == [LOSS, LR]  # both took 200 ms
    assert "one line took 200 ms (budget 50 ms a line)" in disabled[0].line()
    assert disabled[0].line().startswith(f"metrics pattern {LOSS!r} disabled for this run")
    assert extract.take_disabled() == []
    assert not extract
    assert extract.extract("iter 2: loss 1.0") == (None, {})


def test_many_cheap_lines_over_the_window_budget_disable_the_pattern() -> None:
    budget = Budget(line_s=0.05, window_s=0.5, window=10.0)
    extract = MetricExtractor([LOSS], budget, **clocks(1 / 64))
    steps = [extract.extract(f"iter {i}: loss 1.0")[0] for i in range(40)]
    assert steps[:32] == list(range(32))  # 0.5 s of matching in 10 s is allowed
    assert steps[33:] == [None] * 7
    (disabled,) = extract.take_disabled()
    assert "0.52 s of matching within 10 s (budget 0.5 s)" in disabled.why


def test_the_window_budget_renews_with_the_window() -> None:
    budget = Budget(line_s=0.05, window_s=0.5, window=1.0)
    extract = MetricExtractor([LOSS], budget, **clocks(1 / 64, idle_s=1 / 16))
    # 20 % of the time matching: 0.2 s in each 1 s window, for a minute and a half
    assert all(extract.extract(f"iter {i}: loss 1.0")[0] == i for i in range(1200))
    assert extract.take_disabled() == []


def test_waiting_for_a_core_mid_match_is_not_the_patterns_cost() -> None:
    # 200 ms between the two clock reads, of which the thread ran 1 µs: a loaded box
    waited = MetricExtractor(
        [LOSS], Budget(line_s=0.05), clock=SteppingClock(0.2), cpu=SteppingClock(2**-20)
    )
    assert [waited.extract(f"iter {i}: loss 1.0")[0] for i in range(3)] == [0, 1, 2]
    assert waited.take_disabled() == []


def test_a_stored_pattern_re2_refuses_is_disabled_from_the_start() -> None:
    extract = MetricExtractor([r"loss (?P<loss>\d+)(?=ms)", LOSS])
    (refused,) = extract.take_disabled()
    assert "not supported by RE2" in refused.why
    assert extract.extract("iter 3: loss 4") == (3, {"loss": 4.0})


def test_the_thread_delivers_points_with_the_attempt_and_the_time_they_were_read() -> None:
    found: list[Found] = []
    got = threading.Event()

    def deliver(what: Found) -> None:
        found.append(what)
        got.set()

    thread = PatternThread("r", MetricExtractor([LOSS]), deliver, idle_s=0.2)
    thread.feed(2, ["noise", "iter 7: loss 0.5", "iter 8: loss 0.25"], when=123.0)
    assert got.wait(5) and thread.wait_idle(5)
    assert [(p.attempt, p.step, p.time, p.values) for p in found[0].points] == [
        (2, 7, 123.0, {"loss": 0.5}),
        (2, 8, 123.0, {"loss": 0.25}),
    ]


def test_lines_past_the_queue_bound_are_dropped_and_counted() -> None:
    busy, release = threading.Event(), threading.Event()
    found: list[Found] = []

    def deliver(what: Found) -> None:
        busy.set()
        release.wait(5)  # hold the thread so that lines pile up behind it
        found.append(what)

    thread = PatternThread("r", MetricExtractor([LOSS]), deliver, max_pending=10)
    thread.feed(1, ["iter 0: loss 1"], when=0.0)
    assert busy.wait(5)  # the thread holds that batch; the next ones queue
    for batch in range(5):
        thread.feed(1, [f"iter {batch * 4 + i + 1}: loss 1" for i in range(4)], when=0.0)
    release.set()
    assert thread.wait_idle(5)
    steps = [p.step for f in found for p in f.points]
    assert sum(f.dropped for f in found) == 12  # three batches of four never matched
    assert steps == [0, 13, 14, 15, 16, 17, 18, 19, 20]
