"""Starting this node's part of a run: the launch and placement path.

A launch request's spec checked (`validated`), the run record made (`new_run`), the GPUs
taken here (`reserve_gpus`, `take`, first come first served: `check_queue`), the part's
place in the gang (`placement`: ranks, MASTER_PORT, hints, paths) and its command line
(`plan`), the part spawned under its shim (`start_part`), refused while the state dir has
no room (`check_room`), and the collective preflight's part on the GPUs reserved here
(`run_preflight`, which tells `bad_gpus` of a GPU that failed it). The `Supervisor` owns
one and asks it; the gang reaches it through the supervisor's `LocalParts` methods.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sized
from pathlib import Path

from gpud.heal import collective
from gpud.model.run import AttemptRecord, NodeRef, RunRecord, RunState, gpus_text
from gpud.model.snapshot import NodeSnapshot
from gpud.node.statedir import StateDir
from gpud.node.store import Store
from gpud.runs.diagnosis import causes
from gpud.runs.multinode import elastic
from gpud.runs.placement.gpus import Gpu
from gpud.runs.placement.leases import GpuLeases
from gpud.runs.process.shim import DISK_FULL
from gpud.runs.state.book import RunBook
from gpud.runs.state.checkpoints import ResumePoint
from gpud.runs.state.part import Part
from gpud.slurm.jobs import slurm_compute_node
from gpud.wire.envelope import ErrorCode, ProtocolError
from gpud.wire.ingest import Ingest
from gpud.wire.run_messages import PartPlan, PartPreflight
from launch.autotune import recommend_for_node
from launch.backends import Placement, build_command, resolve_hints, resolve_nproc
from launch.sections import SpecError
from launch.spec import RunSpec, parse_spec, require_absolute_paths


class PartStarter:
    def __init__(
        self,
        node: str,
        state: StateDir,
        store: Store,
        book: RunBook,
        leases: GpuLeases,
        hardware: Callable[[], NodeSnapshot],
        ingest: Ingest,
        clock: Callable[[], float],
        logs_max_bytes: int,
    ) -> None:
        self.node = node
        self.state = state
        self.store = store
        self.book = book
        self.leases = leases
        self.hardware = hardware
        self.ingest = ingest
        self.clock = clock
        #: Each part's log holds at most this much, unless its spec's `logs.max_bytes` says.
        self.logs_max_bytes = logs_max_bytes
        #: Who hears of GPUs here that failed a preflight's check (gpud.heal quarantines
        #: them): the run, and GPU index → what failed.
        self.bad_gpus: list[Callable[[RunRecord, dict[int, str]], None]] = []

    def validated(self, data: dict[str, object]) -> RunSpec:
        try:
            spec = parse_spec(data, "spec")
            require_absolute_paths(spec)
        except SpecError as exc:
            raise ProtocolError(ErrorCode.INVALID_BODY, str(exc)) from None
        if spec.workdir is not None and not Path(spec.workdir).is_dir():
            # said now (a dry run too), not as a part that cannot start
            raise ProtocolError(
                ErrorCode.INVALID_BODY,
                f"spec: workdir: {spec.workdir} is not a directory on {self.node}; the"
                " script runs there on every node of the run",
            )
        if not spec.allow_outside_scheduler and slurm_compute_node():
            raise ProtocolError(
                ErrorCode.INVALID_BODY,
                f"{self.node} is a Slurm compute node (slurmd runs here): launch through"
                " Slurm (`gpuctl launch --slurm`), or set allow_outside_scheduler: true",
            )
        return spec

    def placement(
        self,
        run: RunRecord,
        spec: RunSpec,
        attempt: int,
        master_addr: str,
        master_port: int,
        resume_from: str | None,
        gpus: list[Gpu],
    ) -> Placement:
        snapshot = self.hardware()
        real_gpus = len(snapshot.gpus) if snapshot.backend == "nvml" else 0
        recommendation = recommend_for_node(snapshot) if spec.training.auto else None
        run_dir = Path(run.run_dir)
        members = elastic.members_of(run, spec)
        hints = resolve_hints(spec.training, recommendation)
        if run.grad_accum is not None:  # elastic: the world shrank, the global batch did not
            hints = hints.model_copy(update={"gradient_accumulation": run.grad_accum})
        return Placement(
            run_id=run.id,
            attempt=attempt,
            node_name=self.node,
            node_rank=elastic.attempt_rank(run, members),
            nnodes=len(members),
            nproc_per_node=resolve_nproc(spec, real_gpus, len(gpus)),
            master_addr=master_addr,
            master_port=master_port,
            gpu_count=real_gpus,
            python=spec.python or interpreter(),
            run_dir=str(run_dir),
            attempt_dir=str(run_dir / f"attempt-{attempt}"),
            checkpoint_dir=run.checkpoint_dir,
            ingest=self.ingest.ingest_endpoint,
            control=self.ingest.control_endpoint,
            resume_from=resume_from,
            hints=hints,
            gpus=tuple(g.index for g in gpus),
        )

    def plan(self, run: RunRecord, spec: RunSpec, place: Placement) -> PartPlan:
        command = build_command(spec, place)
        return PartPlan(
            node_rank=run.node_rank,
            node=self.node,
            gpus=list(place.gpus),
            argv=command.argv,
            env=command.env,
            cwd=command.cwd,
            files=command.files,
            unset=list(command.unset),
        )

    def new_run(
        self, run_id: str, spec: RunSpec, nodes: list[NodeRef], node_rank: int, attempt: int = 1
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
            attempt=attempt,
            run_dir=str(run_dir),
            checkpoint_dir=checkpoint_dir,
        )

    def start_part(
        self,
        run: RunRecord,
        spec: RunSpec,
        attempt: int,
        master_addr: str,
        master_port: int,
        resume: ResumePoint,
    ) -> Part:
        """Start this node's part of an attempt (its shim, its torchrun) on the GPUs it
        leases here; raises a ProtocolError, with nothing leased, when it cannot have them."""
        held = self.leases.held(run.id, attempt)  # reserved by node 0's all-or-none round
        gpus = held or self.take(run, spec, attempt)
        try:
            part = self._start_part(run, spec, attempt, master_addr, master_port, resume.path, gpus)
        except BaseException:
            self.leases.release(run.id, attempt)
            raise
        self.book.update_part(part, resume_step=resume.step, start=resume.describe())
        return part

    def check_room(self) -> None:
        """Refuse what would start a run while the state dir has no room: its records
        could not be kept (the store retries first). SQLite may still find room in pages
        it holds, so the disk's own free space counts too."""
        self.store.retry(force=True)
        full = self.state_full()
        if full is not None:
            raise ProtocolError(
                ErrorCode.UNAVAILABLE, f"{self.node}: {full}; free space there and try again"
            )

    def state_full(self) -> str | None:
        """Why the state dir cannot take more, in one line, or None: its database waits for
        room, or its disk (or that of `runs/`, often a disk of its own) is full."""
        root = self.state.root
        runs = root / "runs"
        return (
            self.store.full
            or causes.full_disk(root, f"the state dir {root}")
            or (causes.full_disk(runs, f"the run dirs' disk {runs}") if runs.is_dir() else None)
        )

    def reserve_gpus(
        self, run: RunRecord, spec: RunSpec, attempt: int, key: tuple[float, str]
    ) -> list[Gpu]:
        held = self.leases.held(run.id, attempt)
        if held:
            return held
        self.check_queue(run, key)
        return self.take(run, spec, attempt)

    def take(self, run: RunRecord, spec: RunSpec, attempt: int) -> list[Gpu]:
        """Lease the attempt's GPUs here, saying which ones their preflight kept out."""
        gpus = self.leases.take(run.id, run.name, spec, attempt)
        for index, why in sorted(self.leases.skipped.items()):
            self.book.event(
                run, "preflight", f"GPU {index} of {self.node} left out of attempt {attempt}:"
                f" it failed its preflight: {why}", "warning",
            )  # fmt: skip
        return gpus

    def release_gpus(self, run: RunRecord, attempt: int) -> None:
        part = self.book.part(run.id)
        if part is not None and part.record.attempt == attempt and not part.record.state.terminal:
            return  # its part runs on them; they go back when it ends
        self.leases.release(run.id, attempt)

    def check_queue(self, run: RunRecord, key: tuple[float, str]) -> None:
        """First come, first served: no run starts here while an earlier one waits."""
        ahead = self.book.ahead_of(run, key)
        if ahead:
            first = ahead[0]
            raise ProtocolError(
                ErrorCode.UNAVAILABLE,
                f"no GPUs for {run.name} on {self.node}: {len(ahead)} queued run(s) ahead"
                f" (next: {first.id} ({first.name}))",
            )

    def _start_part(
        self,
        run: RunRecord,
        spec: RunSpec,
        attempt: int,
        master_addr: str,
        master_port: int,
        resume_from: str | None,
        gpus: list[Gpu],
    ) -> Part:
        place = self.placement(run, spec, attempt, master_addr, master_port, resume_from, gpus)
        command = build_command(spec, place)
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
            gpus=[g.index for g in gpus],
            gpu_uuids=[g.uuid for g in gpus],
            resume_from=resume_from,
            members=elastic.members_of(run, spec),
            world_size=place.world_size,
            grad_accum=place.hints.gradient_accumulation,
        )
        part = Part(record, self.clock)
        env = command.environ(os.environ)
        try:
            Path(run.run_dir).mkdir(parents=True, exist_ok=True)
            Path(run.checkpoint_dir).mkdir(parents=True, exist_ok=True)
            bound = spec.logs.max_bytes or self.logs_max_bytes
            part.spawn(command.argv, env, command.cwd, command.files, bound)
        except OSError as exc:
            code = ErrorCode.UNAVAILABLE if exc.errno in DISK_FULL else ErrorCode.INTERNAL
            raise ProtocolError(code, f"{self.node}: cannot start the part: {exc}") from None
        self.book.add_part(part)
        resumed = f", resuming from {resume_from}" if resume_from else ""
        on_gpus = f" (GPU {gpus_text(record.gpus)})" if gpus else ""
        self.book.event(
            run,
            "attempt",
            f"attempt {attempt} started: {place.nproc_per_node} process(es)"
            f" on {self.node}{on_gpus}, master {master_addr}:{master_port}{resumed}",
        )
        return part

    async def run_preflight(
        self, run: RunRecord, spec: RunSpec, attempt: int, master: str, world: int, rank: int
    ) -> PartPreflight:
        """This node's part of the attempt's collective check (`gpud.heal.collective`),
        on the GPUs the attempt reserved here, with the run's interpreter."""
        python = spec.python or interpreter()
        if python == interpreter() and not collective.torch_here():
            why = f"no torch for {python}: the check cannot run"
            return PartPreflight(node_rank=run.node_rank, ok=False, error=why)
        gpus = [g.index for g in self.leases.held(run.id, attempt)]
        real = self.real_gpus(gpus)
        backend = "nccl" if real and spec.backend != "gloo" else "gloo"
        found = await collective.run_check(
            python, run.node_rank, master, world, rank, backend, gpus
        )
        if found.failed_gpus:
            failed = {
                index: why.split(": ", 1)[-1]
                for index, why in zip(found.failed_gpus, found.gpu_failures, strict=False)
            }
            for hear in self.bad_gpus:
                hear(run, failed)
        return found

    def holds_real_gpus(self, run: RunRecord, attempt: int) -> bool:
        return self.real_gpus(self.leases.held(run.id, attempt))

    def real_gpus(self, gpus: Sized) -> bool:
        """Some GPUs, and real ones (a simulated node's get no GPU check)."""
        return bool(gpus) and not self.leases.hardware().simulated


def interpreter() -> str:
    """The interpreter a run uses when its spec names none: the daemon's own."""
    import sys

    return sys.executable
