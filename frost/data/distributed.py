"""DistributedSampler: each process of a data-parallel run reads its own disjoint shard of the dataset."""
from __future__ import annotations

import math
from typing import Iterator

import numpy as np

from frost import distributed as dist


class DistributedSampler:
    """Indices of `dataset` for process `rank` of `num_replicas` (defaults: the default process group's).

    Every process draws the same permutation (seeded by seed + epoch: call set_epoch(e) before each epoch for a
    new order) and takes every num_replicas-th index from position rank, so the shards are disjoint and together
    cover the dataset. To give each process the same number of samples, drop_last=False repeats indices from the
    start of the permutation, drop_last=True drops the tail. Pass it as DataLoader(sampler=...)."""

    def __init__(self, dataset, num_replicas: int | None = None, rank: int | None = None, shuffle: bool = True,
                 seed: int = 0, drop_last: bool = False) -> None:
        if num_replicas is None:
            num_replicas = dist.get_world_size() if dist.is_initialized() else 1
        if rank is None:
            rank = dist.get_rank() if dist.is_initialized() else 0
        if num_replicas < 1 or not 0 <= rank < num_replicas:
            raise ValueError(f"DistributedSampler: invalid rank {rank} for num_replicas {num_replicas} "
                             f"(need 0 <= rank < num_replicas)")
        self.dataset, self.num_replicas, self.rank = dataset, num_replicas, rank
        self.shuffle, self.seed, self.drop_last, self.epoch = shuffle, seed, drop_last, 0
        n = len(dataset)
        self.num_samples = n // num_replicas if drop_last else math.ceil(n / num_replicas)
        self.total_size = self.num_samples * num_replicas

    def __iter__(self) -> Iterator[int]:
        n = len(self.dataset)
        order = np.random.default_rng(self.seed + self.epoch).permutation(n) if self.shuffle else np.arange(n)
        if self.total_size > n:  # repeat from the start (wrapping as often as needed when n < num_replicas)
            order = np.resize(order, self.total_size)
        order = order[:self.total_size]
        return iter(order[self.rank::self.num_replicas].tolist())

    def __len__(self) -> int:
        return self.num_samples

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch
