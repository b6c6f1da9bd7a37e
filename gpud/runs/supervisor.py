"""The supervisor: every run with a part on this node, from launch to the last check.

It owns the run and attempt records (persisted in the store), the `Part`s running here,
and — on node 0 of a run — the gang: it polls the other nodes' parts, stops the rest when
one fails, and starts new attempts for resume and automatic restart (`gang.py`).

Everything runs on the daemon's event loop: requests arrive through the control server,
trainer messages through the ingest, and `tick()` drives parts forward four times a
second. Slow or blocking work (calls to other daemons, scanning processes) goes to threads.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from pydantic import BaseModel

from gpud.auth import Caller, PeerKeys
from gpud.ingest import Ingest
from gpud.keys import KeyPair
from gpud.protocol import (
    ErrorCode,
    JoinReply,
    JoinRequest,
    LaunchReply,
    LaunchRequest,
    NodeRefIn,
    PartPlan,
    PartStartRequest,
    PartStatusRequest,
    PartStopRequest,
    ProtocolError,
    ResumeRequest,
    Role,
    RunSummary,
    StopRequest,
    run_topic,
)
from gpud.runmodel import (
    AttemptRecord,
    CheckpointRef,
    HeartbeatMessage,
    MetricPoint,
    NodeRef,
    ProbeMessage,
    RunEvent,
    RunRecord,
    RunState,
    TrainerMessage,
)
from gpud.runs import gang
from gpud.runs.logparse import MetricExtractor, classify, split_rank
from gpud.runs.part import Outcome, Part
from gpud.runs.peers import PeerLink
from gpud.runs.ports import NoFreePort, pick_port
from gpud.runs.telemetry import Telemetry
from gpud.snapshot import GpuSample, NodeSnapshot, Severity
from gpud.statedir import StateDir
from gpud.store import Store
from launch.autotune import recommend_for_node
from launch.backends import (
    Placement,
    build_command,
    resolve_hints,
    resolve_nproc,
)
from launch.spec import RunSpec, SpecError, parse_spec, require_absolute_paths

log = logging.getLogger("gpud.runs")

TICK_S = 0.25
STOP_RESEND_S = 1.0
PIDS_EVERY_S = 2.0

Publish = Callable[[str, BaseModel], None]


def _spec_of(run: RunRecord) -> RunSpec:
    return parse_spec(run.spec, f"run {run.id}")


def _ref(node: NodeRefIn) -> NodeRef:
    return NodeRef(control=node.control, server_key=node.server_key, name=node.name)


class Supervisor:
    def __init__(
        self,
        node: str,
        state: StateDir,
        store: Store,
        publish: Publish,
        ingest: Ingest,
        hardware: Callable[[], NodeSnapshot],
        sample_gpus: Callable[[], Awaitable[list[GpuSample]]],
        peer_keys: PeerKeys,
        keys: KeyPair | None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.node = node
        self.state = state
        self.store = store
        self.publish = publish
        self.ingest = ingest
        self.hardware = hardware
        self.sample_gpus = sample_gpus
        self.peer_keys = peer_keys
        self.keys = keys
        self.clock = clock
        self.runs: dict[str, RunRecord] = {}
        self.parts: dict[str, Part] = {}  # run id → this node's part of the current attempt
        self.peers: dict[str, PeerLink] = {}  # control address → link (node 0 only)
        self.views: dict[str, gang.GangView] = {}  # run id → the other nodes' parts
        self._extractors: dict[str, MetricExtractor] = {}
        self._last_stop_sent: dict[str, float] = {}
        self._last_pids: dict[str, float] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self.telemetry = Telemetry(self)

    # ================================================================== records

    def _save_run(self, run: RunRecord) -> RunRecord:
        self.runs[run.id] = run
        self.store.put_run(run)
        return run

    def _set_run_state(self, run: RunRecord, state: RunState, reason: str | None) -> RunRecord:
        if run.state == state and run.reason == reason:
            return run
        now = self.clock()
        run = self._save_run(
            run.model_copy(update={"state": state, "state_since": now, "reason": reason})
        )
        self.event(run, "state", f"{state.value}: {reason or ''}".rstrip(": "))
        self.publish(run_topic(run.id, "state"), self.summary(run))
        level = logging.WARNING if state is RunState.FAILED else logging.INFO
        log.log(
            level,
            "run %s (attempt %d): %s%s",
            run.id,
            run.attempt,
            state.value,
            f" — {reason}" if reason else "",
        )
        if state.terminal and run.is_coordinator:
            self.store.release_ports(run.id)
        return run

    def event(
        self,
        run: RunRecord,
        kind: str,
        message: str,
        severity: Severity = "info",
        **data: Any,
    ) -> None:
        event = RunEvent(
            run_id=run.id,
            attempt=run.attempt,
            time=self.clock(),
            node=self.node,
            kind=kind,
            severity=severity,
            message=message,
            data=data,
        )
        self.store.add_run_event(event)
        self.publish(run_topic(run.id, "event"), event)

    def summary(self, run: RunRecord) -> RunSummary:
        part = self.parts.get(run.id)
        attempt = part.record if part else None
        latest = self.store.latest_metrics(run.id)
        spec = run.spec
        return RunSummary(
            id=run.id,
            name=run.name,
            state=run.state,
            state_since=run.state_since,
            reason=run.reason,
            attempt=run.attempt,
            restarts=run.restarts,
            created_at=run.created_at,
            node_rank=run.node_rank,
            nodes=run.nodes,
            nproc=attempt.nproc if attempt else None,
            launcher=str(spec.get("launcher", "torchrun")),
            last_step=latest[0] if latest else run.last_step,
            max_steps=(spec.get("training") or {}).get("max_steps"),
            last_values=latest[1] if latest else {},
            last_checkpoint=run.last_checkpoint,
            next_restart_at=run.next_restart_at,
        )

    def find(self, ref: str) -> RunRecord:
        """A run by id, else the newest run of that name; ProtocolError not_found."""
        if ref in self.runs:
            return self.runs[ref]
        run = self.store.run(ref)
        if run is not None:
            return run
        named = [r for r in self.store.runs(limit=1000) if r.name == ref]
        if named:
            return named[0]
        raise ProtocolError(ErrorCode.NOT_FOUND, f"no run {ref!r} on node {self.node}")

    # ================================================================== start-up

    def adopt(self) -> None:
        """Take back the parts that kept running while the daemon was down."""
        for run in self.store.runs(active_only=True):
            self.runs[run.id] = run
            if run.coordinator is not None and run.coordinator.server_key:
                self.peer_keys.grant(run.coordinator.server_key, run.id)
        for record in self.store.active_attempts():
            owner = self.runs.get(record.run_id)
            if owner is None:
                continue
            run = owner
            part = Part(record, self.clock)
            self.parts[run.id] = part
            alive = part.shim_alive()
            what = (
                "re-adopted after a daemon restart"
                if alive
                else "ended while the daemon was down; settling from the shim's record"
            )
            self.event(run, "adopt", what)
            log.info("run %s: %s", run.id, "re-adopted" if alive else "settling after restart")
        # Gang state (and restarts due) are recomputed on the next tick.

    # ================================================================== requests

    def _caller_may_coordinate(self, run: RunRecord, caller: Caller) -> None:
        if caller.role is Role.PEER and (
            run.coordinator is None or caller.key != run.coordinator.server_key
        ):
            raise ProtocolError(
                ErrorCode.FORBIDDEN, f"your key does not coordinate run {run.id} on this node"
            )

    def _validated(self, data: dict[str, object]) -> RunSpec:
        try:
            spec = parse_spec(data, "spec")
            require_absolute_paths(spec)
        except SpecError as exc:
            raise ProtocolError(ErrorCode.INVALID_BODY, str(exc)) from None
        return spec

    def _placement(
        self,
        run: RunRecord,
        spec: RunSpec,
        attempt: int,
        master_addr: str,
        master_port: int,
        resume_from: str | None,
    ) -> Placement:
        snapshot = self.hardware()
        real_gpus = len(snapshot.gpus) if snapshot.backend == "nvml" else 0
        recommendation = recommend_for_node(snapshot) if spec.training.auto else None
        run_dir = Path(run.run_dir)
        return Placement(
            run_id=run.id,
            attempt=attempt,
            node_name=self.node,
            node_rank=run.node_rank,
            nnodes=len(run.nodes),
            nproc_per_node=resolve_nproc(spec, real_gpus),
            master_addr=master_addr,
            master_port=master_port,
            gpu_count=real_gpus,
            python=spec.python or _interpreter(),
            run_dir=str(run_dir),
            attempt_dir=str(run_dir / f"attempt-{attempt}"),
            checkpoint_dir=run.checkpoint_dir,
            ingest=self.ingest.ingest_endpoint,
            control=self.ingest.control_endpoint,
            resume_from=resume_from,
            hints=resolve_hints(spec.training, recommendation),
        )

    def _plan(self, run: RunRecord, spec: RunSpec, place: Placement) -> PartPlan:
        command = build_command(spec, place)
        return PartPlan(
            node_rank=run.node_rank,
            node=self.node,
            argv=command.argv,
            env=command.env,
            cwd=command.cwd,
            files=command.files,
        )

    def _new_run(
        self, run_id: str, spec: RunSpec, nodes: list[NodeRef], node_rank: int
    ) -> RunRecord:
        now = self.clock()
        run_dir = self.state.runs / run_id
        checkpoint_dir = spec.checkpoint.dir or str(run_dir / "checkpoints")
        return RunRecord(
            id=run_id,
            name=spec.name,
            created_at=now,
            spec=spec.model_dump(mode="json"),
            nodes=nodes,
            node_rank=node_rank,
            coordinator=None if node_rank == 0 else nodes[0],
            state=RunState.PENDING,
            state_since=now,
            run_dir=str(run_dir),
            checkpoint_dir=checkpoint_dir,
        )

    def _start_part(
        self,
        run: RunRecord,
        spec: RunSpec,
        attempt: int,
        master_addr: str,
        master_port: int,
        resume_from: str | None,
    ) -> Part:
        place = self._placement(run, spec, attempt, master_addr, master_port, resume_from)
        command = build_command(spec, place)
        Path(run.run_dir).mkdir(parents=True, exist_ok=True)
        Path(run.checkpoint_dir).mkdir(parents=True, exist_ok=True)
        now = self.clock()
        record = AttemptRecord(
            run_id=run.id,
            attempt=attempt,
            node_rank=run.node_rank,
            state=RunState.PENDING,
            state_since=now,
            master_addr=master_addr,
            master_port=master_port,
            nproc=place.nproc_per_node,
            attempt_dir=place.attempt_dir,
            resume_from=resume_from,
        )
        part = Part(record, self.clock)
        env = {k: v for k, v in os.environ.items() if not k.startswith("GPUD_")}
        env.update(command.env)
        try:
            part.spawn(command.argv, env, command.cwd, command.files)
        except OSError as exc:
            raise ProtocolError(ErrorCode.INTERNAL, f"cannot start the shim: {exc}") from None
        self.parts[run.id] = part
        self.store.put_attempt(part.record)
        extractor = MetricExtractor([m.pattern for m in spec.metrics])
        self._extractors[run.id] = extractor
        resumed = f", resuming from {resume_from}" if resume_from else ""
        self.event(
            run,
            "attempt",
            f"attempt {attempt} started: {place.nproc_per_node} process(es)"
            f" on {self.node}, master {master_addr}:{master_port}{resumed}",
        )
        return part

    async def launch(self, req: LaunchRequest, caller: Caller) -> LaunchReply:
        spec = self._validated(req.spec)
        nodes = [_ref(n) for n in req.nodes]
        master_addr = spec.master_addr or _host_of(nodes[0].control)
        run_id = f"{spec.name}-{secrets.token_hex(3)}"
        run = self._new_run(run_id, spec, nodes, node_rank=0)
        try:
            port = pick_port(self.store.leased_ports())
        except NoFreePort as exc:
            raise ProtocolError(ErrorCode.UNAVAILABLE, str(exc)) from None
        if req.dry_run:
            place = self._placement(run, spec, 1, master_addr, port, None)
            return LaunchReply(
                run=self.summary(run),
                master_addr=master_addr,
                master_port=port,
                plan=self._plan(run, spec, place),
            )
        self.store.lease_port(port, run_id, 1, self.clock())
        run = self._save_run(run)
        self.event(run, "launch", f"launched by {caller.name} on {len(nodes)} node(s)")
        self._start_part(run, spec, 1, master_addr, port, None)
        run = self._set_run_state(run, RunState.STARTING, f"attempt 1 on {len(nodes)} node(s)")
        self.views[run.id] = gang.GangView(run.nodes)
        return LaunchReply(run=self.summary(run), master_addr=master_addr, master_port=port)

    def join(self, req: JoinRequest, caller: Caller) -> JoinReply:
        spec = self._validated(req.spec)
        nodes = [_ref(n) for n in req.nodes]
        if req.node_rank >= len(nodes):
            raise ProtocolError(ErrorCode.INVALID_BODY, "node_rank is past the list of nodes")
        existing = self.runs.get(req.run_id) or self.store.run(req.run_id)
        if existing is not None and not req.dry_run:
            raise ProtocolError(ErrorCode.CONFLICT, f"run {req.run_id} already has a part here")
        run = self._new_run(req.run_id, spec, nodes, node_rank=req.node_rank)
        if req.dry_run:
            place = self._placement(run, spec, req.attempt, req.master_addr, req.master_port, None)
            return JoinReply(run=self.summary(run), plan=self._plan(run, spec, place))
        run = self._save_run(run.model_copy(update={"attempt": req.attempt}))
        if nodes[0].server_key:
            self.peer_keys.grant(nodes[0].server_key, run.id)
        self.event(run, "join", f"joined as node {req.node_rank} by {caller.name}")
        self._start_part(run, spec, req.attempt, req.master_addr, req.master_port, None)
        run = self._set_run_state(run, RunState.STARTING, f"attempt {req.attempt}")
        return JoinReply(run=self.summary(run))

    def part_start(self, req: PartStartRequest, caller: Caller) -> AttemptRecord:
        run = self.find(req.run_id)
        self._caller_may_coordinate(run, caller)
        current = self.parts.get(run.id)
        if current is not None and not current.record.state.terminal:
            raise ProtocolError(
                ErrorCode.CONFLICT, f"attempt {current.record.attempt} still runs on {self.node}"
            )
        run = self._save_run(
            run.model_copy(update={"attempt": req.attempt, "stop_requested": False})
        )
        part = self._start_part(
            run, _spec_of(run), req.attempt, req.master_addr, req.master_port, req.resume_from
        )
        self._set_run_state(run, RunState.STARTING, f"attempt {req.attempt}")
        return part.record

    def part_status(self, req: PartStatusRequest, caller: Caller) -> AttemptRecord:
        run = self.find(req.run_id)
        self._caller_may_coordinate(run, caller)
        part = self.parts.get(run.id)
        if part is not None:
            return part.record
        attempts = self.store.attempts(run.id)
        if not attempts:
            raise ProtocolError(ErrorCode.NOT_FOUND, f"run {run.id} has no attempt here yet")
        return attempts[-1]

    def part_stop(self, req: PartStopRequest, caller: Caller) -> AttemptRecord:
        run = self.find(req.run_id)
        self._caller_may_coordinate(run, caller)
        self._stop_own_part(run, force=req.force, reason=req.reason, grace_s=None)
        return self.part_status(PartStatusRequest(run_id=run.id), caller)

    def _stop_own_part(
        self, run: RunRecord, force: bool, reason: str, grace_s: float | None
    ) -> None:
        part = self.parts.get(run.id)
        if part is None or part.record.state.terminal:
            return
        spec = _spec_of(run)
        part.request_stop(spec.stop_grace_s if grace_s is None else grace_s, force)
        self.store.put_attempt(part.record)
        self.event(run, "stop", f"{'force-' if force else ''}stop on {self.node}: {reason}")
        if part.record.library and not force:
            self.ingest.request_stop(run.id, part.record.attempt, reason)
            self._last_stop_sent[run.id] = self.clock()
        if not run.state.terminal:
            self._set_run_state(run, RunState.STOPPING, reason)

    async def stop(self, req: StopRequest, caller: Caller) -> RunSummary:
        run = self.find(req.run)
        if run.state.terminal:
            return self.summary(run)
        reason = f"stop requested by {caller.name}"
        run = self._save_run(
            run.model_copy(update={"stop_requested": True, "next_restart_at": None})
        )
        if run.state is RunState.PENDING and run.id not in self.parts:
            run = self._set_run_state(run, RunState.STOPPED, f"{reason} (restart cancelled)")
            return self.summary(run)
        self._stop_own_part(run, req.force, reason, grace_s=None)
        if run.is_coordinator:
            await gang.stop_peers(self, run, req.force, reason)
        return self.summary(self.runs[run.id])

    async def resume(self, req: ResumeRequest, caller: Caller) -> RunSummary:
        run = self.find(req.run)
        if not run.is_coordinator:
            where = run.nodes[0].control.removeprefix("tcp://")
            raise ProtocolError(
                ErrorCode.CONFLICT, f"resume run {run.id} on node 0 ({where}), which coordinates it"
            )
        if not run.state.terminal:
            raise ProtocolError(
                ErrorCode.CONFLICT, f"run {run.id} is {run.state.value}; stop it before resuming"
            )
        if run.state is RunState.SUCCEEDED:
            raise ProtocolError(ErrorCode.CONFLICT, f"run {run.id} succeeded: nothing to resume")
        run = await gang.start_attempt(self, run, why=f"resumed by {caller.name}")
        return self.summary(run)

    # ================================================================== trainers

    def on_trainer_message(self, kind: str, message: TrainerMessage) -> None:
        run = self.runs.get(message.run)
        part = self.parts.get(message.run)
        if run is None or part is None or message.attempt != part.record.attempt:
            return  # a late message from an earlier attempt, or a stranger
        if isinstance(message, HeartbeatMessage):
            self.telemetry.heartbeat(run, message)
        elif isinstance(message, ProbeMessage):
            self.telemetry.probe(run, message)
        elif kind == "hello":
            if not part.record.library:
                part.update(library=True)
                self.store.put_attempt(part.record)
        elif kind == "metrics":
            point = MetricPoint(
                run_id=run.id,
                attempt=message.attempt,
                step=message.step,  # type: ignore[attr-defined]
                time=message.time,
                values=message.values,  # type: ignore[attr-defined]
            )
            self._record_metrics(run, [point])
        elif kind in ("checkpoint", "stopped"):
            path = getattr(message, "path", None) or getattr(message, "checkpoint", None)
            step = getattr(message, "step", None)
            if path:
                ref = CheckpointRef(path=path, step=step, time=message.time)
                self.runs[run.id] = self._save_run(run.model_copy(update={"last_checkpoint": ref}))
            if kind == "stopped":
                self.event(run, "checkpoint", f"stopped at step {step}; checkpoint {path}")
        elif kind == "finished":
            finished = getattr(message, "exit_code", 1) == 0
            if finished and not part.record.finished:  # every rank says so; record it once
                part.update(finished=True)
                self.store.put_attempt(part.record)

    def _record_metrics(self, run: RunRecord, points: list[MetricPoint]) -> None:
        self.store.add_metrics(points)
        last = max(p.step for p in points)
        if run.last_step is None or last > run.last_step:
            self.runs[run.id] = run.model_copy(update={"last_step": last})
        self.publish(
            run_topic(run.id, "metrics"),
            gang.metrics_event(run.id, points),
        )

    # ================================================================== the tick

    async def serve(self) -> None:
        while True:
            try:
                await self.tick()
            except Exception:
                log.exception("supervisor tick failed; continuing")
            await asyncio.sleep(TICK_S)

    async def tick(self) -> None:
        now = self.clock()
        for run_id, part in list(self.parts.items()):
            run = self.runs.get(run_id)
            if run is None:
                continue
            self._follow_log(run, part)
            if part.record.state.terminal:
                continue
            if now - self._last_pids.get(run_id, 0.0) >= PIDS_EVERY_S:
                self._last_pids[run_id] = now
                part.remember_pids()
            if part.record.stop_requested:
                self._keep_stopping(run, part, now)
            outcome = part.outcome()
            if outcome is not None:
                await self._settle(run, part, outcome)
        self.telemetry.tick(now)
        await gang.tick(self, now)

    def _follow_log(self, run: RunRecord, part: Part) -> None:
        lines = part.read_lines()
        if not lines:
            return
        record = part.record
        if record.state is RunState.STARTING:
            part.update(state=RunState.RUNNING, state_since=self.clock())
            if not run.state.terminal and run.state is not RunState.STOPPING:
                run = self._set_run_state(run, RunState.RUNNING, f"attempt {record.attempt}")
        self.store.put_attempt(part.record)
        self.publish(run_topic(run.id, "log"), gang.log_event(self.node, run, part, lines))
        extractor = self._extractors.get(run.id)
        points = []
        for line in lines:
            local, text = split_rank(line)
            trouble = classify(text)
            if trouble is not None:
                self.telemetry.trouble(run, record.attempt, trouble.kind, text.strip())
                rank = None if local is None else run.node_rank * record.nproc + local
                self.event(
                    run,
                    trouble.kind,
                    f"{trouble.meaning}: {text.strip()[:300]}",
                    trouble.severity,
                    rank=rank,
                )
            if extractor and run.node_rank == 0 and local in (None, 0):
                step, values = extractor.extract(text)
                if step is not None and values:
                    points.append(
                        MetricPoint(
                            run_id=run.id,
                            attempt=record.attempt,
                            step=step,
                            time=self.clock(),
                            values=values,
                        )
                    )
        if points:
            self._record_metrics(run, points)

    def _keep_stopping(self, run: RunRecord, part: Part, now: float) -> None:
        if part.record.library and now - self._last_stop_sent.get(run.id, 0.0) >= STOP_RESEND_S:
            # PUB/SUB has no memory: a rank that subscribed late still gets the request.
            self.ingest.request_stop(run.id, part.record.attempt, run.reason or "stop")
            self._last_stop_sent[run.id] = now
        signalled = part.escalate()
        if signalled:
            self.event(run, "stop", f"{signalled} on {self.node}")

    async def _settle(self, run: RunRecord, part: Part, outcome: Outcome) -> None:
        self._follow_log(run, part)
        now = self.clock()
        part.update(
            state=outcome.state,
            state_since=now,
            reason=outcome.reason,
            exit=outcome.exit,
            ended_at=now,
        )
        self.store.put_attempt(part.record)
        await self._check_nothing_left(run, part)
        if not run.is_coordinator:
            state = outcome.state
            self._set_run_state(self.runs[run.id], state, outcome.reason)
        # Node 0 folds this into the gang state on its next gang tick. A peer keeps the
        # coordinator's key: it may start the next attempt (resume, restart).

    async def _check_nothing_left(self, run: RunRecord, part: Part) -> None:
        """No process of the part may survive it, and none may hold GPU memory."""
        leftovers = await asyncio.to_thread(part.leftovers)
        if leftovers:
            await asyncio.to_thread(_kill, leftovers)
            self.event(
                run,
                "leftovers",
                f"{len(leftovers)} process(es) outlived the attempt and were killed: {leftovers}",
                "warning",
                pids=leftovers,
            )
        holders: list[str] = []
        checked = "simulated GPUs: no NVML check"
        if self.hardware().backend == "nvml":
            gpus = await self.sample_gpus()
            checked = "NVML"
            for gpu in gpus:
                for proc in gpu.processes or []:
                    if proc.pid in part.pids_seen or proc.pid in leftovers:
                        holders.append(f"pid {proc.pid} on GPU {gpu.index}")
        if holders:
            self.event(
                run,
                "gpu_memory",
                "GPU memory still held: " + ", ".join(holders),
                "critical",
                holders=holders,
            )
        else:
            self.event(
                run,
                "verified",
                f"no process of attempt {part.record.attempt} is left on "
                f"{self.node}; no GPU memory held by it ({checked})",
            )


def _kill(pids: list[int]) -> None:
    import signal

    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _host_of(endpoint: str) -> str:
    if not endpoint.startswith("tcp://"):
        return "127.0.0.1"
    host = urlsplit(endpoint).hostname or "127.0.0.1"
    return "127.0.0.1" if host in ("localhost", "0.0.0.0", "*") else host


def _interpreter() -> str:
    import sys

    return sys.executable
