"""Dataset base classes: map-style Dataset, IterableDataset, and TensorDataset over in-memory arrays."""
from __future__ import annotations

from typing import Any, Iterator

import numpy as np


class Dataset:
    """A map-style dataset: dataset[i] for 0 <= i < len(dataset) returns one sample.

    A sample is an array (NumPy, or anything np.asarray takes: int, float) or a tuple of them;
    the DataLoader stacks samples into batch buffers field by field."""

    def __getitem__(self, index: int) -> Any:
        raise NotImplementedError(f"{type(self).__name__} must define __getitem__")

    def __len__(self) -> int:
        raise NotImplementedError(f"{type(self).__name__} must define __len__")


class IterableDataset:
    """A stream of samples: iter(dataset) yields them in its own order (no shuffling, no indexing)."""

    def __iter__(self) -> Iterator[Any]:
        raise NotImplementedError(f"{type(self).__name__} must define __iter__")


def _as_array(x) -> np.ndarray:
    from frost.tensor import Tensor
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
