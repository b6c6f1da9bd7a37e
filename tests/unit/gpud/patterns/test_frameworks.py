"""`metrics: auto` (issue 32 §2): the frameworks' own lines as they print them, `\\r`
updates and all, give the step and metrics with no pattern in the spec."""

from __future__ import annotations

import pytest

from gpud.patterns.frameworks import Recognizers
from gpud.runs.diagnosis.logparse import complete_lines, split_rank, torchrun_lines
from tests.support.logs import TORCHRUN_HF_TRAINER


def read(*lines: str) -> tuple[Recognizers, list[tuple[int | None, dict[str, float]]]]:
    found = Recognizers()
    return found, [found.extract(line) for line in lines]


def test_hugging_face_trainer_dicts_at_the_step_of_its_progress_bar() -> None:
    bar = (
        "  0%|          | 0/400 [00:00<?, ?it/s]\r  2%|▏         | 9/400 [00:07<05:12,"
        "  1.25it/s]\r  2%|▎         | 10/400 [00:08<05:11,  1.25it/s]"
    )
    # 4.46+ prints the values as strings; older releases as numbers
    logged = "{'loss': '6.157', 'grad_norm': '1.23', 'learning_rate': '4.9e-05', 'epoch': '0.03'}"
    older = "{'loss': 5.9, 'grad_norm': 1.1, 'learning_rate': 4.8e-05, 'epoch': 0.05}"
    eval_bar = "100%|██████████| 5/5 [00:00<00:00, 20.10it/s]"
    found, got = read(bar, logged, eval_bar, "\r  5%|▌ | 20/400 [00:16<05:00,  1.26it/s]", older)
    # gpud's steps count from 0: the bar's 10 done is step 9 (every view shows 10 done)
    assert got[0] == (9, {"steps_per_s": 1.25})
    assert got[1] == (9, {"loss": 6.157, "grad_norm": 1.23, "lr": 4.9e-05, "epoch": 0.03})
    assert got[2] == (None, {})  # the evaluation's bar is not a training step
    assert got[3] == (19, {"steps_per_s": 1.26})
    assert got[4] == (19, {"loss": 5.9, "grad_norm": 1.1, "lr": 4.8e-05, "epoch": 0.05})
    assert found.matched == "hf-trainer"


def test_lightnings_bar_gives_the_global_step_and_its_postfix() -> None:
    found, got = read(
        "Epoch 0:  25%|██▌       | 10/40 [00:01<00:03,  8.12it/s, v_num=0, train_loss=2.310]",
        "Epoch 1:  50%|█████     | 20/40 [00:02<00:02,  8.50it/s, v_num=0, train_loss=1.870,"
        " val_acc=0.61]",
        "Validation DataLoader 0: 100%|██████████| 5/5 [00:00<00:00, 40.1it/s]",
    )
    assert got[0] == (9, {"steps_per_s": 8.12, "loss": 2.31})
    assert got[1] == (59, {"steps_per_s": 8.5, "loss": 1.87, "val_acc": 0.61})
    assert got[2] == (None, {})
    assert found.matched == "lightning"


def test_lightnings_rich_bar_too() -> None:
    """With `rich` installed Lightning draws rich's bar; where output is not a terminal,
    rich prints it once, at the end (as Lightning 2.6 printed it under torchrun)."""
    found, got = read(
        "Epoch 0/-2 ━━━━━━━━━━━━━━━━━ 20/20 0:00:00 • 0:00:00 40.72it/s train_loss: 5.721",
        "Epoch 2/3 ━━━━━━━━━━━━━━━ 5/20 0:00:01 • 0:00:03 4.10it/s v_num: 0 train_loss: 2.5",
    )
    assert got[0] == (19, {"steps_per_s": 40.72, "loss": 5.721})
    assert got[1] == (44, {"steps_per_s": 4.1, "loss": 2.5})
    assert found.matched == "lightning"


