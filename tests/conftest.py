"""Fixtures shared by every test: an isolated config dir and real daemons."""

from __future__ import annotations

import compileall
import shutil
import tempfile
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.daemons import RunningDaemon, kill_leftovers, start_daemon
from tests.support.plan import (  # noqa: F401  (hooks: the workers' plan)
    pytest_addoption,
    pytest_collection_modifyitems,
    pytest_configure,
    pytest_xdist_make_scheduler,
)
from tests.support.slurm import LocalSlurm, missing

ROOT = Path(__file__).resolve().parents[1]


def pytest_sessionstart(session: pytest.Session) -> None:
    """Compile the project's modules once, before any worker starts (as pip does for an
    installed package). Where PYTHONDONTWRITEBYTECODE is set (this project's machines set it), every
    daemon, gpuctl and rank the tests start compiled gpud from source again: ~0.45 s of
    CPU per daemon start, ~0.1 s per gpuctl."""
    if hasattr(session.config, "workerinput"):
        return  # an xdist worker: the controller did it
    for package in ("gpud", "launch", "trainers", "tui"):
        compileall.compile_dir(ROOT / package, quiet=1)


@pytest.fixture(autouse=True)
def config_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test gets its own GPUD_CONFIG_DIR (client key, known nodes): nothing leaks."""
    path = tmp_path / "config"
    monkeypatch.setenv("GPUD_CONFIG_DIR", str(path))
    monkeypatch.delenv("GPUD_NODES", raising=False)
    monkeypatch.delenv("GPUD_STATE_DIR", raising=False)
    # Daemons started by tests refuse illegal run state moves (production logs them).
    monkeypatch.setenv("GPUD_STRICT_LIFECYCLE", "1")
    return path


@pytest.fixture
def daemons(tmp_path: Path) -> Iterator[Callable[..., RunningDaemon]]:
    """A factory of running daemons; each is stopped (SIGTERM, clean exit) at the end."""
    started: list[RunningDaemon] = []

    def start(**kwargs: Any) -> RunningDaemon:
        daemon = start_daemon(tmp_path, **kwargs)
        started.append(daemon)
        return daemon

    yield start
    for daemon in started:
        daemon.close_clients()  # those of a daemon the test killed too
        if daemon.proc.poll() is None:
            code = daemon.stop()
            assert code == 0, f"gpud exited {code} on SIGTERM:\n{daemon.log()}"
    if started and (left := kill_leftovers(tmp_path)):
        warnings.warn(f"runs left running at the end of the test, killed: {left}", stacklevel=1)
    for daemon in started:
        assert "illegal run state transition" not in daemon.log(), daemon.log()


@pytest.fixture
def daemon(daemons: Callable[..., RunningDaemon]) -> RunningDaemon:
    return daemons()


@pytest.fixture
def slurm(request: pytest.FixtureRequest) -> Iterator[LocalSlurm]:
    """A real two-node Slurm on loopback (tests/support/slurm.py); skipped, saying why,
    where Slurm is not installed. `.ci/run` installs it. A test may ask for another one
    (accounting, a short MinJobAge) with `tests.support.slurm_runs.with_slurm(...)`."""
    options: dict[str, Any] = getattr(request, "param", {})
    why = missing(bool(options.get("accounting")))
    if why is not None:
        pytest.skip(why)
    root = Path(tempfile.mkdtemp(prefix="slurm-", dir="/tmp"))  # short: a unix socket lives here
    cluster = LocalSlurm(root, **options).start()
    yield cluster
    cluster.stop()
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def cluster(slurm: LocalSlurm, monkeypatch: pytest.MonkeyPatch) -> LocalSlurm:
    """The local Slurm, with this test's gpuctl and daemons pointed at it."""
    monkeypatch.setenv("SLURM_CONF", slurm.env["SLURM_CONF"])
    return slurm
