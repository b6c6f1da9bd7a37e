"""Waiting for something a real process will do."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def until(what: str, check: Callable[[], Any], timeout: float = 120, every: float = 0.1) -> Any:
    """`check()`'s first truthy value within `timeout` seconds; else fail, naming `what`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if found := check():
            return found
        time.sleep(every)
    raise AssertionError(f"never: {what}")
