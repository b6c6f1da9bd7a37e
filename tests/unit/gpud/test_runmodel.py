"""What "step" means (issue 8): one pure definition, carried in every reply's JSON."""

from __future__ import annotations

import json

from gpud.model.run import RankView, RunState, completed_steps, steps_text
from gpud.wire.run_messages import RunSummary


def summary(last_step: int | None, max_steps: int | None = 20) -> RunSummary:
    return RunSummary(
        id="r-1", name="r", state=RunState.SUCCEEDED, state_since=0.0, attempt=1,
        created_at=0.0, node_rank=0, nodes=[], launcher="torchrun",
        last_step=last_step, max_steps=max_steps,
    )  # fmt: skip


def test_steps_done_is_the_last_completed_index_plus_one() -> None:
    assert completed_steps(None) is None  # no step finished yet
    assert completed_steps(0) == 1
    # `for step in range(0, 20): run.log(step)` ends having logged index 19: 20 steps done.
    assert completed_steps(19) == 20


def test_progress_is_written_done_over_total() -> None:
    assert steps_text(20, 20) == "20/20"
    assert steps_text(7, None) == "7"
    assert steps_text(None, 20) == "-"
    assert steps_text(None, 20, missing="–") == "–"


def test_summaries_and_ranks_carry_steps_done_in_their_json() -> None:
    data = json.loads(summary(19).model_dump_json())
    assert (data["last_step"], data["steps_done"], data["max_steps"]) == (19, 20, 20)
    rank = json.loads(RankView(rank=0, node_rank=0, local_rank=0, last_step=19).model_dump_json())
    assert (rank["last_step"], rank["steps_done"]) == (19, 20)
    assert RankView(rank=1, node_rank=0, local_rank=1).steps_done is None


def test_steps_done_is_derived_so_old_and_new_replies_read_alike() -> None:
    new = summary(19).model_dump(mode="json")
    old = {k: v for k, v in new.items() if k != "steps_done"}  # a daemon before issue 8
    assert RunSummary.model_validate(old).steps_done == 20
    # A stale or forged steps_done is ignored: it always follows last_step.
    assert RunSummary.model_validate({**new, "steps_done": 3}).steps_done == 20
    assert summary(19).model_copy(update={"last_step": 4}).steps_done == 5