def test_nanogpt_torchtitan_and_deepspeed_lines() -> None:
    nano, got = read("iter 120: loss 2.3121, time 41.23ms, mfu 34.53%")
    assert got == [(120, {"loss": 2.3121, "step_time_ms": 41.23, "script_mfu_pct": 34.53})]
    assert nano.matched == "nanogpt"
    titan, got = read(
        "\x1b[31mstep: 10  \x1b[32mloss:  8.1234  \x1b[33mmemory: 12.34GiB(15.60%)  \x1b[34m"
        "tps: 1,234  \x1b[35mtflops: 56.78  \x1b[36mmfu: 12.30%\x1b[39m"
    )
    assert got == [
        (9, {"loss": 8.1234, "tokens_per_s_per_gpu": 1234.0, "tflops": 56.78,
              "script_mfu_pct": 12.3})
    ]  # fmt: skip
    assert titan.matched == "torchtitan"
    ds, got = read(
        "[2026-11-28 10:00:00,000] [INFO] [logging.py:128:log_dist] [Rank 0] steps: 10 loss:"
        " 1.2300 iter time (s): 0.510 samples/sec: 62.745"
    )
    assert got == [(9, {"loss": 1.23, "step_time_s": 0.51, "samples_per_s": 62.745})]
    assert ds.matched == "deepspeed"


def test_any_other_progress_bar_is_steps() -> None:
    found, got = read("train:  10%|█         | 100/1000 [00:10<01:30, 10.00it/s, loss=0.5]")
    assert got == [(99, {"steps_per_s": 10.0, "loss": 0.5})]
    _, slow = read("  1%|          | 3/400 [00:12<26:28,  4.00s/it]")
    assert slow == [(2, {"steps_per_s": 0.25})]
    assert found.matched == "tqdm"


@pytest.mark.parametrize(
    "line",
    ["", "loading checkpoint shards", "{'train_runtime': 12.5}", "x" * 100_000 + " 1/2 ["],
)
def test_other_lines_give_nothing(line: str) -> None:
    found, got = read(line)
    assert got[0][0] is None and found.matched is None


def test_a_trainer_under_torchrun_gives_every_logged_loss_at_its_bar_step() -> None:
    """torchrun copies a worker's unfinished line as far as it goes, so its output glues
    the Trainer's dict to the bar before it: `…| 2/20 [00:00<00:00][default0]:{'loss'…`.
    Cut apart (`torchrun_lines`), each dict is read, at the step the bar last showed."""
    lines = torchrun_lines(TORCHRUN_HF_TRAINER.splitlines())
    assert not any("it/s][default0]:" in line for line in lines)
    found = Recognizers()
    points = []
    for line in lines:
        local, text = split_rank(line)
        step, values = found.extract(text) if local == 0 else (None, {})
        if step is not None and "loss" in values:
            points.append((step, values["loss"]))
    # the bar lags the Trainer's count (tqdm redraws at most every 0.1 s): steps only grow
    assert [loss for _, loss in points] == [5.387, 5.387, 5.388, 5.39]
    steps = [step for step, _ in points]
    assert steps == sorted(steps) and steps[-1] == 14
    assert found.matched == "hf-trainer"


def test_a_bar_that_prints_no_newline_gives_its_updates_as_they_come() -> None:
    """tqdm redraws with `\\r` and prints its newline only when the bar ends: a script
    whose only output is a bar (an accelerate loop's) must not wait for that newline (or
    64 KiB of updates) to show a step."""
    bar = b"\rtrain:   0%|   | 1/1000 [00:00<?, 10.0it/s]\rtrain:   0%|   | 2/1000 [00:00<"
    lines, rest = complete_lines(b"", bar, 65536)
    assert lines == [b"\rtrain:   0%|   | 1/1000 [00:00<?, 10.0it/s]"]
    assert rest == b"\rtrain:   0%|   | 2/1000 [00:00<"  # unfinished: it waits
    lines, rest = complete_lines(rest, b"?, 10.0it/s]\rtrain", 65536)
    assert lines == [b"\rtrain:   0%|   | 2/1000 [00:00<?, 10.0it/s]"] and rest == b"\rtrain"
    _, got = read(*(line.decode() for line in lines))
    assert got == [(1, {"steps_per_s": 10.0})]
    # A line's own `\r\n`, its `\r` read before its `\n`, is one line, not two.
    lines, rest = complete_lines(b"", b"step 1\r", 65536)
    assert (lines, rest) == ([], b"step 1\r")
    assert complete_lines(rest, b"\nstep 2\n", 65536) == ([b"step 1\r", b"step 2"], b"")
    assert complete_lines(b"", b"x" * 10, 4) == ([b"x" * 10], b"")  # too long: given whole
