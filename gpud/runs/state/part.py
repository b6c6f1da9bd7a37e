"""One node's part of one attempt: its shim, its log, its stop, its ending.

A `Part` is a plain object driven by the supervisor's tick: `spawn()` once, then `poll()`
until it returns an outcome; `request_stop()` starts the escalation that `poll()` carries
out (handshake → SIGTERM after the grace period → SIGKILL). Everything it learns is
written into its `AttemptRecord`, which the supervisor persists.
"""

from __future__ import annotations

import json
import logging
import signal
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psutil
from typing_extensions import Unpack

from gpud.model.run import (
    EARLY_EXIT,
    EARLY_EXIT_SOURCE,
    AttemptChanges,
    AttemptRecord,
    CauseKind,
    ExitInfo,
    FailureCause,
    RunState,
)
from gpud.runs.diagnosis import causes
from gpud.runs.diagnosis.attempt_log import AttemptLog
from gpud.runs.diagnosis.logparse import complete_lines, root_cause, torchrun_lines
from gpud.runs.process import procs, shim

log = logging.getLogger("gpud.runs")

SHIM = Path(shim.__file__)
#: After SIGTERM, how long ranks get before SIGKILL.
KILL_GRACE_S = 10.0
#: Most bytes read from a log per tick; the rest waits for the next tick.
READ_CHUNK = 1 << 20
#: Lines longer than this are cut (a progress bar without newlines must not eat memory).
MAX_LINE = 64 * 1024
ABORT_SIGNALS = {signal.SIGABRT.value}


@dataclass(frozen=True)
class Outcome:
    state: RunState
    reason: str
    exit: ExitInfo


