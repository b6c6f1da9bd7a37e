"""What publishing metrics costs a training step: `run.log()` beside wandb and TensorBoard,
and a fully instrumented DDP loop beside the bare one.

In one run, each library in a fresh process of its own (as in a trainer), it measures:

- `run.log(step, **5 metrics)` of a launched rank-0 Run (`trainers.init()` with GPUD_RUN_ID,
  GPUD_RUN_DIR so the link thread writes metrics.jsonl, GPUD_INGEST and GPUD_CONTROL): each
  call of a tight loop timed alone with `perf_counter_ns` after a warm-up, median and p99.
  With "gpud up" (a stand-in gpud in this process binds a PULL on ipc:// and drains it
  in a thread, and a PUB for control) and "gpud down" (endpoints nobody binds);
- `wandb.log` of the same 5 values (offline mode), and TensorBoard's
  `SummaryWriter.add_scalar` (5 scalars a step: per call and per step), timed the same way;
  the ratios of their medians to run.log's ("gpud up");
- the step-time overhead of full instrumentation on the CPU DDP example's loop
  (`bench/instrumented_step.py`, 2 processes under torchrun on gloo; the ranks
  launched-looking against the stand-in gpud, with heartbeats, `run.watch(ddp)` and
  `run.probe_collectives(100)`), as the sum of its parts, each timed directly: rank 0's
  mean time inside the per-step calls (run.log and should_stop, made on every rank); the
  probe's extra time spread over its 100 steps; and the background threads' (link thread,
  zmq, the async stop agreement) CPU per step beyond a bare run's, all of it charged to
  the step as if no core were spare. Step times of separate processes differ by several
  % here whatever they run, so as a cross-check one process also times steps in
  alternating blocks of 25 with and without the per-step calls.

Targets (issue 4): run.log at least 100× cheaper than wandb.log; full instrumentation
under 1% of step time. Figures are printed, never asserted.

    .venv/bin/python bench/publisher_overhead.py [--pairs 3] [--steps 400] [--log-calls 200000]

The ratios compare like with like: tight loops, warm caches. run.log is also timed paced
at one call per --pace-us (default 200 µs), as a trainer calls it: each call then starts
with cold caches and costs a few µs, still a rounding error of any step.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import importlib.metadata
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import zmq

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

TRAINING_SCRIPT = ROOT / "bench" / "instrumented_step.py"
RESULT = "RESULT "
PROBE_EVERY = 100  # as bench/instrumented_step.py and trainers/examples/ddp.py
#: The five values every library logs per step (typical magnitudes; constants, so only
#: the publishing is timed).
METRICS = {
    "loss": 0.4321,
    "lr": 2.5e-4,
    "grad_norm": 1.137,
    "samples_per_s": 1893.4,
    "tokens_per_s": 969_420.8,
}


# ---------------------------------------------------------------------- the stand-in gpud


class GpudStandIn:
    """Where a trainer's gpud would be: a PULL on its ingest endpoint, drained and counted
    by message kind in a thread, and a PUB on its control endpoint (never publishes)."""

    def __init__(self, directory: Path) -> None:
        self.ingest = f"ipc://{directory}/ingest.sock"
        self.control = f"ipc://{directory}/control.sock"
        self._ctx = zmq.Context()
        self._pull = self._ctx.socket(zmq.PULL)
        self._pull.bind(self.ingest)
        self._pub = self._ctx.socket(zmq.PUB)
        self._pub.bind(self.control)
        self._counts: collections.Counter[str] = collections.Counter()
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._thread = threading.Thread(target=self._drain, name="gpud-stand-in", daemon=True)
        self._thread.start()

    def _drain(self) -> None:
        while not self._closing.is_set():
            if not self._pull.poll(100):
                continue
            while True:
                try:
                    kind = self._pull.recv_multipart(zmq.NOBLOCK)[0]
                except zmq.Again:
                    break
                with self._lock:
                    self._counts[kind.decode()] += 1

    def take_counts(self, settle_s: float = 0.5) -> dict[str, int]:
        """Messages received by kind since the last call (after `settle_s` for stragglers)."""
        time.sleep(settle_s)
        with self._lock:
            counts, self._counts = dict(self._counts), collections.Counter()
        return counts

    def close(self) -> None:
        self._closing.set()
        self._thread.join()
        self._ctx.destroy(linger=0)


def launched_env(run_id: str, run_dir: Path, ingest: str, control: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUD_", "WANDB_"))}
    run_dir.mkdir(parents=True, exist_ok=True)
    env.update(
        GPUD_RUN_ID=run_id,
        GPUD_RUN_DIR=str(run_dir),
        GPUD_INGEST=ingest,
        GPUD_CONTROL=control,
        OMP_NUM_THREADS="1",
    )
    return env


# ---------------------------------------------------------------------- per-call children


def timed_calls(
    call: Callable[[int], object], calls: int, warmup: int, pace_s: float = 0.0
) -> list[int]:
    """Nanoseconds of each of `calls` calls, after `warmup` untimed ones; with `pace_s`,
    a sleep after each call (a training step releases the GIL and the cores likewise)."""
    for i in range(warmup):
        call(i)
    samples = [0] * calls
    clock = time.perf_counter_ns
    sleep = time.sleep
    for i in range(calls):
        start = clock()
        call(warmup + i)
        samples[i] = clock() - start
        if pace_s:
            sleep(pace_s)
    return samples


def summary_us(samples_ns: list[int]) -> dict[str, float]:
    ordered = sorted(samples_ns)
    return {
        "median_us": statistics.median(ordered) / 1e3,
        "p99_us": ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] / 1e3,
        "calls": len(ordered),
    }


def child_run_log(calls: int, warmup: int, pace_s: float) -> None:
    import trainers

    run = trainers.init()
    if not run.launched:
        raise SystemExit("the run.log child needs GPUD_RUN_ID")
    loss, lr, grad_norm = METRICS["loss"], METRICS["lr"], METRICS["grad_norm"]
    samples_s, tokens_s = METRICS["samples_per_s"], METRICS["tokens_per_s"]

    def log(step: int) -> None:
        run.log(
            step,
            loss=loss,
            lr=lr,
            grad_norm=grad_norm,
            samples_per_s=samples_s,
            tokens_per_s=tokens_s,
        )

    def nothing(step: int) -> None:
        pass

    floor = summary_us(timed_calls(nothing, calls, warmup))["median_us"]
    for i in range(warmup):
        log(i)
    time.sleep(0.3)  # let the link thread catch up: the timed loop starts with it idle
    result = summary_us(timed_calls(log, calls, 0, pace_s))
    result.update(timer_floor_us=floor, logged=warmup + calls, dropped=run.dropped)
    print(RESULT + json.dumps(result), flush=True)
    run.finish()


def child_flops(steps: int, width: int, depth: int, batch: int) -> dict[str, Any]:
    """`run.count_flops()` on a launched Run around the example's step (ToyModel, one
    process, CPU): the first, counted step against bare steps (its one-off cost, the
    counter's import included; and counts once it is imported), then every later step
    with the context against steps without it, in alternating blocks of 25, and the
    context's own cost per call in a tight loop."""
    import torch

    import trainers
    from trainers.examples.toy import IN_FEATURES, OUT_FEATURES, ToyModel
    from trainers.flops import FlopCount

    torch.manual_seed(0)
    torch.set_num_threads(1)
    run = trainers.init()
    if not run.launched:
        raise SystemExit("the FLOPs child needs GPUD_RUN_ID")
    model = ToyModel(width, depth)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x, y = torch.randn(batch, IN_FEATURES), torch.randn(batch, OUT_FEATURES)

    def step() -> None:
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()  # type: ignore[no-untyped-call]

    def timed(context: Callable[[], Any]) -> float:
        start = time.perf_counter()
        with context():
            step()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return time.perf_counter() - start

    def bare() -> Any:
        return contextlib.nullcontext()

    for _ in range(20):  # warm caches and allocator; the counter is not imported yet
        timed(bare)
    before = [timed(bare) for _ in range(25)]
    first = timed(run.count_flops)  # the counted step: imports torch.utils.flop_counter
    # More counts, the counter already imported: the counting itself, without the import.
    second = statistics.median(timed(FlopCount().step) for _ in range(10))
    after = [timed(bare) for _ in range(25)]
    with_ctx: list[float] = []
    without: list[float] = []
    for block in range(max(2, steps // 25)):
        kind, into = (run.count_flops, with_ctx) if block % 2 == 0 else (bare, without)
        into += [timed(kind) for _ in range(25)]

    def enter_exit(_: int) -> None:
        with run.count_flops():
            pass

    def nothing(_: int) -> None:
        pass

    floor = summary_us(timed_calls(nothing, 200_000, 20_000))["median_us"]
    context = summary_us(timed_calls(enter_exit, 200_000, 20_000))
    bare_ms = statistics.median(before + after) * 1e3
    result = {
        "flops_per_step": run.flops_per_step,
        "bare_median_ms": bare_ms,
        "first_ms": first * 1e3,
        "second_count_ms": second * 1e3,
        "with_median_ms": statistics.median(with_ctx) * 1e3,
        "without_median_ms": statistics.median(without) * 1e3,
        "with_mean_ms": statistics.fmean(with_ctx) * 1e3,
        "without_mean_ms": statistics.fmean(without) * 1e3,
        "later_steps": len(with_ctx),
        "context_median_us": context["median_us"],
        "timer_floor_us": floor,
    }
    return result


def print_flops(r: dict[str, Any], width: int, depth: int, batch: int) -> None:
    bare, first, second = r["bare_median_ms"], r["first_ms"], r["second_count_ms"]
    print(
        f"FLOP counting (run.count_flops(), ToyModel width {width} depth {depth}, batch {batch},"
        f" 1 CPU thread; {r['flops_per_step'] / 1e6:,.1f} MFLOP per step counted):"
    )
    print(f"  {'':<40} {'ms':>9} {'× a step':>9}")
    print(f"  {'a bare step (median)':<40} {bare:9.3f} {1:9.2f}")
    print(f"  {'the first step, counted (one-off)':<40} {first:9.3f} {first / bare:9.2f}")
    print(
        f"  {'  one-off cost beyond the step':<40} {first - bare:9.3f} {(first - bare) / bare:9.2f}"
    )
    print(f"  {'  a count once imported (median of 10)':<40} {second:9.3f} {second / bare:9.2f}")
    with_ms, without_ms = r["with_median_ms"], r["without_median_ms"]
    diff = (with_ms - without_ms) / without_ms * 100
    print(
        f"  later steps, median of {r['later_steps']} with / without the context:"
        f" {with_ms:.3f} / {without_ms:.3f} ms ({diff:+.2f} %, machine noise)"
    )
    context_us = r["context_median_us"] - r["timer_floor_us"]
    print(
        f"  the context itself, later steps: {context_us:.3f} µs a step"
        f" ({context_us / 1e3 / bare * 100:.4f} % of a step; timer floor taken off)"
    )


def child_wandb(calls: int, warmup: int, directory: str) -> dict[str, Any]:
    os.environ["WANDB_SILENT"] = "true"
    import wandb

    wandb.init(mode="offline", dir=directory, project="bench")

    def log(step: int) -> None:
        wandb.log(
            {
                "loss": METRICS["loss"],
                "lr": METRICS["lr"],
                "grad_norm": METRICS["grad_norm"],
                "samples_per_s": METRICS["samples_per_s"],
                "tokens_per_s": METRICS["tokens_per_s"],
            },
            step=step,
        )

    result = summary_us(timed_calls(log, calls, warmup))
    wandb.finish()
    return result


def child_tensorboard(steps: int, warmup: int, directory: str) -> dict[str, Any]:
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(directory)
    names = list(METRICS)
    values = list(METRICS.values())

    def add_scalar(call: int) -> None:
        step, which = divmod(call, len(names))
        writer.add_scalar(names[which], values[which], step)

    per_call = timed_calls(add_scalar, steps * len(names), warmup * len(names))
    writer.close()
    per_step = [sum(per_call[i : i + len(names)]) for i in range(0, len(per_call), len(names))]
    return {"per_call": summary_us(per_call), "per_step": summary_us(per_step)}


def run_child(args: list[str], env: dict[str, str] | None = None) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, __file__, *args],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=ROOT,
        check=False,
    )
    for line in out.stdout.splitlines():
        if line.startswith(RESULT):
            parsed: dict[str, Any] = json.loads(line[len(RESULT) :])
            return parsed
    raise SystemExit(f"child {args} gave no result (exit {out.returncode}):\n{out.stderr}")


# ---------------------------------------------------------------------- DDP step time


@dataclass
class TrainingRun:
    """Rank 0's figures of one torchrun job (see `bench/instrumented_step.py`)."""

    mode: str
    steps: int
    background_cpu_ms_per_step: float
    all_mean_ms: float = 0.0
    all_median_ms: float = 0.0
    with_mean_ms: float = 0.0
    with_median_ms: float = 0.0
    without_mean_ms: float = 0.0
    without_median_ms: float = 0.0
    log_median_us: float = 0.0
    log_mean_us: float = 0.0
    should_stop_median_us: float = 0.0
    should_stop_mean_us: float = 0.0
    probe_step_extra_ms: float | None = None
    dropped: int = 0


def train(
    args: argparse.Namespace, mode: str, gpud: GpudStandIn, tmp: Path, index: int
) -> TrainingRun:
    if mode == "bare":
        env = {k: v for k, v in os.environ.items() if not k.startswith("GPUD_")}
        env["OMP_NUM_THREADS"] = "1"
    else:
        env = launched_env(f"bench-ddp-{index}", tmp / f"ddp-{index}", gpud.ingest, gpud.control)
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node=2",
        str(TRAINING_SCRIPT),
        f"--mode={mode}",
        f"--steps={args.steps}",
        f"--warmup={args.warmup_steps}",
        f"--width={args.width}",
    ]
    out = subprocess.run(
        command, capture_output=True, text=True, timeout=900, env=env, cwd=ROOT, check=False
    )
    for line in out.stdout.splitlines():
        if line.startswith("STEP_TIME "):
            return TrainingRun(**json.loads(line.removeprefix("STEP_TIME ")))
    raise SystemExit(f"training run failed (exit {out.returncode}):\n{out.stdout}\n{out.stderr}")


