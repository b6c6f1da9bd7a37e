"""The tail of a run's logs: every node's lines, bounded, mergeable and filterable.

Lines keep torchrun's `[default<local_rank>]:` prefix on the wire; here each line learns its
local and global rank (global = node_rank × nproc + local_rank). A tail fetched with
`run.logs` and the live `run.<id>.log` events can overlap: live lines the fetched chunk
already covers (by byte offset) are dropped, and fetched lines sort before live ones. A
mark where a bounded log dropped lines (`gpud.wire.protocol.LOG_MARK_PREFIX`) passes every rank
filter.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

from gpud.runs.diagnosis.logparse import split_rank  # torchrun's `[default1]:`, torch's `[rank1]: `
from gpud.wire.run_messages import is_log_mark

LINES_KEPT = 5000


@dataclass(frozen=True)
class LogLine:
    seq: int
    node: str
    node_rank: int
    attempt: int
    local_rank: int | None
    rank: int | None
    text: str  # without the rank prefix
    end_offset: int  # where the line ends in the part's log file (estimated for live lines)


class LogBuffer:
    """Per node of a run, the last `maxlen` lines; merged views in arrival order."""

    def __init__(self, maxlen: int = LINES_KEPT) -> None:
        self.maxlen = maxlen
        self.parts: dict[int, deque[LogLine]] = {}
        self.version = 0
        self._next = 0
        self._low = 0
        self.tails_loaded: set[tuple[int, int]] = set()  # (node_rank, attempt)

    def _lines(
        self,
        node: str,
        node_rank: int,
        attempt: int,
        nproc: int | None,
        lines: Sequence[str],
        offset: int,
        seqs: Iterator[int],
    ) -> list[LogLine]:
        # `offset` is where the last line ends (about: a partial line may follow it); each
        # earlier line ends its successors' bytes before that. An estimate that errs late,
        # so overlap removal may keep a duplicate but never drops a line.
        ends = []
        position = offset
        for raw in reversed(lines):
            ends.append(position)
            position -= len(raw.encode()) + 1
        ends.reverse()
        out = []
        for raw, seq, end in zip(lines, seqs, ends, strict=False):
            local, text = split_rank(raw)
            rank = None
            if local is not None and nproc:
                rank = node_rank * nproc + local
            elif local is not None and node_rank == 0:
                rank = local
            out.append(LogLine(seq, node, node_rank, attempt, local, rank, text, end))
        return out

    def add_live(
        self,
        node: str,
        node_rank: int,
        attempt: int,
        nproc: int | None,
        lines: list[str],
        offset: int,
    ) -> None:
        start = self._next
        self._next += len(lines)
        part = self.parts.setdefault(node_rank, deque(maxlen=self.maxlen))
        part.extend(
            self._lines(
                node, node_rank, attempt, nproc, lines, offset, iter(range(start, self._next))
            )
        )
        self.version += 1

    def add_tail(
        self,
        node: str,
        node_rank: int,
        attempt: int,
        nproc: int | None,
        lines: list[str],
        next_offset: int,
    ) -> None:
        """Lines fetched with `run.logs`: they go before the live ones they overlap."""
        part = self.parts.setdefault(node_rank, deque(maxlen=self.maxlen))
        live = [ln for ln in part if not (ln.attempt == attempt and ln.end_offset <= next_offset)]
        self._low -= len(lines)
        fetched = self._lines(
            node, node_rank, attempt, nproc, lines, next_offset, iter(range(self._low, 0))
        )
        merged = sorted([*fetched, *live], key=lambda ln: ln.seq)
        self.parts[node_rank] = deque(merged, maxlen=self.maxlen)
        self.tails_loaded.add((node_rank, attempt))
        self.version += 1

    def lines(
        self,
        node_rank: int | None = None,
        rank: int | None = None,
        search: str | None = None,
        limit: int = LINES_KEPT,
    ) -> list[LogLine]:
        """The newest `limit` lines that pass the filters, oldest first."""
        if node_rank is not None and node_rank not in self.parts:
            return []
        parts = [self.parts[node_rank]] if node_rank is not None else list(self.parts.values())
        merged: Iterable[LogLine] = heapq.merge(*parts, key=lambda ln: ln.seq)
        needle = search.lower() if search else None
        kept = deque(
            (
                ln
                for ln in merged
                if (rank is None or ln.rank == rank or is_log_mark(ln.text))
                and (needle is None or needle in ln.text.lower())
            ),
            maxlen=limit,
        )
        return list(kept)

    def ranks(self) -> list[int]:
        return sorted(
            {ln.rank for part in self.parts.values() for ln in part if ln.rank is not None}
        )

    def __len__(self) -> int:
        return sum(len(p) for p in self.parts.values())
