"""The trainers library on a disk with no room: /dev/full answers every write ENOSPC, and
a descriptor moved onto a real file (dup2) is the disk having room again."""

from __future__ import annotations

import fcntl
import io
import os
from pathlib import Path

import pytest
import torch

from trainers import link
from trainers.checkpoint import CheckpointSpaceError, out_of_room, remove_abandoned
from trainers.output import FullDiskTolerant


def to_dev_full(fd: int) -> None:
    full = os.open("/dev/full", os.O_WRONLY)
    os.dup2(full, fd)
    os.close(full)


def to_file(fd: int, path: Path) -> None:
    real = os.open(path, os.O_WRONLY | os.O_APPEND)
    os.dup2(real, fd)
    os.close(real)


def test_metrics_wait_for_room_and_are_written_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "metrics.jsonl"
    backfill = link.Backfill(str(path))
    backfill.append(['{"step":0}'])
    to_dev_full(backfill.fileno())
    backfill.append(['{"step":1}', '{"step":2}'])  # refused: they wait
    monkeypatch.setattr(link, "BACKFILL_RETRY_S", 0.0)
    backfill.append(['{"step":3}'])
    to_file(backfill.fileno(), path)
    backfill.close()
    assert path.read_text().splitlines() == [f'{{"step":{i}}}' for i in range(4)]


def test_past_its_bound_the_oldest_whole_lines_go(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(link, "BACKFILL_PENDING_BYTES", 100)
    path = tmp_path / "metrics.jsonl"
    backfill = link.Backfill(str(path))
    to_dev_full(backfill.fileno())
    backfill.append([f'{{"step":{i},"pad":"{"x" * 20}"}}' for i in range(10)])
    assert backfill.dropped_lines > 0
    to_file(backfill.fileno(), path)
    backfill.close()
    kept = path.read_text().splitlines()
    assert kept and len(kept) == 10 - backfill.dropped_lines
    assert kept[-1].startswith('{"step":9,')  # the newest kept, every line whole


def test_a_print_to_a_full_disk_is_dropped_and_counted_not_raised(tmp_path: Path) -> None:
    log = tmp_path / "stdout.log"
    raw = open(log, "wb", buffering=0)  # noqa: SIM115 - the stream owns it
    stream = FullDiskTolerant(io.TextIOWrapper(io.BufferedWriter(raw), line_buffering=True))
    print("before", file=stream)
    to_dev_full(raw.fileno())
    for i in range(2000):
        print(f"lost {i}", file=stream)
    stream.flush()
    assert stream.dropped_writes > 0
    to_file(raw.fileno(), log)
    print("after", file=stream)
    text = log.read_text()
    assert text.startswith("before\n")
    assert "of this rank's output were dropped: ENOSPC" in text
    assert text.endswith("after\n")


def test_a_torch_save_that_does_not_fit_is_told_from_other_failures(tmp_path: Path) -> None:
    payload = {"w": torch.zeros(1 << 16)}
    # Whatever torch raises (its short-write RuntimeError, our ENOSPC under it).
    with pytest.raises(Exception) as failed, open("/dev/full", "wb") as f:
        torch.save(payload, f)
    assert out_of_room(failed.value, tmp_path, 1 << 18)
    assert not out_of_room(ValueError("a bug"), tmp_path, 1 << 18)
    error = CheckpointSpaceError(tmp_path, 24, 3_100_000, 900_000)
    assert str(error) == (
        f"no space left on {tmp_path} (checkpoint step 24 needs ~3.1 MB, 0.9 MB free)"
    )


def test_only_temporary_files_no_save_holds_are_removed(tmp_path: Path) -> None:
    abandoned = tmp_path / ".step_00000003.pt.tmp"
    live = tmp_path / ".step_00000009.pt.tmp"
    others = [tmp_path / "step_00000002.pt", tmp_path / ".notes.tmp", tmp_path / "x.pt.tmp"]
    for path in [abandoned, live, *others]:
        path.write_bytes(b"\0" * 1024)
    with open(live, "rb") as saving:
        fcntl.flock(saving.fileno(), fcntl.LOCK_EX)
        assert remove_abandoned(tmp_path) == [abandoned]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(p.name for p in [live, *others])
