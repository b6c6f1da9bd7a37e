"""The gpud daemon: lifecycle, sockets, and the loop that ties the services together.

`Daemon.start()` does everything that can fail for a reason a person must fix (state dir in
use, address in use, unreadable keys) before any client is told the daemon exists; `run()`
then serves until SIGTERM/SIGINT, and `close()` closes sockets and flushes state. Signal
handlers only set an event; all work happens on the loop.
"""

from __future__ import annotations

import asyncio
import errno
import functools
import logging
import os
import signal
import socket
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import zmq
import zmq.asyncio

from gpud import __version__
from gpud.attach.server import INGEST_NAME, AttachServer, prepare_dir
from gpud.hardware.events import detect_events
from gpud.hardware.host import HostSampler
from gpud.hardware.node import NodeSampler, open_gpu_sampler
from gpud.hardware.xid import acknowledged
from gpud.heal.holds import Holds
from gpud.heal.service import Healing
from gpud.kube.pods import KubePods, on_kubernetes
from gpud.model.endpoints import endpoint_host, events_endpoint_for
from gpud.model.snapshot import GpuSample, NodeEvent, NodeSnapshot, Severity
from gpud.model.trainer_messages import TrainerMessage
from gpud.node.ledger import CpuLedger, until_beat
from gpud.node.statedir import StateDir, StateDirBusy
from gpud.node.store import SchemaTooNew, Store
from gpud.notify.service import Notifier
from gpud.prometheus import endpoint as metrics_endpoint
from gpud.prometheus.source import DaemonProcess, DaemonStats, ScrapeSource
from gpud.retention.compact import ensure_incremental
from gpud.retention.heap import HeapKeeper
from gpud.retention.service import Retention
from gpud.runs.lifecycle.attached import AttachConfig
from gpud.runs.lifecycle.supervisor import Supervisor
from gpud.runs.placement.simload import SimulatedLoads
from gpud.security.audit import AuditLog
from gpud.security.auth import (
    EVENTS_ZAP_DOMAIN,
    ZAP_DOMAIN,
    Authorizer,
    Caller,
    KeyRing,
    PeerKeys,
    RoleAuthenticator,
    authorize_local_user_on_first_start,
    authorized_keys_path,
    record_key_changes,
)
from gpud.security.bursts import flush_all
from gpud.security.guard import LIBC, ConnectionGuard
from gpud.security.keygate import KeyGate
from gpud.security.keys import (
    SERVER_KEY,
    KeyFileError,
    KeyPair,
    load_or_create_keypair,
    server_key_dir,
)
from gpud.security.known_nodes import KnownNode, remember_node
from gpud.settings import ServeSettings
from gpud.wire.brief import sum_topic
from gpud.wire.briefing import node_brief
from gpud.wire.control import (
    CONTROL_LIMITS,
    Binding,
    ControlServer,
    Registry,
    bind,
    configure_router,
)
from gpud.wire.envelope import MIN_PROTOCOL, PROTOCOL_VERSION, speaks
from gpud.wire.ingest import Ingest
from gpud.wire.node_messages import (
    AckEventsReply,
    AckEventsRequest,
    DrainReply,
    DrainRequest,
    Empty,
    GcReply,
    GcRequest,
    NodeEventsReply,
    NodeEventsRequest,
    NodeInfo,
    NotifyTestReply,
    NotifyTestRequest,
    UndrainRequest,
)
from gpud.wire.protocol import (
    GANG_STATUS,
    NODE_DRAIN,
    NODE_EVENTS,
    NODE_EVENTS_ACK,
    NODE_GC,
    NODE_HW,
    NODE_INFO,
    NODE_UNDRAIN,
    NODE_USAGE,
    NOTIFY_TEST,
    PART_HEALTH,
    PART_PREFLIGHT,
    PART_RELEASE,
    PART_RESERVE,
    PART_START,
    PART_STATUS,
    PART_STOP,
    RUN_HEALTH,
    RUN_JOIN,
    RUN_LAUNCH,
    RUN_LIST,
    RUN_LOGS,
    RUN_METRICS,
    RUN_RESUME,
    RUN_START,
    RUN_STATUS,
    RUN_STOP,
    hw_topic,
    node_event_topic,
)
from gpud.wire.publisher import EVENTS_LIMITS, EventPublisher, configure_pub

