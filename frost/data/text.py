"""TokenDataset: next-token windows over a 1-D token array, for language models."""
from __future__ import annotations

import os

import numpy as np

from frost.data.dataset import Dataset


class TokenDataset(Dataset):
    """dataset[i] = (tokens[i:i+block_size], tokens[i+1:i+block_size+1]) as int64 arrays."""

    def __init__(self, tokens, block_size: int) -> None:
        from frost.tensor import Tensor
        tokens = tokens.numpy() if isinstance(tokens, Tensor) else np.asarray(tokens)
        if tokens.ndim != 1:
            raise ValueError(f"TokenDataset: tokens must be 1-D, got shape {tokens.shape}")
        if not np.issubdtype(tokens.dtype, np.integer):
            raise TypeError(f"TokenDataset: tokens must be integers, got {tokens.dtype}")
        if not isinstance(block_size, int) or block_size < 1:
            raise ValueError(f"TokenDataset: block_size must be a positive int, got {block_size!r}")
        if len(tokens) < block_size + 1:
            raise ValueError(f"TokenDataset: {len(tokens)} tokens are too few for block_size {block_size} "
                             f"(need at least {block_size + 1})")
        self.tokens, self.block_size = tokens, block_size

    @classmethod
    def from_file(cls, path: str | os.PathLike, block_size: int, dtype=np.uint16) -> "TokenDataset":
        """Tokens from a .npy file or a raw binary file of `dtype` (memory-mapped, not read whole)."""
        path = os.fspath(path)
        tokens = np.load(path, mmap_mode="r") if path.endswith(".npy") else np.memmap(path, dtype=dtype, mode="r")
        return cls(tokens, block_size)

    def __len__(self) -> int:
        return len(self.tokens) - self.block_size

    def __getitem__(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        if not -len(self) <= index < len(self):
            raise IndexError(f"TokenDataset: index {index} out of range for {len(self)} windows")
        index %= len(self)
        window = np.asarray(self.tokens[index:index + self.block_size + 1], dtype=np.int64)
        return window[:-1], window[1:]

    def get_batch(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The windows at `indices`, gathered at once (the DataLoader's fast path)."""
        indices = np.asarray(indices, dtype=np.int64)
        bad = indices[(indices < -len(self)) | (indices >= len(self))]
        if bad.size:
            raise IndexError(f"TokenDataset: index {int(bad[0])} out of range for {len(self)} windows")
        rows = (indices % len(self))[:, None] + np.arange(self.block_size + 1)  # negative: from the end, as [i]
        windows = np.asarray(self.tokens[rows], dtype=np.int64)
        return windows[:, :-1], windows[:, 1:]
