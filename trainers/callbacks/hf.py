"""A Hugging Face `Trainer` under gpud, with one line (imports transformers):

    from trainers.callbacks.hf import GpudCallback
    trainer = Trainer(model, args, train_dataset=data, callbacks=[GpudCallback()])
    trainer.train(resume_from_checkpoint=trainers.init().resume_from)

Every rank sends heartbeats at each optimizer step; rank 0 sends the Trainer's logged
metrics (loss, grad_norm, learning rate as `lr`, epoch, evaluation's `eval_*`) at their
step, and each checkpoint the Trainer saves (`checkpoint-N`, with its save time). The
first optimizer step's FLOPs are counted. On a stop (gpud's, or SIGTERM) the ranks agree
on a step, the Trainer saves a checkpoint there, gpud is told it is the stop's, and
`train()` returns. Outside gpud the callback does nothing.
"""

from __future__ import annotations

import os
from typing import Any

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from trainers.callbacks.steps import FrameworkSteps

#: The Trainer's end-of-training summary (`train_runtime`, `train_loss` …): not a step's.
SUMMARY_KEY = "train_runtime"
#: Kept out of the metrics: a running total, not a rate.
LEFT_OUT = frozenset({"total_flos"})


class GpudCallback(TrainerCallback):
    """Heartbeats, metrics, FLOPs, checkpoints and the stop handshake for a `Trainer`."""

    def __init__(self) -> None:
        self._steps: FrameworkSteps | None = None

    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
        **kwargs: Any,
    ) -> None:  # fmt: skip
        if self._steps is None:
            self._steps = FrameworkSteps()

    def on_step_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
        **kwargs: Any,
    ) -> None:  # fmt: skip
        if self._steps is not None:
            self._steps.step_begin()

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
        **kwargs: Any,
    ) -> None:  # fmt: skip
        steps = self._steps
        if steps is None:
            return
        scheduler = kwargs.get("lr_scheduler")
        values = {"epoch": state.epoch}
        if scheduler is not None and not control.should_log:
            values["lr"] = scheduler.get_last_lr()[0]
        if steps.step_end(state.global_step - 1, values):
            control.should_save = True  # the stop's checkpoint, at this step
            control.should_training_stop = True

    def on_log(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
        logs: dict[str, Any] | None = None, **kwargs: Any,
    ) -> None:  # fmt: skip
        if self._steps is None or not logs or SUMMARY_KEY in logs:
            return
        values = {k: v for k, v in logs.items() if k not in LEFT_OUT}
        self._steps.values(state.global_step - 1, values)

    def on_evaluate(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
        **kwargs: Any,
    ) -> None:  # fmt: skip
        if self._steps is not None:
            self._steps.busy()

    def on_save(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
        **kwargs: Any,
    ) -> None:  # fmt: skip
        if self._steps is not None:
            # where Trainer._save_checkpoint wrote it (PREFIX_CHECKPOINT_DIR)
            name = f"checkpoint-{state.global_step}"
            self._steps.saved(os.path.abspath(os.path.join(args.output_dir or ".", name)),
                              state.global_step - 1)  # fmt: skip

    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
        **kwargs: Any,
    ) -> None:  # fmt: skip
        if self._steps is not None:
            self._steps.ended()


__all__ = ["GpudCallback"]
