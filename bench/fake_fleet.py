"""A fleet of fake gpud nodes for bench/tui_scale.py: each a real CURVE ROUTER and PUB
socket that answers gputop's requests and publishes, every second as gpud does, a
realistic snapshot, brief and run events, so gputop can be measured against hundreds of
nodes on one machine. `run_fleet` runs them in a process of their own.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from multiprocessing.synchronize import Event as EventType
from typing import Any

import zmq

from gpud.hardware.simulated import SimulatedLoad, SimulatedSampler
from gpud.model.run import HealthSummary, NodeRef, RankView, RunState
from gpud.model.snapshot import HostSample, NodeSnapshot
from gpud.security.roles import Role
from gpud.wire.brief import sum_topic
from gpud.wire.briefing import node_brief
from gpud.wire.envelope import ErrorCode, ProtocolError
from gpud.wire.node_messages import NodeEventsReply, NodeInfo
from gpud.wire.protocol import (
    RunLogEvent,
    RunMetricsEvent,
    decode_request,
    encode_error,
    encode_event,
    encode_reply,
    hw_topic,
    run_topic,
)
from gpud.wire.run_messages import LogChunk, MetricRow, MetricsReply, RunList, RunSummary

GIB = 2**30
HISTORY_ROWS = 5000  # what a fake node 0 answers to run.metrics


# =============================================================================== the fleet


@dataclass
class FleetPlan:
    nodes: int
    gpus: int
    runs: int
    rate: float  # metric points per second per run
    public: bytes
    secret: bytes
    controls: list[str] = field(default_factory=list)
    events: list[str] = field(default_factory=list)

    def name(self, i: int) -> str:
        return f"gpu-{'ab'[i * 2 // self.nodes]}{i:03d}"

    def run_nodes(self, r: int) -> list[int]:
        return [r, (r + self.nodes // 2) % self.nodes]


def _host(name: str) -> HostSample:
    return HostSample(
        hostname=name,
        cpu_count_logical=128,
        cpu_count_physical=64,
        cpu_percent=31.0,
        load_1m=20.0,
        memory_total_bytes=2048 * GIB,
        memory_used_bytes=400 * GIB,
        memory_available_bytes=1648 * GIB,
    )


def _endpoint(sock: zmq.Socket[bytes]) -> str:
    value = sock.get(zmq.LAST_ENDPOINT)
    return value.decode() if isinstance(value, bytes) else str(value)


class FakeNode:
    """One node: PUB for events, ROUTER for requests, both CurveZMQ servers."""

    def __init__(self, ctx: zmq.Context[zmq.Socket[bytes]], plan: FleetPlan, i: int) -> None:
        self.plan = plan
        self.i = i
        self.name = plan.name(i)
        self.pub = self._socket(ctx, zmq.PUB)
        self.router = self._socket(ctx, zmq.ROUTER)
        plan.events[i] = _endpoint(self.pub)
        plan.controls[i] = _endpoint(self.router)
        self.seq = 0
        self.started = time.time()
        self.runs = [r for r in range(plan.runs) if i in plan.run_nodes(r)]
        busy = bool(self.runs)
        pid0 = 10_000 + 100 * i

        def loads() -> dict[int, list[SimulatedLoad]]:
            if not busy:
                return {}
            return {
                g: [SimulatedLoad(pid0 + g, "python", 60 * GIB, 92.0)] for g in range(plan.gpus)
            }

        self.sampler = SimulatedSampler(plan.gpus, self.name, loads=loads)
        self.host = _host(self.name)
        self.snapshot: NodeSnapshot | None = None

    def _socket(self, ctx: zmq.Context[zmq.Socket[bytes]], kind: int) -> zmq.Socket[bytes]:
        sock = ctx.socket(kind)
        sock.curve_server = True
        sock.curve_secretkey = self.plan.secret
        sock.curve_publickey = self.plan.public
        sock.linger = 0
        sock.sndhwm = 10_000
        sock.bind_to_random_port("tcp://127.0.0.1")  # no race for ports with anyone
        return sock

    def publish(self, topic: str, body: Any) -> None:
        self.seq += 1
        self.pub.send_multipart(encode_event(topic, self.seq, body))

    def sample(self, runs: list[FakeRun]) -> None:
        now = time.time()
        self.snapshot = NodeSnapshot(
            node=self.name,
            seq=self.seq,
            time=now,
            interval_s=1.0,
            backend="simulated",
            simulated=True,
            driver_version="simulated",
            gpus=self.sampler.sample(),
            host=self.host,
        )
        self.publish(hw_topic(self.name), self.snapshot)
        mine = [(r.summary(r.nodes.index(self.i)), r.health()) for r in runs if self.i in r.nodes]
        self.publish(sum_topic(self.name), node_brief(self.snapshot, mine))


class FakeRun:
    def __init__(self, plan: FleetPlan, r: int) -> None:
        self.plan = plan
        self.id = f"run-{r:02d}"
        self.nodes = plan.run_nodes(r)
        self.step = HISTORY_ROWS
        self.created = time.time() - 3600

    def values(self, step: int) -> dict[str, float]:
        return {
            "loss": 0.1 + 2.0 * math.exp(-step / 4000) + 0.02 * math.sin(step / 13),
            "lr": 3e-4 * max(0.1, 1 - step / 200_000),
            "grad_norm": 0.8 + 0.2 * math.cos(step / 50),
            "tokens_per_s": 410_000.0 + 5000 * math.sin(step / 30),
        }

    def summary(self, node_rank: int) -> RunSummary:
        refs = [
            NodeRef(control=self.plan.controls[n], server_key=self.plan.public.decode())
            for n in self.nodes
        ]
        return RunSummary(
            id=self.id,
            name=self.id.rsplit("-", 1)[0],
            state=RunState.RUNNING,
            state_since=self.created,
            attempt=1,
            created_at=self.created,
            node_rank=node_rank,
            nodes=refs,
            nproc=self.plan.gpus,
            launcher="torchrun",
            last_step=self.step,
            max_steps=200_000,
            last_values=self.values(self.step),
        )

    def health(self) -> HealthSummary:
        now = time.time()
        ranks = [
            RankView(
                rank=k,
                node_rank=k // self.plan.gpus,
                local_rank=k % self.plan.gpus,
                pid=10_000 + 100 * self.nodes[k // self.plan.gpus] + k % self.plan.gpus,
                last_step=self.step,
                step_time_s=1 / self.plan.rate,
                heartbeat_age_s=0.3,
                progress_age_s=0.05,
                gpu_index=k % self.plan.gpus,
            )
            for k in range(self.plan.gpus * len(self.nodes))
        ]
        return HealthSummary(
            run_id=self.id,
            attempt=1,
            time=now,
            verdict="ok",
            backend="nccl",
            world_size=len(ranks),
            ranks=ranks,
        )


def answer(node: FakeNode, runs: list[FakeRun], frame: bytes) -> bytes:
    """The fake node's reply to one request frame."""
    try:
        req, method, body = decode_request(frame)
    except ProtocolError as exc:
        return encode_error(exc.request_id, exc.code, exc.message)
    mine = [run for run in runs if node.i in run.nodes]
    run_id = getattr(body, "run", None)
    run = next((r for r in mine if r.id == run_id), None)
    plan = node.plan
    reply: Any
    if method.name == "node.info":
        reply = NodeInfo(
            node=node.name,
            version="bench",
            protocol=1,
            pid=os.getpid(),
            started_at=node.started,
            uptime_s=time.time() - node.started,
            control=plan.controls[node.i],
            events=plan.events[node.i],
            backend="simulated",
            simulated=True,
            gpu_count=plan.gpus,
            gpu_name="NVIDIA H100 80GB HBM3",
            secure=True,
            role=Role.OPERATOR,
        )
    elif method.name == "node.hw" and node.snapshot is not None:
        reply = node.snapshot
    elif method.name == "node.events":
        reply = NodeEventsReply(events=[])
    elif method.name == "run.list":
        reply = RunList(runs=[r.summary(r.nodes.index(node.i)) for r in mine])
    elif run is not None and method.name == "run.metrics":
        now = time.time()
        rows = [
            MetricRow(
                attempt=1, step=s, time=now - (run.step - s) / plan.rate, values=run.values(s)
            )
            for s in range(0, run.step, max(1, run.step // HISTORY_ROWS))
        ]
        reply = MetricsReply(run_id=run.id, rows=rows)
    elif run is not None and method.name == "run.health":
        reply = run.health()
    elif run is not None and method.name == "run.logs":
        lines = [f"[default{k % 8}]:step {run.step - k} loss 0.1" for k in range(50, 0, -1)]
        reply = LogChunk(
            run_id=run.id,
            node=node.name,
            node_rank=run.nodes.index(node.i),
            attempt=1,
            offset=0,
            next_offset=4096,
            size=4096,
            lines=lines,
            ended=False,
        )
    else:
        return encode_error(req.id, ErrorCode.NOT_FOUND, f"bench: no answer to {method.name}")
    return encode_reply(req.id, reply)


def run_fleet(plan: FleetPlan, ready: Connection, stop: EventType) -> None:
    """The fleet process: publish on schedule, answer requests in between."""
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    plan.controls = [""] * plan.nodes
    plan.events = [""] * plan.nodes
    nodes = [FakeNode(ctx, plan, i) for i in range(plan.nodes)]
    runs = [FakeRun(plan, r) for r in range(plan.runs)]
    poller = zmq.Poller()
    for node in nodes:
        poller.register(node.router, zmq.POLLIN)
    by_socket = {node.router: node for node in nodes}
    start = time.monotonic()
    next_hw = [start + i / plan.nodes for i in range(plan.nodes)]
    next_point = [start + r / (plan.runs * plan.rate) for r in range(plan.runs)]
    next_second = [start + r / plan.runs for r in range(plan.runs)]
    log_offsets = [0] * plan.runs
    ready.send((plan.controls, plan.events))
    while not stop.is_set():
        now = time.monotonic()
        for i, due in enumerate(next_hw):
            if now >= due:
                nodes[i].sample(runs)
                next_hw[i] = due + 1.0
        for r, due in enumerate(next_point):
            if now >= due:
                run = runs[r]
                run.step += 1
                point = {"step": run.step, "time": time.time(), "values": run.values(run.step)}
                event = RunMetricsEvent(run_id=run.id, attempt=1, points=[point])
                nodes[run.nodes[0]].publish(run_topic(run.id, "metrics"), event)
                next_point[r] = due + 1.0 / plan.rate
        for r, due in enumerate(next_second):
            if now >= due:
                run = runs[r]
                lead = nodes[run.nodes[0]]
                lead.publish(run_topic(run.id, "health"), run.health())
                for node_rank, n in enumerate(run.nodes):
                    nodes[n].publish(run_topic(run.id, "state"), run.summary(node_rank))
                    log_offsets[r] += 120
                    lines = [f"[default{k}]:step {run.step} loss 0.1 tok/s 4.1e5" for k in (0, 1)]
                    log = RunLogEvent(
                        node=nodes[n].name,
                        node_rank=node_rank,
                        attempt=1,
                        offset=4096 + log_offsets[r],
                        lines=lines,
                    )
                    nodes[n].publish(run_topic(run.id, "log"), log)
                next_second[r] = due + 1.0
        wait = min(*next_hw, *next_point, *next_second) - time.monotonic()
        for sock, _ in poller.poll(max(0, int(wait * 1000))):
            identity, frame = sock.recv_multipart()
            node = by_socket[sock]
            node.router.send_multipart([identity, answer(node, runs, frame)])
    ctx.destroy(linger=0)