@dataclass(frozen=True)
class CpuMark:
    """CPU seconds used so far, by every process and by this one with its children: the
    difference over a window is what other processes took from the cores meanwhile."""

    wall_s: float
    busy_s: float
    ours_s: float

    @classmethod
    def now(cls) -> CpuMark:
        t = psutil.cpu_times()
        me, children = (
            resource.getrusage(w) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
        )
        return cls(
            wall_s=time.monotonic(),
            busy_s=t.user + t.nice + t.system + getattr(t, "irq", 0.0) + getattr(t, "softirq", 0.0),
            ours_s=me.ru_utime + me.ru_stime + children.ru_utime + children.ru_stime,
        )

    def others_cores(self, since: CpuMark) -> float:
        """Cores' worth of CPU that other processes used between `since` and this mark."""
        others = (self.busy_s - since.busy_s) - (self.ours_s - since.ours_s)
        return max(0.0, others / (self.wall_s - since.wall_s))


# ---------------------------------------------------------------------- report


def verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def machine_line() -> str:
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    return (
        f"machine: {platform.node()}, {os.cpu_count()} cores, "
        f"{psutil.virtual_memory().total / 2**30:.0f} GiB, Python {platform.python_version()}, "
        f"torch {importlib.metadata.version('torch')}, wandb {importlib.metadata.version('wandb')}"
        f", tensorboard {importlib.metadata.version('tensorboard')}; load average {load}"
    )


