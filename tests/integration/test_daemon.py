"""A real `gpud serve` process: telemetry, control round trips and its lifecycle."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from gpud.model.snapshot import NodeSnapshot
from gpud.node.statedir import held_by
from gpud.wire.client import RequestFailed
from tests.support.daemons import RunningDaemon, free_port, spawn_daemon, start_daemon
from tests.support.runs import status


def test_snapshots_arrive_on_the_events_socket(daemon: RunningDaemon) -> None:
    client = daemon.client()
    with client.subscribe("hw.") as sub:
        first = sub.recv(timeout_s=5)
        second = sub.recv(timeout_s=5)
    assert first is not None and second is not None
    assert first.topic == "hw.node0"
    assert second.seq == first.seq + 1
    snap = second.body
    assert isinstance(snap, NodeSnapshot)
    assert snap.simulated and snap.backend == "simulated"
    assert len(snap.gpus) == 8 and all(g.simulated for g in snap.gpus)
    assert snap.seq > first.body.seq
    assert snap.host.cpu_count_logical >= 1


def test_control_round_trip(daemon: RunningDaemon) -> None:
    client = daemon.client()
    info = client.node_info()
    assert info.node == "node0"
    assert (info.gpu_count, info.simulated, info.secure) == (8, True, True)
    assert info.role.value == "operator"  # the local user's key, authorized on first start
    assert info.pid == daemon.proc.pid
    assert info.events.endswith(daemon.events.rsplit(":", 1)[1])
    hw = client.node_hw()
    assert hw.node == "node0" and len(hw.gpus) == 8
    assert client.node_events().events == []


def test_ack_is_audited(daemon: RunningDaemon) -> None:
    reply = daemon.client().ack_events(gpu_index=3)
    assert reply.acknowledged == 0
    lines = (daemon.state_dir / "audit.log").read_text().splitlines()
    record = json.loads(lines[-1])
    assert (record["action"], record["role"], record["ok"]) == ("node.events.ack", "operator", True)
    assert record["body"] == {"gpu_index": 3}


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_stops_cleanly_and_frees_everything(
    daemons: Callable[..., RunningDaemon], tmp_path: Path, sig: int
) -> None:
    # A state dir this deep puts the trainer sockets in a private dir under /tmp.
    first = daemons(state_dir=tmp_path / ("deep-" * 20) / "state")
    digest = hashlib.sha256(str(first.state_dir.resolve()).encode()).hexdigest()[:16]
    sockets = Path(tempfile.gettempdir()) / f"gpud-{os.getuid()}-{digest}"
    assert sockets.is_dir()
    assert first.stop(sig) == 0
    assert "stopped" in first.log()
    assert held_by(first.state_dir / "gpud.pid") is None
    assert not sockets.exists()  # /tmp keeps nothing of a daemon that stopped
    # Same ports, same state dir: all were released.
    control_port = int(first.address.rsplit(":", 1)[1])
    events_port = int(first.events.rsplit(":", 1)[1])
    again = daemons(state_dir=first.state_dir, control_port=control_port, events_port=events_port)
    assert again.client().node_info().pid == again.proc.pid


def _wait_exit(proc: subprocess.Popen[bytes], log: Path) -> tuple[int, str]:
    code = proc.wait(timeout=30)
    return code, log.read_text()


def test_refuses_a_state_dir_in_use(daemon: RunningDaemon, tmp_path: Path) -> None:
    proc, log, *_ = spawn_daemon(tmp_path, node="other", state_dir=daemon.state_dir)
    code, text = _wait_exit(proc, log)
    assert code == 3
    assert f"state dir {daemon.state_dir} is in use by gpud pid {daemon.proc.pid}" in text
    assert "Traceback" not in text
    assert daemon.client().node_info().node == "node0"  # the first one is untouched


def test_refuses_a_port_in_use(daemon: RunningDaemon, tmp_path: Path) -> None:
    port = int(daemon.address.rsplit(":", 1)[1])
    proc, log, *_ = spawn_daemon(tmp_path, node="other", control_port=port)
    code, text = _wait_exit(proc, log)
    assert code == 3
    assert f"--control address tcp://127.0.0.1:{port} is already in use" in text
    assert "Traceback" not in text
    # and the loser released its state dir on the way out
    assert held_by(tmp_path / "state-other" / "gpud.pid") is None


def _serve(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpud", "serve", *args],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, **(env or {})},
    )


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--insecure", "--control", "tcp://0.0.0.0:7000"], "--insecure is refused"),
        (["--interval", "-1"], "interval"),
        (["--interval", "abc"], "'abc' is not a valid float"),
        (["--simulate-gpus", "0"], "simulate_gpus"),
        (["--control", "http://x"], "only tcp:// and ipc://"),
        (["--config", "/nonexistent/gpud.yaml"], "does not exist"),
        (["--master-ports", "29500-29000"], "master_ports"),
    ],
)
def test_bad_settings_exit_2_with_one_line(tmp_path: Path, args: list[str], fragment: str) -> None:
    result = _serve("--state-dir", str(tmp_path / "s"), *args)
    assert result.returncode == 2
    assert fragment in result.stderr
    assert "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) <= 2


def test_settings_precedence_flag_env_file(
    daemons: Callable[..., RunningDaemon], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "gpud.yaml"
    config.write_text("node-name: from-file\nsimulate-gpus: 2\n")
    monkeypatch.setenv("GPUD_SERVE_CONFIG", str(config))
    d = daemons(node="from-flag", simulate_gpus=None)  # flag wins over file
    info = d.client().node_info()
    assert (info.node, info.gpu_count) == ("from-flag", 2)  # GPU count came from the file
    d.stop()
    monkeypatch.setenv("GPUD_SIMULATE_GPUS", "3")  # env wins over file
    proc, log, *_ = spawn_daemon(tmp_path, node="x", simulate_gpus=None)
    try:
        deadline = time.monotonic() + 20
        while "ready:" not in log.read_text() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert "3 simulated GPU(s)" in log.read_text()
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0


def test_gpud_stop_stops_the_daemon_of_a_state_dir(daemon: RunningDaemon) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "gpud", "stop", "--state-dir", str(daemon.state_dir)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 0, result.stderr
    assert f"stopped gpud pid {daemon.proc.pid}" in result.stdout
    assert daemon.proc.wait(timeout=5) == 0
    again = subprocess.run(
        [sys.executable, "-m", "gpud", "stop", "--state-dir", str(daemon.state_dir)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert again.returncode == 1 and "no gpud is running" in again.stderr


def test_free_port_helper_gives_distinct_ports() -> None:
    assert len({free_port() for _ in range(50)}) == 50


def test_node_info_says_what_the_daemons_cpu_went_to(daemon: RunningDaemon) -> None:
    """Issue 22 §5: the daemon accounts its own CPU by component (gpud.node.ledger)."""
    client = daemon.client()
    first = client.node_info()
    time.sleep(2.5)  # a few samples at the daemon's interval
    later = client.node_info()
    assert set(later.cpu_by_component) >= {"sampler", "snapshot", "brief", "supervision", "gc"}
    assert later.cpu_by_component["sampler"] > first.cpu_by_component.get("sampler", 0.0)
    assert later.cpu_seconds is not None and first.cpu_seconds is not None
    charged = sum(later.cpu_by_component.values())
    assert 0 < charged <= later.cpu_seconds, (charged, later.cpu_seconds)


def test_the_clients_kept_for_polls_go_with_a_daemon_the_test_killed(tmp_path: Path) -> None:
    """The tests' own hygiene: the polling client kept for a daemon that a test killed is
    closed with it, so the test process does not run out of descriptors tests later."""

    def descriptors() -> int:
        return len(os.listdir("/proc/self/fd"))

    daemon = start_daemon(tmp_path)  # its readiness check made the process's zmq context
    before = descriptors()
    with pytest.raises(RequestFailed):
        status(daemon, "no-such-run")  # the daemon answered: an error reply
    kept = daemon.polling_client()
    with pytest.raises(RequestFailed):
        status(daemon, "no-such-run")
    assert daemon.polling_client() is kept  # an answered call keeps it
    daemon.proc.send_signal(signal.SIGKILL)
    daemon.proc.wait(timeout=10)
    daemon.close_clients()
    deadline = time.monotonic() + 5
    while descriptors() > before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert descriptors() <= before, os.listdir("/proc/self/fd")
