"""Why an attempt failed: the table of known failure patterns, and reading the evidence.

A failed part leaves evidence on its node: torch's elastic error files (torchrun points
every worker's `TORCHELASTIC_ERROR_FILE` into the attempt's log dir; the trainers library
and torch's `@record` write them on an uncaught exception; gpud points single processes
and DeepSpeed's ranks at `<attempt>/errors/`), torchrun's end-of-run summary (which rank
died first, and by which signal), tracebacks in the log, known lines (NCCL, gloo, CUDA out
of memory, a port in use, no NCCL in this torch...), and the kernel's OOM-kill counter of
the daemon's cgroup.
`find_cause()` turns that into one `FailureCause`. Pure apart from reading those files.
"""

from __future__ import annotations

import json
import re
import signal
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gpud.hardware.events import XID_MEANINGS
from gpud.model.run import (
    EARLY_EXIT,
    EARLY_EXIT_SOURCE,
    ECHO_KINDS,
    CauseKind,
    ExitInfo,
    FailureCause,
)
from gpud.model.snapshot import GpuSample
from gpud.runs.diagnosis.logparse import (
    RootCause,
    failures,
    first_seen_failure,
    rank_parts,
    root_cause,
    split_rank,
)
from gpud.runs.process.shim import ROOM_BYTES, free_bytes

#: How many log lines a cause keeps around the line that matters.
CONTEXT_LINES = 12
#: A summary longer than this is cut: it is one line in every view.
SUMMARY_MAX = 240
#: An XID this long before a failure (or during the attempt, if shorter) is its cause.
HARDWARE_WINDOW_S = 60.0


@dataclass(frozen=True)
class FailurePattern:
    kind: CauseKind
    pattern: re.Pattern[str]
    meaning: str


GLOO_ERROR = re.compile(
    r"Connection closed by peer|Connection reset by peer|Gloo connectFullMesh failed"
)
COLLECTIVE_TIMEOUT = re.compile(
    r"collective operation timeout|Watchdog caught collective operation", re.I
)

#: torchrun's agent, once every local rank has exited 0, waits at its exit barrier for the
#: other nodes' agents: what it logs there when the wait ends (the store went away, or
#: the SIGTERM gpud sends), or at INFO level before.
EXIT_BARRIER_MARKS = ("in _exit_barrier", "Waiting 300 seconds for other agents to finish")

# The known signatures, by name: gpud.runs.diagnosis.hints says what to do about each.
#: What a full disk says: errno's words and numbers, SQLite's, the trainers library's, and
#: torch's zip writer when a save runs out of room (`[enforce fail at inline_container.cc:672]
#: . unexpected pos 8192 vs 8086`, or "file write failed").
DISK_FULL_LINE = re.compile(
    r"No space left on|ENOSPC|\[Errno 28\]|Disk quota exceeded|EDQUOT|\[Errno 122\]"
    r"|database or disk is full|unexpected pos \d+ vs \d+|PytorchStreamWriter failed writing",
    re.I,
)
DISK_FULL = FailurePattern(
    CauseKind.ENVIRONMENT, DISK_FULL_LINE, "a disk is full: the node, not the code"
)
NO_NCCL = FailurePattern(
    CauseKind.ENVIRONMENT,
    re.compile(
        r"Distributed package doesn't have NCCL built in"
        r"|ProcessGroupNCCL is only supported with GPUs"
    ),
    "this torch has no NCCL, or no GPU to run it on",
)
CPU_TORCH = FailurePattern(
    CauseKind.ENVIRONMENT,
    re.compile(r"Torch not compiled with CUDA enabled|module 'torch\._C' has no attribute '_cuda_"),
    "a CUDA script on a CPU build of torch",
)
CUDA_DRIVER = FailurePattern(
    CauseKind.ENVIRONMENT,
    re.compile(
        r"CUDA driver version is insufficient for CUDA runtime version"
        r"|NVIDIA driver on your system is too old|Found no NVIDIA driver on your system"
    ),
    "torch's CUDA needs a driver this node does not have",
)
CUDA_OOM = FailurePattern(
    CauseKind.OOM,
    re.compile(r"CUDA out of memory|OutOfMemoryError|CUDA error: out of memory"),
    "CUDA out of memory",
)
NCCL_ERROR = FailurePattern(
    CauseKind.NCCL,
    re.compile(
        COLLECTIVE_TIMEOUT.pattern
        + r"|NCCL (?:error|timeout|communicator was aborted)|ncclInternalError"
        r"|ncclSystemError|ncclRemoteError|ncclUnhandledCudaError|ncclInvalidUsage",
        re.I,
    ),
    "an NCCL error or collective timeout",
)
ADDRESS_IN_USE = FailurePattern(
    CauseKind.NETWORK,
    re.compile(r"Address already in use|EADDRINUSE|server socket has failed to listen", re.I),
    "address already in use: another process holds the port",
)
MODULE_MISSING = FailurePattern(
    CauseKind.IMPORT,
    re.compile(r"^(?:ModuleNotFoundError|ImportError)\b"),
    "a module could not be imported",
)
DEVICE_ASSERT = FailurePattern(
    CauseKind.USER,
    re.compile(r"device-side assert triggered"),
    "a CUDA kernel's assert failed (most often an index out of range)",
)
FILE_MISSING = FailurePattern(
    CauseKind.USER,
    re.compile(r"FileNotFoundError|No such file or directory|Parent directory .+ does not exist"),
    "a file or directory the script reads or writes is not there",
)
NO_PERMISSION = FailurePattern(
    CauseKind.USER,
    re.compile(r"PermissionError|Permission denied|Operation not permitted"),
    "the script may not read or write a path",
)

