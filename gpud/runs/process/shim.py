"""The shim: owner of one node's part of one attempt (the containerd-shim pattern).

    python -S <path of this file> <attempt-dir>/shim.json     (stdlib only: no site needed)

It starts the launcher (torchrun, deepspeed, accelerate or python) in a process group of
its own, its stdout and stderr a pipe that the shim copies to the attempt's log file, and
waits. It is a child subreaper: ranks orphaned when their launcher dies (torchrun puts every
worker in its own session) are re-parented to it instead of init, so when the launcher ends
the shim still finds them, and ends them too. Then it writes `exit.json` and exits.

The log is bounded when the spec says so (`logs.max_bytes`, `OutputPump`): `output.log`
holds the first quarter of the bound (the head); what follows goes to numbered segments of a
quarter each (`output.log.000001`, ...), of which the last `TAIL_SEGMENTS` are kept (the
tail), and `output.log.index` says where each starts (its offset in the whole output, its
line and time), so readers (`gpud.runs.diagnosis.attempt_log`) can show the head, a mark saying what
was dropped, and the tail. Per chunk past the head this costs a newline count (how many
lines a dropped segment held); files change only at a quarter's end, where a line ends.

A full disk stops neither the shim nor the run: the pipe is drained whatever happens to
the log (`OutputPump`), what could not be written is dropped and counted, and one line in
the log says how much once there is room again; `launcher.json` is retried, and
`exit.json` is written over space reserved when the part started.

It runs in its own session, so the daemon can be restarted, or crash, while runs go on;
the daemon re-adopts it from `shim.json`, `launcher.json` and `exit.json`. Standard
library only: it is on the path of every launch.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

PR_SET_CHILD_SUBREAPER = 36
LEFTOVER_GRACE_S = 3.0
#: What a disk answers when it has no room (ENOSPC; EDQUOT: the user's quota).
DISK_FULL = frozenset({errno.ENOSPC, errno.EDQUOT})
#: Read from the launcher's pipe at most this much at a time.
CHUNK = 64 * 1024
#: How often the pump looks whether the disk has room again (and retries small writes).
RETRY_S = 1.0
#: Room the log's disk needs before output is written again: the marker line and some
#: output fit, rather than a line cut in the middle by the next ENOSPC.
ROOM_BYTES = 256 * 1024
#: While output is dropped, the log's mtime is touched at most this often: the daemon reads
#: it as output (a run printing to a full disk is not silent: not a hang).
TOUCH_S = 1.0
#: Space held for `exit.json` from the start, so the part's end is recorded on a full disk.
EXIT_RESERVE = 4096
#: How long the shim keeps trying to record the end on a disk with no room at all.
EXIT_WRITE_WAIT_S = 60.0
#: After the launcher's end, how long the pump may take to copy what is still in the pipe.
PUMP_JOIN_S = 5.0
#: A bounded log's files hold a quarter of `logs.max_bytes` each: the head, then the tail's
#: segments, of which the last three are kept.
FILE_SHARE = 4
TAIL_SEGMENTS = 3


def segment_path(log_path: str, seq: int) -> str:
    """The `seq`th file of the log's tail (1, 2, ...): numbered, never renamed, so a
    reader that has one open keeps reading it; zero-padded, so `ls` lists them in order."""
    return f"{log_path}.{seq:06d}"


def index_path(log_path: str) -> str:
    """Where a bounded log says where its head ends and its kept segments start."""
    return f"{log_path}.index"


def _become_subreaper() -> bool:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False


def _children(of: int) -> list[int]:
    """Direct children of `of` (after re-parenting: every descendant still alive)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        # Field 4 is the parent pid; the command name before it may hold spaces and ')'.
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) > 1 and int(fields[1]) == of:
            found.append(int(entry))
    return found


def _descendants(root: int) -> list[int]:
    seen: list[int] = []
    frontier = [root]
    while frontier:
        kids = [k for pid in frontier for k in _children(pid)]
        seen.extend(kids)
        frontier = kids
    return seen


def _reap_all() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def end_leftovers(me: int) -> list[int]:
    """SIGTERM what is left of the part, then SIGKILL what survives the grace period."""
    leftovers = _descendants(me)
    if not leftovers:
        return []
    for pid in leftovers:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + LEFTOVER_GRACE_S
    while time.monotonic() < deadline:
        _reap_all()
        if not _descendants(me):
            return leftovers
        time.sleep(0.05)
    for pid in _descendants(me):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    time.sleep(0.05)
    _reap_all()
    return leftovers


def free_bytes(path: str) -> int | None:
    """Bytes an unprivileged writer may still use on the disk of `path` (None: unknown)."""
    try:
        stat = os.statvfs(path)
    except OSError:
        return None
    return stat.f_bavail * stat.f_frsize


