"""Bounded run logs (issue 22 §1): the shim's pump keeps the head and a rotating tail under
`logs.max_bytes`, and `AttemptLog` reads them back as one stream with a mark where lines
were dropped. Real pipes and real files; numbered lines tell what was kept."""

from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpud.model.run import AttemptRecord, RunRecord, RunState
from gpud.runs.diagnosis.attempt_log import AttemptLog
from gpud.runs.diagnosis.logread import read_chunk
from gpud.runs.process import shim
from gpud.wire.run_messages import LogsRequest, is_log_mark

BOUND = 100_000  # a head of 25 kB, and segments of 25 kB, three kept
MARK = re.compile(
    r"^\[gpud\] ---- ([\d,]+) line\(s\) \(([\d.]+ kB)\) dropped here, printed between"
    r" \d\d:\d\d:\d\d and \d\d:\d\d:\d\d \(logs.max_bytes 100 kB\) ----$"
)


def line(i: int, rank: int | None = None) -> bytes:
    prefix = f"[default{rank}]:" if rank is not None else ""
    return f"{prefix}line {i:06d} {'x' * 40}\n".encode()


class Pumped:
    """A pump with a real pipe in front and a real log behind, as the shim runs it."""

    def __init__(self, directory: Path, max_bytes: int | None = BOUND) -> None:
        self.path = directory / "output.log"
        read_end, self.write_end = os.pipe()
        self.log = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self.pump = shim.OutputPump(read_end, self.log, str(self.path), None, max_bytes).start()
        self.read_end = read_end
        self.sent = 0

    def write(self, data: bytes) -> None:
        self.sent += len(data)
        done = threading.Event()

        def run() -> None:
            os.write(self.write_end, data)
            done.set()

        threading.Thread(target=run, daemon=True).start()
        assert done.wait(10), "the pipe was not drained"

    def settle(self) -> None:
        """Wait until the pump has written all that went into the pipe."""
        deadline = time.monotonic() + 10
        while self.pump.offset < self.sent:
            assert time.monotonic() < deadline, "the pump did not catch up"
            time.sleep(0.005)

    def close(self) -> None:
        os.close(self.write_end)
        self.pump.join(10)
        assert not self.pump.thread.is_alive()
        os.close(self.log)
        os.close(self.read_end)


LINE = len(line(0))


def numbers(lines: list[str]) -> list[int]:
    return [int(text.split()[1]) for text in lines if not is_log_mark(text)]


def files(directory: Path) -> dict[str, int]:
    return {p.name: p.stat().st_size for p in directory.iterdir()}


@pytest.fixture
def pumped(tmp_path: Path) -> Iterator[Pumped]:
    pump = Pumped(tmp_path)
    yield pump
    if pump.pump.thread.is_alive():
        pump.close()


def test_the_log_keeps_its_head_and_tail_under_the_bound_and_marks_the_drop(
    tmp_path: Path, pumped: Pumped
) -> None:
    total = 20_000  # 1 MB: ten times the bound
    pumped.write(b"".join(line(i) for i in range(total)))
    pumped.close()
    on_disk = files(tmp_path)
    index = on_disk.pop("output.log.index")
    assert sum(on_disk.values()) <= BOUND and index < 1024
    assert len(on_disk) == 1 + shim.TAIL_SEGMENTS  # the head and three segments
    for name in on_disk:  # every file is cut where a line ends
        assert (tmp_path / name).read_bytes().endswith(b"\n"), name
    lines = AttemptLog(pumped.path).whole().decode().splitlines()
    marks = [i for i, text in enumerate(lines) if is_log_mark(text)]
    assert len(marks) == 1
    head, tail = numbers(lines[: marks[0]]), numbers(lines[marks[0] + 1 :])
    assert head == list(range(len(head))) and len(head) == 25_000 // LINE
    assert tail == list(range(tail[0], total)) and len(tail) * LINE >= BOUND // 2
    found = MARK.match(lines[marks[0]])
    assert found, lines[marks[0]]
    dropped = tail[0] - len(head)
    assert found.group(1) == f"{dropped:,}"
    assert found.group(2) == f"{dropped * LINE / 1000:.3g} kB"


def test_an_unbounded_or_small_log_is_one_file_without_an_index(tmp_path: Path) -> None:
    (tmp_path / "small").mkdir()
    small = Pumped(tmp_path / "small")
    small.write(b"".join(line(i) for i in range(400)))  # 20 kB: within the head
    small.close()
    assert set(files(tmp_path / "small")) == {"output.log"}
    (tmp_path / "free").mkdir()
    free = Pumped(tmp_path / "free", max_bytes=None)
    free.write(b"".join(line(i) for i in range(20_000)))
    free.close()
    assert files(tmp_path / "free") == {"output.log": 20_000 * LINE}


