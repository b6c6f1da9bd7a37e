"""What gputop costs at scale, driven by real zmq publishers and a real trainer.

A separate process plays a fleet: N nodes × 8 simulated GPUs, each with a CurveZMQ PUB
socket that publishes, every second as gpud does, a realistic `NodeSnapshot` (gpud's own
simulated sampler, NVLinks and all) and the node's brief (`sum.<node>`, with its runs), and
a ROUTER socket that answers gputop's requests; 32 runs of 2 nodes × 8 ranks publish 20
metric points per second each, plus health, state and log lines. For each fleet size
(`--nodes 64,256`: side by side) it measures:

1. the CPU of a real `gputop --cluster FILE` process in a real terminal (tmux, 160×48),
   on the fleet screen and on a run screen, and the feed's share of it (its threads);
2. the time of one frame (model → widgets → layout → full repaint → ANSI for a truecolor
   terminal) of the fleet screen and of the run screen, with the feed running;
3. the same for a run whose loss curve has 1,000,000 points;
4. the latency from `run.log()` in a trainer (the real trainers library, in a process a
   real gpud launched) to the value being in gputop's model, p50 and p99.

Targets (issues 5 and 13, at 256 nodes × 8 GPUs, 1 Hz, 32 runs): under 10% of a core,
under 50 ms per frame at p95, under 100 ms p99.

    .venv/bin/python bench/tui_scale.py [--nodes 64,256] [--duration 20]
"""

from __future__ import annotations

import argparse
import asyncio
import io
import math
import multiprocessing
import os
import platform
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import psutil
import zmq

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from rich.console import Console  # noqa: E402

from bench.fake_fleet import (  # noqa: E402
    FakeNode,
    FakeRun,
    FleetPlan,
    run_fleet,
)
from gpud.model.run import NodeRef, RunState  # noqa: E402
from gpud.security.keys import KeyPair, load_or_create_client_keypair  # noqa: E402
from gpud.wire.brief import sum_topic  # noqa: E402
from gpud.wire.briefing import node_brief  # noqa: E402
from gpud.wire.client import NodeTarget  # noqa: E402
from gpud.wire.protocol import (  # noqa: E402
    RunMetricsEvent,
    encode_event,
    hw_topic,
)
from gpud.wire.run_messages import RunSummary  # noqa: E402
from tests.support.daemons import start_daemon  # noqa: E402
from tests.support.runs import launch  # noqa: E402
from tui.model.feed import Feed  # noqa: E402
from tui.model.fleet import FleetModel  # noqa: E402
from tui.model.targets import Target  # noqa: E402

# =============================================================================== measures


def cpu_in_terminal(
    cluster: Path, extra: list[str], config: Path, warmup: float, duration: float
) -> tuple[float | None, float | None, str]:
    """CPU share of one core of a real gputop process in tmux, the feed threads' share of
    it (every thread but the UI's), and its screen."""
    tmux = shutil.which("tmux")
    if tmux is None:
        return None, None, "tmux is not installed"
    socket = f"tui-scale-{os.getpid()}-{time.monotonic_ns()}"
    env = f"GPUD_CONFIG_DIR={shlex.quote(str(config))} PYTHONPATH={shlex.quote(str(ROOT))}"
    command = shlex.join([sys.executable, "-m", "tui", "--cluster", str(cluster), *extra])
    subprocess.run(
        [tmux, "-L", socket, "new-session", "-d", "-x", "160", "-y", "48", f"env {env} {command}"],
        check=True,
    )
    try:
        pane = subprocess.run(
            [tmux, "-L", socket, "list-panes", "-F", "#{pane_pid}"],
            capture_output=True,
            text=True,
            check=True,
        )
        proc = psutil.Process(int(pane.stdout.split()[0]))
        time.sleep(warmup)
        threads_before = {t.id: t.user_time + t.system_time for t in proc.threads()}
        before, started = proc.cpu_times(), time.monotonic()
        time.sleep(duration)
        after, wall = proc.cpu_times(), time.monotonic() - started
        threads_after = {t.id: t.user_time + t.system_time for t in proc.threads()}
        split = sorted(
            ((threads_after[k] - threads_before.get(k, 0.0)) / wall, k == proc.pid)
            for k in threads_after
        )
        print(
            "  threads of the gputop process (share of a core; * = UI thread): "
            + ", ".join(
                f"{share:.1%}{'*' if main else ''}"
                for share, main in reversed(split)
                if share > 0.002
            ),
            flush=True,
        )
        feed = sum(share for share, main in split if not main)
        screen = subprocess.run(
            [tmux, "-L", socket, "capture-pane", "-p"], check=False, capture_output=True, text=True
        ).stdout
    finally:
        subprocess.run([tmux, "-L", socket, "kill-server"], check=False, capture_output=True)
    used = (after.user - before.user) + (after.system - before.system)
    return used / wall, feed, screen


