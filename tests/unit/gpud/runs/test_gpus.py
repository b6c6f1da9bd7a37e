"""Which GPUs a part gets (gpud/runs/placement/gpus.py): the spec's `gpus` against the node's GPUs
and who holds them, on hand-made inputs."""

from __future__ import annotations

import pytest

from gpud.runs.placement.gpus import Gpu, GpuRequestError, GpusBusy, Holder, choose

EIGHT = [Gpu(i, f"GPU-{i:04d}") for i in range(8)]
RUN_A = Holder(run_id="llm-a1b2c3", run_name="llm")
NOTEBOOK = Holder(pid=1234, process="python")


def indices(gpus: list[Gpu]) -> list[int]:
    return [g.index for g in gpus]


def test_a_count_takes_the_first_free_gpus_and_skips_busy_ones() -> None:
    assert indices(choose(4, "auto", EIGHT, {})) == [0, 1, 2, 3]
    busy = {f"GPU-{i:04d}": RUN_A for i in range(4)}
    assert indices(choose(4, "auto", EIGHT, busy)) == [4, 5, 6, 7]


def test_unset_gpus_follow_nproc_or_take_every_free_gpu_for_auto() -> None:
    assert indices(choose(None, 2, EIGHT, {})) == [0, 1]
    busy = {"GPU-0002": NOTEBOOK}
    assert indices(choose(None, "auto", EIGHT, busy)) == [0, 1, 3, 4, 5, 6, 7]


def test_a_list_names_gpus_by_index_or_uuid() -> None:
    assert indices(choose([5, "GPU-0001"], "auto", EIGHT, {})) == [1, 5]


def test_all_takes_every_gpu_and_is_busy_if_any_is_held() -> None:
    assert indices(choose("all", "auto", EIGHT, {})) == list(range(8))
    with pytest.raises(GpusBusy) as busy:
        choose("all", "auto", EIGHT, {"GPU-0002": NOTEBOOK})
    assert str(busy.value) == "needs 8 GPU(s), 7 free: GPU 2 held by pid 1234 (python) outside gpud"


def test_busy_names_every_holder_and_how_many_are_free() -> None:
    busy = {**{f"GPU-{i:04d}": RUN_A for i in range(6)}, "GPU-0006": NOTEBOOK}
    with pytest.raises(GpusBusy) as exc:
        choose(4, "auto", EIGHT, busy)
    assert str(exc.value) == (
        "needs 4 GPU(s), 1 free: GPU 0-5 held by run llm-a1b2c3 (llm); "
        "GPU 6 held by pid 1234 (python) outside gpud"
    )
    assert (exc.value.needed, exc.value.free) == (4, 1)


def test_a_listed_gpu_that_is_held_is_busy_even_if_others_are_free() -> None:
    with pytest.raises(GpusBusy, match="GPU 3 held by run llm-a1b2c3"):
        choose([2, 3], "auto", EIGHT, {"GPU-0003": RUN_A})


@pytest.mark.parametrize(
    ("want", "nproc", "message"),
    [
        (9, "auto", "gpus: 9 GPU(s) asked for, the node has 8"),
        (None, 16, "gpus: 16 GPU(s) asked for, the node has 8 (from nproc_per_node"),
        ([1, 8], "auto", "gpus: the node has no GPU 8 (it has GPUs 0-7)"),
        (["GPU-nope"], "auto", "gpus: the node has no GPU 'GPU-nope'"),
    ],
)
def test_what_the_node_can_never_give_is_a_request_error(
    want: int | list[int | str] | None, nproc: int | str, message: str
) -> None:
    with pytest.raises(GpuRequestError) as exc:
        choose(want, nproc, EIGHT, {})  # type: ignore[arg-type]
    assert str(exc.value).startswith(message)


def test_a_count_prefers_gpus_that_sit_close_together() -> None:
    # Two NVLink islands, {0,1,4,5} and {2,3,6,7}; across them only PCIe (level 30).
    island = {0: "a", 1: "a", 4: "a", 5: "a", 2: "b", 3: "b", 6: "b", 7: "b"}

    def closeness(x: int, y: int) -> int:
        return 0 if island[x] == island[y] else 30

    assert indices(choose(4, "auto", EIGHT, {}, closeness)) == [0, 1, 4, 5]
    # GPU 0 is taken: island b is whole, island a is not.
    busy = {"GPU-0000": RUN_A}
    assert indices(choose(4, "auto", EIGHT, busy, closeness)) == [2, 3, 6, 7]
    assert indices(choose(2, "auto", EIGHT, busy, closeness)) == [1, 4]


def test_a_gpu_a_slurm_job_holds_is_busy_and_names_the_job() -> None:
    job = Holder(pid=4321, process="python", slurm_job="1234")
    with pytest.raises(GpusBusy) as busy:
        choose([3], "auto", EIGHT, {"GPU-0003": job})
    assert (
        str(busy.value) == "needs 1 GPU(s), 7 free: GPU 3 held by Slurm job 1234 (pid 4321, python)"
    )
