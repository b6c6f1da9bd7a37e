"""Which nodes an elastic attempt uses, and the accumulation that keeps its global batch
(issue 21 §3): `gpud.runs.multinode.elastic`, on hand-made runs and specs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gpud.model.run import NodeRef, RunRecord, RunState
from gpud.runs.multinode.elastic import (
    batch_note,
    choose_members,
    grad_accum_for,
    primary,
    reads_grad_accum,
)
from launch.spec import RunSpec, parse_spec


def run_on(nodes: int) -> RunRecord:
    refs = [NodeRef(control=f"tcp://10.0.0.{i}:7711") for i in range(nodes)]
    return RunRecord(
        id="r-1", name="r", created_at=0.0, spec={}, nodes=refs, node_rank=0,
        state=RunState.PENDING, state_since=0.0, run_dir="/tmp/r", checkpoint_dir="/tmp/r/ck",
    )  # fmt: skip


def spec(elastic: dict[str, Any] | None = None, **more: Any) -> RunSpec:
    data: dict[str, Any] = {"name": "r", "launcher": "torchrun", "script": "train.py", **more}
    if elastic is not None:
        data["elastic"] = elastic
        data.setdefault("restart", {"max_attempts": 2})
    return parse_spec(data)


SPARES = ["tcp://10.0.0.3:7711", "tcp://10.0.0.4:7711"]


def test_a_run_that_is_not_elastic_needs_every_node() -> None:
    assert choose_members(run_on(3), spec(), {0, 1, 2}) == ([0, 1, 2], "all 3 node(s)")
    assert choose_members(run_on(3), spec(), {0, 2}) == (None, "node(s) 1 not available")


def test_an_elastic_run_goes_on_with_what_answers_down_to_min_nodes() -> None:
    elastic = spec({"min_nodes": 2})
    assert choose_members(run_on(3), elastic, {0, 2}) == ([0, 2], "2/3 node(s) without node(s) 1")
    assert choose_members(run_on(3), elastic, {0}) == (
        None, "1 healthy node(s) (0), fewer than elastic.min_nodes 2",
    )  # fmt: skip
    # Node 0 coordinates: without it there is no attempt, however many answer.
    assert choose_members(run_on(3), elastic, {1, 2}) == (
        None, "node 0 coordinates the run and is not available",
    )  # fmt: skip


def test_spares_fill_in_for_lost_nodes_up_to_the_runs_size() -> None:
    run = run_on(5)  # nodes 0-2 primary, 3-4 spares
    elastic = spec({"min_nodes": 2, "spares": SPARES})
    assert primary(run, elastic) == [0, 1, 2]
    assert choose_members(run, elastic, {0, 1, 2, 3, 4}) == ([0, 1, 2], "3/3 node(s)")
    chosen = choose_members(run, elastic, {0, 2, 3, 4})
    assert chosen == ([0, 2, 3], "3/3 node(s) without node(s) 1, with spare(s) 3")


def test_max_nodes_caps_an_attempt_below_the_primary_nodes() -> None:
    capped = spec({"min_nodes": 1, "max_nodes": 2, "spares": SPARES})
    assert choose_members(run_on(5), capped, {0, 1, 2, 3, 4}) == (
        [0, 1], "2/3 node(s) without node(s) 2",
    )  # fmt: skip
    assert choose_members(run_on(5), capped, {0, 4}) == (
        [0, 4],
        "2/3 node(s) without node(s) 1, 2, with spare(s) 4",
    )


def test_the_accumulation_keeps_the_global_batch_unless_the_spec_opts_out() -> None:
    keep = spec({"min_nodes": 1}, training={"gradient_accumulation": 2})
    assert grad_accum_for(keep, 2, 3) == 3  # 2 × 3 / 2, rounded up
    assert grad_accum_for(keep, 1, 4) == 8
    assert grad_accum_for(keep, 3, 3) is None  # the whole run: the spec's own
    opt_out = spec({"min_nodes": 1, "keep_global_batch": False})
    assert grad_accum_for(opt_out, 2, 3) is None
    assert grad_accum_for(spec(), 2, 3) is None  # not elastic


def test_the_event_keeps_the_global_batch_only_for_a_script_that_reads_the_accumulation(
    tmp_path: Path,
) -> None:
    """Issue 32 §6: a script that ignores GPUD_GRAD_ACCUM trains a smaller global batch;
    the attempt's event must not say it was kept."""
    scripts = {
        "plain.py": "import torch\nbatch = 32\n",
        "reads.py": "import os\naccum = int(os.environ.get('GPUD_GRAD_ACCUM', 1))\n",
        "library.py": "from trainers import init\n",
    }
    for name, text in scripts.items():
        (tmp_path / name).write_text(text)

    def reads(script: str, library: bool = False) -> bool:
        return reads_grad_accum(spec(script=script, workdir=str(tmp_path)), library)

    assert (reads("plain.py"), reads("reads.py"), reads("library.py")) == (False, True, True)
    assert reads("plain.py", library=True)  # its ranks said hello: the library reads it
    assert not reads("missing.py")  # unreadable here: no promise
    assert batch_note(3, True) == ", gradient accumulation 3 (the global batch kept)"
    assert batch_note(3, False) == (
        ", GPUD_GRAD_ACCUM=3, which the script does not read: its global batch shrinks with"
        " the nodes (the trainers library, or a script that reads it, keeps it)"
    )