class Part:
    def __init__(self, record: AttemptRecord, clock: Callable[[], float]) -> None:
        self.record = record
        self._clock = clock
        self.dir = Path(record.attempt_dir)
        self._popen: subprocess.Popen[bytes] | None = None
        self._partial = b""
        self._log_mtime_ns: int | None = None  # the log's mtime when last looked at
        self._stop_at: float | None = None  # when SIGTERM is due
        self._kill_at: float | None = None  # when SIGKILL is due
        self._termed = False
        self._killed = False
        self.pids_seen: set[int] = set()
        #: The cgroup's OOM-kill count when the part started (None: cannot be told).
        self.oom_kills_at_start: int | None = None
        #: Started by a scheduler, not by gpud (gpud.runs.lifecycle.attached): its "shim" is the
        #: part runner, its end comes from the attach socket, and gpud never signals it.
        self.external = False
        #: Ended, and the daemon read its log (`log_done`) and rank 0's metrics.jsonl
        #: (`metrics_done`) to the end: the ticks stop looking at it (`RunBook.busy_parts`).
        self.log_done = False
        self.metrics_done = False

    # ------------------------------------------------------------------ paths

    @property
    def log_path(self) -> Path:
        return self.dir / "output.log"

    @property
    def exit_path(self) -> Path:
        return self.dir / "exit.json"

    @property
    def state_dir(self) -> Path:
        """The daemon's state dir (the attempt dir is <state>/runs/<run>/attempt-N)."""
        return self.dir.parents[2]

    @property
    def run_dir(self) -> str:
        """The run's dir under this daemon's state dir: what tells its processes apart."""
        return str(self.dir.parent)

    def update(self, **changes: Unpack[AttemptChanges]) -> None:
        self.record = self.record.model_copy(update=dict(changes))

    def _tagged(self) -> list[psutil.Process]:
        """This part's processes by their environment: this node's, never another's."""
        r = self.record
        return procs.tagged(r.run_id, r.attempt, node_rank=r.node_rank, run_dir=self.run_dir)

    # ------------------------------------------------------------------ start

    def spawn(
        self,
        argv: list[str],
        env: dict[str, str],
        cwd: str,
        files: dict[str, str],
        log_max_bytes: int | None = None,
    ) -> None:
        """Write the attempt dir and start the shim in a session of its own; its log holds
        at most `log_max_bytes` (None: no bound)."""
        spec_path = shim.write_spec(self.dir, files, argv, env, cwd, self.log_path, log_max_bytes)
        self.oom_kills_at_start = causes.oom_kills()
        with open(self.dir / "shim.log", "ab") as shim_log:  # the child keeps its own copy
            self._popen = _SHIMS.add_new(subprocess.Popen(
                # The shim is stdlib-only: run its file without site-packages (-S), which
                # takes ~40 ms off every launch.
                [sys.executable, "-S", str(SHIM), str(spec_path)],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=shim_log,
                start_new_session=True,
                close_fds=True,
            ))  # fmt: skip
        now = self._clock()
        self.update(
            state=RunState.STARTING,
            state_since=now,
            started_at=now,
            shim_pid=self._popen.pid,
            shim_started=procs.create_time(self._popen.pid),
        )

    # ------------------------------------------------------------------ running

    def shim_alive(self) -> bool:
        if self._popen is not None and self._popen.poll() is not None:
            return False  # our own child: reaped, so certainly gone
        return procs.is_alive(self.record.shim_pid, self.record.shim_started)

    def touched(self) -> bool:
        """Whether the log's mtime moved since the last look: the shim touches it while it
        drops output on a full disk, so printing that nobody can read is still output."""
        try:
            mtime = self.log_path.stat().st_mtime_ns
        except OSError:
            return False
        moved = self._log_mtime_ns is not None and mtime > self._log_mtime_ns
        self._log_mtime_ns = mtime
        return moved

    def read_lines(self, limit: int = READ_CHUNK) -> list[str]:
        """Complete lines appended to the log since the last call (up to `limit` bytes; a
        mark where a bounded log dropped lines is a line), torchrun's pieces of a line
        apart (`logparse.torchrun_lines`)."""
        try:
            got = AttemptLog(self.log_path).read(self.record.log_offset, limit)
        except OSError:
            return []
        data = got.data
        if not data:
            return []
        self.update(log_offset=got.end)
        if self._partial and got.spans[0].mark and not data.startswith(b"\n"):
            data = b"\n" + data  # what came after the unfinished line was dropped
        lines, self._partial = complete_lines(self._partial, data, MAX_LINE)
        return torchrun_lines(
            [line[:MAX_LINE].decode(errors="replace").rstrip("\r") for line in lines]
        )

    def remember_pids(self) -> None:
        """Note every process of the part (for the stop check and the GPU-memory check)."""
        self.pids_seen.update(p.pid for p in procs.tree(self.record.shim_pid))

    # ------------------------------------------------------------------ stopping

    def request_stop(self, grace_s: float, force: bool, kill_grace_s: float | None = None) -> None:
        now = self._clock()
        if force:
            self._stop_at = now
            self._kill_at = now
        else:
            # No library in the trainers: nobody listens for the handshake, signal at once.
            stop_at = now + (grace_s if self.record.library else 0.0)
            kill_at = stop_at + (KILL_GRACE_S if kill_grace_s is None else kill_grace_s)
            # A second request can only bring the signals forward.
            self._stop_at = stop_at if self._stop_at is None else min(self._stop_at, stop_at)
            self._kill_at = kill_at if self._kill_at is None else min(self._kill_at, kill_at)
        self.update(stop_requested=True, state=RunState.STOPPING, state_since=now)

    def escalate(self) -> str | None:
        """Send the signal that is due, if any; returns a line for the run's events."""
        now = self._clock()
        members = [p for p in procs.tree(self.record.shim_pid)]
        if self._kill_at is not None and now >= self._kill_at and not self._killed:
            self._killed = True
            hit = procs.send(members, signal.SIGKILL)
            return f"SIGKILL to {len(hit)} process(es)" if hit else None
        if self._stop_at is not None and now >= self._stop_at and not self._termed:
            self._termed = True
            hit = procs.send(members, signal.SIGTERM)
            return f"SIGTERM to {len(hit)} process(es)" if hit else None
        return None

    # ------------------------------------------------------------------ ending

    def outcome(self) -> Outcome | None:
        """The attempt's ending on this node, once the shim has recorded it (or vanished)."""
        if self._popen is not None:
            self._popen.poll()  # reap the shim if it was ours
        if self.exit_path.exists():
            try:
                raw = json.loads(self.exit_path.read_text())
            except (OSError, ValueError):
                return None  # being written: next tick
            return self._judge(raw)
        if self.shim_alive():
            return None
        # The shim is gone without a record: kill -9 of the shim, or a reboot.
        leftovers = self._tagged()
        procs.send(leftovers, signal.SIGKILL)
        info = ExitInfo(leftovers_killed=[p.pid for p in leftovers])
        if self.record.stop_failed:
            return Outcome(RunState.FAILED, self.record.stop_failed, info)
        if self.record.stop_requested:
            return Outcome(RunState.STOPPED, "stopped (the shim was gone)", info)
        why = "the shim process died; its part was killed"
        kind = CauseKind.LAUNCH
        full = causes.full_disk(self.dir, f"the state dir {self.state_dir}")
        if full is not None:  # what the shim could not write on: its output, its records
            why, kind = f"the shim process died: {full}; its part was killed", CauseKind.ENVIRONMENT
        info = info.model_copy(update={"cause": self._cause(kind, why)})
        return Outcome(RunState.FAILED, why, info)

    def _judge(self, raw: dict[str, object]) -> Outcome:
        code = raw.get("exit_code")
        sig = raw.get("signal")
        info = ExitInfo(
            exit_code=code if isinstance(code, int) else None,
            signal=sig if isinstance(sig, int) else None,
            leftovers_killed=_int_list(raw.get("leftovers_killed")),
            output_dropped_bytes=_int(raw.get("output_dropped_bytes")),
        )
        cause = root_cause(self._log_tail())
        if cause is not None:
            info = info.model_copy(
                update={
                    "failed_rank": cause.rank,
                    "failed_local_rank": cause.local_rank,
                    "failed_exit": cause.signal_name or f"exit {cause.exitcode}",
                }
            )
        ok = info.exit_code == 0
        finished = self.record.finished
        if self.record.stop_requested:
            if ok and finished:
                return Outcome(RunState.SUCCEEDED, "finished before the stop took effect", info)
            if self.record.stop_failed:
                # Stopped because another part failed; but it may have failed on its own
                # first (and only lost the race to say so): keep a cause that is its own.
                own = self.early_exit() or (None if ok else self._find_cause(info))
                if own is not None and self._ours(own):
                    own = None  # the signal was ours
                info = info.model_copy(update={"cause": own})
                return Outcome(RunState.FAILED, self.record.stop_failed, info)
            return Outcome(RunState.STOPPED, "stopped on request", info)
        if ok:
            return Outcome(RunState.SUCCEEDED, "exit 0", info)
        aborted = (
            cause is not None
            and (cause.exitcode or 0) < 0
            and -(cause.exitcode or 0) in ABORT_SIGNALS
        )
        if finished and aborted:
            info = info.model_copy(update={"teardown_abort": True})
            return Outcome(
                RunState.FAILED,
                f"training finished, but rank {cause.rank} aborted at interpreter exit "  # type: ignore[union-attr]
                "(SIGABRT): the known gloo teardown problem; end the script with "
                "run.finish()",
                info,
            )
        found = self.early_exit() or self._find_cause(info)
        info = info.model_copy(update={"cause": found})
        rank = f"rank {found.rank}: " if found.rank is not None else ""
        return Outcome(RunState.FAILED, f"{rank}{found.summary} ({found.kind.label})", info)

    @property
    def _signalled(self) -> bool:
        return self._termed or self._killed

    def _ours(self, cause: FailureCause) -> bool:
        """Whether the cause is the signal gpud sent to stop the part: a rank killed by it,
        or torchrun's own `SignalException` (it raises one on the SIGTERM it is sent)."""
        if cause.kind is CauseKind.SIGNAL:
            return self._sent(cause)
        return "SignalException" in cause.summary and self._signalled

    def early_exit(self) -> FailureCause | None:
        """This part's ranks all exited 0 and torchrun waited for the other nodes' at its
        exit barrier when it was ended: the script ended early here (issue 26 §3). Node 0
        names it, with the step, over the others' connection errors, their echo."""
        if not any(mark in self._log_tail() for mark in causes.EXIT_BARRIER_MARKS):
            return None
        r = self.record
        ranks = [r.node_rank * r.nproc + i for i in range(r.nproc)] if r.nproc else []
        who = f"rank {ranks[0]}" if len(ranks) == 1 else f"node {r.node_rank}'s ranks"
        return self._cause(CauseKind.USER, f"{who} {EARLY_EXIT}").model_copy(
            update={"rank": ranks[0] if len(ranks) == 1 else None, "source": EARLY_EXIT_SOURCE}
        )

    def _sent(self, cause: FailureCause) -> bool:
        """Whether gpud sent the signal that killed the rank: a stop sends SIGTERM, and
        SIGKILL only once the grace is over; a SIGKILL before that came from elsewhere
        (the OOM killer, an operator, a dying node) and is the part's own cause."""
        if "SIGKILL" in cause.summary:
            return self._killed
        return self._signalled

    def _cause(self, kind: CauseKind, summary: str) -> FailureCause:
        r = self.record
        return FailureCause(
            kind=kind, summary=summary, node_rank=r.node_rank, attempt=r.attempt, time=self._clock()
        )

    def _find_cause(self, info: ExitInfo) -> FailureCause:
        if raw_error := self._shim_error():
            return self._cause(CauseKind.LAUNCH, raw_error)
        now_kills = causes.oom_kills()
        before = self.oom_kills_at_start
        found = causes.find_cause(
            self.dir,
            self._log_tail(),
            info,
            node_rank=self.record.node_rank,
            nproc=self.record.nproc,
            oom_killed=before is not None and now_kills is not None and now_kills > before,
            ended_at=self._clock(),
        )
        return found.model_copy(
            update={"node_rank": self.record.node_rank, "attempt": self.record.attempt}
        )

    def _shim_error(self) -> str | None:
        try:
            raw = json.loads(self.exit_path.read_text())
        except (OSError, ValueError):
            return None
        error = raw.get("error")
        return f"could not start the launcher: {error}" if error else None

    def _log_tail(self, size: int = 64 * 1024) -> str:
        """The end of the output, from the tail's files where the log was bounded."""
        try:
            return AttemptLog(self.log_path).tail_text(size)
        except OSError:
            return ""

    def leftovers(self) -> list[int]:
        """Processes of this attempt still alive after it ended (should be none)."""
        pids = {p.pid for p in self._tagged()}
        pids.update(p.pid for p in procs.tree(self.record.shim_pid))
        return sorted(pids)


def _int(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _int_list(value: object) -> list[int]:
    return [v for v in value if isinstance(v, int)] if isinstance(value, list) else []


class _Shims:
    """Every shim this daemon started, until it is reaped: a part that is replaced or
    left behind (an elastic attempt's stale part) no longer polls its own, and its shim
    would stay `<defunct>` under the daemon. `reap()` each tick."""

    def __init__(self) -> None:
        self._running: set[subprocess.Popen[bytes]] = set()

    def add_new(self, popen: subprocess.Popen[bytes]) -> subprocess.Popen[bytes]:
        self._running.add(popen)
        return popen

    def reap(self) -> int:
        """Reap the shims that ended; returns how many are still running."""
        self._running = {p for p in self._running if p.poll() is None}
        return len(self._running)


_SHIMS = _Shims()
reap_shims = _SHIMS.reap