async def frame_times(
    app: Any, pilot: Any, frames: int, between_s: float
) -> list[tuple[float, float]]:
    """(wall, CPU) seconds of whole frames: model → widgets → layout → a full repaint of
    every widget (nothing cached) → the ANSI a truecolor terminal receives.

    The frame runs synchronously through Textual's own steps (layout and compositor, as
    its update timer would), so the time is the frame's and not the event loop's idle
    wait. CPU is the UI thread's own; wall also counts waiting for the GIL (the feed's
    threads) and for the CPU (other processes).
    """
    console = Console(
        file=io.StringIO(),
        width=app.size.width,
        height=app.size.height,
        force_terminal=True,
        color_system="truecolor",
        legacy_windows=False,
    )
    times = []
    for _ in range(frames):
        await asyncio.sleep(between_s)  # let events flow into the model meanwhile
        screen = app.screen
        wall, cpu = time.perf_counter(), time.thread_time()
        screen.refresh_model()
        for widget in screen.walk_children(with_self=True):
            widget.refresh()
        screen._refresh_layout(app.size)
        console.print(screen._compositor.render_update(full=True))
        times.append((time.perf_counter() - wall, time.thread_time() - cpu))
        console.file = io.StringIO()
        await pilot.pause()
    return times


async def render_in_process(targets: list[Target], keys: KeyPair, frames: int) -> dict[str, Any]:
    from tui.app import GpuTop
    from tui.screens.run import RunScreen

    model = FleetModel(targets)
    feed = Feed(model, targets, keys=keys)
    app = GpuTop(model, feed, refresh_s=3600)  # frames are driven here, not by the timer
    out: dict[str, Any] = {}
    async with app.run_test(size=(160, 48)) as pilot:
        deadline = time.monotonic() + 60
        while sum(model.online(k) for k in model.nodes) < len(targets):
            if time.monotonic() > deadline:
                break
            await asyncio.sleep(0.2)
        out["online"] = sum(model.online(k) for k in model.nodes)
        seen, t0 = model.events_seen, time.monotonic()
        out["fleet"] = await frame_times(app, pilot, frames, 0.1)
        out["events_per_s"] = (model.events_seen - seen) / (time.monotonic() - t0)
        app.push_screen(RunScreen(model, "run-00"))
        deadline = time.monotonic() + 30
        while model.runs.get("run-00") is None or model.runs["run-00"].history != "loaded":
            if time.monotonic() > deadline:
                break
            await asyncio.sleep(0.2)
        out["run"] = await frame_times(app, pilot, frames, 0.1)
        out["run_points"] = len(model.runs["run-00"].metrics.get("loss", ()))
    return out


