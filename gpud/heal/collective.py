"""Running the preflight's collective check on this node (issue 21 §2).

Node 0 asks each node of an attempt (`run.part.preflight`, and itself) to run
`python -m trainers.preflight` beside its loop, with the run's interpreter, on the GPUs the
attempt reserved here; the processes meet at node 0 and node 0's reports each pair's bus
bandwidth. The check never holds the daemon's loop (an asyncio subprocess) and never
outlives its deadline (killed). What it found goes back as a `PartPreflight`: a check that
could not run (no torch for that interpreter, a peer that never came) says so, and node 0
reads that as no verdict rather than as a slow node.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from importlib.util import find_spec

from gpud.wire.run_messages import PartPreflight

#: The whole check, torch's import and the rendezvous included; on 2 CPU cores with three
#: nodes it takes about 5 s.
CHECK_TIMEOUT_S = 30.0


def torch_here() -> bool:
    """Whether this interpreter could run the check (without importing torch)."""
    return find_spec("torch") is not None


async def run_check(
    python: str,
    node_rank: int,
    master: str,
    world: int,
    rank: int,
    backend: str,
    gpus: list[int],
    timeout_s: float = CHECK_TIMEOUT_S,
) -> PartPreflight:
    """One node's part of the check; never raises."""
    env = dict(os.environ)
    if gpus:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in gpus)
    argv = [
        python, "-m", "trainers.preflight", "--master", master, "--world", str(world),
        "--rank", str(rank), "--backend", backend, "--timeout-s", str(timeout_s * 0.8),
    ]  # fmt: skip
    started = time.monotonic()
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env
        )
    except OSError as exc:
        return PartPreflight(node_rank=node_rank, ok=False, error=f"cannot start {python}: {exc}")
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout_s)
    except asyncio.TimeoutError:
        proc.kill()
        await proc.wait()
        return PartPreflight(
            node_rank=node_rank, ok=False, error=f"the check did not end within {timeout_s:g}s"
        )
    seconds = round(time.monotonic() - started, 2)
    lines = out.decode(errors="replace").strip().splitlines()
    if proc.returncode != 0 or not lines:
        tail = err.decode(errors="replace").strip().splitlines()[-1:] or ["no output"]
        return PartPreflight(
            node_rank=node_rank, ok=False, seconds=seconds,
            error=f"the check exited {proc.returncode}: {tail[0][:300]}",
        )  # fmt: skip
    try:
        report = json.loads(lines[-1])
        pairs = {int(k): float(v) for k, v in report.get("pairs", {}).items()}
        failed = {  # the check sees CUDA_VISIBLE_DEVICES' order: back to this node's index
            gpus[g["index"]] if g["index"] < len(gpus) else g["index"]: (
                "wrong matmul result" if not g["matmul_ok"] else "memory test failed"
            )
            for g in report.get("gpus", [])
            if not (g.get("matmul_ok") and g.get("memory_ok"))
        }
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        return PartPreflight(node_rank=node_rank, ok=False, error=f"unreadable report: {exc}")
    bad = [f"GPU {index}: {why}" for index, why in sorted(failed.items())]
    return PartPreflight(
        node_rank=node_rank, ok=not bad, seconds=seconds, pairs=pairs, gpu_failures=bad,
        failed_gpus=sorted(failed), error="; ".join(bad) or None,
    )  # fmt: skip
