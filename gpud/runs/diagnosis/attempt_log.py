"""One part's output as every reader sees it: the head, a mark where lines were dropped, the tail.

The shim writes a bounded log (`logs.max_bytes`) as several files (`gpud.runs.process.shim`):
`output.log` holds the head; numbered segments (`output.log.000007`, ...) hold the tail,
the oldest deleted as new ones start; `output.log.index` says where each file starts. A
log that never passed its head, or was not bounded, is `output.log` alone, with no index.

`AttemptLog` joins them into one stream with one offset space: a byte's offset is its place
in everything the part printed, dropped or not, so an offset a follower keeps (the daemon's
`log_offset`, `gpuctl logs -f`'s next offset) stays good across rotations. The dropped
stretch reads as one mark line (`gpud.wire.protocol.LOG_MARK_PREFIX`) that says how many lines
and bytes are missing there and when they were printed. Every reader goes through it:
`run.logs` (`gpuctl logs`, gputop), the daemon's follow of a part (live lines, metric
patterns), cause finding (the last traceback is in the tail), the part runners' pattern
tail and the Slurm verbs.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpud.model.sizes import size_text
from gpud.runs.process.shim import index_path, segment_path
from gpud.wire.run_messages import LOG_MARK_PREFIX

LOG_NAME = "output.log"
#: A segment can vanish between reading the index and opening it: read the index again.
RETRIES = 3


@dataclass(frozen=True)
class Span:
    """Bytes read from the stream: `data` stands for offsets [start, end). A mark's text
    stands for the whole dropped stretch, so its length is not `end - start`."""

    start: int
    end: int
    data: bytes
    mark: bool = False

    def at(self, index: int) -> int:
        """The offset to read from again to get `data[index:]` (a mark is read whole)."""
        if index >= len(self.data):
            return self.end
        return self.start if self.mark else self.start + index


@dataclass(frozen=True)
class Read:
    """What one `AttemptLog.read` got: spans in order."""

    offset: int
    spans: tuple[Span, ...]

    @property
    def data(self) -> bytes:
        return b"".join(s.data for s in self.spans)

    @property
    def end(self) -> int:
        return self.spans[-1].end if self.spans else self.offset

    def offset_at(self, count: int) -> int:
        """The offset after the first `count` bytes of `data`: where to read on from."""
        for span in self.spans:
            if count < len(span.data):
                return span.at(count)
            count -= len(span.data)
        return self.end


@dataclass(frozen=True)
class _Piece:
    start: int
    end: int
    path: str | None  # None: the dropped stretch


@dataclass(frozen=True)
class _Layout:
    pieces: tuple[_Piece, ...]
    size: int
    index: dict[str, Any] | None = None

    def mark(self, at: int, gap: _Piece) -> bytes:
        """The mark line for a reader at offset `at` of the dropped stretch `gap`."""
        assert self.index is not None
        head, oldest = self.index["head"], self.index["segments"][0]
        bound = self.index.get("max_bytes")
        why = f"logs.max_bytes {size_text(bound)}" if isinstance(bound, int) else "logs.max_bytes"
        if at == gap.start:
            lines = int(oldest["lines"])  # the tail's lines before the oldest kept segment
            began = float(head.get("tail_began") or oldest["time"])
            text = (
                f"{LOG_MARK_PREFIX}{lines:,} line(s) ({size_text(gap.end - gap.start)}) dropped"
                f" here, printed {_between(began, float(oldest['time']))} ({why}) ----"
            )
            lead = "" if head.get("ends_line", True) else "\n"
        else:  # a follower that fell behind by more than the tail holds
            text = (
                f"{LOG_MARK_PREFIX}{size_text(gap.end - at)} more dropped here, printed before"
                f" {_clock(float(oldest['time']))}: rotated out before they were read"
                f" ({why}) ----"
            )
            lead = ""
        return (lead + text + "\n").encode()


def _clock(when: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(when))


def _between(first: float, last: float) -> str:
    day = "%Y-%m-%d"
    if time.strftime(day, time.localtime(first)) != time.strftime(day, time.localtime(last)):
        stamp = "%Y-%m-%d %H:%M:%S"
        first_text = time.strftime(stamp, time.localtime(first))
        return f"between {first_text} and {time.strftime(stamp, time.localtime(last))}"
    return f"between {_clock(first)} and {_clock(last)}"


class AttemptLog:
    """The output of one node's part of one attempt, as one stream (see the module)."""

    def __init__(self, log_path: Path | str) -> None:
        self.path = str(log_path)

    @classmethod
    def of(cls, attempt_dir: Path | str) -> AttemptLog:
        return cls(Path(attempt_dir) / LOG_NAME)

    def _layout(self) -> _Layout:
        try:
            index = json.loads(Path(index_path(self.path)).read_text())
            head_bytes = int(index["head"]["bytes"])
            segments = index["segments"]
            offsets = [int(s["offset"]) for s in segments]
            seqs = [int(s["seq"]) for s in segments]
            if not segments:
                raise ValueError("no segments")
        except FileNotFoundError:
            return self._whole()
        except (OSError, ValueError, KeyError, TypeError):
            return self._whole()  # not ours to judge: read what output.log holds
        pieces = [_Piece(0, head_bytes, self.path)]
        if offsets[0] > head_bytes:
            pieces.append(_Piece(head_bytes, offsets[0], None))
        for seq, start, end in zip(seqs, offsets, offsets[1:], strict=False):
            pieces.append(_Piece(start, end, segment_path(self.path, seq)))
        last = segment_path(self.path, seqs[-1])
        size = offsets[-1] + os.path.getsize(last)  # FileNotFoundError: rotated, read again
        pieces.append(_Piece(offsets[-1], size, last))
        return _Layout(tuple(pieces), size, index)

    def _whole(self) -> _Layout:
        try:
            size = os.path.getsize(self.path)
        except OSError:
            size = 0
        return _Layout((_Piece(0, size, self.path),), size)

    def _steady(self) -> _Layout:
        for _ in range(RETRIES):
            try:
                return self._layout()
            except FileNotFoundError:
                continue
        return self._whole()

    def size(self) -> int:
        """The offset after the last byte printed so far."""
        return self._steady().size

    def read(self, offset: int, limit: int) -> Read:
        """Up to `limit` bytes from `offset` on, across files (and a mark, where the
        offset is in the dropped stretch)."""
        for _ in range(RETRIES):
            try:
                return self._read(self._steady(), offset, limit)
            except FileNotFoundError:
                continue  # a segment went between the index and the open: read it again
        return Read(offset, ())

    def _read(self, layout: _Layout, offset: int, limit: int) -> Read:
        pos = min(offset, layout.size)
        spans: list[Span] = []
        left = limit
        for piece in layout.pieces:
            if piece.end <= pos or piece.start > pos:
                continue
            if left <= 0:
                break
            if piece.path is None:
                text = layout.mark(pos, piece)
                spans.append(Span(pos, piece.end, text, mark=True))
            else:
                wanted = min(left, piece.end - pos)
                with open(piece.path, "rb") as f:
                    f.seek(pos - piece.start)
                    data = f.read(wanted)
                if not data:
                    break
                spans.append(Span(pos, pos + len(data), data))
                if len(data) < wanted:
                    break
            left -= len(spans[-1].data)
            pos = spans[-1].end
        return Read(min(offset, layout.size), tuple(spans))

    def backwards(self, end: int, block: int = 64 * 1024) -> Iterator[Span]:
        """Spans that end at `end` and go back to the start of the log, a block at a time:
        a long log costs only its tail. The dropped stretch is one mark span."""
        layout = self._steady()
        pos = min(end, layout.size)
        try:
            for piece in reversed(layout.pieces):
                if piece.start >= pos:
                    continue
                if piece.path is None:
                    yield Span(piece.start, piece.end, layout.mark(piece.start, piece), True)
                    pos = piece.start
                    continue
                with open(piece.path, "rb") as f:
                    while pos > piece.start:
                        start = max(piece.start, pos - block)
                        f.seek(start - piece.start)
                        data = f.read(pos - start)
                        if data:
                            yield Span(start, start + len(data), data)
                        pos = start
        except FileNotFoundError:
            return  # rotated out while we read back: what came before it is gone too

    def whole(self) -> bytes:
        """All there is, head, mark and tail (a bounded log is at most its bound)."""
        return self.read(0, self.size() + 4096).data

    def tail(self, size: int) -> bytes:
        """The last `size` bytes of the stream (a mark counted as its text)."""
        found: list[bytes] = []
        total = 0
        for span in self.backwards(self.size()):
            found.append(span.data)
            total += len(span.data)
            if total >= size:
                break
        return b"".join(reversed(found))[-size:] if size else b""

    def tail_text(self, size: int = 64 * 1024) -> str:
        return self.tail(size).decode(errors="replace")