async def million_points(frames: int) -> dict[str, Any]:
    from tui.app import GpuTop
    from tui.model.lttb import downsample

    model = FleetModel([])
    run = model._run("big-run-000001")
    run.add_summary(
        "tcp://127.0.0.1:1",
        RunSummary(
            id=run.id,
            name="big-run",
            state=RunState.RUNNING,
            state_since=time.time(),
            attempt=2,
            created_at=time.time(),
            node_rank=0,
            nodes=[NodeRef(control="tcp://127.0.0.1:1")],
            nproc=8,
            launcher="torchrun",
        ),
    )
    n = 1_000_000
    started = time.perf_counter()
    batch = 10_000
    for first in range(0, n, batch):
        attempt = 1 if first < 600_000 else 2
        run.add_points(
            attempt,
            [
                {"step": s, "time": float(s), "values": {"loss": 2 * math.exp(-s / 2e5) + 0.05}}
                for s in range(first, first + batch)
            ],
        )
    ingest_s = time.perf_counter() - started
    series = run.metrics["loss"]
    from array import array

    xs = array("d", range(n))
    ys = array("d", (2 * math.exp(-s / 2e5) + 0.05 for s in range(n)))
    started = time.perf_counter()
    downsample(xs, ys, 300)
    raw_ms = (time.perf_counter() - started) * 1000
    app = GpuTop(model, refresh_s=3600, start_run=run.id)
    async with app.run_test(size=(160, 48)) as pilot:
        await pilot.pause()
        times = []
        for k in range(frames):
            # A new point each frame: the curve is downsampled again every time, as live.
            run.add_points(2, [{"step": n + k, "time": 0.0, "values": {"loss": 0.05}}])
            times.extend(await frame_times(app, pilot, 1, 0.0))
    return {
        "ingest_s": ingest_s,
        "stored": len(series),
        "compactions": series.compactions,
        "raw_downsample_ms": raw_ms,
        "frames": times,
    }


def _body_with(loads: Callable[[bytes], object], frames: list[bytes]) -> object:
    return loads(frames[1])


def decode_costs(plan: FleetPlan) -> list[tuple[str, float, float]]:
    """(decoder, µs per brief, µs per full snapshot) on one fleet node's real events:
    what gputop uses (pydantic, validated into the models), beside the stdlib's
    unvalidated `json.loads` and, where installed, orjson and msgspec (untyped)."""
    import importlib
    import json
    import timeit

    from tui.model.decode import decode

    plan.controls = plan.events = ["tcp://127.0.0.1:1"] * plan.nodes
    node = FakeNode(zmq.Context.instance(), plan, 0)
    runs = [FakeRun(plan, r) for r in range(plan.runs)]
    node.sample(runs)
    assert node.snapshot is not None
    mine = [(r.summary(r.nodes.index(0)), r.health()) for r in runs if 0 in r.nodes]
    events = (
        encode_event(sum_topic(node.name), 1, node_brief(node.snapshot, mine)),
        encode_event(hw_topic(node.name), 1, node.snapshot),
    )
    node.pub.close()
    node.router.close()
    decoders: list[tuple[str, Callable[[list[bytes]], object]]] = [
        ("pydantic, validated (gputop)", decode),
        ("json.loads, unvalidated", lambda frames: json.loads(frames[1])),
    ]
    for module, name in (("orjson", "loads"), ("msgspec.json", "decode")):
        try:
            loads = getattr(importlib.import_module(module), name)
        except ImportError:
            continue
        decoders.append((f"{module}, unvalidated", partial(_body_with, loads)))
    out = []
    for label, fn in decoders:
        brief_s, hw_s = (
            min(timeit.repeat(partial(fn, frames), number=300, repeat=5)) / 300 for frames in events
        )
        out.append((label, brief_s * 1e6, hw_s * 1e6))
    return out


LATENCY_PROBE = """
import time
import trainers

run = trainers.init()
time.sleep(1.0)  # gputop subscribes to the run once it is launched
for step in range({points}):
    run.log(step, sent=time.time(), loss=1.0 / (step + 1))
    time.sleep(0.02)
run.finish()
"""


