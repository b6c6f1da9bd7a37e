"""Serving captured output: a byte range, the last lines, or one rank's lines."""

from __future__ import annotations

import os
from collections.abc import Callable

from gpud.protocol import LogChunk, LogsRequest
from gpud.runmodel import AttemptRecord, RunRecord
from gpud.runs.logparse import split_rank

#: A filter on the start of a line: its first `LINE_START` bytes (or all of a shorter one).
LineFilter = Callable[[bytes], bool]
LINE_START = 256


def _tail_offset(path: str, size: int, lines: int, keep: LineFilter, whole_only: bool) -> int:
    """The offset where the last `lines` lines that `keep` accepts start.

    Reads backwards in blocks, so a long log costs only its tail. With `whole_only`, an
    unfinished last line (no newline yet) is held back: it does not count.
    """
    block = 64 * 1024
    found = 0
    with open(path, "rb") as f:
        f.seek(size - 1)
        ends_with_newline = f.read(1) == b"\n"
        # A trailing newline ends the last line; it does not start a new one.
        pos = size - 1 if ends_with_newline else size
        skip = whole_only and not ends_with_newline
        # The start of the line that straddles `pos` (up to LINE_START bytes of it): a
        # megabyte "line" of progress-bar updates is never held whole.
        pending = b""
        while pos > 0:
            start = max(0, pos - block)
            f.seek(start)
            data = f.read(pos - start) + pending
            pos = start
            cut = len(data)
            newline = data.rfind(b"\n", 0, cut)
            while newline >= 0:
                if skip:
                    skip = False
                elif keep(data[newline + 1 : min(cut, newline + 1 + LINE_START)]):
                    found += 1
                    if found >= lines:
                        return pos + newline + 1
                cut = newline
                newline = data.rfind(b"\n", 0, cut)
            pending = data[: min(cut, LINE_START)]
    return 0  # the file's first line is the earliest one there is


def _every_line(line: bytes) -> bool:
    return True


def _rank_filter(local_rank: int | None) -> LineFilter:
    if local_rank is None:
        return _every_line

    def keep(start: bytes) -> bool:
        return split_rank(start.decode(errors="replace"))[0] == local_rank

    return keep


def read_chunk(
    run: RunRecord,
    record: AttemptRecord,
    node: str,
    req: LogsRequest,
    local_rank: int | None,
) -> LogChunk:
    path = os.path.join(record.attempt_dir, "output.log")
    nobody = False
    if local_rank is not None and run.spec.get("launcher") == "python":
        # One process, no launcher to prefix its lines: every line is rank 0's.
        nobody = local_rank != 0
        local_rank = None
    try:
        size = os.path.getsize(path)
    except OSError:
        size = 0
    if req.offset is not None:
        offset = min(req.offset, size)
    elif req.tail_lines is not None and size:
        # The last N lines of this rank, not this rank's lines among the last N: a rank's
        # filter applies before the tail is cut. While the attempt runs, its unfinished
        # last line is held back, so it does not count.
        keep = _rank_filter(local_rank)
        offset = _tail_offset(path, size, req.tail_lines, keep, not record.state.terminal)
    else:
        offset = 0
    data = b""
    if size > offset:
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read(req.max_bytes)
    # Whole lines only, unless this is the true end of a finished attempt's log; a line
    # longer than max_bytes is handed out anyway, or it would never be.
    newline = data.rfind(b"\n")
    at_end = record.state.terminal and offset + len(data) >= size
    if at_end or (newline < 0 and len(data) == req.max_bytes):
        body = data
    else:
        body = data[: newline + 1]
    lines = body.decode(errors="replace").splitlines()
    if local_rank is not None:
        lines = [line for line in lines if split_rank(line)[0] == local_rank]
    if nobody:
        lines = []
    return LogChunk(
        run_id=run.id,
        node=node,
        node_rank=run.node_rank,
        attempt=record.attempt,
        offset=offset,
        next_offset=offset + len(body),
        size=size,
        lines=lines,
        ended=record.state.terminal and offset + len(body) >= size,
    )
