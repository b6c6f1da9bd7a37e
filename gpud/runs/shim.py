"""The shim: owner of one node's part of one attempt (the containerd-shim pattern).

    python -S <path of this file> <attempt-dir>/shim.json     (stdlib only: no site needed)

It starts the launcher (torchrun, deepspeed, accelerate or python) in a process group of
its own, with stdout and stderr going straight to the attempt's log file, and waits. It is
a child subreaper: ranks orphaned when their launcher dies (torchrun puts every worker in
its own session) are re-parented to it instead of init, so when the launcher ends the shim
still finds them, and ends them too. Then it writes `exit.json` and exits.

It runs in its own session, so the daemon can be restarted, or crash, while runs go on;
the daemon re-adopts it from `shim.json`, `launcher.json` and `exit.json`. Standard
library only: it is on the path of every launch.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

PR_SET_CHILD_SUBREAPER = 36
LEFTOVER_GRACE_S = 3.0


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


def _write_json(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def write_spec(
    directory: Path,
    files: dict[str, str],
    argv: list[str],
    env: dict[str, str],
    cwd: str,
    log: Path,
) -> Path:
    """Write an attempt's files and the shim's spec into `directory` (the daemon's part and
    Slurm's part runner alike). The spec is its owner's alone: the environment may hold
    secrets (WANDB_API_KEY...)."""
    directory.mkdir(parents=True, exist_ok=True)
    for name, content in files.items():
        (directory / name).write_text(content)
    log.touch()
    path = directory / "shim.json"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(json.dumps({"argv": argv, "env": env, "cwd": cwd, "log": str(log)}))
    path.chmod(0o600)  # an older file kept its mode
    return path


def run(spec_path: Path) -> int:
    spec = json.loads(spec_path.read_text())
    directory = spec_path.parent
    subreaper = _become_subreaper()
    # The part ends on the daemon's say-so, never on a terminal's ^C or hang-up.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    with open(spec["log"], "ab", buffering=0) as log:
        try:
            launcher = subprocess.Popen(
                spec["argv"],
                env=spec["env"],
                cwd=spec["cwd"],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                process_group=0,
                restore_signals=True,
            )
        except OSError as exc:
            log.write(f"[gpud-shim] cannot start {spec['argv'][0]}: {exc}\n".encode())
            _write_json(
                directory / "exit.json",
                {"exit_code": 127, "signal": None, "ended_at": time.time(), "error": str(exc)},
            )
            return 127
    _write_json(
        directory / "launcher.json",
        {"pid": launcher.pid, "started_at": time.time(), "subreaper": subreaper},
    )
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
    exit_code = os.waitstatus_to_exitcode(status) if status is not None else None
    _write_json(
        directory / "exit.json",
        {
            "exit_code": exit_code if exit_code is not None and exit_code >= 0 else None,
            "signal": -exit_code if exit_code is not None and exit_code < 0 else None,
            "ended_at": time.time(),
            "leftovers_killed": leftovers,
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
