"""Samplers, as torch.utils.data's: the order in which a DataLoader reads a map-style dataset (sampler=) and how it
groups indices into batches (batch_sampler=)."""
from __future__ import annotations

from typing import Iterable, Iterator, Sized

import numpy as np

from frost.backend import Device, cpu
from frost.generator import Generator

__all__ = ["Sampler", "SequentialSampler", "RandomSampler", "BatchSampler"]


class Sampler:
    """Base class of samplers: an iterable of dataset indices (or of index lists, for batch samplers)."""

    def __iter__(self) -> Iterator:
        raise NotImplementedError(f"{type(self).__name__} must define __iter__")


class SequentialSampler(Sampler):
    """0, 1, ..., len(data_source) - 1."""

    def __init__(self, data_source: Sized) -> None:
        self.data_source = data_source

    def __iter__(self) -> Iterator[int]:
        return iter(range(len(self.data_source)))

    def __len__(self) -> int:
        return len(self.data_source)


class RandomSampler(Sampler):
    """A random permutation of the indices (a new one each epoch), or with replacement=True num_samples indices
    drawn independently. Draws from `generator` (a CPU frost.Generator), else from Frost's global CPU generator
    (frost.manual_seed fixes the orders). num_samples without replacement may exceed the dataset's length: whole
    permutations follow one another, as PyTorch's."""

    def __init__(self, data_source: Sized, replacement: bool = False, num_samples: int | None = None,
                 generator: Generator | None = None) -> None:
        if not isinstance(replacement, bool):
            raise TypeError(f"RandomSampler: replacement should be a boolean value, but got "
                            f"replacement={replacement!r}")
        if num_samples is not None and (isinstance(num_samples, bool) or not isinstance(num_samples, int)
                                        or num_samples <= 0):
            raise ValueError(f"RandomSampler: num_samples should be a positive integer value, but got "
                             f"num_samples={num_samples!r}")
        if generator is not None and not isinstance(generator, Generator):
            raise TypeError(f"RandomSampler: generator must be a frost.Generator, got {type(generator).__name__}")
        self.data_source, self.replacement, self._num_samples = data_source, replacement, num_samples
        self.generator = generator

    @property
    def num_samples(self) -> int:
        return len(self.data_source) if self._num_samples is None else self._num_samples

    def __iter__(self) -> Iterator[int]:
        n, rng = len(self.data_source), self._rng()
        if self.replacement:
            return iter(rng.integers(0, n, size=self.num_samples).tolist())
        whole, rest = divmod(self.num_samples, n)
        parts = [rng.permutation(n) for _ in range(whole)] + [rng.permutation(n)[:rest]]
        return iter(np.concatenate(parts).tolist())

    def __len__(self) -> int:
        return self.num_samples

    def _rng(self) -> np.random.Generator:
        if self.generator is None:
            return cpu.generator()
        return self.generator.engine_for(Device("cpu"), "RandomSampler")


class BatchSampler(Sampler):
    """Lists of batch_size indices from `sampler`, in its order; the last shorter one is kept unless drop_last."""

    def __init__(self, sampler: Iterable[int], batch_size: int, drop_last: bool) -> None:
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size <= 0:
            raise ValueError(f"BatchSampler: batch_size should be a positive integer value, but got "
                             f"batch_size={batch_size!r}")
        if not isinstance(drop_last, bool):
            raise ValueError(f"BatchSampler: drop_last should be a boolean value, but got drop_last={drop_last!r}")
        self.sampler, self.batch_size, self.drop_last = sampler, batch_size, drop_last

    def __iter__(self) -> Iterator[list[int]]:
        batch: list[int] = []
        for index in self.sampler:
            batch.append(index)
            if len(batch) == self.batch_size:
                yield batch
                batch = []
        if batch and not self.drop_last:
            yield batch

    def __len__(self) -> int:
        n = len(self.sampler)
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)
