"""Removing a run dir: everything but its checkpoints, and nothing outside the state dir."""

from __future__ import annotations

from pathlib import Path

from gpud.retention.files import MEASURED_FOR_S, Sizes, keep_paths, measure, remove_run_dir


def run_dir(root: Path, name: str = "r1") -> Path:
    path = root / "runs" / name
    (path / "attempt-1").mkdir(parents=True)
    (path / "attempt-1" / "output.log").write_bytes(b"x" * 1000)
    (path / "metrics.jsonl").write_bytes(b"y" * 500)
    (path / "checkpoints").mkdir()
    (path / "checkpoints" / "step-10.pt").write_bytes(b"z" * 4000)
    return path


def test_the_run_dir_goes_and_its_checkpoints_stay(tmp_path: Path) -> None:
    path = run_dir(tmp_path)
    keep = keep_paths(str(path / "checkpoints"), None)
    sizes = measure(path, keep)
    assert (sizes.removable, sizes.checkpoints) == (1500, 4000)
    done = remove_run_dir(path, tmp_path / "runs", keep)
    assert done.bytes == 1500 and done.kept == [str(path / "checkpoints")] and not done.errors
    assert sorted(p.name for p in path.iterdir()) == ["checkpoints"]
    assert (path / "checkpoints" / "step-10.pt").read_bytes() == b"z" * 4000


def test_the_latest_checkpoint_stays_wherever_it_is_and_empty_dirs_go(tmp_path: Path) -> None:
    path = run_dir(tmp_path)
    (path / "out" / "best").mkdir(parents=True)
    (path / "out" / "best" / "model.pt").write_bytes(b"m")
    (path / "out" / "junk.bin").write_bytes(b"j" * 10)
    (path / "checkpoints" / "step-10.pt").unlink()  # the spec's checkpoint dir, empty
    keep = keep_paths(str(path / "checkpoints"), str(path / "out" / "best" / "model.pt"))
    done = remove_run_dir(path, tmp_path / "runs", keep)
    assert (path / "out" / "best" / "model.pt").exists()
    assert not (path / "out" / "junk.bin").exists() and not (path / "checkpoints").exists()
    assert done.kept == [str(path / "out" / "best" / "model.pt")]


def test_a_run_dir_without_checkpoints_goes_entirely(tmp_path: Path) -> None:
    path = run_dir(tmp_path)
    elsewhere = tmp_path / "shared" / "ckpt"
    elsewhere.mkdir(parents=True)
    (elsewhere / "a.pt").write_bytes(b"a")
    (path / "checkpoints" / "step-10.pt").unlink()
    done = remove_run_dir(path, tmp_path / "runs", keep_paths(str(elsewhere), None))
    assert not path.exists() and (elsewhere / "a.pt").exists() and done.bytes == 1500


def test_a_run_dir_outside_the_state_dir_is_left_alone(tmp_path: Path) -> None:
    path = run_dir(tmp_path / "slurm")
    done = remove_run_dir(path, tmp_path / "state" / "runs", [])
    assert done.outside and (path / "attempt-1" / "output.log").exists()
    assert remove_run_dir(tmp_path / "state" / "runs", tmp_path / "state" / "runs", []).outside


def test_a_symlink_is_removed_never_followed(tmp_path: Path) -> None:
    path = run_dir(tmp_path)
    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "data").write_bytes(b"d")
    (path / "link").symlink_to(precious)
    remove_run_dir(path, tmp_path / "runs", keep_paths(str(path / "checkpoints"), None))
    assert not (path / "link").exists() and (precious / "data").exists()


def test_a_dir_that_holds_still_is_measured_once_and_again_when_its_stamp_moves(
    tmp_path: Path,
) -> None:
    path = tmp_path / "run"
    path.mkdir()
    (path / "output.log").write_bytes(b"x" * 100)
    sizes = Sizes()
    assert sizes.measure(path, [], ("failed", 1.0), now=0.0).removable == 100
    (path / "later.log").write_bytes(b"y" * 50)  # (nothing writes to an ended run's dir)
    assert sizes.measure(path, [], ("failed", 1.0), now=10.0).removable == 100  # kept
    assert sizes.measure(path, [], ("failed", 2.0), now=10.0).removable == 150  # resumed
    assert sizes.measure(path, [], None, now=11.0).removable == 150  # live: every time
    (path / "more.log").write_bytes(b"z" * 25)
    assert sizes.measure(path, [], None, now=12.0).removable == 175
    assert sizes.measure(path, [], ("ok", 3.0), now=13.0).removable == 175
    (path / "last.log").write_bytes(b"w" * 5)
    assert sizes.measure(path, [], ("ok", 3.0), now=13.0 + MEASURED_FOR_S).removable == 180


def test_sizes_let_go_of_dirs_no_longer_measured(tmp_path: Path) -> None:
    sizes = Sizes()
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        sizes.measure(tmp_path / name, [], "ended", now=0.0)
    sizes.forget_unseen()
    sizes.measure(tmp_path / "a", [], "ended", now=1.0)
    sizes.forget_unseen()  # b's run is gone
    (tmp_path / "b" / "f").write_bytes(b"1234")
    assert sizes.measure(tmp_path / "b", [], "ended", now=2.0).removable == 4  # measured anew
