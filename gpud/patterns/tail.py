"""The spec's metric patterns where no daemon reads the output: a part runner's own thread.

The Slurm part runner and `gpud attach` run node 0's part with no daemon beside them, or
with one that cannot read the part's output. This follows the part's output as it grows
(`output.log`, and a bounded log's tail files after it: `gpud.runs.diagnosis.attempt_log`), runs
the patterns over rank 0's lines (RE2, on the same budget as in the daemon)
and appends what they find to `<run-dir>/metrics.jsonl`, in the trainers library's own
format, so `gpuctl metrics`, `ps` and a daemon's backfill read a plain script's metrics
like a library's. Each batch is one `write` on an O_APPEND descriptor: rows never
interleave with another writer's.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path

from gpud.patterns.extract import MetricExtractor
from gpud.patterns.frameworks import Recognizers
from gpud.runs.diagnosis.attempt_log import AttemptLog
from gpud.runs.diagnosis.logparse import complete_lines, split_rank, torchrun_lines

#: How often the log is looked at for new lines.
POLL_S = 0.5
READ_BYTES = 1 << 20
MAX_LINE = 64 * 1024


class MetricsTail:
    """Follow `log_path` in a thread; `close()` reads what is left and ends it."""

    def __init__(
        self,
        log_path: Path,
        metrics_path: Path,
        run_id: str,
        attempt: int,
        patterns: list[str],
        poll_s: float = POLL_S,
        auto: bool = False,
    ) -> None:
        self.log_path = log_path
        self._log = AttemptLog(log_path)  # across a bounded log's files
        self.metrics_path = metrics_path
        self.run_id = run_id
        self.attempt = attempt
        self.extractor: MetricExtractor | Recognizers = (
            Recognizers() if auto else MetricExtractor(patterns)
        )
        self.rows = 0
        self._poll_s = poll_s
        self._offset = 0
        self._partial = b""
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._follow, name="metrics-tail", daemon=True)

    @classmethod
    def start(
        cls,
        log_path: Path,
        metrics_path: Path,
        run_id: str,
        attempt: int,
        patterns: list[str],
        auto: bool = False,
    ) -> MetricsTail | None:
        """A running tail, or None when there are no patterns to apply (`auto`: gpud's
        recognizers of the frameworks' output, `gpud.patterns.frameworks`)."""
        if not patterns and not auto:
            return None
        tail = cls(log_path, metrics_path, run_id, attempt, patterns, auto=auto)
        tail._report_disabled()
        tail._thread.start()
        return tail

    def close(self, timeout_s: float = 30.0) -> None:
        self._done.set()
        self._thread.join(timeout_s)

    def _follow(self) -> None:
        while True:
            finished = self._done.is_set()
            while self._read():  # everything there is, then wait for more
                pass
            if finished:
                self._flush_partial()
                return
            self._done.wait(self._poll_s)

    def _read(self) -> bool:
        try:
            got = self._log.read(self._offset, READ_BYTES)
        except OSError:
            return False
        data = got.data
        if not data:
            return False
        self._offset = got.end
        lines, self._partial = complete_lines(self._partial, data, MAX_LINE)
        self._apply(lines)
        return True

    def _flush_partial(self) -> None:
        if self._partial:
            lines, self._partial = [self._partial], b""
            self._apply(lines)

    def _apply(self, lines: list[bytes]) -> None:
        now = time.time()
        rows = []
        decoded = [raw[:MAX_LINE].decode(errors="replace").rstrip("\r") for raw in lines]
        for line in torchrun_lines(decoded):
            local, text = split_rank(line)
            # (a progress bar's `\r` updates stay in: the recognizers read each of them)
            if local not in (None, 0) or not self.extractor:
                continue
            step, values = self.extractor.extract(text)
            if step is not None and values:
                rows.append(
                    {"run": self.run_id, "attempt": self.attempt, "time": now,
                     "step": step, "values": values}
                )  # fmt: skip
        self._report_disabled()
        if rows:
            self._write(rows)

    def _write(self, rows: list[dict[str, object]]) -> None:
        data = "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in rows).encode()
        try:
            fd = os.open(self.metrics_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, data)
            finally:
                os.close(fd)
        except OSError as exc:
            print(f"[gpud] cannot write {self.metrics_path}: {exc}", file=sys.stderr, flush=True)
            return
        self.rows += len(rows)

    def _report_disabled(self) -> None:
        for disabled in self.extractor.take_disabled():
            print(f"[gpud] {disabled.line()}", file=sys.stderr, flush=True)
