"""The shim's output pump on a disk with no room: /dev/full answers every write ENOSPC,
and a descriptor moved onto a real file (dup2) is the disk having room again."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

from gpud.runs.process import shim


def pumping(log_path: Path) -> tuple[int, int, shim.OutputPump]:
    """A pipe (the launcher's stdout) into a pump whose log is /dev/full for now."""
    read_end, write_end = os.pipe()
    log = os.open("/dev/full", os.O_WRONLY)
    return write_end, log, shim.OutputPump(read_end, log, str(log_path)).start()


def write_all(fd: int, data: bytes, timeout: float = 10.0) -> None:
    """Write into the pipe from a thread: a pump that stopped draining would block it."""
    done = threading.Event()

    def run() -> None:
        os.write(fd, data)
        done.set()

    threading.Thread(target=run, daemon=True).start()
    assert done.wait(timeout), "the pipe was not drained: the launcher would block"


def test_a_full_disk_drops_and_counts_output_and_the_pipe_stays_drained(tmp_path: Path) -> None:
    write_end, _, pump = pumping(tmp_path / "output.log")
    line = b"y" * 99 + b"\n"
    write_all(write_end, line * 20_000)  # 2 MB: 30 pipe buffers' worth
    os.close(write_end)
    pump.join(10)
    assert not pump.thread.is_alive()
    assert pump.dropped_bytes == len(line) * 20_000


def test_once_there_is_room_one_line_says_what_was_dropped(tmp_path: Path) -> None:
    log_path = tmp_path / "output.log"
    write_end, log, pump = pumping(log_path)
    write_all(write_end, b"lost 1\nlost 2\n")
    time.sleep(0.2)
    # Room again: the pump's descriptor now points at the real log.
    real = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(real, log)
    os.close(real)
    time.sleep(shim.RETRY_S + 0.2)
    write_all(write_end, b"kept\n")
    os.close(write_end)
    pump.join(10)
    text = log_path.read_text()
    first, second = text.splitlines()
    assert first.startswith("[gpud-shim] 2 line(s) (14 bytes) of output were dropped: the disk of")
    assert "was full (ENOSPC) from " in first
    assert second == "kept"


def test_exit_json_is_written_over_its_reserved_space(tmp_path: Path) -> None:
    path = tmp_path / "exit.json"
    assert shim.reserve(path)
    reserved = tmp_path / ".exit.json.tmp"
    assert reserved.stat().st_size == shim.EXIT_RESERVE
    shim.record_exit(path, {"exit_code": 0, "signal": None})
    assert json.loads(path.read_text()) == {"exit_code": 0, "signal": None}
    assert not reserved.exists()
