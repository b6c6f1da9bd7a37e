"""Which events become alerts, to which webhooks, once: the daemon's Notifier over a real
run book (its moves go through `RunBook.move`, as the daemon's do). The HTTP edge is a
function that records what would be POSTed."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpud.model.run import (
    CauseKind,
    FailureCause,
    HealthSummary,
    NodeRef,
    RunRecord,
    RunState,
    Stall,
)
from gpud.model.snapshot import NodeEvent
from gpud.node.store import Store
from gpud.notify.sender import Answer, Sender
from gpud.notify.service import Notifier
from gpud.notify.targets import Webhook
from gpud.runs.state.book import RunBook

TEAM = "https://hooks.example.com/team/secret-1"
PAGER = "https://pager.example.com/hook/secret-2"
OWN = "https://hooks.example.com/own/secret-3"


class Posts:
    """The HTTP edge: what was POSTed where."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, dict[str, Any]]] = []
        self.lock = threading.Lock()

    def __call__(self, url: str, body: bytes, timeout_s: float) -> Answer:
        with self.lock:
            self.seen.append((url, json.loads(body)))
        return Answer(ok=True, status=200)

    def settled(self, sender: Sender) -> list[tuple[str, dict[str, Any]]]:
        deadline = time.monotonic() + 5
        while sender.pending() and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.05)
        with self.lock:
            return list(self.seen)


@pytest.fixture
def posts() -> Posts:
    return Posts()


@pytest.fixture
def book(tmp_path: Path) -> Iterator[RunBook]:
    store = Store(tmp_path / "state.db")
    yield RunBook("gpu-a", store, lambda topic, m: None, lambda: 1000.0, strict=True)
    store.close()


def notifier(posts: Posts, book: RunBook, *hooks: Webhook) -> Notifier:
    made = Notifier(list(hooks), "gpu-a", "gpu-a:7711", Sender(posts), clock=lambda: 1234.0)
    book.on_moved.append(made.run_moved)
    return made


def add_run(book: RunBook, tmp_path: Path, node_rank: int = 0, **spec: Any) -> RunRecord:
    return book.add(
        RunRecord(
            id="r-1", name="train", created_at=0.0, spec={"name": "train", **spec},
            nodes=[NodeRef(control="tcp://gpu-a:7711"), NodeRef(control="tcp://gpu-b:7711")],
            node_rank=node_rank, state=RunState.RUNNING, state_since=0.0,
            run_dir=str(tmp_path / "r-1"), checkpoint_dir=str(tmp_path / "ck"),
        )
    )  # fmt: skip


def cause(kind: CauseKind = CauseKind.USER, attempt: int = 1) -> FailureCause:
    return FailureCause(kind=kind, summary="ValueError: bad shard 17", rank=1, node="gpu-b",
                        attempt=attempt, hint="look at shard 17")  # fmt: skip


def test_a_failed_run_goes_to_the_daemons_and_its_own_webhooks_once_per_url(
    posts: Posts, book: RunBook, tmp_path: Path
) -> None:
    made = notifier(posts, book, Webhook(url=TEAM), Webhook(url=PAGER, format="slack"))
    add_run(book, tmp_path, notify=[{"url": TEAM}, {"url": OWN, "format": "discord"}])
    book.move("r-1", RunState.STOPPING, "rank 1 failed")  # no alert: not an end
    book.move("r-1", RunState.FAILED, "rank 1 on node gpu-b: ValueError", cause=cause())
    # settled again with more words: the same alert, not sent again
    book.move("r-1", RunState.FAILED, "rank 1 on node gpu-b: ValueError; more", cause=cause())
    seen = posts.settled(made.sender)
    assert sorted(url for url, _ in seen) == sorted([TEAM, PAGER, OWN])
    body = dict(seen)[TEAM]
    assert body["event"] == "failed" and body["key"] == "r-1/failed/1"
    assert body["cause"]["line"] == (
        "rank 1 on node gpu-b: ValueError: bad shard 17 (user code, attempt 1)"
    )
    assert body["hint"] == "look at shard 17" and body["node"] == "gpu-a"
    assert body["look"] == "gpuctl --node gpu-a:7711 status r-1"
    assert "blocks" in dict(seen)[PAGER] and "embeds" in dict(seen)[OWN]


def test_only_node_0_alerts_about_runs(posts: Posts, book: RunBook, tmp_path: Path) -> None:
    made = notifier(posts, book, Webhook(url=TEAM))
    add_run(book, tmp_path, node_rank=1)
    book.move("r-1", RunState.FAILED, "failed", cause=cause())
    assert posts.settled(made.sender) == []