def _size_of(fd: int) -> int:
    try:
        return os.fstat(fd).st_size
    except OSError:
        return 0


def _clock_text(when: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(when))


class OutputPump:
    """Copies the launcher's output from a pipe to the log, in a thread of its own.

    With `max_bytes`, the log is bounded: the first quarter stays in the log file given
    (the head); the rest goes to numbered segment files of a quarter each, cut where a
    line ends, and once there are more than `TAIL_SEGMENTS` the oldest is deleted. The
    index file, rewritten at each new segment, records the head's size and each kept
    segment's offset, start time and the tail's lines before it: all a reader needs to
    say what was dropped. The log and its files stay under `max_bytes` (plus the few bytes of a
    full-disk line).

    A write the disk refuses (ENOSPC, EDQUOT) stops neither the pump nor the run: it keeps
    draining the pipe, so no rank ever blocks on a full pipe or dies on a write error;
    what could not be written is counted and dropped. Once the disk has room again
    (`ROOM_BYTES`) one line says how much was lost and when, and output flows on. Small
    writes that failed the same way (`later()`) are retried at the same pace."""

    def __init__(
        self,
        source: int,
        log: int,
        log_path: str,
        echo: Callable[[bytes], None] | None = None,
        max_bytes: int | None = None,
    ) -> None:
        self._source = source
        self._log = log
        self._log_path = log_path
        self._dir = os.path.dirname(log_path) or "."
        self._echo = echo
        self.dropped_bytes = 0  # over the whole part
        self._lost_bytes = 0  # since the disk filled: what the next marker reports
        self._lost_lines = 0
        self._full_since: float | None = None
        self._full_errno = errno.ENOSPC
        self._last_try = 0.0
        self._touched = 0.0
        self._ends_line = True
        self._later: list[Callable[[], bool]] = []
        self._lock = threading.Lock()
        # The bound: where output goes now (the head, then a segment) and how full it is.
        self._max_bytes = max_bytes
        self._file_max = max(1, max_bytes // FILE_SHARE) if max_bytes else None
        self._fd = log
        self._file_bytes = _size_of(log)
        self.offset = self._file_bytes  # bytes in the log's files, dropped segments included
        self.lines = 0  # newlines written to the tail's segments (only they are ever dropped)
        self._seq = 0
        self._head: dict[str, Any] | None = None
        self._segments: list[dict[str, Any]] = []  # kept, oldest first
        self._index_due = False
        self.thread = threading.Thread(target=self._run, name="gpud-shim-output", daemon=True)

    def start(self) -> OutputPump:
        self.thread.start()
        return self

    def later(self, write: Callable[[], bool]) -> None:
        """Retry `write` (True: done) every RETRY_S until it succeeds."""
        with self._lock:
            self._later.append(write)

    def join(self, timeout: float) -> None:
        self.thread.join(timeout)

    def _run(self) -> None:
        poller = select.poll()  # not select(): a part runner's descriptors may pass 1024
        poller.register(self._source, select.POLLIN | select.POLLHUP | select.POLLERR)
        while True:
            try:
                ready = poller.poll(RETRY_S * 1000)
                chunk = os.read(self._source, CHUNK) if ready else None
            except InterruptedError:
                continue
            except OSError:
                chunk = b""
            if chunk == b"":
                break  # every writer has closed the pipe: the part has ended
            if chunk is not None:
                self._take(chunk)
            self._retry()
        self._retry(force=True)
        if self._fd != self._log:
            os.close(self._fd)  # a segment of ours; the caller closes the head

    def _take(self, chunk: bytes) -> None:
        if self._echo is not None:
            self._echo(chunk)
        if self._full_since is not None:
            self._retry()
        if self._full_since is not None:
            self._drop(chunk)
            return
        done = self._store(chunk)
        if done < len(chunk):
            self._drop(chunk[done:])

    def _store(self, data: bytes) -> int:
        """Write `data` to the log's files, starting a segment where the bound says;
        returns how much was written (less than all: the disk is full)."""
        most = self._file_max
        if most is None or self._file_bytes + len(data) <= most:
            return self._write(data, 0, len(data))
        done = 0
        while done < len(data):
            end = min(len(data), done + most - self._file_bytes)
            if end < len(data):  # the rest does not fit: this file ends where a line does
                newline = data.rfind(b"\n", done, end)
                if newline >= 0:
                    end = newline + 1
                elif self._file_bytes:
                    end = done  # the line starts the next file
                # else: one line longer than a file is cut at the file's end
            if end > done:
                wrote = self._write(data, done, end)
                done += wrote
                if done < end:
                    return done
            if done < len(data) and not self._next_segment():
                return done
        return done

    def _write(self, data: bytes, start: int = 0, end: int | None = None) -> int:
        """Write `data[start:end]` where output goes now; returns how much the disk took
        (less than all: the disk is full)."""
        end = len(data) if end is None else end
        done = start
        view = memoryview(data)
        while done < end:
            try:
                done += os.write(self._fd, view[done:end])
            except InterruptedError:
                continue
            except OSError as exc:
                self._full(exc.errno if exc.errno in DISK_FULL else errno.EIO)
                break
        wrote = done - start
        if wrote:
            self._ends_line = data[done - 1 : done] == b"\n"
            self._file_bytes += wrote
            self.offset += wrote
            if self._seq:  # in the tail: what may be dropped (the head never is)
                self.lines += data.count(b"\n", start, done)
        return wrote

    def _next_segment(self) -> bool:
        """Go on in a new segment; past TAIL_SEGMENTS, delete the oldest. False: no room."""
        seq = self._seq + 1
        try:
            fd = os.open(
                segment_path(self._log_path, seq), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644
            )
        except OSError as exc:
            self._full(exc.errno if exc.errno in DISK_FULL else errno.EIO)
            return False
        if self._head is None:
            self._head = {"bytes": self.offset, "ends_line": self._ends_line}
        self._segments.append(
            {"seq": seq, "offset": self.offset, "lines": self.lines, "time": time.time()}
        )
        if len(self._segments) == 1:
            self._head["tail_began"] = self._segments[0]["time"]
        gone = self._segments[:-TAIL_SEGMENTS]
        self._segments = self._segments[-TAIL_SEGMENTS:]
        # The index names the new segment before the old one goes: a reader never finds
        # a listed file missing unless it is a rotation behind (then it reads the index
        # again).
        self._index_due = not self._write_index()
        for old in gone:
            try:
                os.unlink(segment_path(self._log_path, old["seq"]))
            except OSError:
                pass
        if self._fd != self._log:
            os.close(self._fd)
        self._fd, self._seq, self._file_bytes = fd, seq, 0
        return True

    def _write_index(self) -> bool:
        """False when it could not be written (it is tried again, as `later()` writes are)."""
        try:
            _write_json(
                Path(index_path(self._log_path)),
                {"max_bytes": self._max_bytes, "head": self._head, "segments": self._segments},
            )
            return True
        except OSError:
            return False

    def _full(self, number: int) -> None:
        if self._full_since is None:
            self._full_since = time.time()
            self._full_errno = number
            self._last_try = time.monotonic()

    def _drop(self, data: bytes) -> None:
        self.dropped_bytes += len(data)
        self._lost_bytes += len(data)
        self._lost_lines += data.count(b"\n")
        now = time.monotonic()
        if now - self._touched >= TOUCH_S:
            self._touched = now
            try:  # a timestamp needs no free block: it works on the full disk
                os.utime(self._log_path)
            except OSError:
                pass

    def _retry(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last_try < RETRY_S:
            return
        self._last_try = now
        with self._lock:
            self._later = [write for write in self._later if not write()]
        if self._index_due:
            self._index_due = not self._write_index()
        if self._full_since is None:
            return
        room = free_bytes(self._dir)
        if room is not None and room < ROOM_BYTES:
            return
        since = self._full_since
        marker = (
            f"[gpud-shim] {self._lost_lines} line(s) ({self._lost_bytes} bytes) of output were"
            f" dropped: the disk of {self._dir} was full ({errno.errorcode[self._full_errno]})"
            f" from {_clock_text(since)} to {_clock_text(time.time())}\n"
        ).encode()
        if not self._ends_line:
            marker = b"\n" + marker
        self._full_since = None
        if self._store(marker) == len(marker):
            self._lost_bytes = self._lost_lines = 0


def _write_json(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def _try_json(path: Path, data: dict[str, Any]) -> bool:
    """`_write_json`, False when the disk has no room (the caller retries)."""
    try:
        _write_json(path, data)
        return True
    except OSError as exc:
        if exc.errno not in DISK_FULL:
            raise
        return False


def reserve(path: Path) -> bool:
    """Hold EXIT_RESERVE bytes for `path`'s temporary file, to be overwritten in place."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(b" " * EXIT_RESERVE)
        return True
    except OSError:
        return False


def _write_reserved(path: Path, data: dict[str, Any]) -> bool:
    """Write `path` over its reserved temporary file (no new blocks), then rename it."""
    tmp = path.with_name(f".{path.name}.tmp")
    text = json.dumps(data).encode()
    if len(text) > EXIT_RESERVE:
        return False
    try:
        fd = os.open(tmp, os.O_WRONLY)  # no O_TRUNC: the blocks stay ours
    except OSError:
        return False
    try:
        os.pwrite(fd, text, 0)
        os.ftruncate(fd, len(text))
    except OSError:
        return False
    finally:
        os.close(fd)
    os.replace(tmp, path)
    return True


def record_exit(path: Path, data: dict[str, Any]) -> None:
    """Write `exit.json` however full the disk is: over the reserved space, else retried
    for EXIT_WRITE_WAIT_S (without it the daemon can only say the shim died)."""
    deadline = time.monotonic() + EXIT_WRITE_WAIT_S
    while True:
        if _write_reserved(path, data) or _try_json(path, data):
            return
        if time.monotonic() > deadline:
            raise OSError(errno.ENOSPC, f"cannot write {path}: the disk is full")
        time.sleep(RETRY_S)


def write_spec(
    directory: Path,
    files: dict[str, str],
    argv: list[str],
    env: dict[str, str],
    cwd: str,
    log: Path,
    log_max_bytes: int | None = None,
) -> Path:
    """Write an attempt's files and the shim's spec into `directory` (the daemon's part and
    Slurm's part runner alike); `log_max_bytes` bounds the log (None: it is not). The spec
    is its owner's alone: the environment may hold secrets (WANDB_API_KEY...)."""
    directory.mkdir(parents=True, exist_ok=True)
    for name, content in files.items():
        (directory / name).write_text(content)
    log.touch()
    for stale in log.parent.glob(f"{log.name}.*"):  # a bounded log's files, from a dir reused
        stale.unlink(missing_ok=True)
    path = directory / "shim.json"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(
            json.dumps(
                {"argv": argv, "env": env, "cwd": cwd, "log": str(log),
                 "log_max_bytes": log_max_bytes}
            )
        )  # fmt: skip
    path.chmod(0o600)  # an older file kept its mode
    return path


def run(spec_path: Path, echo: Callable[[bytes], None] | None = None) -> int:
    """Run the part of `spec_path` to its end; `echo` also gets every chunk of output."""
    spec = json.loads(spec_path.read_text())
    directory = spec_path.parent
    subreaper = _become_subreaper()
    # The part ends on the daemon's say-so, never on a terminal's ^C or hang-up.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    exit_path = directory / "exit.json"
    reserve(exit_path)
    log = os.open(spec["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    read_end, write_end = os.pipe()
    try:
        launcher = subprocess.Popen(
            spec["argv"],
            env=spec["env"],
            cwd=spec["cwd"],
            stdin=subprocess.DEVNULL,
            stdout=write_end,
            stderr=subprocess.STDOUT,
            process_group=0,
            restore_signals=True,
        )
    except OSError as exc:
        os.close(read_end)
        os.close(write_end)
        try:
            os.write(log, f"[gpud-shim] cannot start {spec['argv'][0]}: {exc}\n".encode())
        except OSError:
            pass
        os.close(log)
        record_exit(
            exit_path,
            {"exit_code": 127, "signal": None, "ended_at": time.time(), "error": str(exc)},
        )
        return 127
    os.close(write_end)  # the launcher and its ranks hold it: EOF once they are all gone
    bound = spec.get("log_max_bytes")
    pump = OutputPump(read_end, log, spec["log"], echo, bound if isinstance(bound, int) else None)
    pump.start()
    started = {"pid": launcher.pid, "started_at": time.time(), "subreaper": subreaper}
    if not _try_json(directory / "launcher.json", started):
        pump.later(lambda: _try_json(directory / "launcher.json", started))
    me = os.getpid()
    status = None
    while status is None:
        try:
            pid, raw = os.waitpid(-1, 0)
        except ChildProcessError:
            break
        if pid == launcher.pid:
            status = raw
    leftovers = end_leftovers(me)
    pump.join(PUMP_JOIN_S)
    if not pump.thread.is_alive():  # the Slurm part runner runs this in its own process
        os.close(read_end)
        os.close(log)
    exit_code = os.waitstatus_to_exitcode(status) if status is not None else None
    record_exit(
        exit_path,
        {
            "exit_code": exit_code if exit_code is not None and exit_code >= 0 else None,
            "signal": -exit_code if exit_code is not None and exit_code < 0 else None,
            "ended_at": time.time(),
            "leftovers_killed": leftovers,
            "output_dropped_bytes": pump.dropped_bytes,
        },
    )
    return 0


def main() -> None:
    if len(sys.argv) != 2:
        print("usage: python -S shim.py <attempt-dir>/shim.json", file=sys.stderr)
        sys.exit(2)
    sys.exit(run(Path(sys.argv[1])))


if __name__ == "__main__":
    main()