log = logging.getLogger("gpud")

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_IN_USE = 3


class StartupError(Exception):
    """The daemon cannot start; the message says why and what to change."""

    def __init__(self, message: str, exit_code: int = EXIT_FAILURE) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def _bind(sock: zmq.Socket[Any], address: str, flag: str) -> None:
    try:
        sock.bind(address)
    except zmq.ZMQError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise StartupError(
                f"{flag} address {address} is already in use (another gpud?); "
                f"stop it or pass another {flag}",
                EXIT_IN_USE,
            ) from None
        raise StartupError(f"cannot bind {flag} {address}: {exc.strerror}", EXIT_USAGE) from None


def _local_endpoint(bound: str) -> str:
    """The address a local client uses for a socket bound to `bound`."""
    if endpoint_host(bound) in ("0.0.0.0", "*", "::"):
        return events_endpoint_for("tcp://127.0.0.1:0", bound)
    return bound


def _peer_endpoint(bound: str) -> str:
    """The control address other nodes' daemons reach this one at (a wildcard bind is
    named by this host's name)."""
    host = endpoint_host(bound)
    if host in ("0.0.0.0", "*", "::"):
        return bound.replace(host, socket.getfqdn(), 1)
    return bound


class Daemon:
    def __init__(self, settings: ServeSettings, clock: Callable[[], float] = time.time) -> None:
        self.settings = settings
        self._clock = clock
        self.state = StateDir(settings.state_dir)
        self.started_at = clock()
        self._ctx: zmq.asyncio.Context | None = None
        self._auth: RoleAuthenticator | None = None
        self._authorizer: Authorizer | None = None
        self._control_sock: zmq.Socket[bytes] | None = None
        self._events_sock: zmq.Socket[bytes] | None = None
        self._guards: list[ConnectionGuard] = []
        self._events_gate = KeyGate()
        self._store: Store | None = None
        self._audit: AuditLog | None = None
        self._sampler: NodeSampler | None = None
        self._publisher: EventPublisher | None = None
        self._latest: NodeSnapshot | None = None
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gpud-sampler")
        self._stop = asyncio.Event()
        self.server_public_key: bytes | None = None
        self.peer_keys = PeerKeys()
        self._keys: KeyPair | None = None
        self._ingest: Ingest | None = None
        self._supervisor: Supervisor | None = None
        self._metrics_sock: socket.socket | None = None
        self._process = DaemonProcess()
        self._ledger = CpuLedger(watch_gc=True)
        self._state_full: str | None = None  # why the state dir has no room
        self._control: ControlServer | None = None
        self._healing: Healing | None = None
        self._notify: Notifier | None = None
        self._retention: Retention | None = None

    # ------------------------------------------------------------------ start-up

    def start(self) -> None:
        s = self.settings
        try:
            self.state.acquire()
        except StateDirBusy as exc:
            raise StartupError(str(exc), EXIT_IN_USE) from None
        except OSError as exc:
            raise StartupError(
                f"cannot use state dir {s.state_dir}: {exc.strerror}", EXIT_USAGE
            ) from None
        try:
            self._start_locked()
        except BaseException:
            self.close()
            raise

    def _start_locked(self) -> None:
        s = self.settings
        secure = not s.insecure
        ring: KeyRing | None = None
        server_secret: bytes | None = None
        if secure:
            try:
                key_dir = server_key_dir(self.state.root)
                server, created = load_or_create_keypair(key_dir, SERVER_KEY)
                if created:
                    log.info("created server key in %s", key_dir)
                authorize_local_user_on_first_start(self.state.root)
                ring = KeyRing(authorized_keys_path(self.state.root), peers=self.peer_keys)
            except KeyFileError as exc:
                raise StartupError(str(exc), EXIT_USAGE) from None
            self.server_public_key, server_secret = server.public, server.secret
            self._keys = server
        try:
            self._store = Store(self.state.database)
        except SchemaTooNew as exc:
            raise StartupError(str(exc), EXIT_USAGE) from None
        ensure_incremental(self._store.db, self.state.database)
        log.info(
            "store schema %d (gpud %s, protocol %s)",
            self._store.schema_version,
            __version__,
            speaks(),
        )
        self._audit = AuditLog(self.state.audit_log, int(s.audit_max_mb * 2**20))
        if ring is not None:
            ring.on_change = functools.partial(record_key_changes, self._audit)
        LIBC.prefer_mmap_for_large_blocks()
        self._ctx = zmq.asyncio.Context()
        if ring is not None:
            self._auth = RoleAuthenticator(self._ctx, ring, self._events_gate)  # type: ignore[arg-type]
            self._auth.start()
            self._authorizer = Authorizer(ring)
        self._control_sock = self._make_socket(zmq.ROUTER, server_secret, ZAP_DOMAIN)
        configure_router(self._control_sock)
        self._events_sock = self._make_socket(zmq.XPUB, server_secret, EVENTS_ZAP_DOMAIN)
        configure_pub(self._events_sock)
        _bind(self._control_sock, s.control, "--control")
        _bind(self._events_sock, s.events, "--events")
        if s.metrics is not None:
            try:
                self._metrics_sock = metrics_endpoint.bind(s.metrics)
            except OSError as exc:
                raise StartupError(f"cannot serve --metrics {s.metrics}: {exc.strerror}") from None
        authorized = self._authorizer.authorized if self._authorizer else None
        control_guard = ConnectionGuard(self._control_sock, self._ctx, "control", CONTROL_LIMITS)
        events_guard = ConnectionGuard(
            self._events_sock,
            self._ctx,
            "events",
            EVENTS_LIMITS,
            authorized=authorized,
            gate=self._events_gate,
        )
        self._guards = [control_guard, events_guard]
        self._publisher = EventPublisher(self._events_sock, events_guard)
        loads = (
            SimulatedLoads(self._active_shims, s.simulate_gpus, s.foreign_processes())
            if s.simulate_gpus
            else None
        )
        gpus = open_gpu_sampler(
            s.simulate_gpus,
            s.node_name,
            clock=self._clock,
            loads=loads,
            xid_file=s.simulate_xid_file,
        )
        pods = KubePods(s.kubelet_socket) if on_kubernetes(s.kubelet_socket) else None
        self._sampler = NodeSampler(
            s.node_name,
            gpus,
            HostSampler(),
            s.interval,
            self._clock,
            annotate=pods.annotate if pods else None,
        )
        self._latest = self._sampler.sample()
        self._start_runs()
        assert self._supervisor is not None
        self._healing = Healing(
            Holds(self._store, s.node_name, self._clock), self._supervisor,
            self._snapshot, self._replace_latest, self._emit_node_events,
            self._acknowledge_xids,
        )  # fmt: skip
        self._notify = Notifier(
            list(s.notify), s.node_name, _peer_endpoint(s.control).removeprefix("tcp://"),
            clock=self._clock,
        )  # fmt: skip
        self._notify.attach(self._supervisor)
        publisher = self._publisher
        self._supervisor.on_forget.append(lambda run_id: publisher.forget(f"run.{run_id}."))
        self._retention = Retention(
            s.retention, self._store, self.state, self._supervisor, s.node_name, self._clock
        )
        self._latest, quarantined = self._healing.observe(self._latest)
        self._emit_node_events(quarantined)
        self.registry()  # every method has its handler, or the daemon does not start
        self._register_locally()
        kind = "simulated " if gpus.simulated else ""
        log.info(
            "ready: node %s, %d %sGPU(s) [%s], control %s, events %s, state %s%s",
            s.node_name,
            gpus.gpu_count(),
            kind,
            gpus.backend,
            s.control,
            s.events,
            self.state.root,
            "" if secure else " — INSECURE: no authentication (loopback only)",
        )

    def _start_runs(self) -> None:
        assert self._ctx is not None and self._store is not None
        attach = self.settings.attach
        shared = f"ipc://{attach / INGEST_NAME}" if attach is not None else None
        if attach is not None:
            try:
                prepare_dir(attach)
            except OSError as exc:
                raise StartupError(f"cannot use --attach {attach}: {exc.strerror}") from None
        try:
            self._ingest = Ingest(
                self._ctx,
                self.state.ipc_endpoint("ingest"),
                self.state.ipc_endpoint("trainer-control"),
                self._on_trainer_message,
                shared=shared,
                authorize=self._authorize_attached,
            )
        except zmq.ZMQError as exc:
            raise StartupError(f"cannot bind the trainer sockets: {exc.strerror}") from None
        if attach is not None:
            os.chmod(attach / INGEST_NAME, 0o666)  # every message on it carries a token
        assert self._publisher is not None
        self._supervisor = Supervisor(
            node=self.settings.node_name,
            state=self.state,
            store=self._store,
            publish=self._publisher.publish,
            ingest=self._ingest,
            hardware=self._snapshot,
            sample_gpus=self._sample_gpus_now,
            peer_keys=self.peer_keys,
            keys=self._keys,
            clock=self._clock,
            ledger=self._ledger,
            logs_max_bytes=self.settings.logs_max_bytes,
            master_ports=self.settings.master_port_range(),
            attach=AttachConfig(control=_peer_endpoint(self.settings.control), ingest=shared)
            if shared is not None
            else None,
        )
        self._supervisor.adopt()

    def _active_shims(self) -> list[int | None]:
        sup = self._supervisor
        if sup is None:
            return []
        return sup.book.live_shims()

    def _snapshot(self) -> NodeSnapshot:
        assert self._latest is not None
        return self._latest

    async def _sample_gpus_now(self) -> list[GpuSample]:
        assert self._sampler is not None
        gpus = self._sampler.gpus
        # The sampler thread is the only one that touches the GPU sampler.
        return await asyncio.get_running_loop().run_in_executor(self._executor, gpus.sample)

    def _authorize_attached(self, token: str, message: TrainerMessage) -> bool:
        sup = self._supervisor
        return sup is not None and sup.attached_runs.authorize(token, message)

    def _on_trainer_message(self, kind: str, message: TrainerMessage) -> None:
        if self._supervisor is not None:
            self._supervisor.intake.on_trainer_message(kind, message)

    def _make_socket(
        self, kind: int, server_secret: bytes | None, domain: str
    ) -> zmq.Socket[bytes]:
        """A plain (not asyncio) socket: the loop reads control through a `SocketDrain`,
        the events thread the events socket."""
        assert self._ctx is not None
        sock: zmq.Socket[bytes] = zmq.Context.shadow(self._ctx.underlying).socket(kind)
        if server_secret is not None:
            sock.curve_server = True
            sock.curve_secretkey = server_secret
            sock.zap_domain = domain.encode()
        return sock

    def _register_locally(self) -> None:
        s = self.settings
        remember_node(
            KnownNode(
                control=_local_endpoint(s.control),
                events=_local_endpoint(s.events),
                server_key=self.server_public_key.decode() if self.server_public_key else None,
                insecure=s.insecure,
                name=s.node_name,
                state_dir=str(self.state.root),
            )
        )

    # ------------------------------------------------------------------ serving

    def registry(self) -> Registry:
        """Every method of the protocol with its handler (incomplete: IncompleteRegistry)."""
        return Registry(self.bindings())

    def bindings(self) -> list[Binding[Any, Any]]:
        """The handler this daemon serves each method with (after `start()`)."""
        sup = self._supervisor
        assert sup is not None
        queries = sup.queries
        return [
            bind(NODE_INFO, self._node_info),
            bind(NODE_HW, self._node_hw),
            bind(NODE_EVENTS, self._node_events),
            bind(NODE_EVENTS_ACK, self._ack_events),
            bind(NODE_DRAIN, self._drain),
            bind(NODE_UNDRAIN, self._undrain),
            bind(NOTIFY_TEST, self._notify_test),
            bind(NODE_GC, self._gc),
            bind(NODE_USAGE, lambda body, caller: queries.usage(body)),
            bind(RUN_LAUNCH, sup.launch),
            bind(RUN_JOIN, sup.join),
            bind(RUN_STOP, sup.stop),
            bind(RUN_RESUME, sup.resume),
            bind(RUN_START, sup.start_launched),
            bind(RUN_LIST, lambda body, caller: queries.list_runs(body)),
            bind(RUN_STATUS, lambda body, caller: queries.status(body)),
            bind(RUN_LOGS, lambda body, caller: queries.logs(body)),
            bind(RUN_METRICS, lambda body, caller: queries.metrics(body)),
            bind(RUN_HEALTH, lambda body, caller: queries.health(body)),
            bind(PART_START, sup.part_start),
            bind(PART_RESERVE, sup.part_reserve),
            bind(PART_RELEASE, sup.part_release),
            bind(PART_STOP, sup.part_stop),
            bind(PART_STATUS, sup.part_status),
            bind(PART_PREFLIGHT, sup.part_preflight),
            bind(GANG_STATUS, sup.gang_status),
            bind(PART_HEALTH, queries.part_health),
        ]

    def _node_info(self, body: Empty, caller: Caller) -> NodeInfo:
        assert self._sampler is not None
        gpus = self._latest.gpus if self._latest else []
        names = {g.name for g in gpus}
        return NodeInfo(
            node=self.settings.node_name,
            version=__version__,
            protocol=PROTOCOL_VERSION,
            min_protocol=MIN_PROTOCOL,
            store_schema=self._store.schema_version if self._store is not None else None,
            skipped_messages=self._ingest.skipped.total() if self._ingest is not None else 0,
            pid=os.getpid(),
            started_at=self.started_at,
            uptime_s=round(self._clock() - self.started_at, 3),
            control=self.settings.control,
            events=self.settings.events,
            backend=self._sampler.gpus.backend,
            simulated=self._sampler.gpus.simulated,
            gpu_count=len(gpus),
            gpu_name=names.pop() if len(names) == 1 else ("mixed" if names else None),
            secure=not self.settings.insecure,
            role=caller.role,
            cpu_by_component=self._ledger.totals(),
            cpu_seconds=round(self._process.usage()[0], 3),
        )

    def _drain(self, body: DrainRequest, caller: Caller) -> DrainReply:
        assert self._healing is not None
        return self._healing.drain(body, caller)

    def _undrain(self, body: UndrainRequest, caller: Caller) -> DrainReply:
        assert self._healing is not None
        return self._healing.undrain(body, caller)

    async def _notify_test(self, body: NotifyTestRequest, caller: Caller) -> NotifyTestReply:
        assert self._notify is not None
        return await self._notify.test(body, caller)

    async def _gc(self, body: GcRequest, caller: Caller) -> GcReply:
        assert self._retention is not None
        return await self._retention.handle(body, caller)

    def _node_hw(self, body: Empty, caller: Caller) -> NodeSnapshot:
        assert self._latest is not None
        return self._latest

    def _node_events(self, body: NodeEventsRequest, caller: Caller) -> NodeEventsReply:
        assert self._store is not None
        return NodeEventsReply(events=self._store.node_events(body.limit, body.since))

    def _ack_events(self, body: AckEventsRequest, caller: Caller) -> AckEventsReply:
        cleared = self._acknowledge_xids(body.gpu_index)
        log.info("%s acknowledged %d XID event(s)", caller.name, cleared)
        return AckEventsReply(acknowledged=cleared)

    def _acknowledge_xids(self, gpu_index: int | None) -> int:
        """Mark a GPU's XIDs (every GPU's: None) handled, in the sampler and in the latest
        snapshot (a preflight right after reads it); also an undrained GPU's (gpud.heal)."""
        assert self._sampler is not None
        cleared = self._sampler.gpus.acknowledge_xids(gpu_index)
        if self._latest is not None:
            every = {g.index for g in self._latest.gpus}
            which = every if gpu_index is None else {gpu_index} & every
            self._latest = acknowledged(self._latest, which, self._clock())
        return cleared

    async def _sample_forever(self) -> None:
        assert self._sampler is not None and self._publisher is not None
        loop = asyncio.get_running_loop()
        interval = self.settings.interval
        topic = hw_topic(self.settings.node_name)
        brief_topic = sum_topic(self.settings.node_name)
        while True:
            # On the beat (`gpud.node.ledger`); a sample that took longer than the interval
            # skips the beats it missed instead of bursting.
            await until_beat(interval)
            try:
                sample = self._ledger.charged("sampler", self._sampler.sample)
                snapshot = await loop.run_in_executor(self._executor, sample)
            except Exception:
                log.exception("sampling failed; will retry next interval")
                continue
            with self._ledger.charge("snapshot"):
                events = detect_events(self._latest, snapshot)
                assert self._healing is not None
                snapshot, quarantined = self._healing.observe(snapshot)
                if self._state_full is not None:
                    snapshot = snapshot.model_copy(update={"state_dir_full": self._state_full})
                self._latest = snapshot
                frames = [self._publisher.encode(topic, snapshot)]
            with self._ledger.charge("brief"):
                frames += self._brief(brief_topic, snapshot)
            with self._ledger.charge("snapshot"):
                # Both events in one go: the events thread wakes once for them.
                for event in frames:
                    self._publisher.send(event)
                self._emit_node_events(events + quarantined)

    def _replace_latest(self, snapshot: NodeSnapshot) -> None:
        self._latest = snapshot

    def _emit_node_events(self, events: list[NodeEvent]) -> None:
        """Keep, log and publish node events."""
        if not events:
            return
        assert self._store is not None and self._publisher is not None
        self._store.add_node_events(events)
        topic = node_event_topic(self.settings.node_name)
        for event in events:
            log.warning("%s: %s", event.kind, event.message)
            self._publisher.publish(topic, event)
        if self._notify is not None:
            self._notify.node_events(events)

    def _brief(self, topic: str, snapshot: NodeSnapshot) -> list[list[bytes]]:
        """The node in brief (`gpud.wire.brief`), for views of many nodes, encoded; none if it
        failed."""
        assert self._publisher is not None
        sup = self._supervisor
        try:
            runs = sup.queries.on_this_node(snapshot.time) if sup is not None else []
            return [self._publisher.encode(topic, node_brief(snapshot, runs))]
        except Exception:  # a view of the node must never stop its sampling
            log.exception("the node brief failed")
            return []

    async def run(self) -> None:
        """Serve until SIGTERM/SIGINT (or `request_stop()`)."""
        assert self._control_sock is not None and self._audit is not None
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.request_stop, sig)
        control_guard, _ = self._guards
        control = self._control = ControlServer(
            self._control_sock, self.registry(), self._audit, self._authorizer, control_guard
        )
        metrics = await self._start_metrics()
        attach = await self._start_attach()
        assert self._supervisor is not None and self._ingest is not None
        assert self._publisher is not None and self._retention is not None
        tasks = [
            asyncio.create_task(control.serve(), name="control"),
            asyncio.create_task(self._publisher.serve(), name="events"),
            asyncio.create_task(control_guard.watch(), name="guard-control"),
            asyncio.create_task(self._housekeeping(), name="housekeeping"),
            asyncio.create_task(self._supervisor.serve(), name="supervisor"),
            asyncio.create_task(self._ingest.serve(), name="ingest"),
            asyncio.create_task(self._sample_forever(), name="sampler"),
            asyncio.create_task(self._retention.serve(), name="retention"),
        ]
        stop = asyncio.create_task(self._stop.wait(), name="stop")
        done, _ = await asyncio.wait([stop, *tasks], return_when=asyncio.FIRST_COMPLETED)
        if attach is not None:
            await attach.close()  # first: a stopping daemon ends no attached run
        for task in [stop, *tasks]:
            task.cancel()
        await asyncio.gather(stop, *tasks, return_exceptions=True)
        for task in done:
            if task is not stop and not task.cancelled() and task.exception():
                raise task.exception()  # type: ignore[misc]
        if metrics is not None:
            await metrics.close()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)

    async def _housekeeping(self) -> None:
        """Once a second: what throttled logs and the audit log held back, as counts; the
        state dir's room; the heap long held kept out of the collector's walks (`gc`)."""
        heap = HeapKeeper(time.monotonic())
        while True:
            await until_beat(1.0)  # the sampler's beat at the default interval: one wake-up
            with self._ledger.charge("housekeeping"):
                flush_all()
                if self._audit is not None:
                    self._audit.flush()
                self._watch_state_dir()
                heap.tick(time.monotonic())

    def _watch_state_dir(self) -> None:
        """A state dir that fills, or has room again, is a node event; while it is full,
        the snapshot (`gpuctl hw`, gputop) says so, and launches are refused
        (`Supervisor._check_room`)."""
        assert self._supervisor is not None
        root = self.state.root
        full = self._supervisor.state_full()
        if (full is None) == (self._state_full is None):
            self._state_full = full
            return
        self._state_full = full
        now = self._clock()
        if full is not None:
            kind: Severity = "critical"
            message = f"state dir full: {full}; new launches are refused, runs go on"
        else:
            kind, message = "info", f"state dir {root} has room again"
        if self._latest is not None:
            self._latest = self._latest.model_copy(update={"state_dir_full": full})
        event = NodeEvent(
            node=self.settings.node_name, time=now, kind="state_dir", severity=kind,
            message=message,
        )  # fmt: skip
        self._emit_node_events([event])

    async def _start_metrics(self) -> metrics_endpoint.MetricsEndpoint | None:
        s = self.settings
        if self._metrics_sock is None or self._supervisor is None:
            return None
        tls = None
        if s.metrics_tls_cert is not None and s.metrics_tls_key is not None:
            tls = metrics_endpoint.TlsFiles(
                s.metrics_tls_cert, s.metrics_tls_key, s.metrics_client_ca
            )
        source = ScrapeSource(self._supervisor, self._snapshot, self._daemon_stats)
        endpoint = metrics_endpoint.MetricsEndpoint(self._metrics_sock, source, tls)
        await endpoint.start()
        return endpoint

    async def _start_attach(self) -> AttachServer | None:
        attach = self.settings.attach
        if attach is None or self._supervisor is None:
            return None
        server = AttachServer(attach, self._supervisor.attached_runs)
        try:
            await server.start()
        except OSError as exc:
            raise StartupError(f"cannot serve --attach {attach}: {exc.strerror}") from None
        log.info("attach socket %s: runs gpud did not start may report here", server.path)
        return server

    def _daemon_stats(self) -> DaemonStats:
        cpu, rss = self._process.usage()
        control = self._control
        return DaemonStats(
            cpu_seconds=cpu,
            rss_bytes=rss,
            clients=sum(len(g.connections) for g in self._guards),
            requests=dict(control.served_by) if control is not None else {},
            notify=self._notify.sender.snapshot() if self._notify is not None else {},
            components=self._ledger.totals(),
            state_bytes=self._retention.size.parts() if self._retention is not None else {},
            state_runs=self._store.count_runs() if self._store is not None else None,
        )

    def request_stop(self, sig: int | None = None) -> None:
        if sig is not None:
            log.info("received %s; stopping", signal.Signals(sig).name)
        self._stop.set()

    # ------------------------------------------------------------------ shutdown

    def close(self) -> None:
        """Close sockets, stop threads, flush and release the state dir. Idempotent."""
        self._ledger.close()
        if self._notify is not None:
            self._notify.close()  # what is due goes out first (2 s at most)
            self._notify = None
        if self._ingest is not None:
            self._ingest.close()
            self._ingest = None
        if self._retention is not None:
            self._retention.close()
            self._retention = None
        if self._supervisor is not None:
            self._supervisor.gang.close()
            self._supervisor = None
        if self._publisher is not None:
            self._publisher.close()  # the events thread lets go of the XPUB first
        for guard in self._guards:
            guard.close()
        self._guards = []
        for sock in (self._control_sock, self._events_sock):
            if sock is not None and not sock.closed:
                sock.close(linger=0)
        if self._metrics_sock is not None:
            self._metrics_sock.close()
            self._metrics_sock = None
        if self._auth is not None:
            self._auth.stop()
            self._auth = None
        if self._sampler is not None:
            self._sampler.gpus.close()
            self._sampler = None
        self._executor.shutdown(wait=True, cancel_futures=True)
        if self._store is not None:
            self._store.close()
            self._store = None
        flush_all(everything=True)
        if self._audit is not None:
            self._audit.close()
            self._audit = None
        if self._ctx is not None:
            self._ctx.term()
            self._ctx = None
        self.state.release()


def serve(settings: ServeSettings) -> int:
    """Run a daemon in the foreground; returns the process exit code."""
    daemon = Daemon(settings)
    try:
        daemon.start()
    except StartupError as exc:
        log.error("%s", exc)
        return exc.exit_code
    try:
        asyncio.run(daemon.run())
    finally:
        daemon.close()
        log.info("stopped")
    return EXIT_OK
