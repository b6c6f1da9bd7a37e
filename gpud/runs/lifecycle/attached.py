"""Runs gpud did not start, watched through the attach socket (`gpud.attach`).

A Slurm job's part (or a pod's) attaches to its node's daemon: the run and this node's
part of it enter the run book like any other run, so `gpuctl ps`, `status`, `metrics`,
`health`, gputop and /metrics show them; the ranks report through the shared ingest
socket with the token their part runner chose. gpud never signals, restarts, resumes or
cleans up such a run: the scheduler owns it, and a stop or resume asked of gpud names the
scheduler's way instead.

Who may attach what (the trust model, docs/DESIGN.md "Runs gpud did not start"):
- the kernel names the connecting process (SO_PEERCRED: pid, uid); a Slurm part must be in
  the job it names (its cgroup or environment says so);
- a run id is bound to the uid that first attached it: no other user (root aside) can
  attach to it again, or report into it;
- every message on the shared ingest must carry a token of that run's current attempt,
  which only the run's own processes know (their environment; the daemon keeps it in
  memory only).
"""

from __future__ import annotations

import hmac
import logging
import os
import pwd
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from gpud.attach.wire import (
    AttachReply,
    AttachRequest,
    CoordinatorUpdate,
    EndReport,
    NodesUpdate,
    refusal,
)
from gpud.kube.pods import KubePods
from gpud.model.run import Attachment, AttemptRecord, ExitInfo, NodeRef, RunRecord, RunState
from gpud.model.trainer_messages import TrainerMessage
from gpud.runs.process import procs
from gpud.runs.state.book import RunBook
from gpud.runs.state.part import Part
from gpud.security.auth import PeerKeys
from gpud.slurm.jobs import SlurmJobs
from gpud.wire.envelope import ErrorCode, ProtocolError
from gpud.wire.run_messages import NodeRefIn

log = logging.getLogger("gpud.attach")

#: After a daemon restart, how long an attached part has to attach again before its run
#: is given up as out of touch.
REATTACH_S = 30.0
#: What a part runner said of a job that ended without its end report (killed, cancelled).
GONE = "its part runner ended without a report (cancelled or killed?); {scheduler} has the end"


def _user_name(uid: int) -> str | None:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return None


@dataclass(frozen=True)
class AttachConfig:
    """Where this daemon is, for the parts that attach to it."""

    control: str  # the control endpoint other nodes' daemons reach it at
    ingest: str  # the shared ingest endpoint the attached ranks send to
    job_of: Callable[[int], str] = field(default_factory=lambda: SlurmJobs().of)
    pod_of: Callable[[int], str] = field(default_factory=lambda: KubePods().uid_of)
    user_of: Callable[[int], str | None] = _user_name
    #: Users who may attach to any run: root and the daemon's own.
    trusted_uids: frozenset[int] = field(default_factory=lambda: frozenset({0, os.getuid()}))


@dataclass(frozen=True)
class Peer:
    """Who connected to the attach socket, as the kernel says."""

    pid: int
    uid: int
    gid: int


