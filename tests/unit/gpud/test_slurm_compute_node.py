"""A launch onto a Slurm compute node is refused (gpud/slurm/jobs.py): which slurmd makes
this host one. Real processes named `slurmd` (copies of `tail` and `sleep`), with and
without `-f`."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import psutil
import pytest

from gpud.slurm.jobs import slurm_compute_node, slurmd_conf
from tests.support.waiting import until

#: Every test here reads the whole process table for a slurmd, and some start one that
#: makes this host a compute node: side by side, one would see the other's.
pytestmark = pytest.mark.xdist_group("slurmd-named-processes")


def named_slurmd(tmp_path: Path, program: str) -> Path:
    """A copy of `program` named slurmd: psutil reads its name as slurmd's."""
    (tmp_path / program).mkdir()
    binary = tmp_path / program / "slurmd"
    shutil.copy(shutil.which(program) or f"/bin/{program}", binary)
    return binary


def started(*argv: str, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """The process, once it has exec'd (before that, /proc shows the parent's cmdline)."""
    proc = subprocess.Popen(list(argv), env=env)
    until(
        "the process has exec'd",
        lambda: psutil.Process(proc.pid).cmdline() == list(argv),
        timeout=10,
    )
    return proc


def test_a_slurmd_of_this_daemons_config_makes_a_compute_node(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=test\n")
    # `slurmd -f CONF` that stays up: tail follows the file it is given.
    proc = started(str(named_slurmd(tmp_path, "tail")), "-f", str(conf))
    try:
        assert slurmd_conf(psutil.Process(proc.pid)) == conf
        monkeypatch.setenv("SLURM_CONF", str(conf))
        assert slurm_compute_node()
        # Another cluster's config: a test Slurm on a developer's box is not this node's.
        monkeypatch.setenv("SLURM_CONF", str(tmp_path / "other.conf"))
        assert not slurm_compute_node()
    finally:
        proc.kill()
        proc.wait()


def test_a_slurmd_without_f_reads_its_slurm_conf_or_the_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    slurmd = named_slurmd(tmp_path, "sleep")
    conf = tmp_path / "slurm.conf"
    with_env = started(str(slurmd), "600", env={"SLURM_CONF": str(conf)})
    bare = started(str(slurmd), "600", env={})
    try:
        assert slurmd_conf(psutil.Process(with_env.pid)) == conf
        assert slurmd_conf(psutil.Process(bare.pid)) == Path("/etc/slurm/slurm.conf")
        monkeypatch.delenv("SLURM_CONF", raising=False)
        assert slurm_compute_node()  # the bare one reads the default, as this daemon does
    finally:
        for proc in (with_env, bare):
            proc.kill()
            proc.wait()


def test_a_slurmd_that_died_unreaped_is_no_compute_node(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # not `started`: it may be gone (a zombie, its cmdline unreadable) before the first look;
    # only the exec'd slurmd can exit, since Popen raises when the exec itself fails
    dead = subprocess.Popen([str(named_slurmd(tmp_path, "sleep")), "--no-such-flag"])
    try:
        proc = psutil.Process(dead.pid)
        until("the slurmd exits", lambda: proc.status() == psutil.STATUS_ZOMBIE, timeout=10)
        monkeypatch.delenv("SLURM_CONF", raising=False)
        assert not slurm_compute_node()
    finally:
        dead.wait()
