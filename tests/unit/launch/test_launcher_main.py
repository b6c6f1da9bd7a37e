"""launch.launcher_main runs a module as `python -m` would: same argv, output and status."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from launch import launcher_main

MODULE = """
import sys
print("argv", sys.argv[1:], "name", __name__, end="")  # no newline: flushed all the same
sys.stderr.write("to stderr")
how = sys.argv[1]
if how == "raise":
    raise ValueError("bad batch")
if how == "exit":
    sys.exit(int(sys.argv[2]))
if how == "message":
    sys.exit("cannot go on")
import logging
logging.basicConfig(stream=sys.stderr, format="%(message)s")
logging.getLogger().warning("logged")
"""


def run(tmp_path: Path, *args: str, via: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "launchee.py").write_text(MODULE)
    shipped = tmp_path / "attempt" / launcher_main.FILE_NAME
    shipped.parent.mkdir(exist_ok=True)
    shipped.write_text(launcher_main.source())
    head = [str(shipped)] if via == "launcher_main" else ["-m"]
    return subprocess.run(
        [sys.executable, *head, "launchee", *args],
        cwd=tmp_path,  # the module is found from the cwd, as `python -m` finds it
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize("args", [("ok",), ("exit", "3"), ("exit", "0"), ("message",), ("raise",)])
def test_it_is_python_dash_m_to_the_module_and_its_caller(
    tmp_path: Path, args: tuple[str, ...]
) -> None:
    ours = run(tmp_path, *args, via="launcher_main")
    python = run(tmp_path, *args, via="python -m")
    assert ours.returncode == python.returncode
    assert ours.stdout == python.stdout == f"argv {list(args)} name __main__"
    if args[0] == "raise":  # the same traceback, ending in the exception
        assert ours.stderr.splitlines()[-1] == "ValueError: bad batch"
        assert python.stderr.splitlines()[-1] == "ValueError: bad batch"
        assert ours.returncode == 1
    else:
        assert ours.stderr == python.stderr


def test_without_a_module_it_says_how_to_call_it(tmp_path: Path) -> None:
    shipped = tmp_path / launcher_main.FILE_NAME
    shipped.write_text(launcher_main.source())
    done = subprocess.run(
        [sys.executable, str(shipped)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2
    assert done.stderr == f"usage: python {launcher_main.FILE_NAME} MODULE [ARGS...]\n"
