"""A checkpoint is whole or it is not: real torch.save archives, safetensors files and
checkpoint directories, cut short as a full disk cuts a save (issue 32 §5)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from gpud.checkpoints.whole import broken

STATE = {"model": {"w": torch.arange(4096, dtype=torch.float32)}, "step": 50}


def saved(path: Path) -> Path:
    torch.save(STATE, path)
    return path


def cut(path: Path, keep: int) -> Path:
    """The first `keep` bytes of `path`, as a write that ran out of disk leaves them."""
    data = path.read_bytes()
    path.write_bytes(data[:keep])
    return path


def test_a_torch_save_is_whole_and_loads(tmp_path: Path) -> None:
    path = saved(tmp_path / "ckpt.pt")
    assert broken(path) is None
    assert torch.load(path)["step"] == 50


@pytest.mark.parametrize("fraction", [0.25, 0.5, 0.9, 0.999])
def test_a_torch_save_cut_short_is_not_and_does_not_load(tmp_path: Path, fraction: float) -> None:
    path = saved(tmp_path / "ckpt.pt")
    size = int(path.stat().st_size * fraction)
    cut(path, size)
    why = broken(path)
    assert why == f"cut short: a zip archive without its central directory ({size:,} bytes)"
    with pytest.raises((RuntimeError, OSError)):
        torch.load(path)  # what a resume from it would have met


def test_an_empty_file_is_not_whole(tmp_path: Path) -> None:
    (tmp_path / "ckpt.pt").touch()
    assert broken(tmp_path / "ckpt.pt") == "empty (0 bytes)"


def test_a_legacy_pickle_and_an_unknown_file_pass(tmp_path: Path) -> None:
    legacy = tmp_path / "old.pt"
    torch.save(STATE, legacy, _use_new_zipfile_serialization=False)
    assert broken(legacy) is None  # nothing in it says how long it should be
    (tmp_path / "notes.txt").write_text("step 50\n")
    assert broken(tmp_path / "notes.txt") is None


def test_safetensors_whole_and_cut_short(tmp_path: Path) -> None:
    path = tmp_path / "model.safetensors"
    save_file({"w": torch.arange(4096, dtype=torch.float32)}, str(path))
    assert broken(path) is None
    size = path.stat().st_size
    cut(path, size - 100)
    assert broken(path) == f"cut short: {size - 100:,} bytes where its header says {size:,}"
    cut(path, 4)
    assert broken(path) == "cut short: no safetensors header"


def test_a_checkpoint_directory_is_whole_when_each_of_its_files_is(tmp_path: Path) -> None:
    # DeepSpeed's layout: global_step50/{mp_rank_00_model_states.pt, *_optim_states.pt}
    step = tmp_path / "global_step50"
    step.mkdir()
    saved(step / "mp_rank_00_model_states.pt")
    optim = saved(step / "bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt")
    (step / "latest").write_text("global_step50")
    assert broken(step) is None
    cut(optim, 1000)
    assert broken(step) == (
        "bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt is cut short: a zip archive without"
        " its central directory (1,000 bytes)"
    )
    empty = tmp_path / "checkpoint-100"
    empty.mkdir()
    assert broken(empty) == "an empty directory"


def test_a_link_to_a_checkpoint_that_is_gone_is_unreadable(tmp_path: Path) -> None:
    (tmp_path / "latest.pt").symlink_to(tmp_path / "step_40.pt")  # deleted by keep_last
    assert broken(tmp_path / "latest.pt") == "unreadable: No such file or directory"
