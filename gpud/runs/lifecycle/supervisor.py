"""The supervisor: this node's parts of runs, from launch to the last check.

It serves the run requests (launch, join, stop, resume and the part calls node 0 makes),
starts and stops this node's `Part`s, follows their logs and settles their endings. The
run records and every state change live in the `RunBook` (`book.py`); node 0's gang logic
(polling the other nodes, lost parts, failure propagation, restarts) in `Gang`
(`gang.py`), which starts and stops this node's part through `start_part`/`stop_part`;
what the parts print and the trainers send is taken in by `Intake` (`intake.py`), and
hangs are found by `HangWatch` (`hangs.py`).

Everything runs on the daemon's event loop: requests arrive through the control server,
trainer messages through the ingest, and `tick()` drives parts forward four times a
second. Slow or blocking work (calls to other daemons, scanning processes) goes to threads.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from gpud.model.run import (
    AttemptRecord,
    NodeRef,
    RunRecord,
    RunState,
    can_move,
    new_run_id,
)
from gpud.model.snapshot import GpuSample, NodeSnapshot
from gpud.node.ledger import CpuLedger, next_beat
from gpud.node.statedir import StateDir
from gpud.node.store import Store
from gpud.runs.health.goodput import GoodputKeeper
from gpud.runs.health.hangs import HangWatch
from gpud.runs.health.intake import Intake
from gpud.runs.health.telemetry import Telemetry
from gpud.runs.lifecycle.aftermath import check_nothing_left, explained
from gpud.runs.lifecycle.attached import AttachConfig, AttachedRuns, refuse_control
from gpud.runs.lifecycle.queries import Queries
from gpud.runs.lifecycle.starting import PartStarter
from gpud.runs.multinode import gang
from gpud.runs.placement.gpus import Gpu
from gpud.runs.placement.leases import GpuLeases
from gpud.runs.placement.ports import PORT_RANGE, NoFreePort, master_host, pick_port
from gpud.runs.state.book import Publish, RunBook, check_coordinator, check_member
from gpud.runs.state.checkpoints import ResumePoint, explicit_checkpoint, unset_dir_warning
from gpud.runs.state.part import Outcome, Part, reap_shims
from gpud.security.auth import Caller, PeerKeys
from gpud.security.keys import KeyPair
from gpud.wire.envelope import ErrorCode, ProtocolError
from gpud.wire.ingest import Ingest
from gpud.wire.run_messages import (
    GangStatus,
    JoinReply,
    JoinRequest,
    LaunchReply,
    LaunchRequest,
    NodeRefIn,
    PartPreflight,
    PartPreflightRequest,
    PartReleaseRequest,
    PartReservation,
    PartReserveRequest,
    PartStartRequest,
    PartStatusRequest,
    PartStopRequest,
    ResumeRequest,
    RunStartRequest,
    RunSummary,
    StopRequest,
)
from launch.sections import DEFAULT_LOG_MAX_BYTES
from launch.spec import RunSpec

log = logging.getLogger("gpud.runs")

TICK_S = 0.25
#: The tick's cadence with nothing live, no log to read and no orphan to stop; a run or
#: part added wakes it at once (`RunBook.on_work`). Four idle ticks a second, each a wake
#: of the loop, were a tenth of what an idle daemon spent.
IDLE_TICK_S = 1.0
#: The same tick failure again is logged (with its count) at most this often.
TICK_FAILURE_REPORT_S = 60.0
STOP_RESEND_S = 1.0
PIDS_EVERY_S = 2.0
EXPIRE_EVERY_S = 5.0


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
        attach: AttachConfig | None = None,
        ledger: CpuLedger | None = None,
        logs_max_bytes: int = DEFAULT_LOG_MAX_BYTES,
        master_ports: range = PORT_RANGE,
    ) -> None:
        self.node = node
        self.master_ports = master_ports
        self.ledger = ledger or CpuLedger()
        self.state = state
        self.store = store
        self.ingest = ingest
        self.hardware = hardware
        self.sample_gpus = sample_gpus
        self.peer_keys = peer_keys
        self.clock = clock
        self.book = RunBook(node, store, publish, clock)
        self.telemetry = Telemetry(self.book, hardware)
        self.book.on_ended.append(self.telemetry.final)
        self.gang = gang.Gang(self.book, self, keys, self.telemetry.set_peer_health)
        self.goodput = GoodputKeeper(self.book, self.telemetry.health)
        #: what the runs say: their output and their trainers' messages
        self.intake = Intake(node, self.book, store, self.telemetry, self.goodput,
                             self.ledger, clock)  # fmt: skip
        self.hangs = HangWatch(self.book, self.telemetry, self.gang)
        self.queries = Queries(self.book, self.gang, self.telemetry, self.goodput)
        self.attached_runs = AttachedRuns(
            self.book, peer_keys, node=node, server_key=keys.public_text if keys else None,
            config=attach or AttachConfig(control="", ingest=""),
        )  # fmt: skip
        self.leases = GpuLeases(node, store, hardware, self._run_name, clock)
        #: the launch and placement path: a part's GPUs, its place, its start
        self.starter = PartStarter(
            node, state, store, self.book, self.leases, hardware, ingest, clock, logs_max_bytes
        )
        #: What else may explain a part's end before it is recorded (gpud.heal's
        #: quarantine): each takes the outcome and returns it, or a better one.
        self.explain: list[Callable[[RunRecord, Part, Outcome], Outcome]] = []
        #: Who hears of GPUs that failed a preflight's check here (the starter's list).
        self.bad_gpus = self.starter.bad_gpus
        self._starting: set[str] = set()  # runs whose run.start is under way
        #: Who else lets go of a run retention removed (the publisher's topics).
        self.on_forget: list[Callable[[str], None]] = []
        self._last_stop_sent: dict[str, float] = {}
        self._last_pids: dict[str, float] = {}
        self._last_expire = 0.0
        self._work = asyncio.Event()
        self.book.on_work.append(self._work.set)

    # ================================================================== start-up

    def adopt(self) -> None:
        """Take back the parts that kept running while the daemon was down."""
        for run in self.store.runs(active_only=True):
            self.book.load(run)
            if run.coordinator is not None and run.coordinator.server_key:
                self.peer_keys.grant(run.coordinator.server_key, run.id)
            self._trust_members(run)
        for record in self.store.active_attempts():
            owner = self.book.get(record.run_id)
            if owner is None:
                self._close_stale_attempt(record)
                continue
            run = owner
            part = Part(record, self.clock)
            self.book.add_part(part)
            if run.attached is not None:
                self.attached_runs.adopt(part, self.clock())
                self.book.event(run, "adopt", "waiting for its part runner to attach again")
                continue
            alive = part.shim_alive()
            what = (
                "re-adopted after a daemon restart"
                if alive
                else "ended while the daemon was down; settling from the shim's record"
            )
            self.book.event(run, "adopt", what)
            log.info("run %s: %s", run.id, "re-adopted" if alive else "settling after restart")
        for run in self.book.runs():
            # A run still stopping whose part here had already ended (the other nodes'
            # parts had not): node 0 must see its own part over to fold the run's end.
            ended = [a for a in self.store.attempts(run.id) if a.attempt == run.attempt]
            if self.book.part(run.id) is None and ended:
                self.book.add_part(Part(ended[-1], self.clock))
        self.leases.sweep(self._live_parts())
        # Gang state (and restarts due) are recomputed on the next tick.

    def _close_stale_attempt(self, record: AttemptRecord) -> None:
        """An attempt still `running` on disk under a run that ended: its last write was
        lost (an older gpud on a full disk). The run's end is its end."""
        run = self.store.run(record.run_id)
        if run is None or not run.state.terminal:
            return
        self.store.put_attempt(record.model_copy(update={"state": run.state, "reason": run.reason}))
        log.info(
            "run %s: attempt %d read %s under a %s run; recorded as %s",
            run.id, record.attempt, record.state.value, run.state.value, run.state.value,
        )  # fmt: skip

    def _live_parts(self) -> list[tuple[str, int]]:
        return [
            (run.id, part.record.attempt)
            for run, part in self.book.parts()
            if not part.record.state.terminal
        ]

    def _run_name(self, run_id: str | None) -> str | None:
        run = self.book.known(run_id) if run_id else None
        return run.name if run is not None else None

    # ================================================================== requests

    def start_part(
        self,
        run: RunRecord,
        spec: RunSpec,
        attempt: int,
        master_addr: str,
        master_port: int,
        resume: ResumePoint,
    ) -> Part:
        return self.starter.start_part(run, spec, attempt, master_addr, master_port, resume)

    def state_full(self) -> str | None:
        return self.starter.state_full()

    def free_master_port(self) -> int:
        return pick_port(self.store.leased_ports(), ports=self.master_ports)

    def reserve_gpus(
        self, run: RunRecord, spec: RunSpec, attempt: int, key: tuple[float, str]
    ) -> list[Gpu]:
        return self.starter.reserve_gpus(run, spec, attempt, key)

    def release_gpus(self, run: RunRecord, attempt: int) -> None:
        self.starter.release_gpus(run, attempt)

    async def launch(self, req: LaunchRequest, caller: Caller) -> LaunchReply:
        spec = self.starter.validated(req.spec)
        if not req.dry_run:
            self.starter.check_room()
        nodes = [_ref(n) for n in req.nodes]
        if spec.elastic is not None:
            named = len(nodes) - len(spec.elastic.spares)
            if spec.elastic.min_nodes > named:
                raise ProtocolError(
                    ErrorCode.INVALID_BODY,
                    f"elastic.min_nodes {spec.elastic.min_nodes} is more than the {named}"
                    " node(s) the run is launched on",
                )
        master_addr = master_host(spec, nodes)
        run_id = new_run_id(spec.name)
        run = self.starter.new_run(run_id, spec, nodes, node_rank=0)
        warning = unset_dir_warning(spec, run.checkpoint_dir)
        warnings = [warning] if warning else []
        queue = (req.queue or spec.queue) and not req.dry_run
        try:  # refused here: nothing was set up
            if not req.dry_run:
                self.starter.check_queue(run, run.queue_key)
            gpus = self.leases.choose(spec.name, spec)
        except ProtocolError as exc:
            if not queue or exc.code is not ErrorCode.UNAVAILABLE:
                raise
            return self._queue(run, master_addr, caller, exc.message, warnings)
        if len(nodes) > 1 and (queue or req.start_by_call) and not req.dry_run:
            if req.start_by_call:
                # Every node joins first; gpuctl's run.start then starts the first attempt as
                # node 0 starts any other: reserved everywhere, the preflight, the port,
                # then the parts.
                why = "waiting for every node to join; node 0 starts it then"
                return self._queue(run, master_addr, caller, why, warnings, awaiting_start=True)
            # Node 0 starts it once every node joined and can give its part (all or none).
            why = "waiting for every node to join"
            return self._queue(run, master_addr, caller, why, warnings)
        if spec.preflight and not req.dry_run and self.starter.real_gpus(gpus):
            # Real GPUs: the first attempt starts as any other does, after their matmul and
            # memory test (`Gang.start_attempt`; 4-7 s on an H100); refused, the run is
            # cancelled and the reply says why (a GPU that failed it is quarantined).
            why = "its GPUs' preflight"
            self._queue(run, master_addr, caller, why, warnings, awaiting_start=True)
            started = await self.start_launched(RunStartRequest(run=run_id, queue=queue), caller)
            return started.model_copy(update={"warnings": warnings})
        try:
            port = self.free_master_port()
        except NoFreePort as exc:
            raise ProtocolError(ErrorCode.UNAVAILABLE, str(exc)) from None
        if req.dry_run:
            place = self.starter.placement(run, spec, 1, master_addr, port, None, gpus)
            return LaunchReply(
                run=self.book.summary(run),
                master_addr=master_addr,
                master_port=port,
                plan=self.starter.plan(run, spec, place),
                warnings=warnings,
            )
        self.store.lease_port(port, run_id, 1, self.clock())
        run = self.book.add(run)
        self._trust_members(run)
        self.book.event(
            run, "launch", f"launched by {caller.name} on {len(nodes)} node(s)", by=caller.name
        )
        self._warn(run, warnings)
        self.start_part(run, spec, 1, master_addr, port, ResumePoint(None))
        run = self.book.move(run.id, RunState.STARTING, f"attempt 1 on {len(nodes)} node(s)")
        self.gang.view(run)
        return LaunchReply(
            run=self.book.summary(run), master_addr=master_addr, master_port=port, warnings=warnings
        )

    def _queue(
        self,
        run: RunRecord,
        master_addr: str,
        caller: Caller,
        why: str,
        warnings: list[str],
        awaiting_start: bool = False,
    ) -> LaunchReply:
        """A launch that waits: queued here (and, as gpuctl joins them, on the other nodes);
        with `awaiting_start`, until gpuctl's `run.start` (`start_launched`)."""
        changes = {"queued_at": run.created_at, "awaiting_start": awaiting_start}
        run = self.book.add(run.model_copy(update=changes))
        self._trust_members(run)
        where = f"{len(run.nodes)} node(s)"
        said = "" if awaiting_start else f", queued: {why}"
        said = f"launched by {caller.name} on {where}{said}"
        self.book.event(run, "launch", said, by=caller.name)
        self._warn(run, warnings)
        run = self.book.move(run.id, RunState.QUEUED, why)
        return LaunchReply(
            run=self.book.summary(run),
            master_addr=master_addr,
            warnings=warnings,
            start_by_call=awaiting_start,
        )

    async def start_launched(self, req: RunStartRequest, caller: Caller) -> LaunchReply:
        """`run.start`: every node joined a run launched with `start_by_call`; its first
        attempt starts as any other does (`Gang.start_attempt`: every node's GPUs reserved,
        the preflight, then each part). Refused: the run is cancelled everywhere, and the
        reply says why (with `queue` it waits in the queue instead)."""
        run = self.book.find(req.run)
        if not run.is_coordinator or not run.awaiting_start or run.id in self._starting:
            raise ProtocolError(
                ErrorCode.CONFLICT,
                f"run {run.id} is {run.state.value}: run.start only starts a run launched to"
                " wait for it, once",
            )
        self._starting.add(run.id)  # the gang's tick leaves it alone while awaiting_start
        try:
            run = await self.gang.start_attempt(
                run, why=f"launched by {caller.name}", queue=req.queue
            )
        except ProtocolError as exc:
            current = self.book.get(run.id)
            if current is not None and current.state is RunState.QUEUED:
                current = self.book.update(run.id, awaiting_start=False)
                await self.gang.cancel(current, f"could not start: {exc.message}")
            raise
        finally:
            self._starting.discard(run.id)
            if (current := self.book.get(run.id)) is not None and current.awaiting_start:
                run = self.book.update(run.id, awaiting_start=False)  # queued: the tick's now
        part = self.book.part(run.id)
        master = master_host(self.book.spec(run), run.nodes)
        return LaunchReply(
            run=self.book.summary(run),
            master_addr=part.record.master_addr if part else master,
            master_port=part.record.master_port if part else None,
        )

    def _trust_members(self, run: RunRecord) -> None:
        """Node 0 lets the run's other nodes ask it where the run stands (`run.gang.status`,
        nothing else: `check_member`)."""
        if run.is_coordinator and run.attached is None:
            for node in run.nodes[1:]:
                if node.server_key:
                    self.peer_keys.grant(node.server_key, run.id)

    def _warn(self, run: RunRecord, warnings: list[str]) -> None:
        """The launch's warnings stay in the run's events, for whoever did not launch it."""
        for warning in warnings:
            self.book.event(run, "spec_warning", warning, "warning")

    def join(self, req: JoinRequest, caller: Caller) -> JoinReply:
        spec = self.starter.validated(req.spec)
        nodes = [_ref(n) for n in req.nodes]
        if req.node_rank >= len(nodes):
            raise ProtocolError(ErrorCode.INVALID_BODY, "node_rank is past the list of nodes")
        if self.book.known(req.run_id) is not None and not req.dry_run:
            raise ProtocolError(ErrorCode.CONFLICT, f"run {req.run_id} already has a part here")
        if not req.dry_run:
            self.starter.check_room()
        run = self.starter.new_run(
            req.run_id, spec, nodes, node_rank=req.node_rank, attempt=req.attempt
        )
        queued = req.queued_at is not None and not req.dry_run
        waits = queued and not req.hold  # held: its GPUs must be free now
        if req.standby and not req.dry_run:
            return self._stand_by(run, nodes, caller)
        if req.master_port is None and not queued:
            raise ProtocolError(ErrorCode.INVALID_BODY, "master_port: needed unless queued_at")
        gpus: list[Gpu] = []
        try:
            if not waits and not req.dry_run:
                self.starter.check_queue(run, run.queue_key)  # no jumping this node's queue
            gpus = self.leases.choose(spec.name, spec)
        except ProtocolError as exc:
            if not waits or exc.code is not ErrorCode.UNAVAILABLE:
                raise
        if req.dry_run:
            port = req.master_port or 0
            place = self.starter.placement(
                run, spec, req.attempt, req.master_addr, port, None, gpus
            )
            return JoinReply(run=self.book.summary(run), plan=self.starter.plan(run, spec, place))
        run = self.book.add(run.model_copy(update={"queued_at": req.queued_at}))
        if nodes[0].server_key:
            self.peer_keys.grant(nodes[0].server_key, run.id)
        self.book.event(
            run, "join", f"joined as node {req.node_rank} by {caller.name}", by=caller.name
        )
        if queued:
            why = "node 0 starts it after its preflight" if req.hold else None
            run = self.book.move(
                run.id, RunState.QUEUED, why or "node 0 starts it when its GPUs free up"
            )
            return JoinReply(run=self.book.summary(run))
        assert req.master_port is not None
        self.start_part(run, spec, req.attempt, req.master_addr, req.master_port, ResumePoint(None))
        run = self.book.move(run.id, RunState.STARTING, f"attempt {req.attempt}")
        return JoinReply(run=self.book.summary(run))

    def _stand_by(self, run: RunRecord, nodes: list[NodeRef], caller: Caller) -> JoinReply:
        """A spare joins: the run is known here and node 0 may start a part here later
        (`run.part.reserve`, `run.part.start`), when a node of the run is lost."""
        run = self.book.add(run)
        if nodes[0].server_key:
            self.peer_keys.grant(nodes[0].server_key, run.id)
        self.book.event(
            run, "join", f"joined as spare node {run.node_rank} by {caller.name}", by=caller.name
        )
        run = self.book.move(
            run.id, RunState.PENDING, "a spare: node 0 starts a part here if a node is lost"
        )
        return JoinReply(run=self.book.summary(run))

    def part_reserve(self, req: PartReserveRequest, caller: Caller) -> PartReservation:
        run = self._coordinated(req.run_id, caller)
        part = self.book.part(run.id)
        if part is not None and not part.record.state.terminal:
            raise ProtocolError(
                ErrorCode.CONFLICT, f"attempt {part.record.attempt} still runs on {self.node}"
            )
        waits = can_move(run.state, RunState.QUEUED, next_attempt=True)
        if req.queue and run.state is not RunState.QUEUED and waits:
            # (A part node 0 gave up on may still read `running` here: no queue entry then.)
            run = self.book.move(
                run.id,
                RunState.QUEUED,
                "node 0 starts it when its GPUs free up",
                next_attempt=True,
                queued_at=req.queued_at,
            )
        elif run.queued_at != req.queued_at and run.state is RunState.QUEUED:
            run = self.book.update(run.id, queued_at=req.queued_at)
        gpus = self.reserve_gpus(run, self.book.spec(run), req.attempt, (req.queued_at, run.id))
        return PartReservation(node=self.node, gpus=[g.index for g in gpus])

    def part_release(self, req: PartReleaseRequest, caller: Caller) -> PartReservation:
        run = self._coordinated(req.run_id, caller)
        self.release_gpus(run, req.attempt)
        if req.cancel is not None and run.state is RunState.QUEUED:
            self.book.cancel_queued(run.id, req.cancel)
        return PartReservation(node=self.node)

    def _coordinated(self, run_id: str, caller: Caller) -> RunRecord:
        """A run node 0 acts on here, held in the book (an ended one is read back)."""
        run = self.book.find(run_id)
        check_coordinator(run, caller)
        if self.book.get(run.id) is None:
            self.book.load(run)
        return self.book.get(run.id) or run

    def part_start(self, req: PartStartRequest, caller: Caller) -> AttemptRecord:
        run = self.book.find(req.run_id)
        check_coordinator(run, caller)
        current = self.book.part(run.id)
        if current is not None and not current.record.state.terminal:
            raise ProtocolError(
                ErrorCode.CONFLICT, f"attempt {current.record.attempt} still runs on {self.node}"
            )
        if self.book.get(run.id) is None:
            self.book.load(run)  # an ended run, read back from the store
        run = self.book.update(
            run.id,
            attempt=req.attempt,
            stop_requested=False,
            members=req.members,
            grad_accum=req.grad_accum,
        )
        part = self.start_part(
            run,
            self.book.spec(run),
            req.attempt,
            req.master_addr,
            req.master_port,
            ResumePoint(req.resume_from),
        )
        self.book.move(run.id, RunState.STARTING, f"attempt {req.attempt}", next_attempt=True)
        return part.record

    def part_status(self, req: PartStatusRequest, caller: Caller) -> AttemptRecord:
        run = self.book.find(req.run_id)
        check_coordinator(run, caller)
        part = self.book.part(run.id)
        if part is not None:
            return part.record
        attempts = self.store.attempts(run.id)
        if not attempts:
            raise ProtocolError(ErrorCode.NOT_FOUND, f"run {run.id} has no attempt here yet")
        return attempts[-1]

    def part_stop(self, req: PartStopRequest, caller: Caller) -> AttemptRecord:
        run = self.book.find(req.run_id)
        check_coordinator(run, caller)
        if run.attached is not None:
            raise refuse_control(run, "stop")
        self.obey_stop(run, req)
        return self.part_status(PartStatusRequest(run_id=run.id), caller)

    def obey_stop(self, run: RunRecord, req: PartStopRequest) -> None:
        """Stop this node's part as node 0 asked: by `run.part.stop`, or as this node
        learned by asking node 0 itself (`CoordinatorWatch`)."""
        if req.failed:
            self.stop_part(
                run,
                force=req.force,
                reason=req.reason,
                grace_s=gang.HANG_DUMP_WAIT_S if req.dump else 0.0,
                failed=req.reason,
                dump=req.dump,
            )
        else:
            self.stop_part(run, force=req.force, reason=req.reason)

    async def part_preflight(self, req: PartPreflightRequest, caller: Caller) -> PartPreflight:
        """`run.part.preflight`: node 0 asks this node to run its part of the check."""
        run = self.book.find(req.run_id)
        check_coordinator(run, caller)
        spec = self.book.spec(run)
        return await self.run_preflight(run, spec, req.attempt, req.master, req.world, req.rank)

    async def run_preflight(
        self, run: RunRecord, spec: RunSpec, attempt: int, master: str, world: int, rank: int
    ) -> PartPreflight:
        return await self.starter.run_preflight(run, spec, attempt, master, world, rank)

    def holds_real_gpus(self, run: RunRecord, attempt: int) -> bool:
        return self.starter.holds_real_gpus(run, attempt)

    def gang_status(self, req: PartStatusRequest, caller: Caller) -> GangStatus:
        """`run.gang.status`: one of the run's other nodes asks where node 0 has it."""
        run = self.book.find(req.run_id)
        check_member(run, caller)
        return self.gang.status_for_member(run)

    def stop_part(
        self,
        run: RunRecord,
        *,
        force: bool,
        reason: str,
        grace_s: float | None = None,
        failed: str | None = None,
        dump: bool = False,
    ) -> None:
        """Stop this node's part: handshake, SIGTERM after the grace, SIGKILL after that.

        `failed`: another part failed or was lost — this one ends `failed` for that reason,
        and its ranks get only a short time after SIGTERM (they are most likely stuck).
        `dump`: first ask its trainers for a flight-recorder dump (a hang).
        """
        part = self.book.part(run.id)
        if part is None or part.record.state.terminal:
            return
        if dump and part.record.library:
            self.ingest.request_dump(run.id, part.record.attempt)
        spec = self.book.spec(run)
        part.request_stop(
            spec.stop_grace_s if grace_s is None else grace_s,
            force,
            kill_grace_s=gang.FAILED_KILL_GRACE_S if failed else None,
        )
        self.book.update_part(part, stop_failed=failed)
        self.book.event(run, "stop", f"{'force-' if force else ''}stop on {self.node}: {reason}")
        if part.record.library and not force:
            self.ingest.request_stop(run.id, part.record.attempt, reason)
            self._last_stop_sent[run.id] = self.clock()
        current = self.book.get(run.id)
        if current is not None and current.state.active:
            self.book.move(run.id, RunState.STOPPING, reason)

    async def stop(self, req: StopRequest, caller: Caller) -> RunSummary:
        run = self.book.find(req.run)
        if run.state.terminal:
            return self.book.summary(run)
        if run.attached is not None:
            raise refuse_control(run, "stop")
        reason = f"stop requested by {caller.name}"
        if run.state is RunState.QUEUED:
            if run.is_coordinator:
                return self.book.summary(await self.gang.cancel(run, reason))
            self.leases.release(run.id)  # a reservation node 0 made (no part runs)
            return self.book.summary(self.book.cancel_queued(run.id, reason))
        run = self.book.update(run.id, stop_requested=True, next_restart_at=None)
        own = self.book.part(run.id)
        idle = own is None or own.record.state.terminal
        if run.state is RunState.PENDING and idle and len(run.nodes) == 1:
            run = self.book.move(run.id, RunState.STOPPED, f"{reason} (restart cancelled)")
            return self.book.summary(run)
        self.stop_part(run, force=req.force, reason=reason)
        if run.is_coordinator and req.force:
            silent = await self.gang.stop_peers(run, req.force, reason)
            if silent:
                # A forced stop does not wait for nodes that do not answer.
                self.gang.lose(run, silent, "did not answer the forced stop")
        elif run.is_coordinator:
            self.gang.stop_peers_soon(run, reason)
        return self.book.summary(self.book.get(run.id) or run)

    async def resume(self, req: ResumeRequest, caller: Caller) -> RunSummary:
        run = self.book.find(req.run)
        if run.attached is not None:
            raise refuse_control(run, "resume")
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
        self.starter.check_room()
        if self.book.get(run.id) is None:
            self.book.load(run)
        queue = req.queue or self.book.spec(run).queue
        if req.checkpoint is not None:
            try:
                explicit_checkpoint(req.checkpoint)
            except ValueError as exc:
                raise ProtocolError(ErrorCode.INVALID_BODY, str(exc)) from None
        run = await self.gang.start_attempt(
            run, why=f"resumed by {caller.name}", queue=queue, resume_from=req.checkpoint
        )
        return self.book.summary(run)

    # ================================================================== the tick

    async def serve(self) -> None:
        last: tuple[str, float, int] | None = None  # the failure, when logged, times since
        while True:
            try:
                # Charged across the tick's awaits: idle, none suspends; with runs, a call
                # that does also charges what other tasks ran meanwhile (an upper bound).
                with self.ledger.charge("supervision"):
                    await self.tick()
            except Exception as exc:
                # Four ticks a second: the same failure again is counted, not logged again.
                what, now = f"{type(exc).__name__}: {exc}", time.monotonic()
                if last is not None and last[0] == what and now - last[1] < TICK_FAILURE_REPORT_S:
                    last = (what, last[1], last[2] + 1)
                else:
                    again = ""
                    if last is not None and last[0] == what and last[2] > 0:
                        again = f" (and {last[2]} time(s) since it was logged)"
                    log.exception("supervisor tick failed%s; continuing", again)
                    last = (what, now, 0)
            await self._until_next_tick()

    async def _until_next_tick(self) -> None:
        """TICK_S; with nothing to look at, the next beat of IDLE_TICK_S (`gpud.node.ledger`:
        with the daemon's other idle parts, one wake-up) or until there is."""
        if self.book.ticked() or self.book.busy_parts() or self.gang.has_orphans:
            await asyncio.sleep(TICK_S)
            return
        self._work.clear()
        # Not asyncio.wait_for: before Python 3.12 it can swallow the task's cancel.
        loop = asyncio.get_running_loop()
        timer = loop.call_at(next_beat(loop.time(), IDLE_TICK_S), self._work.set)
        try:
            await self._work.wait()
        finally:
            timer.cancel()

    async def tick(self) -> None:
        now = self.clock()
        with self.ledger.charge("store"):
            self.store.retry()
        reap_shims()
        for run, part in self.book.busy_parts():
            if part.log_done:
                continue
            moved = await self.intake.follow_log(run, part)
            if part.record.state.terminal:
                # Ended, and its log read to the end: not opened again each tick (with a
                # thousand finished runs kept, that cost an idle daemon 5 % of a core).
                part.log_done = not moved
                continue
            if part.external:
                continue  # an attached part ends through the attach socket
            if now - self._last_pids.get(run.id, 0.0) >= PIDS_EVERY_S:
                self._last_pids[run.id] = now
                part.remember_pids()
            if part.record.stop_requested:
                self._keep_stopping(run, part, now)
            outcome = part.outcome()
            if outcome is not None:
                await self._settle(run, part, outcome)
        if now - self._last_expire >= EXPIRE_EVERY_S:
            self._last_expire = now
            self.leases.expire(self._live_parts(), now)
        self.attached_runs.tick(now)
        self.telemetry.tick(now)
        with self.ledger.charge("goodput"):
            self.goodput.tick(now)
        self.hangs.check(now)
        await self.gang.tick(now)

    # ================================================================== retention

    def keeps(self, run_id: str) -> str | None:
        """Why retention (gpud.retention) must leave this run alone now; None: it may go."""
        run = self.book.get(run_id)
        if run is not None and not run.state.terminal:
            return run.state.value
        part = self.book.part(run_id)
        if part is not None and not part.record.state.terminal:
            return f"its part here is still {part.record.state.value}"
        if self.gang.watching(run_id):
            return "node 0 still works on it (a poll, a start, or parts left on lost nodes)"
        if run_id in self._starting:
            return "starting"
        return None

    def forget(self, run_id: str) -> None:
        """Let go of an ended run retention removed: unknown here from now on."""
        self.book.forget(run_id)
        self.telemetry.forget(run_id)
        self.goodput.forget(run_id)
        self.gang.forget(run_id)
        self.intake.forget(run_id)
        self.hangs.forget(run_id)
        self._last_stop_sent.pop(run_id, None)
        self._last_pids.pop(run_id, None)
        for hear in self.on_forget:
            hear(run_id)

    def _keep_stopping(self, run: RunRecord, part: Part, now: float) -> None:
        if part.record.library and now - self._last_stop_sent.get(run.id, 0.0) >= STOP_RESEND_S:
            # PUB/SUB has no memory: a rank that subscribed late still gets the request.
            self.ingest.request_stop(run.id, part.record.attempt, run.reason or "stop")
            self._last_stop_sent[run.id] = now
        signalled = part.escalate()
        if signalled:
            self.book.event(run, "stop", f"{signalled} on {self.node}")

    async def _settle(self, run: RunRecord, part: Part, outcome: Outcome) -> None:
        await self.intake.follow_log(run, part, to_end=True)
        now = self.clock()
        outcome = await explained(self.book, run, part, outcome, self.hardware(), self.explain, now)
        self.book.update_part(
            part,
            state=outcome.state,
            state_since=now,
            reason=outcome.reason,
            exit=outcome.exit,
            ended_at=now,
        )
        await check_nothing_left(self.book, run, part, self.hardware().backend, self.sample_gpus)
        # Every way a part ends comes through here; with nothing of it left, its GPUs are
        # free again.
        self.leases.release(run.id, part.record.attempt)
        if not run.is_coordinator and part.record.attempt == (self.book.get(run.id) or run).attempt:
            self.book.move(run.id, outcome.state, outcome.reason)
        # Node 0 folds this into the gang state on its next gang tick. A peer keeps the
        # coordinator's key: it may start the next attempt (resume, restart).
