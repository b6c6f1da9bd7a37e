"""A real run on a real NVIDIA GPU: NCCL DDP under torchrun on a leased GPU, seen on that
GPU by NVML and /metrics, a second run queued behind it, a graceful stop that releases the
GPU's memory, and a resume from the stop's checkpoint. Skipped without NVML and CUDA.

Set GPUD_GPU_RECORD=DIR to keep what was seen (the /metrics text, a summary) for
docs/verified-on-gpu.md.
"""

from __future__ import annotations

import json
import os
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from gpud.hardware.nvml import NvmlSampler, NvmlUnavailable
from gpud.prometheus.series import FIELDS
from gpud.wire.client import Client
from tests.support.daemons import RunningDaemon, free_port, gpuctl
from tests.support.dcgm_exporter import parity_problems
from tests.support.runs import (
    ROOT,
    force_stop,
    launch,
    nothing_left,
    ranks_of,
    status,
    wait_for,
    wait_for_step,
)
from tests.support.waiting import until

pytestmark = [pytest.mark.gpu, pytest.mark.slow]

Daemons = Callable[..., RunningDaemon]
LONG = "training.max_steps=10000000"


@pytest.fixture
def gpu_count() -> Iterator[int]:
    try:
        sampler = NvmlSampler.open()
    except NvmlUnavailable as exc:
        pytest.skip(f"no NVML GPUs here: {exc}")
    count = sampler.gpu_count()
    sampler.close()
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("NVML sees GPUs but this torch has no CUDA")
    yield count


@pytest.fixture
def record() -> Callable[[str, str], None]:
    where = os.environ.get("GPUD_GPU_RECORD")

    def keep(name: str, text: str) -> None:
        if where:
            Path(where).mkdir(parents=True, exist_ok=True)
            (Path(where) / name).write_text(text)

    return keep


def gpu_spec(tmp_path: Path) -> Path:
    spec = tmp_path / "gpu-ddp.yaml"
    spec.write_text(
        "name: gpu-ddp\nlauncher: torchrun\nnproc_per_node: 1\nbackend: nccl\n"
        f"workdir: {ROOT}\nscript: trainers/examples/ddp.py\ngpus: 1\n"
        "args: [--width, '1024', --depth, '4', --log-every, '10']\n"
        "training: {batch_size_per_gpu: 256, mixed_precision: bf16, max_steps: 100000}\n"
        "checkpoint: {keep_last: 2, every_steps: 500}\n"
        "nccl: {debug: WARN, flight_recorder: true}\nstop_grace_s: 30\n"
    )
    return spec


def gpu_processes(daemon: RunningDaemon) -> dict[int, list[int]]:
    """What NVML says through the daemon: GPU index → pids with a context on it."""
    with Client(daemon.target(), timeout_s=10) as client:
        snap = client.node_hw()
    assert not any(g.simulated for g in snap.gpus)
    return {g.index: [p.pid for p in g.processes or []] for g in snap.gpus}


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
        return str(reply.read().decode())


