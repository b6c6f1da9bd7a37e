"""The scaling baselines gputop compares live runs with (`gpuctl scaling` writes them).

The file is re-read when it changes, looked at no more often than every `CHECK_S`
(a frame must not stat a file), so a measurement taken while gputop is open shows up
within seconds. A file that cannot be read counts as no baselines (`error` says why).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from gpud.scaling.arithmetic import ScalingResult
from gpud.scaling.baselines import BaselineFileError, baselines_path, load_baselines

CHECK_S = 2.0


class BaselineBook:
    def __init__(
        self, path: Path | None = None, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.path = path or baselines_path()
        self.clock = clock
        self.error: str | None = None
        self._results: dict[str, ScalingResult] = {}
        self._seen: tuple[int, int] | None = None
        self._next_check = float("-inf")

    def get(self, name: str) -> ScalingResult | None:
        """The latest measurement of the spec `name`, if there is one."""
        now = self.clock()
        if now >= self._next_check:
            self._next_check = now + CHECK_S
            self._reload()
        return self._results.get(name)

    def _reload(self) -> None:
        try:
            stat = self.path.stat()
        except OSError:
            self._results, self._seen, self.error = {}, None, None
            return
        seen = (stat.st_mtime_ns, stat.st_size)
        if seen == self._seen:
            return
        self._seen = seen
        try:
            self._results, self.error = dict(load_baselines(self.path).baselines), None
        except BaselineFileError as exc:
            self._results, self.error = {}, str(exc)
