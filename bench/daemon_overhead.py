"""What a gpud daemon costs: idle CPU and RSS, and control-socket throughput.

Starts a real `gpud serve` with 8 simulated GPUs at a 1 s interval and one subscriber on
its events, and measures over `--duration` seconds (default 60):

- CPU seconds per wall second of the daemon process, and its RSS;
- requests per second on the control socket (node.info, pipelined from a raw DEALER),
  with CurveZMQ, then the same against an `--insecure` daemon, side by side, as a ratio;
- round-trip latency through the real `Client` class, for context;
- webhook alerts (issue 23 §4): with 4 runs and one alert a second (a run that fails,
  launched every second) to a receiver that answers after 2 s, the daemon's CPU and
  node.info latency beside the same load with no webhooks (`--webhooks-only` runs just this),
  and what the goodput accounting of those runs cost (issue 23 §2, the daemon's ledger).

Targets (issue 2, issue 22 §5): under 0.5% of a core idle, under 80 MB RSS, at least
5,000 authenticated status requests per second. The idle CPU is split by component, as
the daemon itself accounts it (`gpud.node.ledger`, read from `node.info` before and after the
window): sampler, snapshot, brief, supervision, store, housekeeping, and the rest.

    .venv/bin/python bench/daemon_overhead.py [--duration 60] [--requests 30000]
    .venv/bin/python bench/daemon_overhead.py --webhooks-only [--duration 60] [--rounds 1]
    .venv/bin/python bench/daemon_overhead.py --idle-only [--duration 60] [--runs 3]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import psutil
import yaml
import zmq

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gpud.model.run import HealthSummary  # noqa: E402
from gpud.security.keys import load_client_keypair  # noqa: E402
from gpud.wire.brief import sum_topic  # noqa: E402
from gpud.wire.briefing import node_brief  # noqa: E402
from gpud.wire.client import Client, RequestFailed  # noqa: E402
from gpud.wire.node_messages import Empty  # noqa: E402
from gpud.wire.protocol import NODE_INFO, encode_event, encode_request, hw_topic  # noqa: E402
from gpud.wire.run_messages import RunSummary  # noqa: E402
from launch.gpuctl.context import Ctl  # noqa: E402
from launch.gpuctl.launching import start as start_run  # noqa: E402
from launch.spec import load_spec  # noqa: E402
from tests.support.daemons import RunningDaemon, free_port, gpuctl, start_daemon  # noqa: E402
from tests.support.probe import Prober  # noqa: E402
from tests.support.webhooks import Receiver  # noqa: E402

#: Each component's share of a core over the last `idle_cost` window (gpud.node.ledger), and
#: what none claims ("the rest": zmq's threads, the event loop, requests, GC).
LAST_COMPONENTS: dict[str, float] = {}


def component_cpu(daemon: RunningDaemon) -> tuple[float, dict[str, float]]:
    """The daemon's own account: (its CPU seconds, by component), from node.info."""
    with Client(daemon.target()) as client:
        info = client.node_info()
    return info.cpu_seconds or 0.0, dict(info.cpu_by_component)


def idle_cost(daemon: RunningDaemon, duration: float) -> tuple[float, float, int]:
    """(CPU s per wall s, RSS MB, snapshots seen by one subscriber) over `duration`; each
    component's share is left in `LAST_COMPONENTS`."""
    proc = psutil.Process(daemon.proc.pid)
    seen = 0
    stop = threading.Event()

    def subscribe() -> None:
        nonlocal seen
        with Client(daemon.target()) as client, client.subscribe("hw.") as sub:
            while not stop.is_set():
                if sub.recv(timeout_s=0.5) is not None:
                    seen += 1

    thread = threading.Thread(target=subscribe, daemon=True)
    thread.start()
    time.sleep(2.0)  # let start-up work settle before the window opens
    seen_before = seen
    _, parts_before = component_cpu(daemon)
    before = proc.cpu_times()
    start = time.monotonic()
    time.sleep(duration)
    after = proc.cpu_times()
    wall = time.monotonic() - start
    _, parts_after = component_cpu(daemon)
    rss = proc.memory_info().rss / 1e6
    seen -= seen_before
    stop.set()
    thread.join()
    cpu = (after.user + after.system) - (before.user + before.system)
    LAST_COMPONENTS.clear()
    for name, seconds in parts_after.items():
        LAST_COMPONENTS[name] = (seconds - parts_before.get(name, 0.0)) / wall
    LAST_COMPONENTS["the rest"] = cpu / wall - sum(LAST_COMPONENTS.values())
    return cpu / wall, rss, seen


