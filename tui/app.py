"""The `gputop` entry point (the UI itself arrives with its issue)."""

from __future__ import annotations

import sys


def main() -> None:
    print("gputop: not built yet; use `gpuctl nodes` and `gpuctl hw` meanwhile", file=sys.stderr)
    sys.exit(2)
