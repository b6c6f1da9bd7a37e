"""The preflight's collective check, one process per node (issue 21 §2).

    python -m trainers.preflight --master HOST:PORT --world N --rank R [--backend gloo]

Run on each node of an attempt before its ranks start: the processes meet at node 0's
address, and node 0's process (rank 0) runs an all-reduce with each other node in turn
(a group of two: `new_group([0, i])`), so a slow link or a slow node shows as one slow
pair instead of slowing one all-reduce of everybody alike; each pair's figure is the best
of `ROUNDS` rounds taken in turn, so a busy moment of the host is not read as the link.
Each process prints one JSON line: its rank, and on rank 0 the bus bandwidth of each pair
in GB/s (`pairs`), which `gpud.heal.preflight.slow_nodes` judges. On a CUDA GPU
(`--backend nccl`) each rank first multiplies two matrices on every visible GPU and
checks the product against the CPU's, and writes and reads back two bit patterns in a
share of its free memory (`gpus`).

It imports torch (it runs under the run's interpreter, never inside gpud's daemon) and
ends with `os._exit`, after a barrier, as gloo ranks must.

Test hook: `GPUD_TEST_SLOW_PREFLIGHT_S` makes this process wait that long before each of
its all-reduces: its pair with node 0 reads slow (`@PATH`: the seconds are read from that
file, so a test can slow a node between attempts). `GPUD_TEST_BAD_GPU_CHECK=N` makes GPU N
of the node (as `CUDA_VISIBLE_DEVICES` names it) fail its matmul check, when it is visible,
on a machine with no GPU too.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from datetime import timedelta
from typing import Any

WARMUP = 2
ITERS = 5
ROUNDS = 3
SLOW_ENV = "GPUD_TEST_SLOW_PREFLIGHT_S"
BAD_GPU_ENV = "GPUD_TEST_BAD_GPU_CHECK"


def pretend_bad_gpu(found: list[dict[str, Any]], gpu: str) -> list[dict[str, Any]]:
    """The test hook: GPU `gpu` of the node, if visible here, fails its matmul check."""
    visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")]
    if gpu not in visible:
        return found
    index = visible.index(gpu)
    by_index = {g["index"]: g for g in found}
    by_index[index] = {**by_index.get(index, {"index": index, "memory_ok": True})}
    by_index[index]["matmul_ok"] = False
    return [by_index[i] for i in sorted(by_index)]


def slow_seconds() -> float:
    """The slow-down test hook's seconds (0 without it)."""
    value = os.environ.get(SLOW_ENV, "") or "0"
    if value.startswith("@"):
        try:
            with open(value[1:]) as file:
                value = file.read().strip() or "0"
        except OSError:
            return 0.0
    return float(value)


def pair_bandwidth(group: Any, size_bytes: int, on_gpu: bool, slow_s: float) -> float:
    """Bus bandwidth of all-reduces within a group of two, in GB/s (busbw = algbw for
    two ranks, as nccl-tests defines it)."""
    import torch
    import torch.distributed as dist

    device = torch.device("cuda", torch.cuda.current_device()) if on_gpu else None
    tensor = torch.ones(size_bytes // 4, dtype=torch.float32, device=device)

    def one() -> None:
        if slow_s:
            time.sleep(slow_s)
        dist.all_reduce(tensor, group=group)

    for _ in range(WARMUP):
        one()
    if on_gpu:
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(ITERS):
        one()
    if on_gpu:
        torch.cuda.synchronize()
    seconds = (time.perf_counter() - start) / ITERS
    return size_bytes / seconds / 1e9


def gpu_checks(memory_share: float = 0.25) -> list[dict[str, Any]]:
    """Each visible CUDA GPU: a matmul checked against the CPU's (and its TFLOP/s), and a
    pattern written to and read back from a share of its free memory."""
    import torch

    found = []
    for index in range(torch.cuda.device_count()):
        device = torch.device("cuda", index)
        a = torch.randn(2048, 2048, device=device)
        b = torch.randn(2048, 2048, device=device)
        expected = a.cpu() @ b.cpu()
        product = a @ b  # warm-up: cuBLAS's handle and kernel choice are not the GPU's speed
        torch.cuda.synchronize(device)
        start = time.perf_counter()
        for _ in range(10):
            product = a @ b
        torch.cuda.synchronize(device)
        seconds = (time.perf_counter() - start) / 10
        matmul_ok = bool(torch.allclose(product.cpu(), expected, rtol=1e-3, atol=1e-2))
        free, _total = torch.cuda.mem_get_info(device)
        count = int(free * memory_share)  # bytes; the check's bool tensor takes as much
        buffer = torch.empty(count, dtype=torch.uint8, device=device)
        memory_ok = True
        for pattern in (0xA5, 0x5A):  # every bit written as 1 and as 0
            buffer.fill_(pattern)
            memory_ok = memory_ok and bool((buffer == pattern).all())
        del buffer
        torch.cuda.empty_cache()
        found.append(
            {
                "index": index,
                "matmul_ok": matmul_ok,
                "tflops": round(2 * 2048**3 / seconds / 1e12, 2),
                "memory_ok": memory_ok,
                "memory_tested_bytes": count,
            }
        )
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainers.preflight")
    parser.add_argument("--master", required=True, help="node 0's HOST:PORT")
    parser.add_argument("--world", type=int, required=True)
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--backend", default="gloo", choices=["gloo", "nccl"])
    parser.add_argument("--mb", type=float, default=None, help="all-reduce size (MB)")
    parser.add_argument("--timeout-s", type=float, default=30.0)
    args = parser.parse_args(argv)

    started = time.perf_counter()
    import torch
    import torch.distributed as dist

    on_gpu = args.backend == "nccl" and torch.cuda.is_available()
    report: dict[str, Any] = {"rank": args.rank, "gpus": gpu_checks() if on_gpu else []}
    if os.environ.get(BAD_GPU_ENV):
        report["gpus"] = pretend_bad_gpu(report["gpus"], os.environ[BAD_GPU_ENV])
    if on_gpu:
        torch.cuda.set_device(0)
    dist.init_process_group(
        args.backend,
        init_method=f"tcp://{args.master}",
        world_size=args.world,
        rank=args.rank,
        timeout=timedelta(seconds=args.timeout_s),
    )
    size = int((args.mb or (64 if on_gpu else 4)) * 2**20)
    slow_s = slow_seconds()
    pairs: dict[str, float] = {}
    groups = {peer: dist.new_group([0, peer]) for peer in range(1, args.world)}  # all ranks
    for _round in range(ROUNDS):  # the best of a few rounds: a busy moment is not the link
        for peer, group in groups.items():
            if args.rank in (0, peer):
                busbw = pair_bandwidth(group, size, on_gpu, slow_s)
                if args.rank == 0:
                    pairs[str(peer)] = round(max(busbw, pairs.get(str(peer), 0.0)), 4)
    dist.barrier()
    report["pairs"] = pairs
    report["seconds"] = round(time.perf_counter() - started, 2)
    sys.stdout.write(json.dumps(report) + "\n")
    sys.stdout.flush()
    dist.destroy_process_group()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
