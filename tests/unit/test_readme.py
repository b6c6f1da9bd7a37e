"""The README's two commands are the contract with a newcomer; CI must run the second."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def readme_commands() -> list[str]:
    block = re.search(r"```bash\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    assert block, "README.md must open with a bash block holding the two commands"
    return [line for line in block.group(1).splitlines() if line and not line.startswith("#")]


def test_readme_opens_with_two_commands() -> None:
    run, test = readme_commands()
    assert run.endswith("gpud demo")
    assert test.endswith("pytest")


def test_ci_runs_the_readme_test_command() -> None:
    _, test = readme_commands()
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert test in ci, f".ci/run must run exactly: {test}"