#: The one table: a line (or an exception message) matching a pattern has that kind. The
#: first match wins, so the specific come before the general (an environment that has no
#: NCCL before NCCL's own errors; a network error before a missing file it may mention).
PATTERNS: tuple[FailurePattern, ...] = (
    DISK_FULL,
    NO_NCCL,
    CPU_TORCH,
    CUDA_DRIVER,
    CUDA_OOM,
    NCCL_ERROR,
    ADDRESS_IN_USE,
    FailurePattern(
        CauseKind.NETWORK,
        re.compile(GLOO_ERROR.pattern + r"|Connection refused|No route to host"),
        "a gloo peer went away or could not be reached",
    ),
    MODULE_MISSING,
    DEVICE_ASSERT,
    FILE_MISSING,
    NO_PERMISSION,
)


def kind_of(text: str) -> CauseKind | None:
    """The kind of a line or exception message, from the table; None if nothing matches."""
    for entry in PATTERNS:
        if entry.pattern.search(text):
            return entry.kind
    return None


def _cut(text: str) -> str:
    line = " ".join(text.strip().split())
    return line if len(line) <= SUMMARY_MAX else line[: SUMMARY_MAX - 1] + "…"


# --------------------------------------------------------------------------- error files


@dataclass(frozen=True)
class RankError:
    """One rank's uncaught exception, as torch's error-file format records it."""

    rank: int  # global
    message: str  # "ValueError: bad shard 17"
    traceback: str
    mtime: float
    step: int | None = None  # the last step the rank logged (the trainers library's files)


def error_files(attempt_dir: Path, node_rank: int, nproc: int) -> list[RankError]:
    """Every error file of the attempt on this node, earliest first (by mtime: the
    files' own timestamps are whole seconds, too coarse to tell ranks apart)."""
    found: list[RankError] = []
    # torchrun: <log-dir>/<rdzv id>_<random>/attempt_<n>/<local rank>/error.json
    for path in attempt_dir.glob("ranks/*/attempt_*/*/error.json"):
        if path.parent.name.isdigit():
            found += _read_error(path, node_rank * nproc + int(path.parent.name))
    for path in attempt_dir.glob("errors/rank-*.json"):
        number = path.stem.removeprefix("rank-")
        if number.isdigit():
            found += _read_error(path, int(number))
    return sorted(found, key=lambda e: (e.mtime, e.rank))


def _read_error(path: Path, rank: int) -> list[RankError]:
    try:
        data = json.loads(path.read_text(errors="replace"))
        mtime = path.stat().st_mtime
    except (OSError, ValueError):
        return []
    message = data.get("message") if isinstance(data, dict) else None
    if isinstance(message, str):  # the newer, flat format
        return [RankError(rank, message, "", mtime)]
    if not isinstance(message, dict) or not isinstance(message.get("message"), str):
        return []
    extra = message.get("extraInfo")
    extra = extra if isinstance(extra, dict) else {}
    stack = extra.get("py_callstack")
    step = extra.get("gpud_step")
    return [
        RankError(
            rank,
            message["message"],
            stack if isinstance(stack, str) else "",
            mtime,
            step if isinstance(step, int) and not isinstance(step, bool) else None,
        )
    ]


# --------------------------------------------------------------------------- the log