def latency(tmp: Path, points: int) -> list[float]:
    """run.log() in a trainer launched by a real gpud → the value in gputop's model."""
    daemon = start_daemon(tmp, node="latency", simulate_gpus=2, interval=1.0)
    try:
        probe = tmp / "latency_probe.py"
        probe.write_text(LATENCY_PROBE.format(points=points))
        spec = tmp / "latency.yaml"
        spec.write_text(
            "name: latency-probe\nlauncher: python\nnproc_per_node: 1\n"
            "allow_outside_scheduler: true\n"
            f"script: latency_probe.py\nworkdir: {tmp}\nenv:\n  PYTHONPATH: {ROOT}\n"
        )
        targets = [Target(daemon.target())]
        model = FleetModel(targets)
        samples: list[float] = []

        def arrived(_key: str, event: RunMetricsEvent, now: float) -> None:
            for point in event.points:
                sent = (point.get("values") or {}).get("sent")
                if isinstance(sent, float):
                    samples.append(now - sent)

        model.on_metrics = arrived
        feed = Feed(model, targets)
        feed.start()
        try:
            key = targets[0].node.control
            deadline = time.monotonic() + 20
            while not model.online(key) and time.monotonic() < deadline:
                time.sleep(0.05)
            # On screen (as the run screen does): its every event is subscribed to.
            model.focus(launch(daemon, config=spec))
            deadline = time.monotonic() + 120
            while len(samples) < points and time.monotonic() < deadline:
                time.sleep(0.1)
        finally:
            feed.stop()
        return samples
    finally:
        daemon.stop()


# =============================================================================== report


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def row(label: str, result: str, target: str = "") -> None:
    print(f"| {label} | {result} | {target} |")


@dataclass
class AtScale:
    """One fleet size's figures."""

    nodes: int
    cpu_fleet: float | None
    feed_fleet: float | None
    cpu_run: float | None
    feed_run: float | None
    publisher_cpu: float
    rendered: dict[str, Any]
    screens: tuple[str, str]


def measure_fleet(args: argparse.Namespace, nodes: int, tmp: Path, keys: KeyPair) -> AtScale:
    config = tmp / "config"
    public, secret = zmq.curve_keypair()
    plan = FleetPlan(nodes, args.gpus, args.runs, args.rate, public, secret)
    spawn = multiprocessing.get_context("spawn")
    ready, ready_child = spawn.Pipe()
    stop = spawn.Event()
    fleet = spawn.Process(target=run_fleet, args=(plan, ready_child, stop), daemon=True)
    fleet.start()
    if not ready.poll(120):
        raise SystemExit("the fleet process did not start")
    plan.controls, plan.events = ready.recv()
    cluster = tmp / f"cluster-{nodes}.yaml"
    cluster.write_text(
        "nodes:\n"
        + "".join(
            f"  - {{address: '{plan.controls[i]}', events: '{plan.events[i]}',"
            f" server_key: '{public.decode()}', name: {plan.name(i)}}}\n"
            for i in range(nodes)
        )
    )
    targets = [
        Target(NodeTarget(plan.controls[i], public, plan.events[i], plan.name(i)))
        for i in range(nodes)
    ]
    fleet_ps = psutil.Process(fleet.pid)
    try:
        print(f"## {nodes} nodes", flush=True)
        before = fleet_ps.cpu_times()
        cpu_fleet, feed_fleet, screen_fleet = cpu_in_terminal(
            cluster, [], config, args.warmup, args.duration
        )
        cpu_run, feed_run, screen_run = cpu_in_terminal(
            cluster, ["--run", "run-00"], config, args.warmup, args.duration
        )
        after = fleet_ps.cpu_times()
        publisher_cpu = (after.user + after.system - before.user - before.system) / (
            2 * (args.warmup + args.duration)
        )
        rendered = asyncio.run(render_in_process(targets, keys, args.frames))
    finally:
        stop.set()
        fleet.join(10)
    return AtScale(
        nodes, cpu_fleet, feed_fleet, cpu_run, feed_run, publisher_cpu, rendered,
        (screen_fleet, screen_run),
    )  # fmt: skip


def share(value: float | None) -> str:
    return "n/a (no tmux)" if value is None else f"{value:.1%}"