def test_succeeded_is_opt_in(posts: Posts, book: RunBook, tmp_path: Path) -> None:
    made = notifier(posts, book, Webhook(url=TEAM), Webhook(url=PAGER, events=["succeeded"]))
    add_run(book, tmp_path)
    book.move("r-1", RunState.SUCCEEDED, None)
    ((url, body),) = posts.settled(made.sender)
    assert url == PAGER and body["event"] == "succeeded" and body["text"] == "succeeded"


def test_a_restart_after_a_hang_is_alerted_and_other_restarts_are_not(
    posts: Posts, book: RunBook, tmp_path: Path
) -> None:
    made = notifier(posts, book, Webhook(url=TEAM))
    add_run(book, tmp_path)
    book.move("r-1", RunState.PENDING, "oom; restarting in 10s (restart 1 of 3)",
              next_attempt=True, cause=cause(CauseKind.OOM))  # fmt: skip
    assert posts.settled(made.sender) == []
    book.update("r-1", attempt=2)
    book.move("r-1", RunState.STARTING, None)
    book.move("r-1", RunState.RUNNING, None)
    hung = cause(CauseKind.HANG, attempt=2)
    why = f"{hung.one_line()}; restarting in 20s (restart 2 of 3)"
    book.move("r-1", RunState.PENDING, why, next_attempt=True, cause=hung)
    ((_, body),) = posts.settled(made.sender)
    assert body["event"] == "hang" and body["key"] == "r-1/hang/2" and body["text"] == why
    assert body["title"] == "run r-1 (train) hung; restarting"


def health(stuck_for_s: float, attempt: int = 1) -> HealthSummary:
    stall = Stall(rank=1, stuck_for_s=stuck_for_s, timeout_s=600.0, countdown_s=300.0,
                  why="rank 1 computes while the others wait in all_reduce")  # fmt: skip
    return HealthSummary(run_id="r-1", attempt=attempt, time=0.0, verdict="stalled", stall=stall)


def test_a_stall_is_alerted_once_it_has_lasted_each_webhooks_while(
    posts: Posts, book: RunBook, tmp_path: Path
) -> None:
    made = notifier(posts, book, Webhook(url=TEAM, stalled_after_s=60),
                    Webhook(url=PAGER, stalled_after_s=600))  # fmt: skip
    run = add_run(book, tmp_path)
    made.health(run, health(30))
    assert posts.settled(made.sender) == []
    for stuck in (61, 62, 300):
        made.health(run, health(stuck))
    ((url, body),) = posts.settled(made.sender)
    assert url == TEAM and body["event"] == "stalled"
    assert body["title"] == "run r-1 (train) stalled for 61s"
    assert body["text"] == "rank 1: rank 1 computes while the others wait in all_reduce"
    assert body["look"] == "gpuctl --node gpu-a:7711 health r-1"
    assert body["hint"].startswith("the collective timeout ends it in 300s")
    made.health(run, health(601))
    assert [url for url, _ in posts.settled(made.sender)] == [TEAM, PAGER]
    made.health(run, health(900, attempt=2))  # a summary of another attempt: not this run's
    assert len(posts.settled(made.sender)) == 2


def test_a_quarantine_goes_to_the_daemons_webhooks(
    posts: Posts, book: RunBook, tmp_path: Path
) -> None:
    made = notifier(posts, book, Webhook(url=TEAM), Webhook(url=PAGER, events=["failed"]))
    event = NodeEvent(node="gpu-a", time=1234.0, kind="quarantine", severity="critical",
                      gpu_index=2, message="GPU 2 (GPU-x) quarantined: XID 79",
                      data={"uuid": "GPU-x", "reason": "XID 79"})  # fmt: skip
    xid = event.model_copy(update={"kind": "xid", "message": "XID 79 on GPU 2"})
    made.node_events([xid, event])
    made.node_events([event])  # the same event again: one alert
    ((url, body),) = posts.settled(made.sender)
    assert url == TEAM and body["event"] == "quarantine"
    assert (
        body["gpu"] == {"index": 2, "uuid": "GPU-x"}
        and body["look"] == "gpuctl --node gpu-a:7711 hw"
    )
    assert body["hint"].endswith("gpuctl undrain gpu-a --gpu 2")


def test_a_daemon_without_webhooks_sends_nothing(
    posts: Posts, book: RunBook, tmp_path: Path
) -> None:
    made = notifier(posts, book)
    add_run(book, tmp_path)
    book.move("r-1", RunState.FAILED, "failed", cause=cause())
    assert posts.settled(made.sender) == [] and made.sender.snapshot()["sent"] == 0