@dataclass(frozen=True)
class Traceback:
    local_rank: int | None
    summary: str  # the exception line
    lines: list[str]  # the end of the traceback, the exception line last
    rank: int | None = None  # global, where torch's excepthook said (`[rank3]: ...`)

    def global_rank(self, node_rank: int, nproc: int) -> int | None:
        if self.local_rank is not None:
            return node_rank * nproc + self.local_rank
        return self.rank


def tracebacks(text: str, local_rank: int | None = None) -> list[Traceback]:
    """Every Python traceback in the log (of one local rank, when given), in the order
    they ended. torchrun's `[default1]:` and torch's own `[rank1]: ` prefixes are read
    and taken off; lines of different ranks may interleave."""
    found: list[Traceback] = []
    block: dict[tuple[int | None, int | None], list[str]] = {}
    for raw in text.splitlines():
        local, rank, line = rank_parts(raw)
        if local_rank is not None and local != local_rank:
            continue
        key = (local, rank)
        body = line.lstrip()
        if body.startswith("Traceback (most recent call last):"):
            block[key] = [line]
            continue
        current = block.get(key)
        if current is None:
            continue
        if line.startswith((" ", "\t")) or not line.strip() or _chained(line):
            current.append(line)
            continue
        # The first unindented line ends the traceback: the exception itself (not the
        # launcher's own report that a child failed).
        current.append(line)
        summary = _cut(line)
        if summary and "ChildFailedError" not in summary:
            found.append(Traceback(local, summary, current[-CONTEXT_LINES:], rank))
        block.pop(key)
    return found


def last_traceback(text: str, local_rank: int | None = None) -> Traceback | None:
    """The last Python traceback in the log (of one local rank, when given)."""
    found = tracebacks(text, local_rank)
    return found[-1] if found else None


def _trace_kind(trace: Traceback) -> CauseKind:
    return kind_of(trace.summary) or kind_of("\n".join(trace.lines)) or CauseKind.USER


def own_exception(text: str, local_rank: int | None) -> Traceback | None:
    """The exception that failed this node's part: the failed rank's own traceback (of any
    rank, when torchrun did not say which), unless that is a connection error and another
    rank raised something else — a peer's knock-on error is never the cause while the
    rank that died first said why (the earliest such exception)."""
    every = tracebacks(text)
    own = [t for t in every if local_rank is None or t.local_rank == local_rank]
    trace = own[-1] if own else None
    if trace is None or _trace_kind(trace) in ECHO_KINDS:
        first = next((t for t in every if _trace_kind(t) not in ECHO_KINDS), None)
        trace = first or trace
    return trace


def _chained(line: str) -> bool:
    return line.startswith(
        (
            "During handling of the above exception",
            "The above exception was the direct cause",
        )
    )


def last_lines(text: str, local_rank: int | None = None, count: int = CONTEXT_LINES) -> list[str]:
    """The last lines of the log (of one local rank, when given)."""
    lines = []
    for raw in text.splitlines():
        local, body = split_rank(raw)
        # torchrun's summary numbers its entries "[0]:", which reads like a rank prefix.
        if body.strip() and (local_rank is None or local == local_rank):
            lines.append(raw)
    return lines[-count:]


def known_line(text: str, local_rank: int | None = None) -> tuple[CauseKind, str, list[str]] | None:
    """The last line of the log (of one local rank, when given) that the pattern table
    knows, with the lines before it."""
    lines = text.splitlines()
    if local_rank is not None:
        lines = [raw for raw in lines if split_rank(raw)[0] == local_rank]
    for i in range(len(lines) - 1, -1, -1):
        _, line = split_rank(lines[i])
        kind = kind_of(line)
        if kind is not None:
            return kind, _cut(line), lines[max(0, i - CONTEXT_LINES + 1) : i + 1]
    return None


# --------------------------------------------------------------------------- a full disk


def full_disk(
    path: Path, what: str, free_of: Callable[[str], int | None] = free_bytes
) -> str | None:
    """`what` (e.g. "the state dir /var/lib/gpud") is full: one line, or None while its
    disk has room (less than the shim's ROOM_BYTES counts as full). `free_of` reads the
    free bytes of a path's disk."""
    free = free_of(str(path))
    if free is None or free >= ROOM_BYTES:
        return None
    return f"{what} is full (ENOSPC: {free / 1e6:.1f} MB free)"


# --------------------------------------------------------------------------- OOM killer


