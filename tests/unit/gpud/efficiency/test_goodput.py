"""The goodput clock: every second in one bucket, and time moved once it is known."""

from __future__ import annotations

import pytest

from gpud.efficiency.goodput import Bucket, Goodput, GoodputClock, bucket_of


def test_each_state_has_its_bucket() -> None:
    assert bucket_of("queued", 1, False, False) is Bucket.QUEUED
    assert bucket_of("pending", 1, False, False) is Bucket.STARTING
    assert bucket_of("pending", 1, True, False, restart_due=True) is Bucket.RESTARTING
    assert bucket_of("starting", 1, False, False) is Bucket.STARTING
    assert bucket_of("starting", 2, False, False) is Bucket.RESTARTING
    assert bucket_of("running", 1, False, False) is Bucket.STARTING
    assert bucket_of("running", 2, False, False) is Bucket.RESTARTING
    assert bucket_of("running", 2, True, False) is Bucket.TRAINING
    assert bucket_of("running", 2, True, True) is Bucket.STALLED
    assert bucket_of("stopping", 1, True, False) is Bucket.STOPPING
    assert bucket_of("succeeded", 1, True, False) is None


def a_run_with_a_hang_and_a_restart() -> GoodputClock:
    """Created at 0; queued 10 s; starts; first step at 20; trains to step 39 at 60 (a
    save of 2 s at step 29); no progress from 60; health says stalled for 20 s at 80;
    stopped at 85, pending 3 s, attempt 2 from step 29, first step 30 at 95, trains to
    step 59 at 125, succeeds."""
    c = GoodputClock(Goodput(until=0.0))
    c.advance(10.0, "queued", 1)
    c.advance(12.0, "starting", 1)
    c.advance(20.0, "running", 1)
    c.stepped(1, 0, 20.0)
    c.advance(50.0, "running", 1)
    c.stepped(1, 29, 50.0)
    c.checkpointed(1, 2.0)
    c.advance(60.0, "running", 1)
    c.stepped(1, 39, 60.0)
    c.advance(80.0, "running", 1)
    c.stall(1, 20.0)
    c.stall(1, 25.0)  # still stalled: counted once
    c.advance(85.0, "running", 1)
    c.advance(88.0, "stopping", 1)
    c.advance(91.0, "pending", 1, restart_due=True)
    c.advance(95.0, "running", 2)
    c.stepped(2, 30, 95.0)
    c.next_attempt(2, 29)
    c.advance(125.0, "running", 2)
    c.stepped(2, 59, 125.0)
    c.end(125.0, "running", 2)
    return c


def test_the_buckets_add_up_to_the_wall_time_and_say_where_it_went() -> None:
    g = a_run_with_a_hang_and_a_restart().record()
    s = g.seconds
    assert g.wall_s == pytest.approx(125.0)
    assert sum(s.values()) == pytest.approx(125.0)
    assert s["queued"] == pytest.approx(10.0)
    assert s["starting"] == pytest.approx(10.0)  # 10 → 20: launch to the first step
    assert s["checkpointing"] == pytest.approx(2.0)
    assert s["stalled"] == pytest.approx(25.0)  # the 20 s health saw, then 5 more
    assert s["stopping"] == pytest.approx(3.0)
    assert s["restarting"] == pytest.approx(7.0)  # failure to attempt 2's first step
    # Attempt 1 trained 60 s less 2 s saving and 20 s stalled: 38 s for steps 0-39, of
    # which steps 30-39 (10 of 40) were done again by attempt 2.
    assert s["lost"] == pytest.approx(38.0 * 10 / 40)
    assert s["training"] == pytest.approx(38.0 - 9.5 + 30.0)
    assert g.ratio == pytest.approx(58.5 / 125.0)
    first, second = g.attempts
    assert (first.attempt, second.attempt, second.resume_step) == (1, 2, 29)
    assert second.ratio == pytest.approx(30.0 / 34.0)  # 4 s from its start to its first step
    assert "47% [" in g.line() and "lost 9.5s" in g.line() and "(wall 2m05s)" in g.line()


def test_a_record_carried_over_goes_on_where_it_was() -> None:
    """A daemon restart: the clock rebuilt from its record adds the time it was down to
    the bucket the run was in, and nothing else changes."""
    c = GoodputClock(Goodput(until=0.0))
    c.advance(5.0, "running", 1)
    c.stepped(1, 0, 5.0)
    c.advance(15.0, "running", 1)
    again = GoodputClock(c.record())
    again.advance(45.0, "running", 1)
    g = again.record()
    assert g.seconds["starting"] == pytest.approx(5.0)
    assert g.seconds["training"] == pytest.approx(40.0)
    assert g.wall_s == pytest.approx(45.0)


def test_an_ended_record_takes_no_more_time_and_a_move_never_goes_negative() -> None:
    c = GoodputClock(Goodput(until=0.0))
    c.advance(3.0, "running", 1)
    c.stepped(1, 0, 3.0)
    c.advance(4.0, "running", 1)
    c.checkpointed(1, 60.0)  # a save longer than the training counted: what there was
    c.end(4.0, "running", 1)
    c.advance(100.0, "running", 1)
    g = c.record()
    assert g.seconds["training"] == 0.0 and g.seconds["checkpointing"] == pytest.approx(1.0)
    assert g.wall_s == pytest.approx(4.0) and g.ended


