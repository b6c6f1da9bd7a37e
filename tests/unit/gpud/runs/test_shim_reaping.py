"""Every shim the daemon started is reaped once it ends, whether or not its part still
looks at it (issue 33 §4: a replaced part's shim stayed `<defunct>` for minutes)."""

from __future__ import annotations

import subprocess
import sys

import psutil

from gpud.runs.state.part import _Shims
from tests.support.waiting import until


def test_an_ended_shim_nobody_polls_is_reaped_by_the_tick() -> None:
    shims = _Shims()
    quick = shims.add_new(subprocess.Popen([sys.executable, "-c", "pass"]))
    slow = shims.add_new(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"]))
    pid = quick.pid
    del quick  # the part that started it is gone: nothing of ours polls it
    until("the quick one is a zombie", lambda: psutil.Process(pid).status()
          == psutil.STATUS_ZOMBIE, timeout=10)  # fmt: skip
    assert shims.reap() == 1  # the slow one runs on
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    slow.kill()
    slow.wait()
    assert shims.reap() == 0
