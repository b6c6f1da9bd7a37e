"""Serving captured output: a byte range, the last lines, or one rank's lines."""

from __future__ import annotations

import os

from gpud.protocol import LogChunk, LogsRequest
from gpud.runmodel import AttemptRecord, RunRecord
from gpud.runs.logparse import split_rank


def _tail_offset(path: str, size: int, lines: int) -> int:
    """The offset where the last `lines` lines of the file start."""
    block = 64 * 1024
    end = size
    found = 0
    with open(path, "rb") as f:
        while end > 0:
            start = max(0, end - block)
            f.seek(start)
            data = f.read(end - start)
            # A trailing newline ends the last line; it does not start a new one.
            scan = data[:-1] if end == size and data.endswith(b"\n") else data
            count = scan.count(b"\n")
            if found + count >= lines:
                cut = len(scan)
                for _ in range(lines - found):
                    cut = scan.rfind(b"\n", 0, cut)
                return start + cut + 1
            found += count
            end = start
    return 0


def _ends_with_newline(path: str, size: int) -> bool:
    with open(path, "rb") as f:
        f.seek(size - 1)
        return f.read(1) == b"\n"


def read_chunk(
    run: RunRecord,
    record: AttemptRecord,
    node: str,
    req: LogsRequest,
    local_rank: int | None,
) -> LogChunk:
    path = os.path.join(record.attempt_dir, "output.log")
    try:
        size = os.path.getsize(path)
    except OSError:
        size = 0
    if req.offset is not None:
        offset = min(req.offset, size)
    elif req.tail_lines is not None and size:
        wanted = req.tail_lines
        if not record.state.terminal and not _ends_with_newline(path, size):
            wanted += 1  # the unfinished last line is held back: count one more
        offset = _tail_offset(path, size, wanted)
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