def test_a_restart_from_scratch_loses_every_step_of_the_attempt_before() -> None:
    c = GoodputClock(Goodput(until=0.0))
    c.advance(1.0, "running", 1)
    c.stepped(1, 0, 1.0)
    c.advance(11.0, "running", 1)
    c.stepped(1, 9, 11.0)
    c.advance(12.0, "pending", 1, restart_due=True)
    c.advance(13.0, "running", 2)
    c.stepped(2, 0, 13.0)
    c.next_attempt(2, None)
    g = c.record()
    assert g.seconds["lost"] == pytest.approx(10.0) and g.seconds["training"] == 0.0
    assert Goodput(until=0.0).ratio is None and "n/a" in Goodput(until=0.0).line()


def test_a_script_that_never_reports_a_step_counts_its_running_time_as_training() -> None:
    c = GoodputClock(Goodput(until=0.0))
    c.advance(2.0, "starting", 1)
    c.advance(12.0, "running", 1)  # running from 2
    c.advance(13.0, "pending", 1, restart_due=True)
    c.advance(14.0, "starting", 2)  # attempt 2: attempt 1 is over
    c.advance(20.0, "running", 2)
    c.end(20.0, "running", 2)
    g = c.record()
    first, second = g.attempts
    assert first.unstepped and second.unstepped
    assert first.seconds["training"] == pytest.approx(10.0)
    assert first.seconds["starting"] == pytest.approx(2.0)
    assert second.seconds["training"] == pytest.approx(6.0)  # running from 14
    assert g.wall_s == pytest.approx(20.0)
    assert g.line().endswith("; no steps seen: running counted as training")


def test_a_resumed_run_counts_again_from_its_resume() -> None:
    c = GoodputClock(Goodput(until=0.0))
    c.advance(10.0, "running", 1)
    c.stepped(1, 0, 10.0)
    c.end(10.0, "running", 1)
    again = GoodputClock(c.record())
    again.advance(50.0, "starting", 2)  # still ended: nothing
    again.reopen(100.0)
    again.advance(104.0, "starting", 2)
    g = again.record()
    assert not g.ended and g.wall_s == pytest.approx(14.0)
    assert g.attempts[-1].seconds["restarting"] == pytest.approx(4.0)


def test_a_viewer_carries_a_stored_account_on_in_the_bucket_the_run_is_in() -> None:
    """gputop's live reading: node 0 stored the account as the run went running (before
    its first step); 30 s later, training, it reads 30 s more of training."""
    c = GoodputClock(Goodput(until=0.0))
    c.advance(10.0, "starting", 1)
    stored = c.record()
    trained = stored.carried_to(40.0, "running", 1, stepped=True)
    assert trained.seconds["starting"] == 10.0 and trained.seconds["training"] == 30.0
    assert trained.until == 40.0 and trained.ratio == pytest.approx(0.75)
    assert stored.seconds["training"] == 0.0  # the stored account is left as it was
    unstepped = stored.carried_to(40.0, "running", 1, stepped=False)
    assert unstepped.seconds["starting"] == 40.0
    # A next attempt the record does not hold yet: restarting until it steps.
    second = stored.carried_to(15.0, "starting", 2, stepped=False)
    assert [(a.attempt, a.seconds) for a in second.attempts][-1] == (2, {"restarting": 5.0})
    assert stored.carried_to(5.0, "running", 1, stepped=True) is stored  # not after `until`
    assert stored.carried_to(40.0, "succeeded", 1, stepped=True) is stored  # ended: nothing
    stalled = stored.model_copy(update={"stalled": True})
    assert stalled.carried_to(40.0, "running", 1, stepped=True).seconds["stalled"] == 30.0


def test_the_time_no_daemon_watched_is_its_own_bucket() -> None:
    """Issue 33 §6: gpud restarted (or upgraded) under a run: from its record to the new
    daemon's start nothing was watched; not training, not the bucket it was in."""
    c = GoodputClock(Goodput(until=0.0))
    c.advance(5.0, "running", 1)
    c.stepped(1, 0, 5.0)
    c.advance(15.0, "running", 1)
    again = GoodputClock(c.record())
    again.unwatched(1, 30.0)  # the new daemon started at 30
    again.advance(45.0, "running", 1)
    g = again.record()
    assert (g.seconds["starting"], g.seconds["training"]) == (5.0, 25.0)
    assert g.seconds["unwatched"] == 15.0 and g.wall_s == 45.0
    assert "unwatched 15.0s" in g.line()


def test_a_run_no_daemon_accounted_has_its_time_rebuilt_from_its_steps() -> None:
    """An upgrade from a release without goodput: the run's steps in the store say it
    started training at 8 s and stepped until 31 s; the daemon adopted it at 40 s."""
    c = GoodputClock(Goodput(until=0.0))  # created at 0
    c.before_watched(1, (0, 8.0), (99, 31.0))
    c.unwatched(1, 40.0)
    c.stepped(1, 120, 42.0)  # the new daemon's first step seen: training goes on
    c.advance(50.0, "running", 1)
    g = c.record()
    assert g.seconds["starting"] == 8.0
    assert g.seconds["training"] == pytest.approx(23.0 + 10.0)
    assert g.seconds["unwatched"] == 9.0 and g.wall_s == 50.0
    assert g.attempts[0].first_step == 0 and g.attempts[0].last_step == 120