def print_components(indent: str = "    ", parts: dict[str, float] | None = None) -> None:
    """A window's CPU by component (the last one's by default), largest first, as % of a
    core."""
    for name, share in sorted((parts or LAST_COMPONENTS).items(), key=lambda kv: -kv[1]):
        print(f"{indent}{name:<14}{share * 100:7.3f} % of a core")


def throughput(daemon: RunningDaemon, requests: int, window: int = 64) -> float:
    """node.info requests per second, `window` in flight, replies counted not parsed."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.linger = 0
    target = daemon.target()
    if target.server_key is not None:
        keys = load_client_keypair()
        assert keys is not None and keys.secret is not None
        sock.curve_serverkey = target.server_key
        sock.curve_publickey, sock.curve_secretkey = keys.public, keys.secret
    sock.connect(target.control)
    frames = [encode_request(f"b{i}", NODE_INFO, Empty()) for i in range(requests)]
    # Warm-up: handshake and caches.
    for frame in frames[:200]:
        sock.send(frame)
    for _ in range(200):
        sock.recv()
    sent = received = 0
    start = time.perf_counter()
    while received < requests:
        while sent < requests and sent - received < window:
            sock.send(frames[sent])
            sent += 1
        sock.recv()
        received += 1
    elapsed = time.perf_counter() - start
    ctx.destroy(linger=0)
    return requests / elapsed


def latency_ms(daemon: RunningDaemon, count: int = 500) -> float:
    """Median round trip of node.info through the real Client, one at a time."""
    with Client(daemon.target()) as client:
        client.node_info()
        samples = []
        for _ in range(count):
            t = time.perf_counter()
            client.node_info()
            samples.append((time.perf_counter() - t) * 1000)
    return statistics.median(samples)


def launch_sleepers(daemon: RunningDaemon, tmp: Path, count: int, gpus: int = 2) -> list[str]:
    """`count` runs of one sleeping process each, on `gpus` GPUs each: runs for /metrics
    to list and for the daemon to supervise."""
    script = tmp / "sleeper.py"
    script.write_text("import time\ntime.sleep(3600)\n")
    spec = tmp / "sleeper.yaml"
    spec.write_text(f"name: sleeper\nlauncher: python\nscript: {script}\ngpus: {gpus}\n")
    ids = []
    for _ in range(count):
        result = gpuctl("--node", daemon.address, "--json", "launch", str(spec))
        assert result.returncode == 0, result.stderr
        ids.append(json.loads(result.stdout)["run"]["id"])
    return ids


def scrape_cost(daemon: RunningDaemon, url: str, count: int = 200) -> tuple[float, float, int]:
    """(median ms per scrape, daemon CPU ms per scrape, bytes) over `count` scrapes."""
    proc = psutil.Process(daemon.proc.pid)
    urllib.request.urlopen(url, timeout=10).read()
    before = proc.cpu_times()
    took = []
    size = 0
    for _ in range(count):
        t = time.perf_counter()
        with urllib.request.urlopen(url, timeout=10) as reply:
            size = len(reply.read())
        took.append((time.perf_counter() - t) * 1000)
    after = proc.cpu_times()
    cpu = (after.user + after.system) - (before.user + before.system)
    return statistics.median(took), cpu * 1000 / count, size


def idle_with_scrapes(daemon: RunningDaemon, url: str, duration: float, every: float) -> float:
    """The daemon's CPU (share of a core) over `duration`, scraped every `every` seconds."""
    stop = threading.Event()

    def scraper() -> None:
        while not stop.wait(every):
            urllib.request.urlopen(url, timeout=10).read()

    thread = threading.Thread(target=scraper, daemon=True)
    thread.start()
    try:
        cpu, _, _ = idle_cost(daemon, duration)
    finally:
        stop.set()
        thread.join()
    return cpu


