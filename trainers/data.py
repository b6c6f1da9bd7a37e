"""Data-loading helpers for exact resume (imports torch)."""

from __future__ import annotations

from collections.abc import Iterator, Sized
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler


class ResumableDistributedSampler(DistributedSampler[Any]):
    """A DistributedSampler that can start mid-epoch, skipping what was already consumed,
    at the same world size or another one (an elastic run that lost a node).

    The order of an epoch depends only on (seed, epoch), as in DistributedSampler, which
    deals the epoch's permutation out round-robin: global position p goes to rank
    p % world. So after every rank consumed c samples, the first c × world positions are
    done, whatever the world was. `load_state_dict` takes that global count and deals the
    rest of the epoch to the ranks of the world it runs in now: the same sequence as a
    straight run at the same world, and at another world no sample twice and none left
    out (but the padding or the dropped tail of the epoch, as the sampler's own). The
    training loop counts what it consumed itself (DataLoader workers prefetch).
    """

    def __init__(self, dataset: Sized, **kwargs: Any) -> None:
        super().__init__(dataset, **kwargs)  # type: ignore[arg-type]
        self._start = 0  # global positions of this epoch to skip (a resume's first epoch)
        self._base = 0  # global positions of this epoch consumed before the resume

    def _rest_of_epoch(self) -> list[int]:
        """This rank's share of the epoch's positions from `_start` on."""
        count = len(self.dataset)  # type: ignore[arg-type]
        if self.shuffle:
            g = torch.Generator()
            g.manual_seed(self.seed + self.epoch)
            order = torch.randperm(count, generator=g).tolist()
        else:
            order = list(range(count))
        left = max(0, count - self._start)
        if self.drop_last:
            size = left - left % self.num_replicas
        else:
            size = -(-left // self.num_replicas) * self.num_replicas
            while len(order) < self._start + size:  # padded as DistributedSampler pads
                order += order[: self._start + size - len(order)]
        rest = order[self._start : self._start + size]
        return rest[self.rank :: self.num_replicas]

    def __iter__(self) -> Iterator[Any]:
        if not self._start:
            return super().__iter__()
        indices = self._rest_of_epoch()
        self._start = 0  # only the first epoch after a resume is partial
        return iter(indices)

    def __len__(self) -> int:
        if not self._start:
            return self.num_samples
        return len(self._rest_of_epoch())

    def state_dict(self, consumed: int) -> dict[str, int]:
        """`consumed`: this rank's samples of the epoch so far (every rank's is the same)."""
        return {
            "epoch": self.epoch,
            "consumed": consumed,
            "world": self.num_replicas,
            "global": self._base + consumed * self.num_replicas,
        }

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.set_epoch(state["epoch"])
        world = state.get("world", self.num_replicas)
        self._start = state.get("global", state["consumed"] * world)
        self._base = self._start

    def next_epoch(self) -> None:
        """The next epoch, counted from its start."""
        self._base = 0
        self.set_epoch(self.epoch + 1)


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
        """Continue where the checkpoint's epoch stood, at this world size; `consumed`
        then counts this rank's samples since the resume."""
        self.sampler.load_state_dict(state)
        self.consumed = 0

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
            self.sampler.next_epoch()