def per_call_row(name: str, r: dict[str, Any], note: str = "") -> str:
    return f"  {name:<28} {r['median_us']:9.2f} {r['p99_us']:10.1f} {r['calls']:>9,}" + (
        f"   {note}" if note else ""
    )


def print_per_call(
    up: dict[str, Any],
    up_received: dict[str, int],
    paced_run: tuple[dict[str, Any], dict[str, int], int],
    down: dict[str, Any],
    wb: dict[str, Any],
    tb: dict[str, Any],
) -> None:
    print(f"per call, 5 metrics a call ({up['timer_floor_us']:.2f} µs timer floor included):")
    print(f"  {'':<28} {'median µs':>9} {'p99 µs':>10} {'calls':>9}")
    jsonl_note = f"delivered {up_received.get('metrics', 0):,} of {up['logged']:,}"
    paced, paced_received, pace_us = paced_run
    print(per_call_row("run.log, gpud up", up, jsonl_note + " (tight loop: the rest dropped)"))
    paced_note = f"delivered {paced_received.get('metrics', 0):,} of {paced['logged']:,}"
    print(per_call_row(f"run.log, up, 1 per {pace_us} µs", paced, paced_note))
    print(per_call_row("run.log, gpud down", down, f"dropped {down['dropped']:,}"))
    print(per_call_row("wandb.log (offline)", wb))
    print(per_call_row("add_scalar (1 scalar)", tb["per_call"]))
    print(per_call_row("add_scalar × 5 (one step)", tb["per_step"]))
    print("ratios of medians (to run.log with gpud up, tight loop; paced):")
    for name, median in (
        ("wandb.log / run.log", wb["median_us"]),
        ("add_scalar / run.log", tb["per_call"]["median_us"]),
        ("add_scalar × 5 / run.log", tb["per_step"]["median_us"]),
    ):
        ratio, cold = median / up["median_us"], median / paced["median_us"]
        target = f"   target >= 100×   {verdict(ratio >= 100)}" if name.startswith("wandb") else ""
        print(f"  {name:<28} {ratio:9.0f}× {cold:6.0f}×{target}")


