"""Data-loading helpers for exact resume (imports torch)."""

from __future__ import annotations

from collections.abc import Iterator, Sized
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset
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


class ResumableBatches:
    """Endless batches, epoch after epoch, that know where they are for a checkpoint.

    Counts the samples handed out in the current epoch (`state_dict()`, with the epoch the
    sampler keeps), moves each batch to `device` (and `dtype`), and gives every epoch's
    DataLoader a generator of its own: a DataLoader otherwise seeds each new iterator from
    the global RNG, and a resumed run creates one iterator more than a straight one.
    """

    def __init__(
        self,
        dataset: Dataset[Any],
        sampler: ResumableDistributedSampler,
        batch_size: int,
        device: torch.device,
        dtype: torch.dtype | None = None,
    ) -> None:
        self.sampler = sampler
        self.consumed = 0
        self._dataset = dataset
        self._batch_size = batch_size
        self._device = device
        self._dtype = dtype

    def state_dict(self) -> dict[str, int]:
        return self.sampler.state_dict(self.consumed)

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.sampler.load_state_dict(state)
        self.consumed = state["consumed"]

    def __iter__(self) -> Iterator[tuple[torch.Tensor, ...]]:
        while True:
            loader = DataLoader(
                self._dataset,
                batch_size=self._batch_size,
                sampler=self.sampler,
                generator=torch.Generator(),
            )
            for batch in loader:
                self.consumed += len(batch[0])
                yield tuple(
                    t.to(device=self._device, dtype=self._dtype, non_blocking=True) for t in batch
                )
            self.consumed = 0
            self.sampler.set_epoch(self.sampler.epoch + 1)