def brief_cost(daemon: RunningDaemon, count: int = 2000) -> tuple[float, float, int, int]:
    """(µs to build and encode the node's brief, µs to encode its full snapshot, their
    sizes): what the daemon does each interval for `sum.<node>` (issue 13) beside what it
    always did for `hw.<node>`, timed here on the daemon's own snapshot and runs."""
    with Client(daemon.target()) as client:
        snapshot = client.node_hw()
        runs: list[tuple[RunSummary, HealthSummary | None]] = []
        for summary in client.runs().runs:
            try:
                health: HealthSummary | None = client.run_health(summary.id)
            except RequestFailed:
                health = None
            runs.append((summary, health))
    node = snapshot.node

    def best(work: Callable[[], object]) -> float:
        times = []
        for _ in range(5):
            started = time.perf_counter()
            for _ in range(count):
                work()
            times.append((time.perf_counter() - started) / count * 1e6)
        return min(times)

    brief_frames = encode_event(sum_topic(node), 1, node_brief(snapshot, runs))
    brief_us = best(lambda: encode_event(sum_topic(node), 1, node_brief(snapshot, runs)))
    hw_us = best(lambda: encode_event(hw_topic(node), 1, snapshot))
    hw_size = len(encode_event(hw_topic(node), 1, snapshot)[1])
    return brief_us, hw_us, len(brief_frames[1]), hw_size


def alert_load(tmp: Path, gpus: int, duration: float, receiver: Receiver | None,
               node: str) -> tuple[float, Prober, int, float]:  # fmt: skip
    """A daemon with 4 runs and a run that fails launched every second (one `failed` alert
    a second), with webhooks to `receiver` or none: (daemon CPU, the prober's latencies
    of node.info meanwhile, runs launched, the goodput accounting's CPU as the daemon's
    ledger charged it), each per wall second."""
    extra: tuple[str, ...] = ()
    if receiver is not None:
        config = tmp / f"{node}.yaml"
        config.write_text(yaml.safe_dump({"notify": [{"url": receiver.url, "format": "slack"}]}))
        extra = ("--config", str(config))
    daemon = start_daemon(tmp, node=node, simulate_gpus=gpus, interval=1.0, extra=extra)
    sleepers: list[str] = []
    try:
        sleepers = launch_sleepers(daemon, tmp, 4, gpus=1)
        script = tmp / "fails.py"
        script.write_text("raise SystemExit('bad shard 17')\n")
        spec_path = tmp / "fails.yaml"
        spec_path.write_text(f"name: fails\nlauncher: python\nscript: {script}\ngpus: 1\n")
        spec = load_spec(spec_path)
        ctl = Ctl(nodes=[daemon.address], json=True, timeout=10.0)
        target = daemon.target()
        time.sleep(3.0)
        proc = psutil.Process(daemon.proc.pid)
        launched = 0
        with Prober(daemon) as prober:
            _, parts_before = component_cpu(daemon)
            before = proc.cpu_times()
            began = time.monotonic()
            while (elapsed := time.monotonic() - began) < duration:
                start_run(ctl, spec, [target])
                launched += 1
                time.sleep(max(0.0, launched - (time.monotonic() - began)))
            after = proc.cpu_times()
            _, parts_after = component_cpu(daemon)
        cpu = (after.user + after.system) - (before.user + before.system)
        goodput = parts_after.get("goodput", 0.0) - parts_before.get("goodput", 0.0)
        return cpu / elapsed, prober, launched, goodput / elapsed
    finally:
        for run_id in sleepers:
            gpuctl("--node", daemon.address, "stop", run_id, "--force")
        daemon.stop()


