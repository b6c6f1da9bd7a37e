"""Test hooks: make a rank hang or run slow on purpose (for gpud's health tests).

Off unless set in the environment; the training loop pays one attribute check per step.

    GPUD_TEST_HANG_RANK=1 GPUD_TEST_HANG_AT_STEP=50    rank 1 stops making progress
    GPUD_TEST_SLOW_RANK=1 GPUD_TEST_SLOW_S=0.05        rank 1 takes 50 ms longer per step
    GPUD_TEST_RAISE_RANK=1 GPUD_TEST_RAISE_AT_STEP=3   rank 1 raises ValueError after step 3
        (GPUD_TEST_RAISE_MESSAGE: its message)
    GPUD_TEST_ONLY_ATTEMPTS=1,2                        hang and raise only in these attempts
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class TestHooks:
    __test__ = False  # not a pytest test class

    hang_at_step: int | None
    slow_s: float
    raise_at_step: int | None = None
    raise_message: str = "raised by the test hook"

    @classmethod
    def from_env(cls, env: Mapping[str, str], rank: int) -> TestHooks | None:
        hang = slow = raise_at = None
        only = env.get("GPUD_TEST_ONLY_ATTEMPTS")
        now = only is None or env.get("GPUD_ATTEMPT", "1") in only.split(",")
        if env.get("GPUD_TEST_HANG_RANK") == str(rank) and now:
            hang = int(env.get("GPUD_TEST_HANG_AT_STEP", "0"))
        if env.get("GPUD_TEST_SLOW_RANK") == str(rank):
            slow = float(env.get("GPUD_TEST_SLOW_S", "0.05"))
        if env.get("GPUD_TEST_RAISE_RANK") == str(rank) and now:
            raise_at = int(env.get("GPUD_TEST_RAISE_AT_STEP", "0"))
        if hang is None and slow is None and raise_at is None:
            return None
        return cls(
            hang_at_step=hang,
            slow_s=slow or 0.0,
            raise_at_step=raise_at,
            raise_message=env.get("GPUD_TEST_RAISE_MESSAGE", cls.raise_message),
        )

    def after_step(self, step: int) -> None:
        if self.slow_s:
            time.sleep(self.slow_s)
        if self.raise_at_step is not None and step >= self.raise_at_step:
            raise ValueError(self.raise_message)
        if self.hang_at_step is not None and step >= self.hang_at_step:
            while True:  # the rank is stuck; only a signal ends it
                time.sleep(3600)