def oom_kills(
    cgroup_root: Path = Path("/sys/fs/cgroup"), membership: Path = Path("/proc/self/cgroup")
) -> int | None:
    """The kernel's OOM-kill count for this process's memory cgroup, None when unknown.

    A run's processes live in the daemon's cgroup (systemd's unit, a container), so a count
    that grew while a rank died by SIGKILL means the OOM killer did it. cgroup v2 keeps it
    in memory.events, v1 (kernel 4.13+) in memory.oom_control."""
    try:
        entries = membership.read_text().splitlines()
    except OSError:
        return None
    for entry in entries:
        _, controllers, path = entry.split(":", 2) if entry.count(":") >= 2 else ("", "", "")
        if controllers == "memory":
            count = _counter(cgroup_root / "memory" / path.lstrip("/") / "memory.oom_control")
        elif controllers == "":
            count = _counter(cgroup_root / path.lstrip("/") / "memory.events")
        else:
            continue
        if count is not None:
            return count
    return None


def _counter(path: Path) -> int | None:
    try:
        text = path.read_text()
    except OSError:
        return None
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key == "oom_kill" and value.strip().isdigit():
            return int(value)
    return None


# --------------------------------------------------------------------------- hardware


def hardware_cause(
    gpus: list[GpuSample], uuids: list[str], started: float | None, ended: float
) -> FailureCause | None:
    """An XID, or a lost GPU, on one of the part's GPUs in the seconds before it failed:
    then the exception the ranks saw (a CUDA error, an NCCL error) is only the symptom."""
    since = max(started or 0.0, ended - HARDWARE_WINDOW_S)
    ours = [g for g in gpus if g.uuid in set(uuids)]
    for gpu in ours:
        if gpu.lost:
            return FailureCause(
                kind=CauseKind.HARDWARE,
                summary=f"GPU {gpu.index} ({gpu.uuid}) is lost: the driver no longer reaches it",
                source="nvml",
                time=ended,
            )
    xids = [(r.time, gpu, r.code) for gpu in ours for r in gpu.xid.recent if since <= r.time]
    if not xids:
        return None
    when, gpu, code = min(xids, key=lambda x: x[0])
    meaning = XID_MEANINGS.get(code, ("warning", "see NVIDIA's XID catalogue"))[1]
    return FailureCause(
        kind=CauseKind.HARDWARE,
        summary=f"XID {code} on GPU {gpu.index} ({meaning}),"
        f" {ended - when:.0f}s before the failure",
        source="nvml",
        time=when,
    )


# --------------------------------------------------------------------------- the cause


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _from_signal(
    rank: int | None, name: str, oom_killed: bool, lines: list[str], when: float | None
) -> FailureCause:
    if oom_killed and name == "SIGKILL":
        return FailureCause(
            kind=CauseKind.OOM,
            summary="killed by the kernel's OOM killer (SIGKILL): host memory ran out",
            rank=rank,
            source="signal",
            lines=lines,
            time=when,
        )
    return FailureCause(
        kind=CauseKind.SIGNAL,
        summary=f"killed by {name}",
        rank=rank,
        source="signal",
        lines=lines,
        time=when,
    )


def exited_early(text: str, nproc: int) -> list[int]:
    """The local ranks that exited 0 before the others failed: torchrun's end-of-run
    summary lists every worker that did not exit 0 (those it ended once one failed too,
    by SIGTERM), so a rank it leaves out had already ended well."""
    listed = {f.local_rank for f in failures(text)}
    if nproc <= 1 or not listed:
        return []
    return [local for local in range(nproc) if local not in listed]


def find_cause(
    attempt_dir: Path,
    log_text: str,
    exit: ExitInfo,
    *,
    node_rank: int,
    nproc: int,
    oom_killed: bool = False,
    ended_at: float | None = None,
) -> FailureCause:
    """Why this node's part failed, from the best evidence there is.

    Earliest error file first (the rank whose exception started it); but when that is a
    connection error and torchrun saw another rank die by a signal first, the signal is
    the cause and the connection error its echo. Then a signal (for an abort, the last
    known line that rank printed before it, when there is one; for an abort or fault after
    a Python exception, the exception), a rank's own exception over a peer's connection
    error, the last known line, and at worst the exit code. A connection error while a
    rank of this node had exited 0 is that rank's early exit (issue 32 §1). What to do
    about it: gpud.runs.diagnosis.hints.
    """
    found = _find_cause(
        attempt_dir, log_text, exit, node_rank=node_rank, nproc=nproc,
        oom_killed=oom_killed, ended_at=ended_at,
    )  # fmt: skip
    early = exited_early(log_text, nproc) if found.kind in ECHO_KINDS else []
    if not early:
        return found
    rank = node_rank * nproc + early[0]
    return FailureCause(
        kind=CauseKind.USER,
        summary=f"rank {rank} {EARLY_EXIT}",
        rank=rank,
        source=EARLY_EXIT_SOURCE,
        lines=[f"the others saw: {found.summary}"],
        time=found.time,
    )


