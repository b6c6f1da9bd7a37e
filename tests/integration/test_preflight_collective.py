"""The preflight's collective check (issue 21 §2) with real processes and real gloo: three
`python -m trainers.preflight` meet on loopback as three nodes would, node 0 runs an
all-reduce with each other node in turn, and a node made slow (the test hook) is the one
named far below its peers. On a real GPU the same process checks a matmul and memory."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from subprocess import PIPE
from typing import Any

import pytest

from gpud.heal.preflight import slow_nodes
from tests.support.daemons import free_port
from tests.support.runs import ROOT

pytestmark = pytest.mark.slow


def run_preflight(
    world: int, slow: dict[int, float], backend: str = "gloo"
) -> list[dict[str, Any]]:
    master = f"127.0.0.1:{free_port()}"
    procs = []
    for rank in range(world):
        env = {**os.environ, "GPUD_TEST_SLOW_PREFLIGHT_S": str(slow.get(rank, 0))}
        argv = [
            sys.executable, "-m", "trainers.preflight", "--master", master,
            "--world", str(world), "--rank", str(rank), "--backend", backend,
        ]  # fmt: skip
        procs.append(subprocess.Popen(argv, stdout=PIPE, stderr=PIPE, text=True, env=env, cwd=ROOT))
    reports = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        reports.append(json.loads(out.strip().splitlines()[-1]))
    return reports


def test_a_slow_node_is_named_far_below_its_peers() -> None:
    reports = run_preflight(3, slow={2: 0.05})
    assert [r["rank"] for r in reports] == [0, 1, 2]
    pairs = {int(k): v for k, v in reports[0]["pairs"].items()}
    assert sorted(pairs) == [1, 2] and all(v > 0 for v in pairs.values())
    print(f"pairs {pairs}; seconds per process {[r['seconds'] for r in reports]}")
    named = slow_nodes(pairs)
    assert list(named) == [2], pairs
    assert named[2].startswith("all-reduce with node 0 at "), named
    assert reports[1]["pairs"] == {} and reports[0]["gpus"] == []  # rank 0 measures; CPU


def test_nodes_alike_name_nobody() -> None:
    reports = run_preflight(3, slow={})
    pairs = {int(k): v for k, v in reports[0]["pairs"].items()}
    assert slow_nodes(pairs) == {}, pairs


@pytest.mark.gpu
def test_on_a_gpu_the_matmul_and_memory_check_pass() -> None:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU here")
    (report,) = run_preflight(1, slow={}, backend="nccl")
    assert report["gpus"] and all(g["matmul_ok"] and g["memory_ok"] for g in report["gpus"])
    print(f"on a GPU: {report['gpus']}")
