"""The run book: the one owner of run states, with the transition table enforced."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from pydantic import BaseModel

from gpud.model.run import (
    ACTIVE,
    NEXT_ATTEMPT,
    TERMINAL,
    WITHIN,
    NodeRef,
    RunRecord,
    RunState,
    can_move,
)
from gpud.node.store import Store
from gpud.runs.state.book import IllegalTransition, RunBook
from launch.spec import RunSpec, parse_spec


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def new_book(tmp_path: Path, strict: bool) -> tuple[RunBook, list[tuple[str, BaseModel]]]:
    published: list[tuple[str, BaseModel]] = []
    store = Store(tmp_path / "state.db")
    book = RunBook("n0", store, lambda topic, m: published.append((topic, m)), Clock(), strict)
    book.add(
        RunRecord(
            id="r-1",
            name="r",
            created_at=0.0,
            spec={},
            nodes=[NodeRef(control="ipc:///x")],
            node_rank=0,
            state=RunState.PENDING,
            state_since=0.0,
            run_dir=str(tmp_path / "r-1"),
            checkpoint_dir=str(tmp_path / "r-1" / "ck"),
        )
    )
    return book, published


def test_terminal_and_active_are_derived_from_the_one_table() -> None:
    assert {RunState.STOPPED, RunState.SUCCEEDED, RunState.FAILED, RunState.LOST} == TERMINAL
    assert {
        RunState.PENDING,
        RunState.QUEUED,
        RunState.STARTING,
        RunState.RUNNING,
        RunState.STOPPING,
    } == ACTIVE
    assert all(not WITHIN[s] for s in TERMINAL)
    assert RunState.SUCCEEDED not in NEXT_ATTEMPT  # nothing follows success


def test_a_move_is_stored_evented_and_published(tmp_path: Path) -> None:
    book, published = new_book(tmp_path, strict=True)
    book.move("r-1", RunState.STARTING, "attempt 1")
    run = book.move("r-1", RunState.RUNNING, "attempt 1")
    assert book.store.run("r-1") == run
    assert [e.message for e in book.store.run_events("r-1")][-1] == "running: attempt 1"
    assert [t for t, _ in published if t.endswith(".state")] == ["run.r-1.state"] * 2


def test_an_illegal_move_raises_when_strict(tmp_path: Path) -> None:
    book, _ = new_book(tmp_path, strict=True)
    book.move("r-1", RunState.STARTING, None)
    book.move("r-1", RunState.SUCCEEDED, "done")
    with pytest.raises(IllegalTransition, match="succeeded → running"):
        book.move("r-1", RunState.RUNNING, "again")
    assert book.store.run("r-1").state is RunState.SUCCEEDED  # type: ignore[union-attr]


def test_an_illegal_move_is_logged_and_applied_in_production(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    book, _ = new_book(tmp_path, strict=False)
    book.move("r-1", RunState.STARTING, None)
    book.move("r-1", RunState.FAILED, "boom")
    book.move("r-1", RunState.RUNNING, "resurrected")
    assert "illegal run state transition" in caplog.text
    assert book.store.run("r-1").state is RunState.RUNNING  # type: ignore[union-attr]


def test_the_next_attempt_opens_only_from_an_ended_or_failing_attempt(tmp_path: Path) -> None:
    assert not can_move(RunState.FAILED, RunState.STARTING)
    assert can_move(RunState.FAILED, RunState.STARTING, next_attempt=True)
    assert not can_move(RunState.SUCCEEDED, RunState.STARTING, next_attempt=True)
    book, _ = new_book(tmp_path, strict=True)
    book.move("r-1", RunState.STARTING, None)
    book.move("r-1", RunState.FAILED, "boom")
    run = book.move("r-1", RunState.STARTING, "resumed", next_attempt=True, attempt=2)
    assert (run.state, run.attempt) == (RunState.STARTING, 2)


def test_a_terminal_move_releases_the_port_lease_and_calls_the_end_hooks(
    tmp_path: Path,
) -> None:
    book, _ = new_book(tmp_path, strict=True)
    ended: list[str] = []
    book.on_ended.append(lambda run: ended.append(run.state.value))
    book.store.lease_port(29500, "r-1", 1, 0.0)
    book.move("r-1", RunState.STARTING, None)
    assert book.store.leased_ports() == {29500}
    book.move("r-1", RunState.STOPPED, "stopped")
    assert book.store.leased_ports() == set()
    assert ended == ["stopped"]


def test_a_queued_run_starts_or_is_cancelled_and_nothing_running_goes_back_to_the_queue() -> None:
    assert WITHIN[RunState.QUEUED] == {RunState.STARTING, RunState.STOPPED, RunState.FAILED}
    assert can_move(RunState.STOPPED, RunState.QUEUED, next_attempt=True)  # a resume waits
    assert can_move(RunState.PENDING, RunState.QUEUED)  # a restart waits
    assert not can_move(RunState.RUNNING, RunState.QUEUED, next_attempt=True)
    assert not can_move(RunState.STOPPED, RunState.QUEUED)


def test_the_queue_is_first_come_first_served_by_node_0s_time_then_id(tmp_path: Path) -> None:
    book, _ = new_book(tmp_path, strict=True)
    base = book.get("r-1")
    assert base is not None
    for run_id, queued_at in (("r-3", 5.0), ("r-2", 5.0), ("r-4", 1.0)):
        book.add(base.model_copy(update={"id": run_id, "queued_at": queued_at}))
        book.move(run_id, RunState.QUEUED, "waiting")
    assert [r.id for r in book.queue()] == ["r-4", "r-2", "r-3"]
    positions = {r.id: book.summary(r).queue_position for r in book.runs()}
    assert positions == {"r-1": None, "r-4": 1, "r-2": 2, "r-3": 3}
    assert book.summary(book.queue()[1]).state_label == "queued #2"
    r3 = book.get("r-3")
    assert r3 is not None
    assert [r.id for r in book.ahead_of(r3, r3.queue_key)] == ["r-4", "r-2"]
    book.move("r-4", RunState.STOPPED, "cancelled")
    assert [r.id for r in book.queue()] == ["r-2", "r-3"]


def test_a_runs_spec_is_parsed_once_and_kept_while_the_book_knows_the_run(
    tmp_path: Path,
) -> None:
    book, _ = new_book(tmp_path, strict=True)
    stored = parse_spec({"name": "r", "script": "train.py", "nproc_per_node": 3})
    made = book.get("r-1")
    assert made is not None
    book.add(made.model_copy(update={"spec": stored.model_dump(mode="json")}))
    run = book.get("r-1")
    assert run is not None
    spec = book.spec(run)
    assert isinstance(spec, RunSpec) and spec.nproc_per_node == 3 and spec.script == "train.py"
    moved = book.move("r-1", RunState.STARTING, None)  # a new record, the same spec
    assert book.spec(moved) is spec
    book.forget("r-1")
    assert book.spec(run) is not spec  # unknown now: parsed again, not kept
    assert book.spec(run) == spec


#: Where `parse_spec` may be called in gpud, and why: a stored run's spec becomes a
#: `RunSpec` in one place only (issue 34).
PARSE_SPEC_CALLERS = {
    ("gpud/runs/state/book.py", "spec"): "RunBook.spec: the one place for a stored run",
    ("gpud/runs/lifecycle/starting.py", "validated"): "a launch request's spec, no run yet",
    ("gpud/slurm/part.py", "main"): "the Slurm part runner's config file, no stored run",
}


def test_nothing_but_the_book_parses_a_stored_runs_spec() -> None:
    root = Path(__file__).resolve().parents[4]
    found = set()
    for path in sorted((root / "gpud").rglob("*.py")):
        tree = ast.parse(path.read_text())
        for func in ast.walk(tree):
            if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(func):
                if (
                    isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Name)
                    and node.func.id == "parse_spec"
                ):
                    found.add((str(path.relative_to(root)), func.name))
    assert found == set(PARSE_SPEC_CALLERS), found ^ set(PARSE_SPEC_CALLERS)