def _find_cause(
    attempt_dir: Path,
    log_text: str,
    exit: ExitInfo,
    *,
    node_rank: int,
    nproc: int,
    oom_killed: bool,
    ended_at: float | None,
) -> FailureCause:
    root = root_cause(log_text)
    # A rank killed by a signal other than torchrun's own SIGTERM (sent to the others once
    # one failed) is the strongest evidence there is, wherever the summary lists it.
    listed = failures(log_text)
    if not listed and (seen := first_seen_failure(log_text)) is not None:
        listed = [seen]  # the agent's own line stands in for a summary that is missing
    killed = [f for f in listed if _killed_by(f) is not None]
    if killed:
        root = killed[0]
    local = root.local_rank if root is not None else None
    root_rank = None if local is None else node_rank * nproc + local
    died = _killed_by(root)
    errors = error_files(attempt_dir, node_rank, nproc)
    if errors:
        first = errors[0]
        kind = kind_of(first.message) or kind_of(first.traceback) or CauseKind.USER
        if not (kind in ECHO_KINDS and died is not None and root_rank != first.rank):
            stack = [line for line in first.traceback.splitlines() if line.strip()]
            return FailureCause(
                kind=kind,
                summary=_cut(first.message),
                rank=first.rank,
                source="error file",
                lines=stack[-CONTEXT_LINES:],
                time=first.mtime,
                step=first.step,
            )
    if died is not None:
        trace = last_traceback(log_text, local) if died in AFTER_AN_EXCEPTION else None
        if trace is not None:
            # The rank raised, then died at teardown (gloo aborts it at interpreter exit,
            # or a C++ destructor faults): the exception is the failure, not the signal.
            return FailureCause(
                kind=_trace_kind(trace),
                summary=trace.summary,
                rank=root_rank,
                source="traceback",
                lines=trace.lines,
                time=ended_at,
            )
        said = known_line(log_text, local) if died == "SIGABRT" and local is not None else None
        if said is not None:
            # An abort is how C++ ends a process on an uncaught exception (`terminate
            # called after throwing ...`: NCCL's watchdog, a CUDA error): the line the
            # rank printed before it says which.
            kind, line, lines = said
            return FailureCause(
                kind=kind, summary=line, rank=root_rank, source="log", lines=lines, time=ended_at
            )
        return _from_signal(root_rank, died, oom_killed, last_lines(log_text, local), ended_at)
    trace = own_exception(log_text, local)
    if trace is not None:
        rank = trace.global_rank(node_rank, nproc)
        if rank is None:
            rank = root_rank
        if rank is None and nproc == 1:
            rank = node_rank
        return FailureCause(
            kind=_trace_kind(trace),
            summary=trace.summary,
            rank=rank,
            source="traceback",
            lines=trace.lines,
            time=ended_at,
        )
    known = known_line(log_text)
    if known is not None:
        kind, line, lines = known
        return FailureCause(
            kind=kind, summary=line, rank=root_rank, source="log", lines=lines, time=ended_at
        )
    if exit.signal:
        return _from_signal(
            None, _signal_name(exit.signal), oom_killed, last_lines(log_text), ended_at
        )
    code = exit.exit_code
    return FailureCause(
        kind=CauseKind.UNKNOWN,
        summary=f"exit code {code}" if code is not None else "ended without an exit code",
        rank=root_rank,
        source="exit code",
        lines=last_lines(log_text, local),
        time=ended_at,
    )


#: How a rank that raised may still end: gloo aborts it at interpreter exit, a C++
#: destructor faults. Its traceback, printed before, is the failure.
AFTER_AN_EXCEPTION = frozenset({"SIGABRT", "SIGSEGV"})
#: What torchrun (and gpud's stop) send to the ranks that are left: never a cause.
TEARDOWN_SIGNALS = frozenset({"SIGTERM", "SIGINT", "SIGHUP"})


def _killed_by(entry: RootCause | None) -> str | None:
    if entry is None or entry.exitcode is None or entry.exitcode >= 0:
        return None
    name = entry.signal_name or _signal_name(-entry.exitcode)
    return None if name in TEARDOWN_SIGNALS else name
