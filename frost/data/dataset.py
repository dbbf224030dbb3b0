"""Dataset base classes (map-style Dataset, IterableDataset), TensorDataset over in-memory arrays, and the
PyTorch-style utilities over datasets: Subset, random_split, ConcatDataset."""
from __future__ import annotations

import bisect
import itertools
import math
import warnings
from typing import Any, Iterator, Sequence

import numpy as np

from frost.backend import cpu
from frost.tensor import Tensor


class Dataset:
    """A map-style dataset: dataset[i] for 0 <= i < len(dataset) returns one sample.

    A sample is an array (NumPy, or anything np.asarray takes: int, float) or a tuple of them;
    the DataLoader stacks samples into batch buffers field by field."""

    def __getitem__(self, index: int) -> Any:
        raise NotImplementedError(f"{type(self).__name__} must define __getitem__")

    def __len__(self) -> int:
        raise NotImplementedError(f"{type(self).__name__} must define __len__")

    def __add__(self, other: Any) -> "ConcatDataset":
        return ConcatDataset([self, other])


class IterableDataset:
    """A stream of samples: iter(dataset) yields them in its own order (no shuffling, no indexing)."""

    def __iter__(self) -> Iterator[Any]:
        raise NotImplementedError(f"{type(self).__name__} must define __iter__")


def _as_array(x) -> np.ndarray:
    if isinstance(x, Tensor):
        return x.detach().numpy()  # the dataset holds the values, off any graph
    return np.asarray(x)


class TensorDataset(Dataset):
    """Rows of equally long arrays or frost Tensors: dataset[i] = (a[i], b[i], ...) as NumPy values."""

    def __init__(self, *arrays) -> None:
        if not arrays:
            raise ValueError("TensorDataset: needs at least one array")
        self.arrays = [_as_array(a) for a in arrays]
        lengths = [len(a) for a in self.arrays]
        if len(set(lengths)) != 1:
            raise ValueError(f"TensorDataset: arrays have different lengths {lengths}")

    def __getitem__(self, index: int) -> tuple:
        return tuple(a[index] for a in self.arrays)

    def get_batch(self, indices: np.ndarray) -> tuple:
        """Rows `indices` of every array, gathered at once (the DataLoader's fast path)."""
        return tuple(a[indices] for a in self.arrays)

    def __len__(self) -> int:
        return len(self.arrays[0])


def is_iterable_dataset(dataset: Any) -> bool:
    """Whether `dataset` is a stream (read with iter(), in its own order) rather than indexed: a frost
    IterableDataset, an instance of any class named IterableDataset (PyTorch's torch.utils.data.IterableDataset,
    Hugging Face's datasets.IterableDataset: they inherit a __getitem__ that only raises), or any object with
    __iter__ and no __getitem__ (a generator, a custom stream). Decided by protocol, so torch is never imported."""
    if isinstance(dataset, IterableDataset):
        return True
    if any(cls.__name__ == "IterableDataset" for cls in type(dataset).__mro__):
        return True
    return hasattr(dataset, "__iter__") and not hasattr(dataset, "__getitem__")


def _index_array(who: str, indices: Sequence[int], size: int | None) -> np.ndarray:
    """`indices` as int64 rows, checked to be whole numbers within a dataset of `size` samples (None: unknown);
    negative ones count from the end."""
    array = np.asarray(indices)
    if array.size == 0:
        return np.zeros(0, dtype=np.int64)
    if array.ndim != 1 or array.dtype.kind not in "iu":
        raise TypeError(f"{who}: indices must be a flat sequence of ints, got {type(indices).__name__} of "
                        f"dtype {array.dtype} and shape {array.shape}")
    if size is not None and (array.min() < -size or array.max() >= size):
        bad = int(array.max()) if array.max() >= size else int(array.min())
        raise IndexError(f"{who}: index {bad} is out of range for a dataset of {size} samples")
    array = array.astype(np.int64)
    if size is not None:
        array[array < 0] += size  # a dataset need not take negative indices: hand it the row
    return array


