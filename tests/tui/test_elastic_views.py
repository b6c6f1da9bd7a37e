"""gputop's view of an elastic run (issue 21 §3): the Run screen's header says how many of
its nodes the attempt uses and its world size, the runs table's shape counts the attempt's
nodes, and the curve's resume marks carry each attempt's world size when it changed."""

from __future__ import annotations

from tests.tui.scenes import summary
from tui.model.runs import RunView
from tui.widgets.loss_chart import resume_marks
from tui.widgets.run_header import header_text
from tui.widgets.runs_table import shape

NODES = ["tcp://10.0.0.1:7711", "tcp://10.0.0.2:7711", "tcp://10.0.0.3:7711"]


def elastic_run(members: list[int] | None, world: int) -> RunView:
    run = RunView("ddp-1")
    base = summary("ddp-1", NODES, attempt=2, nproc=1)
    run.add_summary(
        "n0",
        base.model_copy(
            update={"elastic": True, "members": members, "planned_nodes": 3, "world_size": world}
        ),
    )
    return run


def test_a_run_short_of_a_node_says_so_in_its_header_and_shape() -> None:
    run = elastic_run([0, 1], 2)
    assert "2/3 nodes, world 2" in header_text(run, "loss").plain
    assert shape(run) == "2×1"
    whole = elastic_run([0, 1, 2], 3)
    assert "3/3 nodes, world 3" in header_text(whole, "loss").plain and shape(whole) == "3×1"


def test_resume_marks_carry_the_world_size_where_it_changed() -> None:
    run = elastic_run([0, 1], 2)
    run.worlds = {1: 3, 2: 2, 3: 3}
    for attempt, steps in ((1, range(0, 50)), (2, range(40, 90)), (3, range(80, 120))):
        run.add_points(attempt, [{"step": s, "values": {"loss": 1.0 / (s + 1)}} for s in steps])
    drawn = run.metrics["loss"].drawn(64)
    assert resume_marks(drawn, run.worlds) == "3 ranks, @40 (2 ranks), @80 (3 ranks)"
    assert resume_marks(drawn, {1: 2, 2: 2, 3: 2}) == "@40,@80"  # one world: no noise