def test_a_follower_keeps_its_place_across_rotations_and_is_told_what_it_missed(
    pumped: Pumped,
) -> None:
    log = AttemptLog(pumped.path)
    seen: list[str] = []
    offset = 0

    def follow(limit: int = 1 << 20) -> None:
        nonlocal offset
        got = log.read(offset, limit)
        text = got.data.decode()
        assert text == "" or text.endswith("\n")  # the pump writes whole lines here
        seen.extend(text.splitlines())
        offset = got.end

    n = 0
    for _ in range(30):  # keeps up: 40 kB between reads, less than the tail holds
        pumped.write(b"".join(line(i) for i in range(n, n + 800)))
        n += 800
        pumped.settle()
        follow()
    assert numbers(seen) == list(range(n)) and not any(is_log_mark(t) for t in seen)
    # Falls behind: it read part of a segment, then the tail moved on by far more.
    pumped.write(b"".join(line(i) for i in range(n, n + 200)))
    n += 200
    pumped.settle()
    follow(limit=LINE * 100)
    pumped.write(b"".join(line(i) for i in range(n, n + 10_000)))
    n += 10_000
    pumped.settle()
    follow()
    marks = [t for t in seen if is_log_mark(t)]
    assert len(marks) == 1 and re.search(r"kB more dropped here, printed before", marks[0])
    got = numbers(seen)
    assert got == sorted(set(got)) and got[-1] == n - 1  # in order, none twice, to the end


def test_cause_finding_reads_the_tail_files(pumped: Pumped) -> None:
    pumped.write(b"".join(line(i) for i in range(5_000)))
    pumped.write(b'Traceback (most recent call last):\n  File "x.py", line 1\nValueError: late\n')
    pumped.close()
    tail = AttemptLog(pumped.path).tail_text(200)
    assert tail.endswith("ValueError: late\n")
    assert "ValueError: late" not in pumped.path.read_text()  # output.log is the head only


def records(directory: Path, state: RunState) -> tuple[RunRecord, AttemptRecord]:
    run = RunRecord(
        id="r", name="r", created_at=0, spec={}, nodes=[], node_rank=0, state=state,
        state_since=0, run_dir=str(directory), checkpoint_dir=str(directory),
    )  # fmt: skip
    attempt = AttemptRecord(
        run_id="r", attempt=1, node_rank=0, state=state, state_since=0, master_addr="x",
        master_port=1, nproc=2, attempt_dir=str(directory),
    )  # fmt: skip
    return run, attempt


def test_gpuctl_logs_chunks_tail_and_ranks_show_the_mark(tmp_path: Path, pumped: Pumped) -> None:
    pumped.write(b"".join(line(i, rank=i % 2) for i in range(10_000)))
    pumped.close()
    run, attempt = records(tmp_path, RunState.FAILED)
    # From the start, 64 kB at a time, as `gpuctl logs -f` does: every line once, in order.
    lines: list[str] = []
    request = LogsRequest(run="r", max_bytes=64 * 1024)
    while True:
        chunk = read_chunk(run, attempt, "n", request, None)
        lines += chunk.lines
        if chunk.ended:
            break
        request = request.model_copy(update={"offset": chunk.next_offset})
    whole = AttemptLog(pumped.path).whole().decode().splitlines()
    assert lines == whole and sum(map(is_log_mark, lines)) == 1
    mark_at = next(i for i, text in enumerate(lines) if is_log_mark(text))
    # The last N lines, reaching back over the mark into the head.
    back = len(lines) - mark_at + 2
    tail = read_chunk(run, attempt, "n", LogsRequest(run="r", tail_lines=back), None)
    assert tail.lines == lines[-back:] and is_log_mark(tail.lines[2])
    # One rank's lines keep the mark.
    ranked = read_chunk(run, attempt, "n", LogsRequest(run="r", max_bytes=4 << 20), 1)
    assert sum(map(is_log_mark, ranked.lines)) == 1
    assert all(is_log_mark(t) or t.startswith("[default1]:") for t in ranked.lines)


def test_a_line_longer_than_a_file_is_cut_and_nothing_is_lost_before_the_bound(
    tmp_path: Path,
) -> None:
    pump = Pumped(tmp_path, max_bytes=400_000)
    huge = b"#" * 150_000 + b"\n"  # longer than a quarter
    pump.write(line(0) + huge + line(1))
    pump.close()
    text = AttemptLog(pump.path).whole()
    assert text == line(0) + huge + line(1)
    assert all(size <= 100_000 for name, size in files(tmp_path).items())