class Subset(Dataset):
    """The samples `indices` of `dataset`, in that order: subset[i] = dataset[indices[i]] (as PyTorch's Subset).

    The hooks the DataLoader reads pass through: `get_batch` (the gather of a batch's rows, when the dataset has
    one), `finish_on_device` and `for_device` (GPU decoding, frost.data.png_device)."""

    def __init__(self, dataset: Any, indices: Sequence[int]) -> None:
        if is_iterable_dataset(dataset):
            raise TypeError(f"Subset: {type(dataset).__name__} is an iterable dataset (a stream has no indices); "
                            f"Subset needs a map-style dataset")
        size = len(dataset) if hasattr(dataset, "__len__") else None
        self.dataset, self.indices = dataset, indices
        self._rows = _index_array("Subset", indices, size)
        if hasattr(dataset, "get_batch"):
            self.get_batch = self._get_batch
        if hasattr(dataset, "finish_on_device"):
            self.finish_on_device = dataset.finish_on_device
        if hasattr(dataset, "for_device"):
            self.for_device = self._for_device

    def __getitem__(self, index: int | Sequence[int]) -> Any:
        if isinstance(index, (list, tuple)):
            return [self.dataset[int(self._rows[i])] for i in index]
        return self.dataset[int(self._rows[index])]

    def __len__(self) -> int:
        return len(self._rows)

    def _get_batch(self, indices: np.ndarray) -> Any:
        """The dataset's get_batch over this subset's rows `indices` (one gather, as the dataset's own)."""
        return self.dataset.get_batch(self._rows[np.asarray(indices, dtype=np.int64)])

    def _for_device(self, device: Any) -> "Subset":
        return Subset(self.dataset.for_device(device), self.indices)


def _split_lengths(lengths: Sequence[int | float], n: int) -> list[int]:
    """random_split's lengths: counts summing to n, or fractions summing to 1 (PyTorch's rounding: floor each,
    then one more sample to the first splits, round robin, until they sum to n)."""
    if not lengths:
        raise ValueError("random_split: lengths is empty; give the splits' sizes or fractions")
    total = sum(lengths)
    if math.isclose(total, 1) and total <= 1:
        for i, fraction in enumerate(lengths):
            if not 0 <= fraction <= 1:
                raise ValueError(f"random_split: fraction at index {i} is {fraction}, not between 0 and 1")
        counts = [int(math.floor(n * fraction)) for fraction in lengths]
        for i in range(n - sum(counts)):
            counts[i % len(counts)] += 1
        empty = [i for i, count in enumerate(counts) if count == 0]
        if empty:
            warnings.warn(f"random_split: the splits at index {', '.join(map(str, empty))} have length 0 (their "
                          f"fractions of {n} samples round down to nothing)", UserWarning, stacklevel=3)
        return counts
    if any(isinstance(x, float) and not float(x).is_integer() or x < 0 for x in lengths):
        raise ValueError(f"random_split: lengths {list(lengths)} are neither counts >= 0 nor fractions summing to 1")
    if total != n:
        raise ValueError(f"random_split: the lengths {list(lengths)} sum to {total}, but the dataset has {n} samples")
    return [int(x) for x in lengths]


def random_split(dataset: Any, lengths: Sequence[int | float],
                 generator: np.random.Generator | None = None) -> list[Subset]:
    """Split a map-style dataset into disjoint random Subsets of the given lengths (counts summing to len(dataset),
    or fractions summing to 1), as PyTorch's random_split. The permutation is drawn from `generator` (a NumPy
    Generator), by default from frost's CPU generator, so frost.manual_seed fixes the split. PyTorch draws from its
    own generator, so the same seed gives another (equally random) split there."""
    if generator is not None and not isinstance(generator, np.random.Generator):
        raise TypeError(f"random_split: generator must be a numpy.random.Generator (frost's CPU generator is one), "
                        f"got {type(generator).__name__}")
    counts = _split_lengths(lengths, len(dataset))
    order = (generator or cpu.generator()).permutation(sum(counts)).tolist()
    return [Subset(dataset, order[end - count:end]) for end, count in zip(itertools.accumulate(counts), counts)]


class ConcatDataset(Dataset):
    """Map-style datasets one after the other (as PyTorch's ConcatDataset; `a + b` for frost Datasets): index i
    reads the dataset whose range holds i. `cumulative_sizes[k]` is the number of samples in datasets 0..k."""

    def __init__(self, datasets: Sequence[Any]) -> None:
        self.datasets = list(datasets)
        if not self.datasets:
            raise ValueError("ConcatDataset: datasets is empty; give at least one dataset")
        for i, dataset in enumerate(self.datasets):
            if is_iterable_dataset(dataset):
                raise TypeError(f"ConcatDataset: dataset {i} ({type(dataset).__name__}) is an iterable dataset; "
                                f"ConcatDataset joins map-style datasets (chain streams with itertools.chain)")
        self.cumulative_sizes = list(itertools.accumulate(len(d) for d in self.datasets))

    def __len__(self) -> int:
        return self.cumulative_sizes[-1]

    def __getitem__(self, index: int) -> Any:
        n = len(self)
        if not -n <= index < n:
            raise IndexError(f"ConcatDataset: index {index} is out of range for {n} samples")
        index = index + n if index < 0 else int(index)
        part = bisect.bisect_right(self.cumulative_sizes, index)
        return self.datasets[part][index - (self.cumulative_sizes[part - 1] if part else 0)]
