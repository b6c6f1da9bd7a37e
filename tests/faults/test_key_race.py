"""Daemons started at the same moment share one user's client key (issue 26 §5).

Every `gpud serve` with a fresh GPUD_CONFIG_DIR creates the user's client key and
authorizes it in its own state dir. Started together, they must agree on one key: the
first creates it, whole, and the others read it. Two ways to start them together: real
daemons (what users do), and processes released at one instant onto the key alone (a
sharper race than the daemons' start-up jitter allows, so a regression cannot hide).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpud.security.auth import authorized_keys_path
from gpud.security.keys import CLIENT_KEY, load_keypair
from tests.support.daemons import RunningDaemon, spawn_daemon

pytestmark = [pytest.mark.faults, pytest.mark.slow]

DAEMONS = 6
ROUNDS = 2

#: Asks for the user's client key in each of `count` fresh config dirs, in order, and
#: prints what it got (or the error). Several of these started together reach each dir
#: close together, the leader often preempted half-way through creating it (2 cores, 12
#: processes): hundreds of races in a few seconds.
ASK_EACH = """
import os, sys
from pathlib import Path
from gpud.security.keys import KeyFileError, load_or_create_client_keypair
root, count = Path(sys.argv[1]), int(sys.argv[2])
for i in range(count):
    os.environ["GPUD_CONFIG_DIR"] = str(root / f"config-{i}")
    try:
        pair, created = load_or_create_client_keypair()
        print(i, pair.public.decode(), created, flush=True)
    except KeyFileError as exc:
        print(i, "error", str(exc).replace(" ", "_"), flush=True)
"""


def authorized(state_dir: Path) -> list[str]:
    data = json.loads(authorized_keys_path(state_dir).read_text())
    return [entry["key"] for entry in data["keys"]]


def start_together(tmp_path: Path, config: Path, count: int) -> list[RunningDaemon]:
    """`count` daemons started at once on one config dir; each ready, or its log."""
    started = []
    for i in range(count):
        proc, log_path, address, events, state = spawn_daemon(
            tmp_path, node=f"n{i}", simulate_gpus=1, state_dir=tmp_path / f"state-{i}"
        )
        started.append(RunningDaemon(proc, address, events, state, f"n{i}", log_path))
    deadline = time.monotonic() + 60
    waiting = list(started)
    while waiting and time.monotonic() < deadline:
        for daemon in list(waiting):
            if daemon.proc.poll() is not None or "ready:" in daemon.log():
                waiting.remove(daemon)
        time.sleep(0.1)
    return started


def test_daemons_started_together_agree_on_one_client_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for round_ in range(ROUNDS):
        config = tmp_path / f"config-{round_}"
        monkeypatch.setenv("GPUD_CONFIG_DIR", str(config))
        where = tmp_path / f"round-{round_}"
        where.mkdir()
        began = time.monotonic()
        daemons = start_together(where, config, DAEMONS)
        print(f"round {round_}: {DAEMONS} daemons up in {time.monotonic() - began:.1f}s")
        try:
            for daemon in daemons:
                assert daemon.proc.poll() is None, f"{daemon.node} exited:\n{daemon.log()}"
                assert "ready:" in daemon.log(), f"{daemon.node} never ready:\n{daemon.log()}"
            key = load_keypair(config / "keys", CLIENT_KEY)
            for daemon in daemons:
                assert authorized(daemon.state_dir) == [key.public_text], daemon.node
                with daemon.client(keys=key) as client:
                    assert client.node_info().node == daemon.node
        finally:
            for daemon in daemons:  # all at once: eight in a row take a while
                if daemon.proc.poll() is None:
                    daemon.proc.send_signal(signal.SIGTERM)
            for daemon in daemons:
                assert daemon.proc.wait(timeout=30) == 0, daemon.log()


def test_processes_racing_through_many_fresh_config_dirs_get_one_key_each(
    tmp_path: Path,
) -> None:
    script = tmp_path / "ask.py"
    script.write_text(ASK_EACH)
    dirs, racers = 300, 12
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), str(tmp_path), str(dirs)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(racers)
    ]
    answers = [p.communicate(timeout=120) for p in procs]
    got: dict[int, list[tuple[str, str]]] = {}
    for (out, err), proc in zip(answers, procs, strict=True):
        assert proc.returncode == 0, err
        for line in out.splitlines():
            number, key, created = line.split()
            got.setdefault(int(number), []).append((key, created))
    wrong = []
    for index in range(dirs):
        on_disk = load_keypair(tmp_path / f"config-{index}" / "keys", CLIENT_KEY).public_text
        answers_here = got.get(index, [])
        keys = {key for key, _ in answers_here}
        creators = [c for _, c in answers_here].count("True")
        if len(answers_here) != racers or keys != {on_disk} or creators != 1:
            wrong.append((index, sorted(keys - {on_disk}), creators))
    assert not wrong, f"{len(wrong)} of {dirs} dirs raced badly, e.g. {wrong[:3]}"
