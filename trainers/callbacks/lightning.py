"""A Lightning script under gpud, with one line (imports `lightning`, else
`pytorch_lightning`):

    from trainers.callbacks.lightning import GpudCallback
    trainer = L.Trainer(..., callbacks=[GpudCallback()])
    trainer.fit(model, ckpt_path=trainers.init().resume_from)

Every rank sends heartbeats at each optimizer step (`trainer.global_step`); rank 0 sends
the learning rate every step and, every `log_every_n_steps`, the step's loss and what the
module logged (`self.log`, the numbers in `trainer.callback_metrics`). The first optimizer
step's FLOPs are counted. Each checkpoint the Trainer writes (ModelCheckpoint's, or a
`trainer.save_checkpoint` of the script's own) is reported with its save time. On a stop
(gpud's, or SIGTERM) the ranks agree on a step, the callback writes `stop-step=N.ckpt`
beside the run's other checkpoints, gpud is told it is the stop's, and `fit` returns.
Outside gpud the callback does nothing.
"""

from __future__ import annotations

import os
from typing import Any

from trainers.callbacks.steps import FrameworkSteps

try:
    from lightning.pytorch import Callback
except ImportError:  # the older package name (hooks are called by name: either Trainer)
    from pytorch_lightning import Callback  # type: ignore[assignment]

#: Lightning's Trainer and LightningModule, of either package.
Trainer = Any
LightningModule = Any


class GpudCallback(Callback):
    """Heartbeats, metrics, FLOPs, checkpoints and the stop handshake for a Lightning
    `Trainer` (automatic or manual optimization; one step per optimizer step)."""

    def __init__(self) -> None:
        self._steps: FrameworkSteps | None = None

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self._steps is not None:
            return
        self._steps = steps = FrameworkSteps()
        if not steps.run.launched:
            return
        save = trainer.save_checkpoint

        def save_checkpoint(filepath: Any, *args: Any, **kwargs: Any) -> None:
            save(filepath, *args, **kwargs)
            steps.saved(os.path.abspath(os.fspath(filepath)), trainer.global_step - 1)

        trainer.save_checkpoint = save_checkpoint  # ModelCheckpoint saves through it

    def on_train_batch_start(
        self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if self._steps is not None:
            self._steps.step_begin()

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any,
        batch_idx: int,
    ) -> None:  # fmt: skip
        steps = self._steps
        step = trainer.global_step - 1
        if steps is None or step < 0 or step == steps.last_step:
            return  # no optimizer step yet (accumulating gradients)
        values: dict[str, Any] = {}
        if trainer.optimizers:
            values["lr"] = trainer.optimizers[0].param_groups[0]["lr"]
        if trainer.global_step % max(trainer.log_every_n_steps, 1) == 0:
            values.update(trainer.callback_metrics)  # read now and then: each a device sync
            loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
            if loss is not None and hasattr(loss, "item"):
                values["loss"] = loss
        if steps.step_end(step, values) and not trainer.should_stop:
            trainer.should_stop = True
            trainer.save_checkpoint(self._stop_path(trainer))  # every rank: a collective

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self._steps is not None:
            self._steps.ended()

    @staticmethod
    def _stop_path(trainer: Trainer) -> str:
        checkpoint = trainer.checkpoint_callback
        folder = getattr(checkpoint, "dirpath", None) or os.path.join(
            trainer.default_root_dir, "checkpoints"
        )
        return os.path.join(folder, f"stop-step={trainer.global_step}.ckpt")


__all__ = ["GpudCallback"]