def print_ddp(
    args: argparse.Namespace,
    bare: list[TrainingRun],
    mixed: list[TrainingRun],
    received_by_kind: dict[str, int],
    others_cores: float,
) -> None:
    print(
        f"DDP step, 2 processes on gloo, ToyModel {args.width}×4, batch 32 × 2 accumulated, "
        f"{args.steps} steps timed after {args.warmup_steps}; {args.pairs} runs where blocks "
        "of 25 steps alternate with and without the per-step calls (run.log + should_stop on "
        "every rank), each beside a bare run:"
    )
    mean = statistics.mean
    per_run = [(r.with_mean_ms / r.without_mean_ms - 1) * 100 for r in mixed]
    inline = mean(per_run)
    print(f"  {'':<28} {'mean ms':>8} {'median ms':>10}")
    for name, key in (("steps without the calls", "without"), ("steps with the calls", "with")):
        print(
            f"  {name:<28} {mean(getattr(r, f'{key}_mean_ms') for r in mixed):8.2f} "
            f"{mean(getattr(r, f'{key}_median_ms') for r in mixed):10.2f}"
        )
    print(
        f"  {'bare runs (other processes)':<28} {mean(r.all_mean_ms for r in bare):8.2f} "
        f"{mean(r.all_median_ms for r in bare):10.2f}   "
        "(across processes: noise of several %, for context)"
    )
    step_ms = mean(r.without_mean_ms for r in mixed)
    probes = [r.probe_step_extra_ms for r in mixed if r.probe_step_extra_ms is not None]
    probe_ms = mean(probes) if probes else 0.0
    probe_pct = probe_ms / PROBE_EVERY / step_ms * 100
    background_ms = mean(r.background_cpu_ms_per_step for r in mixed) - mean(
        r.background_cpu_ms_per_step for r in bare
    )
    background_pct = max(0.0, background_ms) / step_ms * 100
    log_us = mean(r.log_mean_us for r in mixed)
    stop_us = mean(r.should_stop_mean_us for r in mixed)
    calls_pct = (log_us + stop_us) / 1e3 / step_ms * 100
    total = calls_pct + probe_pct + background_pct
    print(
        f"  per-step calls        {calls_pct:+7.2f} %   (rank 0's mean time inside them: "
        f"run.log {log_us:.1f} µs, should_stop {stop_us:.0f} µs; medians "
        f"{mean(r.log_median_us for r in mixed):.1f} and "
        f"{mean(r.should_stop_median_us for r in mixed):.0f} µs)"
    )
    print(
        f"  probe every {PROBE_EVERY}       {probe_pct:+7.2f} %   ({probe_ms:.1f} ms each, "
        "a 4 MiB all-reduce)"
    )
    print(
        f"  background threads    {background_pct:+7.2f} %   ({background_ms:+.2f} ms CPU a step "
        "beyond a bare run's: the link thread, zmq, the async stop agreement; charged in full, "
        "as if no core were spare)"
    )
    print(f"  total                 {total:+7.2f} %   target < 1 %   {verdict(total < 1)}")
    print(
        f"  cross-check, step time with the calls against without (mean ms): {inline:+.2f} %, "
        "runs " + ", ".join(f"{x:+.2f}" for x in per_run) + " (the machine's noise shows here)"
    )
    received = ", ".join(f"{k} {v:,}" for k, v in sorted(received_by_kind.items()))
    print(
        f"  the stand-in gpud received: {received}; dropped {sum(r.dropped for r in mixed)} "
        "(rank 0)"
    )
    cores = os.cpu_count() or 1
    # Two ranks on two cores leave no room: anyone else's work turns every collective into
    # a wait for the scheduler, and the step times stop measuring this library.
    busy = " (busy machine: step times are scheduling noise; rerun when quiet)"
    print(
        f"  other processes used {others_cores:.2f} of {cores} cores during these runs"
        + (busy if others_cores > 0.25 else "")
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--log-calls", type=int, default=200_000, help="timed run.log calls")
    parser.add_argument(
        "--paced-calls", type=int, default=20_000, help="timed run.log calls, paced"
    )
    parser.add_argument(
        "--pace-us", type=int, default=200, help="pause after each paced run.log call"
    )
    parser.add_argument("--wandb-calls", type=int, default=3_000, help="timed wandb.log calls")
    parser.add_argument("--tb-steps", type=int, default=4_000, help="timed steps of 5 scalars")
    parser.add_argument("--pairs", type=int, default=3, help="bare/mixed DDP run pairs")
    parser.add_argument("--steps", type=int, default=400, help="timed DDP steps per run")
    parser.add_argument("--warmup-steps", type=int, default=50, help="untimed DDP steps first")
    parser.add_argument("--width", type=int, default=1024, help="ToyModel width")
    parser.add_argument("--flops-steps", type=int, default=400, help="later steps, FLOPs part")
    parser.add_argument("--flops-batch", type=int, default=64, help="batch of the FLOPs part")
    parser.add_argument("--flops-only", action="store_true", help="run the FLOPs part alone")
    parser.add_argument(
        "--child", choices=["run-log", "wandb", "tensorboard", "flops"], help="internal"
    )
    parser.add_argument("--child-dir", help="internal")
    args = parser.parse_args()

    if args.child == "run-log":
        child_run_log(args.log_calls, 20_000, args.pace_us / 1e6)  # ends the process
    elif args.child == "wandb":
        print(RESULT + json.dumps(child_wandb(args.wandb_calls, 200, args.child_dir)))
        return
    elif args.child == "tensorboard":
        print(RESULT + json.dumps(child_tensorboard(args.tb_steps, 200, args.child_dir)))
        return
    elif args.child == "flops":
        found = child_flops(args.flops_steps, args.width, 2, args.flops_batch)
        print(RESULT + json.dumps(found), flush=True)
        os._exit(0)  # as Run.finish: no teardown of the link thread to wait for

    print(machine_line(), flush=True)
    started = time.monotonic()
    flops_args = [
        "--child=flops",
        f"--flops-steps={args.flops_steps}",
        f"--flops-batch={args.flops_batch}",
        f"--width={args.width}",
    ]
    if args.flops_only:
        with tempfile.TemporaryDirectory(prefix="gpud-bench-") as name:
            gpud = GpudStandIn(Path(name))
            try:
                env = launched_env("bench-flops", Path(name) / "flops", gpud.ingest, gpud.control)
                flops = run_child(flops_args, env)
            finally:
                gpud.close()
        print_flops(flops, args.width, 2, args.flops_batch)
        return
    with tempfile.TemporaryDirectory(prefix="gpud-bench-") as name:
        tmp = Path(name)
        gpud = GpudStandIn(tmp)
        try:
            calls = [f"--log-calls={args.log_calls}", "--child=run-log", "--pace-us=0"]
            up_env = launched_env("bench-up", tmp / "up", gpud.ingest, gpud.control)
            up = run_child(calls, up_env)
            up_received = gpud.take_counts()
            paced_calls = [
                f"--log-calls={args.paced_calls}",
                "--child=run-log",
                f"--pace-us={args.pace_us}",
            ]
            paced_env = launched_env("bench-paced", tmp / "paced", gpud.ingest, gpud.control)
            paced = run_child(paced_calls, paced_env)
            paced_received = gpud.take_counts()
            nobody = f"ipc://{tmp}/nobody"
            down = run_child(calls, launched_env("bench-down", tmp / "down", nobody, nobody))
            tb = run_child(
                [f"--tb-steps={args.tb_steps}", "--child=tensorboard", f"--child-dir={tmp}/tb"]
            )
            wb = run_child(
                [f"--wandb-calls={args.wandb_calls}", "--child=wandb", f"--child-dir={tmp}"]
            )
            flops_env = launched_env("bench-flops", tmp / "flops", gpud.ingest, gpud.control)
            flops = run_child(flops_args, flops_env)

            bare: list[TrainingRun] = []
            mixed: list[TrainingRun] = []
            ddp_start = CpuMark.now()
            for pair in range(args.pairs):
                order = ("bare", "mixed") if pair % 2 == 0 else ("mixed", "bare")
                for mode in order:
                    result = train(args, mode, gpud, tmp, len(bare) + len(mixed))
                    (mixed if mode == "mixed" else bare).append(result)
            others = CpuMark.now().others_cores(since=ddp_start)
            ddp_received = gpud.take_counts()
        finally:
            gpud.close()

    print_per_call(up, up_received, (paced, paced_received, args.pace_us), down, wb, tb)
    print_ddp(args, bare, mixed, ddp_received, others)
    print_flops(flops, args.width, 2, args.flops_batch)
    print(
        f"total {time.monotonic() - started:.0f} s; load average at the end "
        + ", ".join(f"{x:.1f}" for x in os.getloadavg())
    )


if __name__ == "__main__":
    main()
