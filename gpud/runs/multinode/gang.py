"""The gang, as node 0 runs it: one state for the whole run, whatever node it comes from.

Node 0 polls the other nodes' parts (in the background: a silent node never holds up the
tick), asks `decide()` what the parts add up to, and carries the decision out: it marks
silent parts `lost`, stops the other parts when one failed or was lost, and starts new
attempts — for `resume` and for automatic restarts, by the same path. A restart after a
lost node waits until every node answers again, and first stops what is left of the old
attempt anywhere. Parts of ended runs whose node was lost are stopped when it comes back.

Every attempt takes its GPUs on all nodes at once or not at all (`Reservations.reserve`,
gpud/runs/multinode/reserving.py): this node
first, then every other node's reservation; if one cannot, the others are given back.
A run that may wait (`queue`, or an automatic restart) is then `queued`, holds nothing,
and is tried again every `QUEUE_RETRY_S` — so two queued multi-node runs never hold part of
what the other needs. Each node serves its queue first come first served, by the time node
0 queued the run (`RunRecord.queue_key`, the same on every node): the earliest run is
never held up by a later one anywhere, so the queue cannot deadlock.

The gang reads and writes runs only through the `RunBook`, and starts and stops this
node's part through the narrow `LocalParts` interface the supervisor provides
(gpud/runs/multinode/local.py).
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Coroutine
from typing import Any

from gpud.model.run import AttemptRecord, FailureCause, NodeRef, RunRecord, RunState
from gpud.runs.multinode import elastic
from gpud.runs.multinode.coordinator_watch import CoordinatorWatch, stop_for, went_on_without
from gpud.runs.multinode.decide import GangDecision, GangView, RestartPolicy, decide, echo_wait
from gpud.runs.multinode.local import HealthSink, LocalParts
from gpud.runs.multinode.peer_stops import RETRY_S, PeerStops
from gpud.runs.multinode.peers import PeerLink, PeerLinks, each
from gpud.runs.multinode.reserving import Reservations
from gpud.runs.placement.ports import NoFreePort, master_host
from gpud.runs.state.book import RunBook
from gpud.runs.state.checkpoints import resume_point
from gpud.security.keys import KeyPair
from gpud.wire.client import ClientError, Unreachable
from gpud.wire.envelope import ErrorCode, ProtocolError
from gpud.wire.protocol import GANG_STATUS, PART_HEALTH, PART_START, PART_STATUS, PART_STOP
from gpud.wire.run_messages import (
    GangStatus,
    PartHealth,
    PartStartRequest,
    PartStatusRequest,
    PartStopRequest,
    PartView,
)

log = logging.getLogger("gpud.runs")

POLL_S = 0.5
#: An automatic restart that could not start (its part's files found no room, a node
#: refused) is tried again this often, while the run stays pending saying why.
START_RETRY_S = 10.0
#: How often node 0 looks for the parts of ended runs on nodes that were lost.
ORPHAN_POLL_S = 2.0
#: How long node 0 keeps looking for them.
ORPHAN_WATCH_S = 3600.0
#: After SIGTERM, how long the ranks of a part stopped because the gang failed get
#: before SIGKILL: they are most likely stuck in a collective with the dead ranks.
FAILED_KILL_GRACE_S = 2.0
#: How often node 0 tries again to start a queued run.
QUEUE_RETRY_S = 1.0
#: A run launched to wait for gpuctl's run.start is cancelled if none came by then.
AWAIT_START_S = 300.0
#: A hung run's ranks get this long to write their flight-recorder dumps before SIGTERM.
HANG_DUMP_WAIT_S = 1.0


class Gang:
    def __init__(
        self, book: RunBook, local: LocalParts, keys: KeyPair | None, health: HealthSink
    ) -> None:
        self.book = book
        self.local = local
        self.keys = keys
        self.health = health
        self.views: dict[str, GangView] = {}
        self.links = PeerLinks(keys)  # one link to each other node, for node 0's calls
        self._busy: dict[str, asyncio.Task[None]] = {}  # run id → its poll or restart
        self._orphans: dict[str, tuple[float, set[int]]] = {}  # run → (ended at, lost ranks)
        self._orphan_poll = 0.0
        self._errands: set[asyncio.Task[Any]] = set()
        self._queue_tried: dict[str, float] = {}  # queued run → when last tried
        self.reservations = Reservations(book, local, self.links)
        self._stops = PeerStops()  # what node 0 asked of the other nodes, until it is done
        self._watch = CoordinatorWatch()  # this node asking node 0 about the runs it is in
        # Why each node the current attempt goes on without was left out (elastic runs),
        # for status's NODE table.
        self._left_out: dict[str, dict[int, str]] = {}

    def close(self) -> None:
        self.links.close()

    # ------------------------------------------------------------------ calls

    def _others(self, run: RunRecord) -> list[int]:
        """The other nodes of the current attempt (every node but node 0, unless an
        elastic attempt uses fewer)."""
        return [r for r in elastic.members_of(run, self.book.spec(run)) if r != 0]

    def _background(self, run_id: str, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._busy[run_id] = task
        task.add_done_callback(lambda t: _report(run_id, t))

    def _errand(self, work: Coroutine[Any, Any, Any]) -> None:
        """Run `work` beside the tick (a silent node must never hold the tick up)."""
        task = asyncio.get_running_loop().create_task(work)
        self._errands.add(task)
        task.add_done_callback(self._errands.discard)

    def stop_peers_soon(self, run: RunRecord, reason: str) -> None:
        """A user's stop for the other parts, asked beside the reply: a node that does not
        answer is asked again until its part has stopped or it is lost."""
        if len(run.nodes) > 1:
            self._errand(self.stop_peers(run, force=False, reason=reason))

    def _idle(self, run_id: str) -> bool:
        task = self._busy.get(run_id)
        return task is None or task.done()

    def watching(self, run_id: str) -> bool:
        """Whether node 0 still works on the run: a poll, restart or start under way, or
        its leftover parts on nodes that were lost (retention leaves such a run alone)."""
        return not self._idle(run_id) or run_id in self._orphans

    def forget(self, run_id: str) -> None:
        """Let go of an ended run retention removed."""
        self.views.pop(run_id, None)
        self._queue_tried.pop(run_id, None)
        self._left_out.pop(run_id, None)

    # ------------------------------------------------------------------ views

    def view(self, run: RunRecord) -> GangView:
        view = self.views.get(run.id)
        if view is None or view.nodes != run.nodes:  # an attached run learns its nodes late
            members = elastic.members_of(run, self.book.spec(run))
            view = self.views[run.id] = GangView(run.nodes, self.book.clock(), members)
        return view

    def part_views(self, run: RunRecord) -> list[PartView]:
        own = self.book.current_part(run)
        mine = PartView(
            node_rank=run.node_rank,
            node=run.nodes[run.node_rank],
            state=own.record.state if own else None,
            reason=own.record.reason if own else None,
            seen_at=self.book.clock(),
            gpus=own.record.held_gpus if own else [],
            cause=own.record.exit.cause if own and own.record.exit else None,
            flight_recorder=own.record.exit.flight_recorder if own and own.record.exit else [],
        )
        view = self.views.get(run.id)
        if view is None or not run.is_coordinator:
            return [mine]
        out = [  # never in `view.parts`: those are the attempt's members
            PartView(node_rank=r, node=run.nodes[r], left_out=why)
            for r, why in sorted(self._left_out.get(run.id, {}).items())
        ]
        return [mine, *view.parts.values(), *out]

    async def _poll(self, run: RunRecord, view: GangView) -> None:
        ranks = [
            r
            for r in self._others(run)
            if view.parts[r].state is not RunState.LOST and run.nodes[r].control
        ]
        request = PartStatusRequest(run_id=run.id)
        replies = await self.links.call(run, ranks, PART_STATUS, each(request))
        healths = await self.links.call(run, ranks, PART_HEALTH, each(request))
        self.health(run.id, {r: h for r, h in healths.items() if isinstance(h, PartHealth)})
        now = self.book.clock()
        for rank, reply in replies.items():
            old = view.parts[rank]
            if old.state is RunState.LOST:
                continue  # decided while this poll was under way
            if isinstance(reply, Unreachable):
                view.parts[rank] = old.model_copy(update={"error": str(reply)})
            elif isinstance(reply, AttemptRecord) and reply.attempt == run.attempt:
                view.parts[rank] = old.model_copy(
                    update={"state": reply.state, "reason": reply.reason, "seen_at": now,
                            "error": None, "gpus": reply.held_gpus,
                            "cause": reply.exit.cause if reply.exit else None,
                            "flight_recorder":
                                reply.exit.flight_recorder if reply.exit else []}
                )  # fmt: skip
            else:  # it answered: about an older attempt, or with an error reply
                error = str(reply) if isinstance(reply, ClientError) else None
                view.parts[rank] = old.model_copy(update={"seen_at": now, "error": error})

    # ------------------------------------------------------------------ the tick

    @property
    def has_orphans(self) -> bool:
        """Ranks of ended runs still to be stopped: the ticks must go on at full pace."""
        return bool(self._orphans)

    async def tick(self, now: float) -> None:
        woke = self._watch.tick(now)
        runs = self.book.ticked()
        self._watch.keep({run.id for run in runs if not run.is_coordinator})
        for run in runs:
            if not run.is_coordinator:
                self._watch_coordinator(run, now, woke)
                continue
            if run.awaiting_start:  # gpuctl is joining the nodes; its run.start starts it
                if self.book.clock() - run.state_since > AWAIT_START_S and self._idle(run.id):
                    why = f"no run.start came within {AWAIT_START_S:.0f}s of the launch"
                    self._background(run.id, self._never_started(run.id, why))
                continue
            if run.state is RunState.QUEUED:
                tried = self._queue_tried.get(run.id, 0.0)
                if now - tried >= QUEUE_RETRY_S and self._idle(run.id):
                    self._queue_tried[run.id] = now
                    self._background(run.id, self._start_queued(run.id))
                continue
            if run.state is RunState.PENDING and run.next_restart_at is not None:
                if now >= run.next_restart_at and self._idle(run.id):
                    self._background(run.id, self._restart_when_ready(run.id))
                continue
            if run.state.terminal:
                continue
            view = self.view(run)
            if len(run.nodes) > 1 and now - view.last_poll >= POLL_S and self._idle(run.id):
                view.last_poll = now
                self._background(run.id, self._poll(run, view))
            if run.attached is not None:
                continue  # its scheduler decides its fate: node 0 only reads the others
            await self._carry_out(run, view, now)
            self._ask_again(run, view, now)
        if self._orphans and now - self._orphan_poll >= ORPHAN_POLL_S:
            self._orphan_poll = now
            await self._stop_orphans(now)

    # ------------------------------------------------------------------ node N's side

    def status_for_member(self, run: RunRecord) -> GangStatus:
        """What node 0 tells one of the run's other nodes that asks (`run.gang.status`)."""
        return GangStatus(
            run_id=run.id,
            state=run.state,
            attempt=run.attempt,
            reason=run.reason,
            stop=self._stops.wanted(run),
            members=run.members,
        )

    def _watch_coordinator(self, run: RunRecord, now: float, woke: bool) -> None:
        """Ask node 0 where the run stands, now and then, while a part of it runs here."""
        own = self.book.part(run.id)
        live = own is not None and not own.record.state.terminal
        if not live or run.attached is not None or run.coordinator is None:
            self._watch.forget(run.id)
            return
        assert own is not None
        if own.record.stop_requested or not self._watch.due(run.id, now, woke):
            return
        self._watch.sending(run.id, now)
        self._errand(self._ask_coordinator(run, run.coordinator, own.record.attempt))

    async def _ask_coordinator(self, run: RunRecord, node0: NodeRef, attempt: int) -> None:
        # A link of its own, closed after the one call: a connection kept open to a node 0
        # that dies and comes back (refusing this key until it has re-adopted the run)
        # piles up handshake events nobody reads, and once froze this daemon's shutdown.
        link = PeerLink(node0, self.keys)
        try:
            request = PartStatusRequest(run_id=run.id)
            status = await asyncio.to_thread(link.call, GANG_STATUS, request)
        except ClientError as exc:  # node 0 restarting, or an older gpud: nothing changes
            log.debug("run %s: node 0 did not say where the run stands: %s", run.id, exc)
            return
        finally:
            await asyncio.to_thread(link.close)
            self._watch.answered(run.id)
        stop = stop_for(status, attempt, run.node_rank)
        current = self.book.get(run.id)
        own = self.book.part(run.id)
        if stop is None or current is None or own is None or own.record.attempt != attempt:
            return
        if own.record.state.terminal or own.record.stop_requested:
            return  # node 0's own ask got here first
        self.book.event(
            current, "stop", f"node 0 wants this part stopped ({stop.reason}): stopping it",
            "warning",
        )  # fmt: skip
        self.local.obey_stop(current, stop)

    async def _carry_out(self, run: RunRecord, view: GangView, now: float) -> None:
        own = self.book.current_part(run)
        parts = {0: self.part_views(run)[0], **view.parts}
        spec = self.book.spec(run)
        exit_info = own.record.exit if own is not None else None
        teardown = exit_info is not None and exit_info.teardown_abort
        decision = decide(
            run,
            parts,
            now=now,
            since=view.since,
            lost_after_s=spec.lost_after_s,
            restart=RestartPolicy(
                spec.restart.max_attempts,
                spec.restart.backoff_s,
                spec.restart.backoff_max_s,
                frozenset(spec.restart.on),
                elastic=spec.elastic is not None,
            ),
            cause=view.cause,
            teardown_abort=teardown,
            step_of=lambda: _latest_step(self.book, run.id),
        )
        for rank in decision.lost:
            self._mark_lost(run, view, rank, f"no answer for {spec.lost_after_s:g}s")
        if decision.propagate is not None and view.cause is None:
            if echo_wait(view, decision, now):
                return  # the part that failed first may yet say why: ask again next tick
            view.cause = decision.cause
            self._propagate(run, decision.propagate)
        self._settle(run, decision)

    def _mark_lost(self, run: RunRecord, view: GangView, rank: int, why: str) -> None:
        part = view.parts[rank]
        view.parts[rank] = part.model_copy(update={"state": RunState.LOST, "reason": why})
        where = part.node.name or part.node.control
        self.book.event(run, "lost", f"node {rank} ({where}) lost: {why}", "critical", rank=rank)

    def _settle(self, run: RunRecord, decision: GangDecision) -> None:
        run = self.book.get(run.id) or run
        if decision.state is RunState.PENDING and decision.restart_at is not None:
            self.book.move(
                run.id,
                RunState.PENDING,
                decision.reason,
                next_attempt=True,
                next_restart_at=decision.restart_at,
                cause=decision.cause,
            )
        elif decision.state is RunState.FAILED:
            self.book.move(run.id, decision.state, decision.reason, cause=decision.cause)
        elif decision.state is not RunState.PENDING:  # nothing heard yet: no news
            self.book.move(run.id, decision.state, decision.reason)
        ended = self.book.get(run.id)
        view = self.views.get(run.id)
        if ended is not None and ended.state.terminal and view is not None:
            lost = {r for r, p in view.parts.items() if p.state is RunState.LOST}
            if lost:
                self._orphans[run.id] = (self.book.clock(), lost)

    def hang(self, run: RunRecord, cause: FailureCause) -> None:
        """Health called the run stalled for `restart.hang_timeout_s`: ask every rank for a
        flight-recorder dump, stop the gang as failed with the cause `hang`; `decide` then
        restarts it from the latest checkpoint when `restart` allows."""
        view = self.view(run)
        if view.cause is not None:
            return  # already failing
        cause = cause.model_copy(update={"step": _latest_step(self.book, run.id)})
        view.cause = cause
        reason = cause.one_line()
        self.book.event(
            run, "hang", f"{reason}; asking for a flight-recorder dump, then stopping", "critical"
        )
        self.local.stop_part(
            run, force=False, reason=reason, grace_s=HANG_DUMP_WAIT_S, failed=reason, dump=True
        )
        if len(run.nodes) > 1:
            self._errand(self.stop_peers(run, force=False, reason=reason, failed=True, dump=True))

    def _propagate(self, run: RunRecord, reason: str) -> None:
        """One part failed or was lost: stop every other part, as failed, at once.

        The other nodes are asked in the background: a silent one must not hold up the
        tick (it is lost after `lost_after_s` all the same).
        """
        if len(run.nodes) > 1:
            self.book.event(run, "propagate", f"{reason}; stopping the other parts", "warning")
        own = self.book.current_part(run)
        if own is not None and not own.record.state.terminal:
            # The others are most likely stuck in a collective with the dead ranks: no
            # handshake, straight to SIGTERM.
            self.local.stop_part(run, force=False, reason=reason, grace_s=0.0, failed=reason)
        if len(run.nodes) > 1:
            self._errand(self.stop_peers(run, force=False, reason=reason, failed=True))

    # ------------------------------------------------------------------ stopping

    async def stop_peers(
        self, run: RunRecord, force: bool, reason: str, failed: bool = False, dump: bool = False
    ) -> list[int]:
        """Ask the other nodes to stop their parts; returns the ranks that did not answer.
        Those, and any part not yet over, are asked again until it is (`PeerStops`)."""
        if len(run.nodes) < 2:
            return []
        request = self._stops.want(
            run,
            PartStopRequest(
                run_id=run.id, force=force, reason=reason[:500], failed=failed, dump=dump
            ),
        )
        others = self._others(run)
        now = self.book.clock()
        for rank in others:
            self._stops.sending(run.id, rank, now)
        replies = await self.links.call(run, others, PART_STOP, each(request))
        silent = []
        for rank, reply in replies.items():
            self._stops.answered(run.id, rank, not isinstance(reply, Unreachable))
            if isinstance(reply, ClientError):
                self.book.event(
                    run,
                    "stop",
                    f"could not reach node {rank} to stop its part: {reply}; asking again"
                    f" every {RETRY_S:g}s until it has stopped or is lost",
                    "warning",
                )
            if isinstance(reply, Unreachable):
                silent.append(rank)
        return silent

    def _ask_again(self, run: RunRecord, view: GangView, now: float) -> None:
        """Ask again each part node 0 wanted stopped that its polls do not show over."""
        due = self._stops.due(run, view.parts, now)
        if due is None:
            return
        request, ranks = due
        for rank in ranks:
            self._stops.sending(run.id, rank, now)
        self._errand(self._stop_again(run, ranks, request))

    async def _stop_again(
        self, run: RunRecord, ranks: list[int], request: PartStopRequest
    ) -> list[int]:
        replies = await self.links.call(run, ranks, PART_STOP, each(request))
        for rank, reply in replies.items():
            if self._stops.answered(run.id, rank, not isinstance(reply, Unreachable)):
                state = reply.state.value if isinstance(reply, AttemptRecord) else "?"
                self.book.event(
                    run,
                    "stop",
                    f"node {rank} answers again (its part was {state}); asked it to stop its part",
                    "warning",
                )
        return []

    def lose(self, run: RunRecord, ranks: list[int], why: str) -> None:
        """Mark parts lost now (a forced stop does not wait for silent nodes)."""
        view = self.view(run)
        for rank in ranks:
            state = view.parts[rank].state
            if state is None or not state.terminal:
                self._mark_lost(run, view, rank, why)

    async def _stop_orphans(self, now: float) -> None:
        for run_id, (ended, ranks) in list(self._orphans.items()):
            run = self.book.known(run_id)
            if run is None or now - ended > ORPHAN_WATCH_S or not ranks:
                self._orphans.pop(run_id, None)
                continue
            status = PartStatusRequest(run_id=run.id)
            replies = await self.links.call(run, sorted(ranks), PART_STATUS, each(status))
            for rank, reply in replies.items():
                if isinstance(reply, Unreachable):
                    continue
                ranks.discard(rank)
                if isinstance(reply, AttemptRecord) and not reply.state.terminal:
                    self.book.event(run, "orphan", f"node {rank} is back; stopping its part")
                    why = _orphan_reason(run, reply.attempt, rank)
                    stop = PartStopRequest(run_id=run.id, force=True, reason=why, failed=True)
                    await self.links.call(run, [rank], PART_STOP, each(stop))

    # ------------------------------------------------------------------ new attempts

    async def _restart_when_ready(self, run_id: str) -> None:
        """An automatic restart, once every node answers and the old attempt is over; an
        elastic run does not wait for a silent node: it starts on the others."""
        run = self.book.get(run_id)
        if run is None or run.state is not RunState.PENDING or run.next_restart_at is None:
            return
        view = self.views.get(run.id)
        lost = {r for r, p in view.parts.items() if p.state is RunState.LOST} if view else set()
        silent, waiting = await self._old_attempt_left(run, lost)
        can_leave_out = self.book.spec(run).elastic is not None and 0 not in silent
        if waiting or (silent and not can_leave_out):
            why = waiting or "node(s) " + ", ".join(map(str, sorted(silent))) + " do not answer"
            self.book.move(run.id, RunState.PENDING, f"restart waits: {why}")
            return
        try:
            await self.start_attempt(
                run, why="automatic restart", automatic=True, queue=True, left_out=silent
            )
        except ProtocolError as exc:
            if exc.code is ErrorCode.CONFLICT:  # it never can: say so, do not retry forever
                self.book.move(run.id, RunState.FAILED, f"{run.reason}; restart refused: {exc}")
                return
            log.error("run %s: restart failed: %s", run.id, exc.message)
            current = self.book.get(run.id)
            if current is not None and current.state is RunState.PENDING:
                # It may start later (the disk has room again, a node answers): tried
                # again every START_RETRY_S, not left pending with nothing due.
                self.book.move(
                    run.id,
                    RunState.PENDING,
                    f"restart waits: {exc.message} (tried again every {START_RETRY_S:g}s)",
                    next_restart_at=self.book.clock() + START_RETRY_S,
                )

    async def _never_started(self, run_id: str, why: str) -> None:
        """gpuctl launched the run and never said every node joined (it died, or lost node
        0): the run leaves every node's queue rather than wait for good."""
        run = self.book.get(run_id)
        if run is not None and run.awaiting_start and run.state is RunState.QUEUED:
            self.book.event(run, "stop", f"cancelled: {why}", "warning")
            await self.cancel(self.book.update(run.id, awaiting_start=False), why)

    async def _start_queued(self, run_id: str) -> None:
        run = self.book.get(run_id)
        if run is None or run.state is not RunState.QUEUED:
            return
        try:
            await self.start_attempt(run, why="its GPUs are free", queue=True)
        except ProtocolError as exc:
            log.error("run %s: could not start from the queue: %s", run.id, exc.message)

    async def _old_attempt_left(
        self, run: RunRecord, lost: set[int]
    ) -> tuple[set[int], str | None]:
        """The nodes of the last attempt that do not answer, and why a new attempt cannot
        start yet (a part still running: it is stopped first). A node already declared
        `lost` is asked too (it may be back), unless the run is elastic: then it is left
        out at once rather than waited for (its leftovers are stopped when it answers)."""
        request = PartStatusRequest(run_id=run.id)
        skip = lost if self.book.spec(run).elastic is not None else set()
        asked = [r for r in self._others(run) if r not in skip]
        replies = await self.links.call(run, asked, PART_STATUS, each(request))
        silent = set(skip) | {r for r, reply in replies.items() if isinstance(reply, Unreachable)}
        running = [
            r
            for r, reply in replies.items()
            if isinstance(reply, AttemptRecord) and not reply.state.terminal
        ]
        if running:
            stop = PartStopRequest(run_id=run.id, force=True, reason="restart", failed=True)
            await self.links.call(run, running, PART_STOP, each(stop))
            return silent, "stopping what is left of the last attempt on node(s) " + ", ".join(
                map(str, running)
            )
        return silent, None

    async def start_attempt(
        self,
        run: RunRecord,
        why: str,
        automatic: bool = False,
        queue: bool = False,
        resume_from: str | None = None,
        left_out: set[int] | frozenset[int] = frozenset(),
    ) -> RunRecord:
        """A new attempt of the whole run, from the run's latest checkpoint (or the one
        `resume_from` names): resume, restart, and a queued run's start. With its GPUs busy
        somewhere it is refused (ProtocolError `unavailable`), or with `queue` it waits:
        the run is `queued`, holding nothing. Refused (`conflict`) when the spec requires a
        checkpoint and the run has none of its own. An elastic run starts on the nodes that
        can (`left_out`: known silent), if there are enough (`gpud.runs.multinode.elastic`); an
        automatic restart with too few fails instead of waiting, unless the spec queues."""
        spec = self.book.spec(run)
        automatic = automatic or run.queued_restart
        attempt, fresh = self._next_attempt(run)
        if resume_from is not None:  # kept on the record: it may wait in the queue
            run = self.book.update(run.id, resume_next=resume_from)
        # In a thread: resume.pattern is the user's glob, and a wide one over a big shared
        # filesystem takes its whole budget (checkpoints.SEARCH_BUDGET_S) to search.
        point = await asyncio.to_thread(resume_point, run, spec, fresh)
        queued = run.state is RunState.QUEUED
        key = run.queue_key if queued else (self.book.clock(), run.id)
        # An elastic restart whose spec does not queue fails below min_nodes rather than
        # wait: it takes no place in the other nodes' queues.
        short_fails = automatic and spec.elastic is not None and not spec.queue
        got = await self.reservations.reserve(
            run, spec, attempt, key, queue and not short_fails, left_out
        )
        refusal, members, words = got.refusal, got.members, got.words
        current = self.book.get(run.id) or run
        if current.state is not run.state or current.stop_requested != run.stop_requested:
            await self.reservations.release(run, attempt)  # stopped (cancelled) while we asked
            return current
        if refusal is not None:
            if got.too_few and short_fails:
                return self._too_few_to_restart(run, refusal, left_out)
            if not queue:
                self.book.update(run.id, resume_next=None)  # refused: --from is not kept
                raise ProtocolError(ErrorCode.UNAVAILABLE, refusal)
            room = self.local.state_full() is not None  # not the GPUs: the state dir's disk
            waiting = f"waiting for {'room' if room else 'GPUs'}: {refusal}"
            if queued:
                if _same_words(current.reason, waiting):  # asked again each tick: no news
                    return current
                return self.book.move(run.id, RunState.QUEUED, waiting)
            self.book.event(run, "queue", f"queued: {refusal}")
            return self.book.move(
                run.id,
                RunState.QUEUED,
                waiting,
                next_attempt=True,
                queued_at=key[0],
                next_restart_at=None,
                queued_restart=automatic,
            )
        self._queue_tried.pop(run.id, None)
        own = self.book.part(run.id)
        master_addr = own.record.master_addr if own else master_host(spec, run.nodes)
        # One node: no all-reduce to measure, but a real GPU still gets its matmul and
        # memory test before the attempt takes it.
        why_out = dict(got.left_out)
        if spec.preflight and (len(members) > 1 or self.local.holds_real_gpus(run, attempt)):
            members, words, failing = await self.reservations.preflight(
                run, spec, attempt, members, words, master_addr
            )
            why_out.update(failing)
        try:
            port = self.local.free_master_port()
        except NoFreePort as exc:
            await self.reservations.release(run, attempt)
            raise ProtocolError(ErrorCode.UNAVAILABLE, str(exc)) from None
        self.book.store.lease_port(port, run.id, attempt, self.book.clock())
        earlier = self.book.current_part(run)  # the attempt before: did its ranks say hello?
        library = earlier is not None and earlier.record.library
        before = elastic.members_of(run, spec)
        previous = run  # what the record says if this attempt cannot start after all
        full = len(elastic.primary(run, spec))
        grad_accum = elastic.grad_accum_for(spec, len(members), full)
        run = self.book.update(
            run.id,
            attempt=attempt,
            stop_requested=False,
            next_restart_at=None,
            restarts=run.restarts + (1 if automatic else 0),
            queued_restart=False,
            resume_next=None,
            members=members if spec.elastic is not None else None,
            grad_accum=grad_accum,
        )
        self.views[run.id] = GangView(run.nodes, self.book.clock(), members)
        self._left_out[run.id] = (
            {
                r: why_out.get(r) or ("a spare, not needed" if r >= full else "not chosen")
                for r in range(len(run.nodes))
                if r not in members
            }
            if spec.elastic is not None
            else {}
        )
        self._orphans.pop(run.id, None)
        left_behind = set(before) - set(members)
        if left_behind:  # a part of theirs may still run: stopped once they answer
            self._orphans[run.id] = (self.book.clock(), left_behind)
        self._stops.forget(run.id)
        shape = f", on {words}" if spec.elastic is not None else ""
        if grad_accum is not None:
            shape += elastic.batch_note(grad_accum, elastic.reads_grad_accum(spec, library))
        self.book.event(run, "attempt", f"attempt {attempt}: {why}, {point.describe()}{shape}")
        try:
            self.local.start_part(run, spec, attempt, master_addr, port, point)
        except ProtocolError as exc:  # e.g. no room on the state dir's disk for its files
            await self.reservations.release(run, attempt)
            self.book.store.release_ports(run.id)
            self._undo_attempt(run, previous, attempt, exc.message)
            raise
        run = self.book.move(
            run.id, RunState.STARTING, f"attempt {attempt}: {why}", next_attempt=True
        )
        request = PartStartRequest(
            run_id=run.id,
            attempt=attempt,
            master_addr=master_addr,
            master_port=port,
            resume_from=point.path,
            members=run.members,
            grad_accum=grad_accum,
        )
        replies = await self.links.call(run, self._others(run), PART_START, each(request))
        failed = {rank: reply for rank, reply in replies.items() if isinstance(reply, Exception)}
        if failed:
            rank, error = next(iter(failed.items()))
            message = f"node {rank} could not start attempt {attempt}: {error}"
            run = self.book.update(run.id, stop_requested=True)
            self.local.stop_part(run, force=True, reason=message, grace_s=0.0)
            await self.stop_peers(run, force=True, reason=message)
            raise ProtocolError(ErrorCode.UNAVAILABLE, message)
        return self.book.get(run.id) or run

    def _undo_attempt(self, now: RunRecord, previous: RunRecord, attempt: int, why: str) -> None:
        """An attempt whose part here could not start is not an attempt: the record goes
        back to the one before (so `ps` and `status` agree on the attempt), and says why."""
        self.book.update(
            now.id,
            attempt=previous.attempt,
            restarts=previous.restarts,
            members=previous.members,
            grad_accum=previous.grad_accum,
        )
        self.book.event(now, "attempt", f"attempt {attempt} did not start: {why}", "warning")

    def _too_few_to_restart(
        self, run: RunRecord, why: str, silent: set[int] | frozenset[int]
    ) -> RunRecord:
        """An elastic run below `min_nodes` whose spec does not queue: its restart fails
        the run (issue 21 §3), keeping the cause of the attempt that failed. A silent node's
        leftovers are stopped once it answers, as after any ended run."""
        self.book.update(run.id, resume_next=None)
        if silent:
            self._orphans[run.id] = (self.book.clock(), set(silent))
        return self.book.move(
            run.id,
            RunState.FAILED,
            f"not restarted: {why} (queue: false; with queue: true it would wait, queued)",
            next_restart_at=None,
            queued_restart=False,
        )

    async def cancel(self, run: RunRecord, reason: str) -> RunRecord:
        """Stop a queued run: it leaves every node's queue, and holds nothing anywhere."""
        attempt, _ = self._next_attempt(run)
        run = self.book.cancel_queued(run.id, reason)
        self._queue_tried.pop(run.id, None)
        await self.reservations.release(run, attempt, cancel=reason)
        return self.book.get(run.id) or run

    def _next_attempt(self, run: RunRecord) -> tuple[int, bool]:
        """The number the run's next attempt gets, and whether it is its first: a run
        queued at launch has no attempt yet, so its first start is attempt 1."""
        fresh = not self.book.store.attempts(run.id)
        return (run.attempt if fresh else run.attempt + 1), fresh


def _report(run_id: str, task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("run %s: gang work failed", run_id, exc_info=task.exception())


def _latest_step(book: RunBook, run_id: str) -> int | None:
    latest = book.store.latest_metrics(run_id)
    return latest[0] if latest else None


def _orphan_reason(run: RunRecord, attempt: int, rank: int) -> str:
    """Why a node that came back has its stale part stopped, as its own log says it: the
    run ended, or (an elastic run) it went on without this node."""
    if run.state.terminal:
        return f"run {run.id} ended"
    return went_on_without(run.id, attempt, rank, run.attempt)


#: The part of a full store's refusal that changes each time it is asked.
_WAITING_WRITES = re.compile(r"\d+ write\(s\) wait in memory")


def _same_words(old: str | None, new: str) -> bool:
    """The same reason but for a full store's count of the writes waiting."""
    if old is None:
        return False
    return _WAITING_WRITES.sub("#", old) == _WAITING_WRITES.sub("#", new)