def ms(times: list[tuple[float, float]]) -> str:
    cpu = [c * 1000 for _, c in times]
    wall = [w * 1000 for w, _ in times]
    return (
        f"{statistics.median(cpu):.1f} / {pct(cpu, 0.95):.1f} ms"
        f" ({statistics.median(wall):.1f} / {pct(wall, 0.95):.1f})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", default="64,256", help="fleet sizes, side by side")
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--runs", type=int, default=32)
    parser.add_argument("--rate", type=float, default=20.0, help="metric points/s per run")
    parser.add_argument("--duration", type=float, default=20.0, help="CPU window, seconds")
    parser.add_argument("--warmup", type=float, default=10.0)
    parser.add_argument("--frames", type=int, default=30)
    parser.add_argument("--latency-points", type=int, default=400)
    args = parser.parse_args()
    sizes = [int(n) for n in args.nodes.split(",")]

    with tempfile.TemporaryDirectory(prefix="tui-scale-") as tmp_name:
        tmp = Path(tmp_name)
        os.environ["GPUD_CONFIG_DIR"] = str(tmp / "config")
        keys, _ = load_or_create_client_keypair()
        print(
            f"# gputop at scale: {args.nodes} nodes × {args.gpus} GPUs, {args.runs} runs ×"
            f" {args.rate:g} metric points/s; Python {platform.python_version()},"
            f" {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at start",
            flush=True,
        )
        results = [measure_fleet(args, n, tmp, keys) for n in sizes]
        big = asyncio.run(million_points(args.frames))
        decodes = decode_costs(FleetPlan(64, args.gpus, args.runs, args.rate, *zmq.curve_keypair()))
        lat = latency(tmp, args.latency_points)

    for r in results:
        up_line = next((ln for ln in r.screens[0].splitlines() if "nodes up" in ln), "?")
        run_line = next((ln for ln in r.screens[1].splitlines() if "run-00" in ln), "?")
        print(f"{r.nodes} nodes, fleet screen in the terminal: {up_line.strip()[:100]}")
        print(f"{r.nodes} nodes, run screen in the terminal:   {run_line.strip()[:100]}")
        print(
            f"{r.nodes} nodes, in-process feed: {r.rendered['online']}/{r.nodes} nodes online,"
            f" {r.rendered['events_per_s']:.0f} events/s into the model;"
            f" publisher process {r.publisher_cpu:.0%} of a core"
        )
    print()
    print("| measure | " + " | ".join(f"{r.nodes} nodes" for r in results) + " | target |")
    print("|---|" + "---|" * len(results) + "---|")

    def line(label: str, cells: list[str], target: str) -> None:
        print(f"| {label} | " + " | ".join(cells) + f" | {target} |")

    line("gputop CPU, fleet screen (real terminal, 160×48)",
         [share(r.cpu_fleet) for r in results], "< 10%")  # fmt: skip
    line("  of which the feed (its threads)", [share(r.feed_fleet) for r in results], "")
    line("gputop CPU, run screen", [share(r.cpu_run) for r in results], "< 10%")
    line("  of which the feed", [share(r.feed_run) for r in results], "")
    line("frame, fleet screen: CPU median / p95 ms (wall)",
         [ms(r.rendered["fleet"]) for r in results], "p95 < 50 ms")  # fmt: skip
    line("frame, run screen: CPU median / p95 ms (wall)",
         [ms(r.rendered["run"]) for r in results], "p95 < 50 ms")  # fmt: skip
    line("events/s into the model (fleet screen)",
         [f"{r.rendered['events_per_s']:.0f}" for r in results], "")  # fmt: skip
    print()
    print("| measure | result | target |")
    print("|---|---|---|")
    row("frame, run screen, 1,000,000-point loss curve: CPU median / p95 (wall)",
        ms(big["frames"]), "< 50 ms")  # fmt: skip
    row(
        "  of which the stored curve",
        f"{big['stored']:,} points after {big['compactions']} compactions"
        f" (1,000,000 fed in {big['ingest_s']:.1f} s)",
    )
    row("  MinMax-LTTB of the raw 1,000,000 points to 300", f"{big['raw_downsample_ms']:.0f} ms")
    for label, brief_us, hw_us in decodes:
        row(f"decode one event, {label}: brief / full snapshot",
            f"{brief_us:.0f} / {hw_us:.0f} µs")  # fmt: skip
    if lat:
        lat_ms = [x * 1000 for x in lat]
        row(
            f"run.log() → gputop model, p50 / p99 ({len(lat)} points)",
            f"{pct(lat_ms, 0.5):.1f} / {pct(lat_ms, 0.99):.1f} ms",
            "p99 < 100 ms",
        )
    else:
        row("run.log() → gputop model", "no samples (the probe run did not report)", "")


if __name__ == "__main__":
    main()
