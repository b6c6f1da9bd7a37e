"""The straggler verdict over time (issue 24 §5): persistence, hysteresis, a stall's aftermath."""

from __future__ import annotations

from gpud.model.run import Straggler
from gpud.runs.health.stragglers import CLEAR_AT, NAME_AT, SETTLE_S, WINDOWS, StragglerWatch


def slow(rank: int, ratio: float = 2.0) -> Straggler:
    return Straggler(rank=rank, step_time_s=0.02 * ratio, median_step_time_s=0.02, ratio=ratio)


def feed(
    watch: StragglerWatch, start: float, candidates: list[Straggler | None]
) -> list[int | None]:
    """One judgement a second; the rank named after each."""
    named = []
    for i, candidate in enumerate(candidates):
        verdict = watch.judge(start + i, candidate)
        named.append(verdict.rank if verdict else None)
    return named


def test_a_rank_slow_all_along_is_named_after_a_few_seconds_with_its_latest_ratio() -> None:
    watch = StragglerWatch()
    named = feed(watch, 0.0, [slow(1, 1.5 + i / 10) for i in range(WINDOWS)])
    assert named == [None] * (NAME_AT - 1) + [1] * (WINDOWS - NAME_AT + 1)
    verdict = watch.judge(10.0, slow(1, 3.0))
    assert verdict is not None and verdict.ratio == 3.0
    assert watch.score == (WINDOWS, WINDOWS)


def test_noise_that_names_either_rank_for_a_few_seconds_in_turn_names_nobody() -> None:
    """What a busy 2-core box measured after a SIGCONT: runs of 4-6 s per rank."""
    watch = StragglerWatch()
    pattern = [slow(1)] * 5 + [None] + [slow(0)] * 6 + [None, None] + [slow(1)] * 4 + [None]
    pattern += [slow(0)] * 3 + [None]
    named = feed(watch, 0.0, pattern * 4)
    assert set(named) == {None}


def test_a_named_straggler_holds_through_a_few_quiet_seconds_then_clears() -> None:
    watch = StragglerWatch()
    feed(watch, 0.0, [slow(2)] * WINDOWS)
    quiet = feed(watch, 10.0, [None] * (WINDOWS - CLEAR_AT - 1))
    assert quiet == [2] * len(quiet)  # no flapping on a ratio dipping under the threshold
    assert feed(watch, 20.0, [None]) == [None]


def test_nothing_is_judged_during_a_stall_and_for_a_while_after_it() -> None:
    watch = StragglerWatch()
    feed(watch, 0.0, [slow(0)] * WINDOWS)
    watch.stalled(10.0)
    watch.stalled(28.0)  # still stalled at 28 s: it ends after that
    assert feed(watch, 28.5, [slow(1, 9.0)] * int(SETTLE_S)) == [None] * int(SETTLE_S)
    # Settled: a fresh record, so the old straggler is not named again from before
    assert feed(watch, 28.0 + SETTLE_S, [None] * 3) == [None] * 3


def test_asking_more_often_than_once_a_second_does_not_speed_the_verdict_up() -> None:
    watch = StragglerWatch()
    for i in range(40):  # ten times a second for four seconds
        assert watch.judge(i / 10, slow(1)) is None
    assert watch.score[1] <= 5