class AttachedRuns:
    def __init__(
        self,
        book: RunBook,
        peer_keys: PeerKeys,
        *,
        node: str,
        server_key: str | None,
        config: AttachConfig,
    ) -> None:
        self.book = book
        self.peer_keys = peer_keys
        self.node = node
        self.control = config.control
        self.server_key = server_key
        self.ingest = config.ingest
        self._job_of = config.job_of
        self._pod_of = config.pod_of
        self._user_of = config.user_of
        self._trusted = config.trusted_uids
        #: run id → token → attempt: what the ranks of each attached part may send with.
        self._tokens: dict[str, dict[str, int]] = {}
        #: run id → when its part must have attached again (after a daemon restart).
        self._waiting: dict[str, float] = {}

    # ------------------------------------------------------------------ attaching

    def attach(self, req: AttachRequest, peer: Peer) -> AttachReply:
        req = self._renumbered(req)
        try:
            self._check(req, peer)
            run = self._run_for(req, peer)
        except ProtocolError as exc:
            log.warning(
                "attach of %s (node %d) by pid %d uid %d refused: %s",
                req.run_id, req.node_rank, peer.pid, peer.uid, exc.message,
            )  # fmt: skip
            return refusal(exc.code.value, exc.message)
        self._part_for(run, req, peer)
        self._tokens[run.id] = {
            t: a for t, a in self._tokens.get(run.id, {}).items() if a == req.attempt
        }
        self._tokens[run.id][req.token] = req.attempt
        self._waiting.pop(run.id, None)
        attached = run.attached
        assert attached is not None
        job = f" job {attached.job_id}" if attached.job_id else ""
        self.book.event(
            run,
            "attached",
            f"{attached.scheduler}{job}: node {req.node_rank} ({req.host}) attached, attempt"
            f" {req.attempt}, {req.nproc} process(es), pid {peer.pid}, user"
            f" {attached.user or attached.uid}",
        )
        return AttachReply(
            ok=True,
            attempt=req.attempt,
            ingest=self.ingest,
            node=self.node,
            control=self.control,
            server_key=self.server_key,
        )

    def _renumbered(self, req: AttachRequest) -> AttachRequest:
        """A pod or a hand-started command run again under an id whose run ended here is
        that run's next attempt (Slurm numbers its own attempts: those are kept)."""
        existing = self.book.known(req.run_id)
        if (
            req.scheduler == "slurm"
            or existing is None
            or not existing.state.terminal
            or req.attempt > existing.attempt
        ):
            return req
        attempt = existing.attempt + 1
        where = req.attempt_dir.replace(f"attempt-{req.attempt}", f"attempt-{attempt}")
        return req.model_copy(update={"attempt": attempt, "attempt_dir": where})

    def _check(self, req: AttachRequest, peer: Peer) -> None:
        if req.scheduler == "slurm":
            if req.job_id is None:
                raise ProtocolError(ErrorCode.INVALID_BODY, "a Slurm part must name its job_id")
            found = self._job_of(peer.pid)
            if found != req.job_id:
                where = f"Slurm job {found}" if found else "no Slurm job gpud can see"
                raise ProtocolError(
                    ErrorCode.FORBIDDEN,
                    f"pid {peer.pid} is not in Slurm job {req.job_id} (it is in {where})",
                )
        pod = self._pod_of(peer.pid)
        if req.scheduler == "kubernetes":
            if req.pod_uid is None:
                raise ProtocolError(ErrorCode.INVALID_BODY, "a pod's part must name its pod_uid")
            if pod != req.pod_uid.replace("_", "-"):
                where = f"pod {pod}" if pod else "no pod gpud can see"
                raise ProtocolError(
                    ErrorCode.FORBIDDEN,
                    f"pid {peer.pid} is not in pod {req.pod_uid} (it is in {where})",
                )
        existing = self.book.known(req.run_id)
        if existing is None:
            return
        # Root in a pod is not the node's root: only a process outside pods is trusted.
        trusted = peer.uid in self._trusted and not pod
        if existing.attached is None:
            raise ProtocolError(
                ErrorCode.CONFLICT,
                f"run {req.run_id} was launched by gpud here; nothing can attach to it",
            )
        owner = existing.attached
        if owner.uid != peer.uid and not trusted:
            raise ProtocolError(
                ErrorCode.FORBIDDEN,
                f"run {req.run_id} belongs to {owner.user or 'uid'} ({owner.uid}); uid"
                f" {peer.uid} may not attach to it",
            )
        if existing.node_rank != req.node_rank and not existing.state.terminal:
            raise ProtocolError(
                ErrorCode.CONFLICT,
                f"node {existing.node_rank} of run {req.run_id} is attached here already: one"
                " part of a run per daemon",
            )
        if req.attempt < existing.attempt:
            raise ProtocolError(
                ErrorCode.CONFLICT,
                f"attempt {req.attempt} of run {req.run_id} is older than its attempt"
                f" {existing.attempt}",
            )
        if req.attempt == existing.attempt and existing.state.terminal:
            raise ProtocolError(
                ErrorCode.CONFLICT, f"attempt {req.attempt} of run {req.run_id} already ended"
            )

    def _run_for(self, req: AttachRequest, peer: Peer) -> RunRecord:
        """The run record: new, the next attempt of a known one, or the same (re-attach)."""
        existing = self.book.known(req.run_id)
        now = self.book.clock()
        why = f"attached by its part runner on {req.host}"
        if existing is None:
            nodes = [
                self._self_ref() if i == req.node_rank else NodeRef(control="")
                for i in range(req.nnodes)
            ]
            run = RunRecord(
                id=req.run_id,
                name=req.name,
                created_at=req.created_at,
                spec=req.spec,
                nodes=nodes,
                node_rank=req.node_rank,
                state=RunState.RUNNING,
                state_since=now,
                reason=why,
                attempt=req.attempt,
                run_dir=req.run_dir,
                checkpoint_dir=_checkpoint_dir(req),
                attached=Attachment(
                    scheduler=req.scheduler,
                    job_id=req.job_id,
                    pod_uid=req.pod_uid,
                    uid=peer.uid,
                    user=self._user_of(peer.uid),
                    host=req.host,
                ),
            )
            self.book.add(run)
            self.book.event(run, "state", f"running: {why}")
            return run
        if self.book.get(existing.id) is None:
            self.book.load(existing)
        attached = existing.attached
        assert attached is not None
        if req.job_id and req.job_id != attached.job_id:  # a resume is a new job
            moved = attached.model_copy(update={"job_id": req.job_id})
            self.book.update(existing.id, attached=moved)
        if req.attempt == existing.attempt:
            return self.book.get(existing.id) or existing
        if existing.state is RunState.SUCCEEDED:
            # Started again under its id (a pod, a command typed again): a succeeded run
            # never opens another attempt of itself, so this one begins it afresh.
            fresh = existing.model_copy(
                update={"state": RunState.STARTING, "state_since": now, "reason": why,
                        "attempt": req.attempt, "cause": None, "last_step": None}
            )  # fmt: skip
            self.book.add(fresh)
            self.book.event(fresh, "attach", f"run again as attempt {req.attempt}")
            return self.book.move(existing.id, RunState.RUNNING, why)
        if not existing.state.terminal:
            self.book.move(existing.id, RunState.PENDING, "a newer attempt attached",
                           next_attempt=True)  # fmt: skip
        self.book.move(existing.id, RunState.STARTING, why, next_attempt=True,
                       attempt=req.attempt, cause=None)  # fmt: skip
        return self.book.move(existing.id, RunState.RUNNING, why)

    def _part_for(self, run: RunRecord, req: AttachRequest, peer: Peer) -> None:
        own = self.book.part(run.id)
        if own is not None and own.record.attempt == req.attempt and not own.record.state.terminal:
            own.external = True
            self.book.update_part(own, shim_pid=peer.pid, shim_started=procs.create_time(peer.pid))
            return
        now = self.book.clock()
        record = AttemptRecord(
            run_id=run.id,
            attempt=req.attempt,
            node_rank=req.node_rank,
            state=RunState.RUNNING,
            state_since=now,
            master_addr="",
            master_port=0,
            nproc=req.nproc,
            attempt_dir=req.attempt_dir,
            resume_from=req.resume_from,
            start=f"from {req.resume_from}" if req.resume_from else "from scratch",
            started_at=now,
            shim_pid=peer.pid,
            shim_started=procs.create_time(peer.pid),
            library=True,
        )
        part = Part(record, self.book.clock)
        part.external = True
        self.book.add_part(part)

    def _self_ref(self) -> NodeRef:
        return NodeRef(control=self.control, server_key=self.server_key, name=self.node)

    # ------------------------------------------------------------------ while it runs

    def update(self, run_id: str, attempt: int, update: NodesUpdate | CoordinatorUpdate) -> None:
        run = self.book.get(run_id)
        if run is None or run.attempt != attempt or run.attached is None:
            return
        if isinstance(update, NodesUpdate) and run.is_coordinator:
            nodes = [_ref(n) if n is not None else NodeRef(control="") for n in update.nodes]
            nodes[:1] = [self._self_ref()]
            if nodes != run.nodes:
                self.book.update(run_id, nodes=nodes)
        elif isinstance(update, CoordinatorUpdate) and not run.is_coordinator:
            coordinator = _ref(update.coordinator)
            if coordinator != run.coordinator and coordinator.server_key:
                nodes = list(run.nodes)
                nodes[0] = coordinator
                self.book.update(run_id, coordinator=coordinator, nodes=nodes)
                # The job's own user vouches for its node 0's daemon, as an operator's
                # run.join does for a gpud run: that key may read this run's part here.
                self.peer_keys.grant(coordinator.server_key, run_id)

    def authorize(self, token: str, message: TrainerMessage) -> bool:
        """A message on the shared ingest: its token must be one of its run's attempt."""
        tokens = self._tokens.get(message.run)
        if not tokens:
            return False
        for known, attempt in tokens.items():
            if hmac.compare_digest(known, token):
                return attempt == message.attempt
        return False

    # ------------------------------------------------------------------ the end

    def ended(self, run_id: str, attempt: int, report: EndReport | None) -> None:
        """The part runner's last word, or its connection closed without one."""
        run = self.book.get(run_id)
        part = self.book.part(run_id)
        if run is None or part is None or part.record.attempt != attempt:
            return
        if part.record.state.terminal:
            return
        scheduler = run.attached.scheduler if run.attached else "the scheduler"
        if report is None:
            state, reason = RunState.STOPPED, GONE.format(scheduler=scheduler)
            info = ExitInfo()
        else:
            state, reason = report.state, report.reason
            cause = report.cause
            if cause is not None:
                cause = cause.model_copy(update={"node_rank": run.node_rank, "attempt": attempt,
                                                 "node": cause.node or self.node})  # fmt: skip
            info = ExitInfo(exit_code=report.exit_code, signal=report.signal, cause=cause)
        now = self.book.clock()
        self.book.update_part(
            part, state=state, state_since=now, reason=reason, exit=info, ended_at=now
        )
        self._tokens.pop(run_id, None)
        if run.attempt == attempt:
            self.book.move(run_id, state, reason, cause=info.cause or run.cause)

    def adopt(self, part: Part, now: float) -> None:
        """After a daemon restart: the part runner reconnects, or the run is given up."""
        part.external = True
        self._waiting[part.record.run_id] = now + REATTACH_S

    def tick(self, now: float) -> None:
        for run_id, deadline in list(self._waiting.items()):
            if now < deadline:
                continue
            del self._waiting[run_id]
            part = self.book.part(run_id)
            if part is None or part.record.state.terminal:
                continue
            run = self.book.get(run_id)
            if run is not None:
                self.book.event(run, "attach", f"no word from its part runner {REATTACH_S:.0f}s"
                                " after the daemon restarted", "warning")  # fmt: skip
            self.ended(run_id, part.record.attempt, None)


def refuse_control(run: RunRecord, verb: str) -> ProtocolError:
    """What gpud says when asked to stop or resume a run it only watches."""
    attached = run.attached
    assert attached is not None
    if attached.scheduler == "slurm":
        job = f"Slurm job {attached.job_id}" if attached.job_id else "a Slurm job"
        how = f"`gpuctl {verb} {run.id}` as its owner ({attached.user or attached.uid})"
        where = f"run {run.id} is {job}: {verb} it through Slurm, with {how}"
    else:
        where = f"run {run.id} runs under {attached.scheduler}: {verb} it there"
    return ProtocolError(ErrorCode.CONFLICT, f"{where}; gpud only watches it")


def _ref(node: NodeRefIn) -> NodeRef:
    return NodeRef(control=node.control, server_key=node.server_key, name=node.name)


def _checkpoint_dir(req: AttachRequest) -> str:
    checkpoint = req.spec.get("checkpoint")
    given = checkpoint.get("dir") if isinstance(checkpoint, dict) else None
    return str(given) if given else str(Path(req.run_dir) / "checkpoints")