def test_a_gpu_run_leases_its_gpu_stops_releasing_its_memory_and_resumes(
    daemons: Daemons,
    tmp_path: Path,
    gpu_count: int,
    record: Callable[[str, str], None],
) -> None:
    port = free_port()
    daemon = daemons(simulate_gpus=None, interval=0.5, extra=("--metrics", f"127.0.0.1:{port}"))
    record("metrics-idle.txt", scrape(port))
    spec = gpu_spec(tmp_path)
    first = launch(daemon, LONG, config=spec)
    second = ""
    try:
        wait_for_step(daemon, first, 50, timeout=300)
        # One node, one real GPU: its matmul and memory test ran before the attempt took it.
        checked = [e.message for e in status(daemon, first).events if e.kind == "preflight"]
        record("preflight.txt", "\n".join(checked))
        assert any(
            m.startswith("preflight on 1 node in ")
            and m.endswith(": its GPUs passed the matmul and memory test")
            for m in checked
        ), checked
        run = status(daemon, first).run
        assert len(run.gpus) == 1, run
        gpu = run.gpus[0]
        rank0 = ranks_of(first)[0]
        # NVML (through the daemon) sees the rank's context on its leased GPU.
        until(
            "the rank on its GPU",
            lambda: rank0.pid in gpu_processes(daemon).get(gpu, []),
            timeout=60,
        )
        assert rank0.environ()["CUDA_VISIBLE_DEVICES"] == str(gpu)
        # /metrics labels that GPU's series with the run and its rank.
        text = until(
            "run and rank labels",
            lambda: next((t for t in [scrape(port)] if f'run="{first}"' in t), None),
            timeout=30,
        )
        record("metrics-running.txt", text)
        used = [
            line
            for line in text.splitlines()
            if line.startswith("DCGM_FI_DEV_FB_USED{") and f'run="{first}"' in line
        ]
        assert len(used) == 1 and f'gpu="{gpu}"' in used[0] and 'rank="0"' in used[0], used

        if gpu_count == 1:
            # A second run waits for the one GPU instead of sharing it.
            out = gpuctl("--node", daemon.address, "launch", str(spec), "--queue", "--set", LONG)
            assert out.returncode == 0, out.stderr
            second = out.stdout.split()[1]
            queued = status(daemon, second).run
            assert queued.state.value == "queued", queued
            assert f"held by run {first}" in (queued.reason or ""), queued.reason

        stop = gpuctl("--node", daemon.address, "stop", first, timeout=180)
        assert stop.returncode == 0, (stop.stdout, stop.stderr)
        stopped = status(daemon, first)
        assert stopped.run.state.value == "stopped"
        checkpoint = stopped.run.last_checkpoint
        assert checkpoint is not None and checkpoint.step is not None
        assert checkpoint.step == stopped.run.last_step
        nothing_left(first)
        # Its memory is released: NVML lists no process of it, and gpud says so.
        assert all(rank0.pid not in pids for pids in gpu_processes(daemon).values())
        verified = until(
            "the verified event",
            lambda: [e for e in status(daemon, first).events if e.kind == "verified"],
            timeout=60,
        )
        assert "(NVML)" in verified[-1].message, verified[-1].message
        assert not [e for e in status(daemon, first).events if e.kind == "gpu_memory"]

        if second:
            wait_for_step(daemon, second, 10, timeout=300)  # it got the freed GPU
            force_stop(daemon, second)

        resumed = gpuctl("--node", daemon.address, "--json", "resume", first, timeout=60)
        assert resumed.returncode == 0, resumed.stderr
        assert json.loads(resumed.stdout)["run"]["attempt"] == 2
        wait_for_step(daemon, first, checkpoint.step + 20, timeout=300)
        s = status(daemon, first)
        assert s.attempts[-1].resume_from == checkpoint.path
        logs = gpuctl("--node", daemon.address, "logs", first).stdout
        assert f"at step {checkpoint.step + 1}" in logs, logs[-2000:]
        health = gpuctl("--node", daemon.address, "health", first)
        record(
            "summary.txt",
            "\n".join(
                [
                    f"gpu {gpu}; stop checkpoint {checkpoint.path} at step {checkpoint.step}",
                    f"verified: {verified[-1].message}",
                    "health after resume:",
                    health.stdout,
                    "ps:",
                    gpuctl("--node", daemon.address, "ps").stdout,
                ]
            ),
        )
        final = scrape(port)
        record("metrics-resumed.txt", final)
        names = [f.name for f in FIELDS]  # every GPU family's samples carry its own name
        present = [n for n in names if f"\n{n}{{" in final]
        absent = [n for n in names if n not in present]
        record("dcgm-names.json", json.dumps({"present": present, "absent": absent}, indent=1))
        # What differs from dcgm-exporter's defaults on this GPU, for docs/verified-on-gpu.md.
        record("dcgm-parity.json", json.dumps(parity_problems(final), indent=1))
    finally:
        for run_id in (first, second):
            if run_id and not status(daemon, run_id).run.state.terminal:
                force_stop(daemon, run_id)
    wait_for(daemon, first, {"stopped"}, timeout=60)
