"""Exact resume of the data order, at the same world size and at another (elastic)."""

from __future__ import annotations

import torch
from torch.utils.data import TensorDataset

from trainers.data import ResumableBatches, ResumableDistributedSampler

N = 103
DATA = TensorDataset(torch.arange(N), torch.arange(N))


def sampler(rank: int, world: int, drop_last: bool = True) -> ResumableDistributedSampler:
    return ResumableDistributedSampler(
        DATA, num_replicas=world, rank=rank, shuffle=True, seed=7, drop_last=drop_last
    )


def test_a_resume_at_the_same_world_continues_the_very_same_sequence() -> None:
    for rank in range(4):
        straight = list(sampler(rank, 4))
        resumed = sampler(rank, 4)
        resumed.load_state_dict({"epoch": 0, "consumed": 10})  # an old checkpoint's state
        assert len(resumed) == len(straight) - 10
        assert list(resumed) == straight[10:]


def test_a_resume_at_a_smaller_world_takes_every_sample_left_once() -> None:
    before = [list(sampler(rank, 3)) for rank in range(3)]
    done = {i for share in before for i in share[:12]}  # 12 each at world 3
    state = sampler(0, 3).state_dict(12)
    assert state["global"] == 36 and state["world"] == 3
    after = []
    for rank in range(2):
        s = sampler(rank, 2)
        s.load_state_dict(state)
        after.append(list(s))
    rest = [i for share in after for i in share]
    assert len(rest) == len(set(rest)) == 2 * len(after[0])  # no sample twice, equal shares
    assert not done & set(rest)  # nothing trained before comes again
    assert len(done) + len(rest) >= N - 2  # the epoch's dropped tail at most (drop_last)


def test_the_batches_count_from_the_resume_and_the_next_epoch_is_whole() -> None:
    s = sampler(1, 2)
    batches = ResumableBatches(DATA, s, batch_size=5, device=torch.device("cpu"))
    batches.load_state_dict({"epoch": 0, "consumed": 20, "world": 3, "global": 60})
    left = len(s)  # what the partial epoch deals this rank: (103 - 60) // 2
    assert left == 21
    stream = iter(batches)
    next(stream)
    assert batches.state_dict()["global"] == 60 + 5 * 2
    for _ in range(-(-left // 5) - 1):
        next(stream)
    next(stream)  # the first batch of epoch 1: whole again
    assert s.epoch == 1 and len(s) == s.num_samples and batches.state_dict()["global"] == 5 * 2