def per_alert_cpu_ms(count: int = 300) -> tuple[float, float]:
    """(CPU ms per alert, of which the loop's share): what one `failed` alert costs the
    daemon's threads: on its loop, the alert from the run record and the Slack body; on a
    sender thread, the POST to a local receiver (answering at once). Thread CPU time, so
    the receiver in this process does not count."""
    from gpud.model.run import CauseKind, FailureCause, NodeRef, RunRecord, RunState
    from gpud.notify.alerts import run_ended
    from gpud.notify.payloads import render
    from gpud.notify.sender import http_post

    run = RunRecord(
        id="train-3f9a2c", name="train", created_at=0.0, spec={"name": "train"},
        nodes=[NodeRef(control="tcp://gpu-a:7711")], node_rank=0, state=RunState.FAILED,
        state_since=1.0, run_dir="/tmp/r", checkpoint_dir="/tmp/c", attempt=2,
        cause=FailureCause(kind=CauseKind.USER, summary="ValueError: bad shard 17", rank=1,
                           node="gpu-b", step=40, attempt=2, hint="look at shard 17"),
    )  # fmt: skip
    loop_s = post_s = 0.0

    def work(url: str) -> None:
        nonlocal loop_s, post_s
        http_post(url, b"{}", 5.0)  # warm-up
        for _ in range(count):
            began = time.thread_time()
            alert = run_ended(run, "gpu-a", "gpu-a:7711")
            assert alert is not None
            body = render(alert, "slack")
            built = time.thread_time()
            http_post(url, body, 5.0)
            loop_s += built - began
            post_s += time.thread_time() - built

    with Receiver() as receiver:
        thread = threading.Thread(target=work, args=(receiver.url,))
        thread.start()
        thread.join()
    return (loop_s + post_s) * 1000 / count, loop_s * 1000 / count


