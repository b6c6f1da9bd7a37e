"""`gpud stop`: stop the daemon that holds a state dir, and say what becomes of its runs.

Runs outlive their daemon by design: every part runs under a shim, and the next daemon on
the same state dir adopts it again. So a plain stop only tells how many runs keep going
and how to stop them. `--runs` first stops each run through the control socket, as
`gpuctl stop` does (node 0 stops the whole gang), waits until every one has ended, and
only then stops the daemon; runs that do not end in time leave the daemon running, so it
can finish stopping them.

The daemon is found through the known-nodes file, where it records its addresses and its
state dir when it starts.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable

from gpud.model.endpoints import AddressError
from gpud.node.statedir import StateDir, held_by
from gpud.security.known_nodes import load_known_nodes
from gpud.wire.client import Client, ClientError, ConfigError, NodeTarget, resolve_target
from gpud.wire.protocol import RUN_STOP
from gpud.wire.run_messages import RunSummary, StopRequest

#: How long `--runs` waits for the runs to end by default: a spec's default `stop_grace_s`
#: (30 s) for the checkpoint handshake, the 10 s from SIGTERM to SIGKILL, and a margin.
RUNS_TIMEOUT_S = 60.0
REQUEST_TIMEOUT_S = 10.0
#: A stop request to node 0 waits for it to reach the other nodes of the gang.
STOP_REQUEST_TIMEOUT_S = 30.0
POLL_S = 0.2
#: Run ids named in one line at most.
NAMED_RUNS = 10

Echo = Callable[[str], None]


class StopFailed(Exception):
    """The daemon, or its runs, could not be stopped; the message says why and what next."""


def local_target(state: StateDir) -> NodeTarget:
    """How to reach the daemon of `state` (the newest entry it wrote, if it moved)."""
    try:
        known = load_known_nodes()
    except AddressError as exc:
        raise ConfigError(str(exc)) from None
    mine = [n for n in known.nodes if n.state_dir == str(state.root)]
    if not mine:
        raise ConfigError(
            f"the known-nodes file has no daemon with state dir {state.root} "
            "(was it started by another user, or with another GPUD_CONFIG_DIR?)"
        )
    newest = max(mine, key=lambda n: n.updated)
    return resolve_target(newest.control, known)


def active_runs(target: NodeTarget) -> list[RunSummary]:
    """The runs with a part on this node that have not ended (pending ones included)."""
    with Client(target, timeout_s=REQUEST_TIMEOUT_S) as client:
        return client.runs(active_only=True, limit=1000).runs


def stop_runs(
    target: NodeTarget, runs: list[RunSummary], timeout_s: float, echo: Echo
) -> list[str]:
    """Ask for every run to stop and wait for them to end; returns the ids still going."""
    with Client(target, timeout_s=REQUEST_TIMEOUT_S) as client:
        for run in runs:
            _request_stop(client, run, echo)
        deadline = time.monotonic() + timeout_s
        going = [run.id for run in runs]
        while going:
            for run_id in list(going):
                summary = client.run_status(run_id).run
                if summary.state.terminal:
                    going.remove(run_id)
                    why = f" ({summary.reason})" if summary.reason else ""
                    echo(f"{run_id} {summary.state.value}{why}")
            if not going or time.monotonic() >= deadline:
                break
            time.sleep(POLL_S)
    return going


def _request_stop(local: Client, run: RunSummary, echo: Echo) -> None:
    """Node 0 stops the gang; when it is another node that cannot be asked, stop this
    node's part (node 0 then stops the others, as for any part that ends)."""
    if run.node_rank != 0:
        node0 = run.nodes[0]
        key = node0.server_key.encode("ascii") if node0.server_key else None
        try:
            with Client(NodeTarget(node0.control, key)) as client:
                client.call(RUN_STOP, StopRequest(run=run.id), STOP_REQUEST_TIMEOUT_S)
            return
        except ClientError as exc:
            echo(f"{run.id}: node 0 could not be asked ({exc}); stopping this node's part")
    local.call(RUN_STOP, StopRequest(run=run.id), STOP_REQUEST_TIMEOUT_S)


def terminate(state: StateDir, pid: int, timeout_s: float) -> None:
    """SIGTERM the daemon and wait until it has released the state dir."""
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return  # it ended on its own in the meantime
    deadline = time.monotonic() + timeout_s
    while held_by(state.pid_file) is not None:
        if time.monotonic() >= deadline:
            raise StopFailed(f"gpud pid {pid} did not stop within {timeout_s:g}s")
        time.sleep(0.1)


def stop(
    state: StateDir,
    pid: int,
    timeout_s: float,
    echo: Echo,
    warn: Echo,
    runs: bool = False,
    runs_timeout_s: float = RUNS_TIMEOUT_S,
) -> None:
    """What `gpud stop [--runs]` does, for the daemon `pid` that holds `state`."""
    try:
        target = local_target(state)
        going = active_runs(target)
    except ClientError as exc:
        if runs:
            raise StopFailed(
                f"cannot ask gpud pid {pid} to stop its runs: {exc}; nothing was stopped"
            ) from None
        warn(f"could not ask gpud pid {pid} about its runs ({exc}); any that are going keep going")
        going = []
    else:
        if runs:
            going = _stop_runs_first(target, going, pid, runs_timeout_s, echo)
    terminate(state, pid, timeout_s)
    echo(f"stopped gpud pid {pid}")
    if going:
        one = len(going) == 1
        echo(
            f"{_runs(len(going))} {'keeps' if one else 'keep'} going under "
            f"{'its shim' if one else 'their shims'}: {_ids(going)}"
        )
        echo(
            f"gpud adopts {'it' if one else 'them'} again when it starts; stop runs with "
            "`gpuctl stop <run>` while it runs, or with `gpud stop --runs`"
        )


def _stop_runs_first(
    target: NodeTarget, going: list[RunSummary], pid: int, timeout_s: float, echo: Echo
) -> list[RunSummary]:
    """Stop `going` and wait for them; returns the runs launched meanwhile (if any)."""
    if not going:
        echo("no runs are going")
        return []
    echo(f"stopping {_runs(len(going))}: {_ids(going)}")
    try:
        left = stop_runs(target, going, timeout_s, echo)
    except ClientError as exc:
        raise StopFailed(f"stopping the runs of gpud pid {pid} failed: {exc}") from None
    if left:
        raise StopFailed(
            f"{_runs(len(left))} did not end within {timeout_s:g}s ({', '.join(left)}); "
            f"gpud pid {pid} keeps running to finish stopping them: see "
            "`gpuctl status <run>`, or `gpuctl stop <run> --force`"
        )
    try:
        return active_runs(target)
    except ClientError:
        return []


def _runs(count: int) -> str:
    return f"{count} run" if count == 1 else f"{count} runs"


def _ids(runs: list[RunSummary]) -> str:
    named = ", ".join(run.id for run in runs[:NAMED_RUNS])
    return named + (f" and {len(runs) - NAMED_RUNS} more" if len(runs) > NAMED_RUNS else "")
