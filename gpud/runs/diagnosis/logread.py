"""Serving captured output: a byte range, the last lines, or one rank's lines (offsets and
the mark where a bounded log dropped lines: `gpud.runs.diagnosis.attempt_log`)."""

from __future__ import annotations

from collections.abc import Callable

from gpud.model.run import AttemptRecord, RunRecord
from gpud.runs.diagnosis.attempt_log import AttemptLog
from gpud.runs.diagnosis.logparse import split_rank
from gpud.wire.run_messages import LogChunk, LogsRequest, is_log_mark

#: A filter on the start of a line: its first `LINE_START` bytes (or all of a shorter one).
LineFilter = Callable[[bytes], bool]
LINE_START = 256


def _tail_offset(log: AttemptLog, size: int, lines: int, keep: LineFilter, whole_only: bool) -> int:
    """The offset where the last `lines` lines that `keep` accepts start.

    Reads backwards in blocks, so a long log costs only its tail; a mark where lines were
    dropped is a line too. With `whole_only`, an unfinished last line (no newline yet) is
    held back: it does not count.
    """
    found = 0
    first = True
    skip = False
    # The start of the line that begins after the current block (up to LINE_START bytes
    # of it): a megabyte "line" of progress-bar updates is never held whole.
    pending = b""
    for span in log.backwards(size):
        data = span.data + pending
        cut = len(data)
        if first:
            first = False
            if data.endswith(b"\n"):
                cut -= 1  # a trailing newline ends the last line; it does not start one
            else:
                skip = whole_only
        newline = data.rfind(b"\n", 0, cut)
        while newline >= 0:
            if skip:
                skip = False
            elif keep(data[newline + 1 : min(cut, newline + 1 + LINE_START)]):
                found += 1
                if found >= lines:
                    return span.at(newline + 1)
            cut = newline
            newline = data.rfind(b"\n", 0, cut)
        pending = data[: min(cut, LINE_START)]
    return 0  # the first line is the earliest one there is


def _every_line(line: bytes) -> bool:
    return True


def _rank_filter(local_rank: int | None) -> LineFilter:
    if local_rank is None:
        return _every_line

    def keep(start: bytes) -> bool:
        text = start.decode(errors="replace")
        return is_log_mark(text) or split_rank(text)[0] == local_rank

    return keep


def read_chunk(
    run: RunRecord,
    record: AttemptRecord,
    node: str,
    req: LogsRequest,
    local_rank: int | None,
) -> LogChunk:
    log = AttemptLog.of(record.attempt_dir)
    nobody = False
    if local_rank is not None and run.spec.get("launcher") == "python":
        # One process, no launcher to prefix its lines: every line is rank 0's.
        nobody = local_rank != 0
        local_rank = None
    size = log.size()
    if req.offset is not None:
        offset = min(req.offset, size)
    elif req.tail_lines is not None and size:
        # The last N lines of this rank, not this rank's lines among the last N: a rank's
        # filter applies before the tail is cut. While the attempt runs, its unfinished
        # last line is held back, so it does not count.
        keep = _rank_filter(local_rank)
        offset = _tail_offset(log, size, req.tail_lines, keep, not record.state.terminal)
    else:
        offset = 0
    got = log.read(offset, req.max_bytes)
    data = got.data
    # Whole lines only, unless this is the true end of a finished attempt's log; a line
    # longer than max_bytes is handed out anyway, or it would never be.
    newline = data.rfind(b"\n")
    at_end = record.state.terminal and got.end >= size
    if at_end or (newline < 0 and len(data) >= req.max_bytes):
        body = data
    else:
        body = data[: newline + 1]
    next_offset = got.offset_at(len(body))
    lines = body.decode(errors="replace").splitlines()
    if local_rank is not None:
        lines = [line for line in lines if is_log_mark(line) or split_rank(line)[0] == local_rank]
    if nobody:
        lines = []
    return LogChunk(
        run_id=run.id,
        node=node,
        node_rank=run.node_rank,
        attempt=record.attempt,
        offset=got.offset,
        next_offset=next_offset,
        size=size,
        lines=lines,
        ended=record.state.terminal and next_offset >= size,
    )
