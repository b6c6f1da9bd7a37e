"""The systemd unit in config/systemd: systemd's own verifier accepts it, and it keeps runs
alive across `systemctl restart gpud` (KillMode=process: SIGTERM to the daemon alone,
which leaves every run under its shim for the next daemon to adopt — what
tests/integration/test_gpud_stop.py checks of a SIGTERM to the daemon)."""

from __future__ import annotations

import configparser
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.runs import ROOT

UNIT = ROOT / "config" / "systemd" / "gpud.service"
ANALYZE = shutil.which("systemd-analyze")
needs_analyze = pytest.mark.skipif(
    ANALYZE is None, reason="systemd-analyze is not installed (Debian: apt-get install systemd)"
)
INSTALLED_GPUD = "/opt/gpud/.venv/bin/gpud"


def service() -> configparser.SectionProxy:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read_string(UNIT.read_text())
    return parser["Service"]


def verify(unit_text: str, tmp_path: Path, name: str = "gpud.service") -> str:
    """`systemd-analyze verify` of the unit with ExecStart pointing at this venv's gpud
    (it checks that the binary exists); returns what it said about the unit."""
    gpud = Path(sys.executable).with_name("gpud")
    path = tmp_path / name
    path.write_text(unit_text.replace(INSTALLED_GPUD, str(gpud)))
    assert ANALYZE is not None
    done = subprocess.run(
        [ANALYZE, "verify", "--man=no", str(path)], capture_output=True, text=True, timeout=60
    )
    about = [line for line in (done.stdout + done.stderr).splitlines() if name in line]
    assert done.returncode == 0 or about, done.stderr
    return "\n".join(about)


@needs_analyze
def test_systemd_analyze_verify_accepts_the_unit(tmp_path: Path) -> None:
    assert verify(UNIT.read_text(), tmp_path) == ""


@needs_analyze
def test_the_verifier_would_catch_a_broken_unit(tmp_path: Path) -> None:
    broken = UNIT.read_text().replace("KillMode=process", "KillMode=proces")
    assert "Failed to parse kill mode" in verify(broken, tmp_path, "broken.service")


def test_the_unit_keeps_runs_alive_across_a_restart_and_restarts_on_failure() -> None:
    s = service()
    assert s["KillMode"] == "process"  # not control-group: runs live in this cgroup too
    assert s["Restart"] == "on-failure"
    assert s["StateDirectory"] == "gpud" and "--state-dir /var/lib/gpud" in s["ExecStart"]
    assert s["ExecStart"].startswith(f"{INSTALLED_GPUD} serve")
    assert s["User"] == "gpud"
