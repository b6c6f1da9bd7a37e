"""The CPU DDP example in "pods" as Kubernetes operators start them, without gpud: each pod
gets the variables Kubeflow's training operator (or JobSet and the Job controller) would
inject, and the trainers library must name each rank's node rank and node rightly in what
it sends. No cluster here: the pods are processes on this host, and the ingest socket the
ranks report to is a plain PULL socket owned by the test (no daemon accepts a run it did
not launch yet); every message is validated by the daemon's own wire models."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq

from gpud.model.trainer_messages import (
    TRAINER_MESSAGES,
    HeartbeatMessage,
    HelloMessage,
    TrainerMessage,
)
from tests.support.daemons import free_port

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
DDP = ROOT / "trainers" / "examples" / "ddp.py"
SMALL = ["--steps", "30", "--width", "64", "--depth", "2", "--samples", "1024"]
NODES = ("kube-node-a", "kube-node-b")


@pytest.fixture
def ingest() -> Iterator[tuple[str, zmq.Socket[bytes]]]:
    # ipc paths are limited to ~100 bytes: pytest's tmp_path can be longer.
    with tempfile.TemporaryDirectory(prefix="k8s-") as short:
        ctx = zmq.Context()
        pull = ctx.socket(zmq.PULL)
        pull.setsockopt(zmq.RCVHWM, 100_000)  # read only after the pods end, as the daemon's
        address = f"ipc://{short}/ingest"
        pull.bind(address)
        try:
            yield address, pull
        finally:
            ctx.destroy(linger=0)


def pod_env(tmp_path: Path, ingest: str, node: str, **extra: str) -> dict[str, str]:
    """A pod's environment: the manifest's own variables plus `extra` (the operator's)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUD_", "PET_"))}
    for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    env.update(
        PYTHONPATH=str(ROOT),
        OMP_NUM_THREADS="1",
        GPUD_RUN_ID="cpu-ddp",  # as config/kubernetes/train-cpu-ddp-pytorchjob.yaml sets
        GPUD_RUN_DIR=str(tmp_path / "shared"),
        GPUD_INGEST=ingest,  # where the node's daemon will listen, once pods may report
        NODE_NAME=node,  # the downward API's spec.nodeName
        **extra,
    )
    return env


def run_pods(commands: list[tuple[list[str], dict[str, str]]], tmp_path: Path) -> None:
    procs = [
        subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        for cmd, env in commands
    ]
    outputs = [p.communicate(timeout=240)[0].decode(errors="replace") for p in procs]
    for proc, out in zip(procs, outputs, strict=True):
        assert proc.returncode == 0, out[-3000:]


def received(pull: zmq.Socket[bytes]) -> list[tuple[str, TrainerMessage]]:
    """Everything the ranks sent, each validated strictly as the daemon's ingest does."""
    found = []
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        if not pull.poll(500):
            break
        kind, body = pull.recv_multipart()
        found.append((kind.decode(), TRAINER_MESSAGES[kind.decode()].model_validate_json(body)))
    return found


def by_rank(messages: list[tuple[str, TrainerMessage]], kind: str) -> dict[int, TrainerMessage]:
    return {getattr(m, "rank"): m for k, m in messages if k == kind}  # noqa: B009 - any kind


def test_a_pytorchjob_under_torchrun_names_node_ranks_and_nodes(
    tmp_path: Path, ingest: tuple[str, zmq.Socket[bytes]]
) -> None:
    """Master and Worker pods, 2 processes each, as training-operator 1.9 sets them up; the
    pods' torchrun reads its flags from the PET_* variables alone."""
    address, pull = ingest
    port = str(free_port())
    pods = []
    for index, node in enumerate(NODES):
        operator = {
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": port,
            "PET_MASTER_ADDR": "127.0.0.1",
            "PET_MASTER_PORT": port,
            "WORLD_SIZE": "4",
            "RANK": str(index),
            "PET_NODE_RANK": str(index),
            "PET_NNODES": "2",
            "PET_NPROC_PER_NODE": "2",
        }
        command = [sys.executable, "-m", "torch.distributed.run", str(DDP), *SMALL]
        pods.append((command, pod_env(tmp_path, address, node, **operator)))
    run_pods(pods, tmp_path)

    messages = received(pull)
    hellos = by_rank(messages, "hello")
    assert sorted(hellos) == [0, 1, 2, 3]
    for rank, hello in hellos.items():
        assert isinstance(hello, HelloMessage)
        assert (hello.node_rank, hello.node, hello.nnodes) == (rank // 2, NODES[rank // 2], 2)
        assert (hello.local_rank, hello.world_size) == (rank % 2, 4)
    beats = [m for k, m in messages if k == "heartbeat"]
    assert {m.rank for m in beats if isinstance(m, HeartbeatMessage)} == {0, 1, 2, 3}
    for beat in beats:
        assert isinstance(beat, HeartbeatMessage)
        assert (beat.node_rank, beat.node) == (beat.rank // 2, NODES[beat.rank // 2])
    # Rank 0 also kept its metrics on the shared volume, as without any daemon.
    lines = (tmp_path / "shared" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == list(range(30))


def test_jobset_pods_without_torchrun_name_their_node_rank_from_the_job_indices(
    tmp_path: Path, ingest: tuple[str, zmq.Socket[bytes]]
) -> None:
    """A JobSet of 2 Jobs × 1 pod, one process per pod started by python itself: the
    Job controller's JOB_COMPLETION_INDEX (0 in both) and JobSet's job-index annotation
    through the downward API (JOB_INDEX), in the reverse of launch order."""
    address, pull = ingest
    port = str(free_port())
    pods = []
    for job in (1, 0):
        env = {
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": port,
            "WORLD_SIZE": "2",
            "RANK": str(job),
            "JOB_COMPLETION_INDEX": "0",
            "JOB_INDEX": str(job),
            "REPLICATED_JOB_REPLICAS": "2",
            "PET_NNODES": "2",
        }
        command = [sys.executable, str(DDP), *SMALL]
        pods.append((command, pod_env(tmp_path, address, NODES[job], **env)))
    run_pods(pods, tmp_path)

    hellos = by_rank(received(pull), "hello")
    assert sorted(hellos) == [0, 1]
    for rank, hello in hellos.items():
        assert isinstance(hello, HelloMessage)
        assert (hello.node_rank, hello.node, hello.local_rank) == (rank, NODES[rank], 0)
