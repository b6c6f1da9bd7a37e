"""Data-loading helpers for exact resume (imports torch)."""

from __future__ import annotations

from collections.abc import Iterator, Sized
from typing import Any

from torch.utils.data.distributed import DistributedSampler


class ResumableDistributedSampler(DistributedSampler[Any]):
    """A DistributedSampler that can start mid-epoch, skipping what was already consumed.

    The order of an epoch depends only on (seed, epoch), as in DistributedSampler, so
    `load_state_dict({"epoch": e, "consumed": n})` continues the very same sequence at its
    n-th sample. The training loop counts `consumed` itself (DataLoader workers prefetch,
    so the sampler cannot know what was trained on).
    """

    def __init__(self, dataset: Sized, **kwargs: Any) -> None:
        super().__init__(dataset, **kwargs)  # type: ignore[arg-type]
        self._skip = 0

    def __iter__(self) -> Iterator[Any]:
        indices = list(super().__iter__())[self._skip :]
        self._skip = 0  # only the first epoch after a resume is partial
        return iter(indices)

    def __len__(self) -> int:
        return self.num_samples - self._skip

    def state_dict(self, consumed: int) -> dict[str, int]:
        return {"epoch": self.epoch, "consumed": consumed}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.set_epoch(state["epoch"])
        self._skip = state["consumed"]
