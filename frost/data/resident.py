"""A dataset held whole on the device as uint8 and sampled by an on-device permutation: an epoch needs no host work."""
from __future__ import annotations

from typing import Iterator, Sequence

import numpy as np

from frost import backend
from frost.backend import Device
from frost.data import transforms
from frost.ops.draws import randperm
from frost.tensor import Tensor


class DeviceDataset:
    """Images (N, H, W, C) uint8 and integer labels, kept on `device` in NCHW order.

    `epoch_indices` draws a permutation on the device (frost's generator, seeded by frost.manual_seed) and
    yields batch index tensors; `batch(index)` gathers and scales to [0, 1], `augment(...)` also pad-crops,
    flips and normalizes (one kernel on the GPU). Both are device-only, so a step captured by frost.jit can
    take the index tensor as its input and do the gather itself.
    """

    def __init__(self, images, labels, device: str = "cuda") -> None:
        images = np.asarray(images)
        labels = np.asarray(labels)
        if images.ndim != 4 or images.dtype != np.uint8:
            raise ValueError(f"DeviceDataset: images must be uint8 (N, H, W, C), got {images.dtype} {images.shape}")
        if len(labels) != len(images):
            raise ValueError(f"DeviceDataset: {len(images)} images but {len(labels)} labels")
        self.device = Device(device)
        self.images_nhwc = backend.to_device(np.ascontiguousarray(images), self.device)
        self.images = backend.to_device(np.ascontiguousarray(images.transpose(0, 3, 1, 2)), self.device)
        self.labels = backend.to_device(labels.astype(np.int64), self.device)

    def __len__(self) -> int:
        return int(self.images.shape[0])

    def epoch_indices(self, batch_size: int, drop_last: bool = True) -> Iterator[Tensor]:
        """Index tensors (on the device) of one epoch's batches, in a fresh random order."""
        n = len(self)
        perm = randperm(n, device=str(self.device)).data
        stop = n - n % batch_size if drop_last else n
        for start in range(0, stop, batch_size):
            yield Tensor(perm[start:start + batch_size])

    def batch(self, index: Tensor) -> tuple[Tensor, Tensor]:
        """(images as float32 NCHW in [0, 1], labels) at `index` (on the GPU the gather and scaling are one kernel)."""
        i = self._index(index, "batch")
        return Tensor(transforms.gather_scaled(self.images, i)), Tensor(self.labels[i])

    def augment(self, index: Tensor, offsets_y, offsets_x, flips, size: int, padding: int,
                mean: Sequence[float], std: Sequence[float]) -> tuple[Tensor, Tensor]:
        """(augmented float32 NCHW images, labels) at `index`: the CPU `augment` or its one-launch GPU twin."""
        i = self._index(index, "augment")
        x = transforms.gather_augmented(self.images_nhwc, i, offsets_y, offsets_x, flips, size, padding, mean, std)
        return Tensor(x), Tensor(self.labels[i])

    def _index(self, index: Tensor, what: str):
        """index's array: integers (a bool mask would gather images 0 and 1 while the labels took the mask)."""
        i = index.data
        if i.dtype.kind not in "iu" or i.ndim != 1:
            raise TypeError(f"DeviceDataset.{what}: index must be a 1-D integer tensor, got {i.dtype} {tuple(i.shape)}")
        return i
