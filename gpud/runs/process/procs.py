"""Finding and ending the processes of a run's part.

Two views, because neither alone is enough: the shim's process tree (exact, and complete
while the shim lives, since it is a child subreaper), and a scan for processes whose
environment carries the run's GPUD_RUN_ID (survives a dead shim and processes that
re-parented themselves, as long as they did not scrub their environment).
"""

from __future__ import annotations

import signal

import psutil


def is_alive(pid: int | None, started: float | None) -> bool:
    """True if `pid` runs and is the same process (its create time matches `started`)."""
    if pid is None:
        return False
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False
        return started is None or abs(proc.create_time() - started) < 0.5
    except psutil.Error:
        return False


def create_time(pid: int) -> float | None:
    try:
        return float(psutil.Process(pid).create_time())
    except psutil.Error:
        return None


def tree(pid: int | None) -> list[psutil.Process]:
    """Every descendant of `pid` (not `pid` itself)."""
    if pid is None:
        return []
    try:
        return list(psutil.Process(pid).children(recursive=True))
    except psutil.Error:
        return []


def tagged(
    run_id: str,
    attempt: int | None = None,
    *,
    node_rank: int | None = None,
    run_dir: str | None = None,
) -> list[psutil.Process]:
    """Live processes whose environment says they belong to `run_id` (and `attempt`).

    `node_rank` and `run_dir` narrow it to one node's part: two daemons on one host (a
    supported set-up) run parts of the same run and attempt side by side, and each may
    only touch its own — the ones started with its node rank, under its own state dir.
    """
    wanted = {"GPUD_RUN_ID": run_id}
    if attempt is not None:
        wanted["GPUD_ATTEMPT"] = str(attempt)
    if node_rank is not None:
        wanted["GPUD_NODE_RANK"] = str(node_rank)
    if run_dir is not None:
        wanted["GPUD_RUN_DIR"] = run_dir
    found = []
    for proc in psutil.process_iter():
        try:
            env = proc.environ()
        except psutil.Error:
            continue
        if any(env.get(key) != value for key, value in wanted.items()):
            continue
        try:
            if proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except psutil.Error:
            continue
    return found


def send(procs: list[psutil.Process], sig: signal.Signals) -> list[int]:
    """Signal each process; returns the pids that were still there to receive it."""
    hit = []
    for proc in procs:
        try:
            proc.send_signal(sig)
            hit.append(proc.pid)
        except psutil.Error:
            continue
    return hit
