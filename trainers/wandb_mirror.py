"""Rank 0's metrics, mirrored to Weights & Biases when the run spec asks for it.

Runs in the link thread, never in the training step: `wandb.log` costs ~100-250 µs a call
(offline mode, on this project's machine), a hundred times `run.log()`. wandb reads its
project, entity and mode from the WANDB_* variables gpud sets; files go to the run dir.
"""

from __future__ import annotations

import sys
from typing import Any


class WandbMirror:
    def __init__(self, run_id: str, attempt: int, run_dir: str | None, config: dict[str, Any]):
        self._run_id = run_id
        self._attempt = attempt
        self._run_dir = run_dir
        self._config = config
        self._run: Any = None
        self._broken = False

    def log(self, bodies: list[dict[str, Any]]) -> None:
        if self._broken or not bodies:
            return
        try:
            if self._run is None:
                import wandb

                self._run = wandb.init(
                    name=self._run_id,
                    id=self._run_id,
                    resume="allow",
                    dir=self._run_dir,
                    config={**self._config, "gpud_attempt": self._attempt},
                )
            for body in bodies:
                self._run.log(body["values"], step=body["step"])
        except Exception as exc:  # a mirror must never take the training down
            self._broken = True
            print(f"[gpud] wandb mirror disabled: {exc}", file=sys.stderr)

    def close(self) -> None:
        if self._run is not None:
            try:
                self._run.finish()
            except Exception as exc:
                print(f"[gpud] wandb finish: {exc}", file=sys.stderr)
