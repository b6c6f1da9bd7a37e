"""A rank's node rank and node from gpud's, torchrun's and the Kubernetes operators'
variables, as each of them sets them (trainers.placement)."""

from __future__ import annotations

import pytest

from trainers.env import RunEnv
from trainers.placement import placement_from

#: What Kubeflow's training operator (v1.9, `setPodEnv`) gives worker 0 of a PyTorchJob
#: with a Master and `nprocPerNode: "2"`: the pod is node 1 of 2.
PYTORCHJOB_WORKER = {
    "MASTER_ADDR": "cpu-ddp-master-0",
    "MASTER_PORT": "23456",
    "PET_MASTER_ADDR": "cpu-ddp-master-0",
    "PET_MASTER_PORT": "23456",
    "WORLD_SIZE": "4",
    "RANK": "1",
    "PET_NODE_RANK": "1",
    "PET_NPROC_PER_NODE": "2",
    "PET_NNODES": "2",
    "NODE_NAME": "gpu-node-b",  # the manifest's downward API: spec.nodeName
}
#: What torchrun adds for its second worker on that pod (local_elastic_agent).
TORCHRUN_WORKER = {
    "RANK": "3",
    "LOCAL_RANK": "1",
    "WORLD_SIZE": "4",
    "GROUP_RANK": "1",
    "GROUP_WORLD_SIZE": "2",
    "LOCAL_WORLD_SIZE": "2",
    "TORCHELASTIC_RUN_ID": "none",
}


def test_gpud_says_it_first() -> None:
    env = {**PYTORCHJOB_WORKER, **TORCHRUN_WORKER, "GPUD_NODE_RANK": "3", "GPUD_NODE": "box3"}
    place = placement_from(env, hostname="pod-x")
    assert (place.node_rank, place.node, place.source) == (3, "box3", "gpud")


def test_a_pytorchjob_rank_under_torchrun_takes_torchruns_group_rank() -> None:
    # With a c10d rendezvous the group rank need not be the pod's: it numbers the ranks.
    env = {**PYTORCHJOB_WORKER, **TORCHRUN_WORKER, "GROUP_RANK": "0", "RANK": "1"}
    place = placement_from(env, hostname="cpu-ddp-worker-0")
    assert (place.node_rank, place.nnodes, place.source) == (0, 2, "torchrun")
    assert place.node == "gpu-node-b"  # the pod's node, not the pod


def test_a_pytorchjob_pod_without_torchrun_takes_the_operators_node_rank() -> None:
    place = placement_from(PYTORCHJOB_WORKER, hostname="cpu-ddp-worker-0")
    assert (place.node_rank, place.nnodes, place.source) == (1, 2, "training-operator")


def test_elastic_nnodes_is_a_range_and_no_count() -> None:
    env = {**PYTORCHJOB_WORKER, "PET_NNODES": "1:4"}
    assert placement_from(env, hostname="p").nnodes is None


def test_without_node_name_the_node_is_the_host_name() -> None:
    env = {k: v for k, v in PYTORCHJOB_WORKER.items() if k != "NODE_NAME"}
    assert placement_from(env, hostname="cpu-ddp-worker-0").node == "cpu-ddp-worker-0"


@pytest.mark.parametrize(
    ("env", "rank"),
    [
        # One Job of 4 pods (JobSet's PyTorch examples): the completion index.
        ({"JOB_COMPLETION_INDEX": "2"}, 2),
        # 4 Jobs of 1 pod: the job index (through the downward API) times 1.
        ({"JOB_COMPLETION_INDEX": "0", "JOB_INDEX": "3", "REPLICATED_JOB_REPLICAS": "4",
          "PET_NNODES": "4"}, 3),
        # 2 Jobs of 2 pods: job 1's second pod is node 3.
        ({"JOB_COMPLETION_INDEX": "1", "JOB_INDEX": "1", "REPLICATED_JOB_REPLICAS": "2",
          "PET_NNODES": "4"}, 3),
    ],
)  # fmt: skip
def test_jobset_indices(env: dict[str, str], rank: int) -> None:
    place = placement_from(env, hostname="p")
    assert (place.node_rank, place.source) == (rank, "jobset")


def test_a_job_index_without_the_pods_per_job_is_not_guessed() -> None:
    place = placement_from({"JOB_COMPLETION_INDEX": "1", "JOB_INDEX": "1"}, hostname="p")
    assert (place.node_rank, place.source) == (0, "none")


def test_kubeflow_trainer_v2_sets_pet_node_rank_from_the_completion_index() -> None:
    env = {"PET_NODE_RANK": "2", "JOB_COMPLETION_INDEX": "2", "PET_NNODES": "4"}
    assert placement_from(env, hostname="p").source == "training-operator"


@pytest.mark.parametrize("bad", ["", "x", "-1", "1.5", " "])
def test_garbage_falls_through_to_the_next_source(bad: str) -> None:
    place = placement_from({"GPUD_NODE_RANK": bad, "PET_NODE_RANK": "1"}, hostname="p")
    assert (place.node_rank, place.source) == (1, "training-operator")


def test_nobody_says_node_zero() -> None:
    place = placement_from({}, hostname="laptop")
    assert (place.node_rank, place.node, place.nnodes, place.source) == (0, "laptop", None, "none")


def test_run_env_carries_the_placement() -> None:
    env = RunEnv.from_environ({**PYTORCHJOB_WORKER, **TORCHRUN_WORKER})
    assert (env.rank, env.local_rank, env.world_size) == (3, 1, 4)
    assert (env.node_rank, env.node, env.nnodes, env.placed_by) == (1, "gpu-node-b", 2, "torchrun")
    assert not env.launched