def webhooks_side_by_side(tmp: Path, gpus: int, duration: float, rounds: int = 1) -> None:
    """No webhooks, then webhooks, `rounds` times in turn (machine noise hits both alike);
    the sum of the rounds' CPU and the probes' latencies taken together."""
    delay = 2.0
    print(f"webhooks: {gpus} simulated GPUs, 4 runs, one run failing a second (one alert a"
          f" second), {rounds} x {duration:.0f} s each side in turn, node.info asked every"
          " 20 ms meanwhile")  # fmt: skip
    cpu = {False: 0.0, True: 0.0}
    goodput = {False: 0.0, True: 0.0}
    latencies: dict[bool, list[float]] = {False: [], True: []}
    launched = 0
    with Receiver(delay_s=delay) as receiver:
        for n in range(rounds):
            for hooks in (False, True):
                used, probe, count, accounting = alert_load(
                    tmp, gpus, duration, receiver if hooks else None, f"r{n}-{int(hooks)}"
                )
                cpu[hooks] += used / rounds
                goodput[hooks] += accounting / rounds
                latencies[hooks] += probe.latencies
                launched += count if hooks else 0
        deadline = time.monotonic() + 10
        while receiver.count() < launched and time.monotonic() < deadline:
            time.sleep(0.2)

    def pct(values: list[float], q: float) -> float:
        ordered = sorted(values)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000 if ordered else 0.0

    labels = {False: "no webhooks", True: f"Slack webhook, answers after {delay:g} s"}
    for hooks, label in labels.items():
        print(f"  {label:38} daemon CPU {cpu[hooks] * 100:5.2f} % of a core;"
              f" node.info median {pct(latencies[hooks], 0.5):5.2f} ms,"
              f" p99 {pct(latencies[hooks], 0.99):6.2f} ms,"
              f" slowest {pct(latencies[hooks], 1.0):4.0f} ms")  # fmt: skip
    quiet, loud = cpu[False], cpu[True]
    print(f"  webhooks add {(loud - quiet) * 100:+5.2f} % of a core (ratio"
          f" {loud / quiet if quiet else float('nan'):.2f}); p99 ratio"
          f" {pct(latencies[True], 0.99) / pct(latencies[False], 0.99):.2f};"
          f" {receiver.count()} of {launched} alerts received")  # fmt: skip
    share = sum(goodput.values()) / sum(cpu.values()) if sum(cpu.values()) else 0.0
    print(f"  goodput accounting (node 0's clocks of 4 live runs and a new run a second)"
          f": {sum(goodput.values()) / 2 * 100:.3f} % of a core, {share:.1%}"
          " of the daemon's CPU (its own ledger)")  # fmt: skip
    each, on_loop = per_alert_cpu_ms()
    print(f"  one alert: {each:.2f} ms of the daemon's CPU ({on_loop:.2f} ms on its loop, the"
          f" rest on a sender thread): {each / 10:.3f} % of a core at one a second")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=60.0, help="idle window, seconds")
    parser.add_argument("--requests", type=int, default=30_000, help="requests per run")
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument(
        "--webhooks-only", action="store_true", help="only the webhook scenario (issue 23 §4)"
    )
    parser.add_argument("--rounds", type=int, default=1, help="webhook scenario: rounds")
    parser.add_argument("--runs", type=int, default=3, help="--idle-only: windows (median)")
    parser.add_argument(
        "--idle-only", action="store_true", help="only the idle cost, split by component"
    )
    parser.add_argument(
        "--real", action="store_true", help="with --idle-only: this box's GPUs through NVML"
    )
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="gpud-bench-") as tmp:
        os.environ["GPUD_CONFIG_DIR"] = str(Path(tmp) / "config")
        if args.webhooks_only:
            print(
                f"machine: {platform.node()}, {os.cpu_count()} cores, "
                f"Python {platform.python_version()}"
            )
            webhooks_side_by_side(Path(tmp), args.gpus, args.duration, args.rounds)
            return
        if args.idle_only:
            # Issue 33 §7: the median of `--runs` windows, each on a fresh daemon, each
            # printed with the machine's load beside it (a busy machine inflates them all).
            gpus = None if args.real else args.gpus
            what = "this box's GPUs (NVML)" if args.real else f"{args.gpus} simulated GPUs"
            runs: list[tuple[float, float, dict[str, float]]] = []
            for i in range(args.runs):
                idle = start_daemon(Path(tmp), node=f"idle{i}", simulate_gpus=gpus, interval=1.0)
                try:
                    cpu, rss, _ = idle_cost(idle, args.duration)
                finally:
                    idle.stop()
                load = os.getloadavg()[0]
                print(
                    f"run {i + 1}: {cpu * 100:.3f} % of a core, {rss:.1f} MB"
                    f" (load average {load:.2f} over the last minute)"
                )
                runs.append((cpu, rss, dict(LAST_COMPONENTS)))
            cpu, rss, parts = sorted(runs, key=lambda r: r[0])[len(runs) // 2]
            print(
                f"idle daemon, {what}, 1 s interval, 1 subscriber, {args.duration:.0f} s,"
                f" median of {len(runs)}: {cpu * 100:.3f} % of a core, {rss:.1f} MB; of which:"
            )
            print_components(parts=parts)
            return
        secure = start_daemon(Path(tmp), node="secure", simulate_gpus=args.gpus, interval=1.0)
        insecure = start_daemon(
            Path(tmp),
            node="insecure",
            simulate_gpus=args.gpus,
            interval=1.0,
            extra=("--insecure",),
        )
        try:
            print(
                f"machine: {platform.node()}, {os.cpu_count()} cores, "
                f"{psutil.virtual_memory().total / 2**30:.0f} GiB, "
                f"Python {platform.python_version()}"
            )
            print(
                f"idle window: {args.duration:.0f} s, {args.gpus} simulated GPUs, 1 s interval, "
                "1 subscriber"
            )
            cpu, rss, seen = idle_cost(secure, args.duration)
            print(f"  daemon CPU        {cpu * 100:6.2f} % of a core   (target < 0.5 %), of which:")
            print_components()
            print(f"  daemon RSS        {rss:6.1f} MB            (target < 80 MB)")
            print(f"  snapshots seen    {seen:6d}               (expected ~{args.duration:.0f})")
            print(f"control socket: node.info x {args.requests}, 64 in flight")
            # Interleave the two so machine noise hits both alike; keep the best of 3 each.
            curve_runs, plain_runs = [], []
            for _ in range(3):
                curve_runs.append(throughput(secure, args.requests))
                plain_runs.append(throughput(insecure, args.requests))
            curve, plain = max(curve_runs), max(plain_runs)
            print(f"  CurveZMQ          {curve:8,.0f} req/s       (target >= 5,000)")
            print(f"  --insecure        {plain:8,.0f} req/s")
            print(f"  ratio curve/plain {curve / plain:8.2f}")
            print(
                f"  Client round trip {latency_ms(secure):8.3f} ms median (one at a time, CurveZMQ)"
            )
        finally:
            for daemon in (secure, insecure):
                daemon.stop()
        port = free_port()
        scraped = start_daemon(
            Path(tmp),
            node="scraped",
            simulate_gpus=args.gpus,
            interval=1.0,
            extra=("--metrics", f"127.0.0.1:{port}"),
        )
        url = f"http://127.0.0.1:{port}/metrics"
        sleepers: list[str] = []
        try:
            sleepers = launch_sleepers(scraped, Path(tmp), 4)
            time.sleep(3.0)
            print(f"/metrics: {args.gpus} simulated GPUs, 4 runs, side by side with the above")
            median, cpu_ms, size = scrape_cost(scraped, url)
            print(f"  one scrape        {median:8.2f} ms median, {cpu_ms:.2f} ms of daemon CPU,"
                  f" {size / 1024:.0f} KiB   (target < 5 ms)")  # fmt: skip
            # The same daemon and runs, unscraped then scraped every 15 s: the difference is
            # what serving /metrics costs.
            quiet, _, _ = idle_cost(scraped, args.duration)
            with_scrapes = idle_with_scrapes(scraped, url, args.duration, 15.0)
            print(
                f"  daemon CPU, 4 runs, not scraped      {quiet * 100:5.2f} % of a core, of which:"
            )
            print_components()
            print(f"  daemon CPU, 4 runs, scraped every 15 s {with_scrapes * 100:5.2f} % of a core"
                  f" (ratio {with_scrapes / quiet if quiet else float('nan'):.2f})")  # fmt: skip
            print(f"  scraping adds     {(with_scrapes - quiet) * 100:+5.2f} % of a core"
                  "   (target < 1 %)")  # fmt: skip
            brief_us, hw_us, brief_size, hw_size = brief_cost(scraped)
            print(f"node brief (sum.<node>, issue 13): {args.gpus} GPUs, 4 runs, each interval")
            print(f"  build + encode    {brief_us:8.0f} µs, {brief_size / 1024:.1f} KiB"
                  f"   ({brief_us / 1e4:.3f} % of a core at 1 s)")  # fmt: skip
            print(f"  full snapshot     {hw_us:8.0f} µs, {hw_size / 1024:.1f} KiB  (encode only,"
                  f" as before briefs; ratio brief/snapshot {brief_us / hw_us:.2f})")  # fmt: skip
        finally:
            for run_id in sleepers:
                gpuctl("--node", scraped.address, "stop", run_id, "--force")
            scraped.stop()
        webhooks_side_by_side(Path(tmp), args.gpus, args.duration, args.rounds)


if __name__ == "__main__":
    main()
