"""Start real `gpud serve` processes on free loopback ports and talk to them."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from gpud.security.keys import KeyPair
from gpud.wire.client import Client, ClientError, NodeTarget, resolve_target

_HANDED_OUT: set[int] = set()


def free_port() -> int:
    """A loopback port free now and never handed out before in this process.

    The kernel may give the same ephemeral port to two binds in a row (CI once
    saw a daemon's control and events ports coincide), so remember what we gave.
    """
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port


def run_cli(
    *args: str, env: dict[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """Run `python -m <module> args…` (module first) and capture its output."""
    return subprocess.run(
        [sys.executable, "-m", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


def gpuctl(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return run_cli("launch.gpuctl", *args, timeout=timeout)


def complete(words: str) -> subprocess.CompletedProcess[str]:
    """What bash asks gpuctl while the user presses tab after `words`."""
    env = {"_GPUCTL_COMPLETE": "bash_complete", "COMP_WORDS": words,
           "COMP_CWORD": str(len(words.split()) - (0 if words.endswith(" ") else 1))}  # fmt: skip
    return run_cli("launch.gpuctl", env=env, timeout=30)


@dataclass
class RunningDaemon:
    proc: subprocess.Popen[bytes]
    address: str  # HOST:PORT of the control socket
    events: str  # tcp:// endpoint of the events socket
    state_dir: Path
    node: str
    log_path: Path
    clients: list[Client] = field(default_factory=list)
    _polling: dict[int, Client] = field(default_factory=dict, repr=False)

    def target(self) -> NodeTarget:
        return resolve_target(self.address)

    def client(self, keys: KeyPair | None = None, timeout_s: float = 5.0) -> Client:
        client = Client(self.target(), keys=keys, timeout_s=timeout_s)
        self.clients.append(client)
        return client

    def polling_client(self) -> Client:
        """This thread's client for the tests' polls, kept until the daemon stops: a new
        client per poll costs ~4 ms of CPU, at both ends, for its CURVE handshake (0.35 ms
        on a client kept open), and tests poll every 100 ms for seconds."""
        me = threading.get_ident()
        client = self._polling.get(me)
        if client is None:
            client = self._polling[me] = self.client()
        return client

    def forget_polling_client(self) -> None:
        """After a call nobody answered: the next poll starts afresh (a daemon that
        restarted elsewhere, a key that changed)."""
        client = self._polling.pop(threading.get_ident(), None)
        if client is not None:
            client.close()
            self.clients.remove(client)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def close_clients(self) -> None:
        """Close every client made with `client()`, the polling ones too (a client left
        open to a daemon that was killed keeps its sockets, and the test process runs out
        of descriptors some tests later)."""
        for client in self.clients:
            client.close()
        self.clients.clear()
        self._polling.clear()

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 15.0) -> int:
        self.close_clients()
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"gpud did not stop on {sig}; log:\n{self.log()}") from None


def spawn_daemon(
    tmp_path: Path,
    *,
    node: str = "node0",
    simulate_gpus: int | None = 8,
    interval: float = 0.2,
    extra: tuple[str, ...] = (),
    state_dir: Path | None = None,
    control_port: int | None = None,
    events_port: int | None = None,
    cwd: Path | None = None,
    python: str | Path = sys.executable,
) -> tuple[subprocess.Popen[bytes], Path, str, str, Path]:
    """Start `gpud serve` without waiting; returns (proc, log, control, events, state_dir).
    `python`: another install's interpreter (tests/integration/test_upgrade.py)."""
    control_port = control_port or free_port()
    events_port = events_port or free_port()
    state_dir = state_dir or tmp_path / f"state-{node}"
    log_path = tmp_path / f"gpud-{node}-{time.monotonic_ns()}.log"
    args = [
        str(python),
        "-m",
        "gpud",
        "serve",
        "--node-name",
        node,
        "--state-dir",
        str(state_dir),
        "--control",
        f"tcp://127.0.0.1:{control_port}",
        "--events",
        f"tcp://127.0.0.1:{events_port}",
        "--interval",
        str(interval),
        *extra,
    ]
    if simulate_gpus:
        args += ["--simulate-gpus", str(simulate_gpus)]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, cwd=cwd)
    return (
        proc,
        log_path,
        f"127.0.0.1:{control_port}",
        f"tcp://127.0.0.1:{events_port}",
        state_dir,
    )


def start_daemon(tmp_path: Path, ready_timeout: float = 30.0, **kwargs: Any) -> RunningDaemon:
    """Start a daemon and wait until it answers node.info."""
    proc, log_path, address, events, state_dir = spawn_daemon(tmp_path, **kwargs)
    daemon = RunningDaemon(
        proc, address, events, state_dir, str(kwargs.get("node", "node0")), log_path
    )
    deadline = time.monotonic() + ready_timeout
    last_error = "it never logged ready"
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"gpud exited with {proc.returncode}:\n{daemon.log()}")
        if "ready:" in daemon.log():
            try:
                with Client(daemon.target(), timeout_s=1.0) as client:
                    client.node_info()
                return daemon
            except ClientError as exc:
                last_error = str(exc)
        time.sleep(0.05)
    # Ask from a fresh process too: it tells a stuck daemon from a stuck test process.
    fresh = gpuctl("--node", daemon.address, "--timeout", "2", "nodes")
    daemon.stop(signal.SIGKILL)
    raise AssertionError(
        f"gpud did not become ready ({last_error}); a fresh gpuctl says: "
        f"{fresh.returncode} {fresh.stdout}{fresh.stderr}\n{daemon.log()}"
    )


def kill_leftovers(root: Path) -> list[str]:
    """SIGKILL every live process of a run whose run dir is under `root` (a test's
    tmp_path); returns what was killed, as `PID NAME`.

    A daemon stopped by SIGTERM leaves its runs training (a restarted daemon adopts them),
    so a test that ends without stopping its runs would leave ranks burning CPU under the
    tests after it for as long as they train."""
    prefix = str(root) + os.sep
    killed = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get("GPUD_RUN_DIR", "").startswith(prefix):
                name = proc.name()
                proc.kill()
                killed.append(f"{proc.pid} {name}")
        except psutil.Error:
            continue
    return killed
