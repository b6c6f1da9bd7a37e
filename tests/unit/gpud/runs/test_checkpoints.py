"""`resume.pattern` is a user's glob matched by the daemon: the newest of this run's matches,
and a bound on how much of a filesystem one pattern may make it look at."""

from __future__ import annotations

import itertools
import os
from pathlib import Path

import pytest

from gpud.runs.state import checkpoints
from gpud.runs.state.checkpoints import newest_checkpoint, unset_dir_warning
from launch.spec import RunSpec, parse_spec


def _touch(path: Path, mtime: float) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x")
    os.utime(path, (mtime, mtime))


def test_the_newest_match_written_since_the_run_was_created(tmp_path: Path) -> None:
    _touch(tmp_path / "step_1.pt", 1000)  # another run's, before this one was created
    _touch(tmp_path / "step_2.pt", 2000)
    _touch(tmp_path / "step_3.pt", 3000)
    _touch(tmp_path / ".step_4.pt.tmp", 4000)  # a save in progress
    path, note = newest_checkpoint("*.pt*", str(tmp_path), created_at=1500)
    assert path == str(tmp_path / "step_3.pt")
    assert note is not None and note.startswith("passed over 1 older match(es)")


def test_a_pattern_that_matches_too_much_is_cut_and_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for i in range(30):
        _touch(tmp_path / f"d{i}" / "ckpt.pt", 2000 + i)
    monkeypatch.setattr(checkpoints, "MAX_MATCHES", 10)
    path, note = newest_checkpoint("*/*", str(tmp_path), created_at=0)
    assert path is not None
    assert note == (
        f"looked at the first 10 matches of {tmp_path}/*/* only"
        " (resume.pattern matches too much: narrow it)"
    )


def test_a_slow_search_stops_at_its_time_budget(tmp_path: Path) -> None:
    for i in range(5):
        _touch(tmp_path / f"step_{i}.pt", 2000 + i)
    ticks = itertools.count()
    path, note = newest_checkpoint(
        "*.pt", str(tmp_path), created_at=0, clock=lambda: float(next(ticks))
    )  # every look at the clock is a second later: the 2 s budget ends the search early
    assert note is not None and "looked at the first 2 matches" in note
    assert path is not None


def spec(**changes: object) -> RunSpec:
    body: dict[str, object] = {"name": "nano", "script": "train.py", **changes}
    return parse_spec(body)


def test_resume_args_without_a_checkpoint_dir_is_said_in_one_line() -> None:
    asks = spec(resume={"args": ["--init_from=resume"]})
    assert unset_dir_warning(asks, "/var/lib/gpud/runs/r/checkpoints") == (
        "resume.args is set but checkpoint.dir is not: gpud will look in"
        " /var/lib/gpud/runs/r/checkpoints; set checkpoint.dir to where the script writes its"
        " checkpoints"
    )
    assert "gpud looked in /x;" in (unset_dir_warning(asks, "/x", looked=True) or "")
    # Nothing to say: no resume.args, a checkpoint.dir, checkpoints the trainer reports, or
    # a pattern that names its own dir.
    for fine in (
        spec(),
        spec(resume={"args": ["--resume"]}, checkpoint={"dir": "/out"}),
        spec(resume={"args": ["--resume"], "latest": "reported"}),
        spec(resume={"args": ["--resume"], "pattern": "/out/ckpt.pt"}),
    ):
        assert unset_dir_warning(fine, "/x") is None


def test_a_newest_checkpoint_cut_short_is_passed_over_for_the_one_before(tmp_path: Path) -> None:
    import torch

    for step, when in ((10, 2000), (20, 3000)):
        file = tmp_path / f"step_{step}.pt"
        torch.save({"step": step}, file)
        os.utime(file, (when, when))
    newest = tmp_path / "step_20.pt"
    newest.write_bytes(newest.read_bytes()[:300])  # the save the full disk cut short
    os.utime(newest, (3000, 3000))
    path, note = newest_checkpoint("step_*.pt", str(tmp_path), created_at=1500)
    assert path == str(tmp_path / "step_10.pt")
    assert note == (
        f"passed over {newest}: cut short: a zip archive without its central directory (300 bytes)"
    )
    (tmp_path / "step_10.pt").write_bytes(b"PK\x03\x04")  # and the one before, too
    os.utime(tmp_path / "step_10.pt", (2000, 2000))
    path, note = newest_checkpoint("step_*.pt", str(tmp_path), created_at=1500)
    assert path is None and note is not None and note.count("passed over") == 2
