"""Upgrades with real processes and two installs (issue 22 §3).

The previous release is the commit at tag `v0.1.0`, installed the cheap way: `git archive`
of the tag into a folder, and a venv of its own whose `.pth` puts that folder first and
this interpreter's site-packages after it (torch, pyzmq, … come from there; the `.pth`
files in those are not read, so this checkout's editable install does not leak in). Its
daemon runs as `<venv>/bin/python -m gpud serve`, outside this checkout, and the ranks of
the runs it launches run under that interpreter: they use the previous release's trainers
library. HEAD is this checkout.

- In place: gpud 0.1.0 launches a CPU DDP run and is stopped (SIGTERM: runs go on without
  it); HEAD's gpud starts on the same state dir, migrates the store forward (its schema
  version recorded), adopts the run, and the old library's ranks keep reporting metrics
  and heartbeats to it; a stop goes through their checkpoint handshake, and no step's
  metrics are missing.
- Mixed: a 2-node run launched by HEAD's gpuctl with node 0 on one release and node 1 on
  the other, both ways, trains and stops cleanly.

Skipped, saying why, where the checkout has no git history or no `v0.1.0` tag.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
import subprocess
import sys
import sysconfig
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from gpud import __version__
from gpud.model.run import RunState
from gpud.node.store import SCHEMA_VERSION
from tests.faults.test_runs_end import restart
from tests.support.daemons import RunningDaemon, gpuctl
from tests.support.runs import (
    FAST,
    assert_no_gap,
    health,
    launch,
    nothing_left,
    ranks_of,
    status,
    steps_recorded,
    wait_for_step,
)
from tests.support.waiting import until

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
PREVIOUS_TAG = "v0.1.0"
PREVIOUS_VERSION = "0.1.0"
#: The store schema gpud 0.1.0 wrote.
PREVIOUS_SCHEMA = 4
#: The previous release's own example: its script as that release's library knows it (the
#: script of HEAD calls what 0.1.0's library lacks, e.g. `run.count_flops()`).
CPU_DDP_SPEC = Path("config/examples/cpu-ddp.yaml")

Daemons = Callable[..., RunningDaemon]


@dataclass(frozen=True)
class Install:
    """Another release of gpud: its source tree and the interpreter that runs it."""

    root: Path
    python: Path


def _git(*args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True)


@pytest.fixture(scope="module")
def previous(tmp_path_factory: pytest.TempPathFactory) -> Install:
    """gpud 0.1.0, installed from the tag into a venv of its own (a few seconds)."""
    if shutil.which("git") is None or _git("rev-parse", "--git-dir").returncode != 0:
        pytest.skip("needs this checkout's git history (the previous release is a git tag)")
    if _git("rev-parse", "--verify", "-q", f"{PREVIOUS_TAG}^{{commit}}").returncode != 0:
        pytest.skip(f"no tag {PREVIOUS_TAG} in this clone (git fetch --tags)")
    base = tmp_path_factory.mktemp(f"gpud-{PREVIOUS_VERSION}")
    tree = base / "src"
    tree.mkdir()
    archive = _git("archive", PREVIOUS_TAG)
    assert archive.returncode == 0, archive.stderr
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive.stdout, check=True)
    venv = base / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    purelib = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    site = subprocess.run(
        [str(python), "-c", purelib], capture_output=True, text=True, check=True
    ).stdout.strip()
    ours = dict.fromkeys([sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]])
    Path(site, "gpud-previous.pth").write_text("\n".join([str(tree), *ours]) + "\n")
    found = subprocess.run(
        [str(python), "-c", "import gpud, trainers; print(gpud.__version__, gpud.__file__)"],
        capture_output=True, text=True, cwd=base,
    )  # fmt: skip
    assert found.returncode == 0, found.stderr
    assert found.stdout.split() == [PREVIOUS_VERSION, str(tree / "gpud" / "__init__.py")]
    return Install(tree, python)


def previous_daemon(daemons: Daemons, install: Install, node: str) -> RunningDaemon:
    daemon = daemons(node=node, simulate_gpus=None, python=install.python, cwd=install.root)
    assert daemon.client().node_info().version == PREVIOUS_VERSION
    return daemon


def store_schema(state_dir: Path) -> tuple[int, list[tuple[int, int, str]]]:
    """The store's schema version, and its migrations as (found, version, gpud)."""
    db = sqlite3.connect(f"file:{state_dir / 'gpud.db'}?mode=ro", uri=True)
    try:
        (version,) = db.execute("PRAGMA user_version").fetchone()
        tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master")}
        history = (
            db.execute("SELECT found, version, gpud FROM schema_history ORDER BY version")
            if "schema_history" in tables
            else []
        )
        return int(version), [tuple(row) for row in history]
    finally:
        db.close()


def stop_with_checkpoint(node0: RunningDaemon, run_id: str) -> int:
    """`gpuctl stop`: the trainers' handshake; returns the step the checkpoint is of."""
    stop = gpuctl("--node", node0.address, "stop", run_id, timeout=120)
    assert stop.returncode == 0, stop.stderr
    stopped = status(node0, run_id)
    assert stopped.run.state is RunState.STOPPED, stopped.run.reason
    checkpoint = stopped.run.last_checkpoint
    assert checkpoint is not None and Path(checkpoint.path).exists(), stopped.events[-5:]
    assert checkpoint.step is not None and checkpoint.step == stopped.run.last_step
    assert "stopped at step" in gpuctl("--node", node0.address, "logs", run_id).stdout
    return checkpoint.step


