"""`gpud serve --master-ports FIRST-LAST`: the ports a node hands its runs as MASTER_PORT,
for a cluster whose firewall opens only those between nodes. A real daemon, real torchrun:
the ranks see a port of the range, a launch that finds the range full is refused in one
line naming it while the run that holds it goes on, and the port serves again once that
run has stopped."""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from pathlib import Path

from gpud.runs.placement.ports import bindable
from tests.support.daemons import RunningDaemon, gpuctl
from tests.support.runs import force_stop, script_spec, status, wait_for
from tests.support.waiting import until

#: A rank that says which MASTER_PORT it was given, then holds it until stopped.
SAYS_ITS_PORT = """
import os, signal, sys, time
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
print("master port", os.environ["MASTER_PORT"], flush=True)
while True:
    time.sleep(0.5)
"""


def _launch(daemon: RunningDaemon, spec: Path) -> tuple[str, dict[str, object]]:
    """`gpuctl --json launch`: the run's id and the rendezvous it says the run got."""
    done = gpuctl("--node", daemon.address, "--json", "launch", str(spec))
    assert done.returncode == 0, (done.stdout, done.stderr)
    reply = json.loads(done.stdout)
    return str(reply["run"]["id"]), reply["master"]


def test_runs_get_their_master_port_from_the_daemons_range(
    daemons: Callable[..., RunningDaemon], tmp_path: Path
) -> None:
    # Below the kernel's ephemeral ports (a connection's local port may take one of those
    # at any time) and apart from gpud's default range, which other tests' daemons use.
    start = random.randrange(20_000, 28_000)
    port = next(p for p in range(start, start + 1000) if bindable(p))
    daemon = daemons(extra=("--master-ports", f"{port}-{port}"))
    spec = script_spec(tmp_path, SAYS_ITS_PORT, name="says-port", launcher="torchrun")
    run_id, master = _launch(daemon, spec)
    assert master == {"addr": "127.0.0.1", "port": port}
    wait_for(daemon, run_id, {"running"})
    logs = ("--node", daemon.address, "logs", run_id)
    until("the rank's MASTER_PORT", lambda: f"master port {port}" in gpuctl(*logs).stdout)

    # The range is full: refused, in one line that names it; the run holding it goes on.
    full = gpuctl("--node", daemon.address, "launch", str(spec))
    assert full.returncode == 1, (full.stdout, full.stderr)
    assert f"no free MASTER_PORT in {port}-{port}" in full.stderr, full.stderr
    assert "--master-ports" in full.stderr and "Traceback" not in full.stderr
    assert len(full.stderr.strip().splitlines()) == 1, full.stderr
    assert status(daemon, run_id).run.state.value == "running"

    # Stopped, its port serves the next run at once.
    force_stop(daemon, run_id)
    again, master = _launch(daemon, spec)
    assert master == {"addr": "127.0.0.1", "port": port}
    force_stop(daemon, again)