def test_an_upgrade_in_place_adopts_the_previous_releases_run_and_loses_no_step(
    daemons: Daemons, previous: Install
) -> None:
    old = previous_daemon(daemons, previous, "n0")
    assert store_schema(old.state_dir) == (PREVIOUS_SCHEMA, [])
    run_id = launch(old, FAST, "training.max_steps=100000", config=previous.root / CPU_DDP_SPEC)
    wait_for_step(old, run_id, 10)
    ranks = ranks_of(run_id)
    assert sorted(ranks) == [0, 1]
    # The ranks run the previous release's interpreter, so its trainers library.
    assert all(Path(p.cmdline()[0]) == previous.python for p in ranks.values())

    assert old.stop() == 0  # SIGTERM: the runs go on without their daemon
    time.sleep(1.0)
    assert all(p.is_running() for p in ranks.values())
    new = restart(daemons, old)

    info = new.client().node_info()
    assert (info.version, info.store_schema) == (__version__, SCHEMA_VERSION)
    assert store_schema(new.state_dir) == (
        SCHEMA_VERSION,
        [(PREVIOUS_SCHEMA, SCHEMA_VERSION, __version__)],
    )
    assert "re-adopted" in new.log()
    upgraded_at = status(new, run_id).run.last_step or 0
    # The old library reports to the new daemon: metrics, and both ranks' heartbeats.
    wait_for_step(new, run_id, upgraded_at + 20)
    # Goodput carries the account on (issue 33 §6): the previous release kept none, so the
    # steps it stored say when the run started training and how far it got under it;
    # only the gap after them is unwatched, none of it `starting`.
    rows = json.loads(gpuctl("--node", new.address, "--json", "metrics", run_id,
                             "--name", "loss").stdout)["rows"]  # fmt: skip
    first_at = min(r["time"] for r in rows)
    old_steps = [r["time"] for r in rows if r["step"] <= upgraded_at]
    g = status(new, run_id).goodput
    assert g is not None, "no goodput after the upgrade"
    created = status(new, run_id).run.created_at
    assert g.seconds["starting"] <= first_at - created + 1.0, (g.seconds, first_at - created)
    assert g.seconds["training"] >= max(old_steps) - first_at, g.seconds
    assert 0 < g.seconds["unwatched"] < 30, g.seconds
    until(
        "both ranks' heartbeats reach the new daemon",
        lambda: [r.heartbeat_age_s is not None and r.heartbeat_age_s < 5
                 for r in health(new, run_id).ranks] == [True, True],
        timeout=30,
    )  # fmt: skip
    assert info.skipped_messages == 0 and new.client().node_info().skipped_messages == 0
    assert set(ranks_of(run_id).values()) == set(ranks.values())  # the same processes

    last = stop_with_checkpoint(new, run_id)
    assert last > upgraded_at + 20
    assert_no_gap(steps_recorded(new, run_id), last + 1)
    nothing_left(run_id)


@pytest.mark.parametrize("previous_node", [0, 1], ids=["node0-previous", "node1-previous"])
def test_a_two_node_run_across_two_releases_trains_and_stops_cleanly(
    daemons: Daemons, previous: Install, previous_node: int
) -> None:
    nodes = [
        previous_daemon(daemons, previous, f"n{rank}")
        if rank == previous_node
        else daemons(node=f"n{rank}", simulate_gpus=None)
        for rank in (0, 1)
    ]
    run_id = launch(
        nodes[0], FAST, "training.max_steps=100000", config=previous.root / CPU_DDP_SPEC,
        nodes=(nodes[0].address, nodes[1].address),
    )  # fmt: skip
    wait_for_step(nodes[0], run_id, 10)
    assert sorted(ranks_of(run_id)) == [0, 1, 2, 3]
    s0 = status(nodes[0], run_id)
    assert [p.state for p in s0.parts] == [RunState.RUNNING, RunState.RUNNING], s0.parts

    last = stop_with_checkpoint(nodes[0], run_id)
    assert status(nodes[1], run_id).run.state is RunState.STOPPED
    assert [p.state for p in status(nodes[0], run_id).parts] == [RunState.STOPPED] * 2
    assert_no_gap(steps_recorded(nodes[0], run_id), last + 1)
    nothing_left(run_id)

    # `gpuctl usage` (new in 0.2.0) across both: the 0.1.0 node is one line saying what it
    # lacks; the other node's figures come anyway.
    usage = gpuctl("--node", nodes[0].address, "--node", nodes[1].address, "usage", "--by", "node")
    old = nodes[previous_node].address
    assert usage.returncode == 1, (usage.stdout, usage.stderr)
    assert usage.stderr.splitlines() == [
        f"gpuctl: error: {old}: unknown request type 'node.usage': that gpud is older than"
        f" this client (gpud {__version__}); upgrade it for node.usage [unknown_type]"
    ], usage.stderr
    assert "no GPU time used since" in usage.stdout  # the CPU run's: no GPU-hours, from HEAD
