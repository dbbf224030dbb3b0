"""TokenDataset: next-token windows over a 1-D token array, for language models, and the token file it reads.

A corpus is encoded once (`TokenDataset.encode_to_file`) into a .npy file of uint16 ids (uint32 past
65,536 tokens), written beside its final name and renamed into place, so a reader never sees half a
file; `TokenDataset.from_file` then memory-maps it and `sample` draws random (x, y) blocks from it.
"""
from __future__ import annotations

import os
import tempfile
from concurrent.futures import ThreadPoolExecutor
from typing import Iterable, Iterator, Sequence

import numpy as np

from frost.data.dataset import Dataset
from frost.io import expand_path, read_npy
from frost.tensor import Tensor

NPY_HEADER_BYTES = 128  # a 1-D array's .npy header, padded by NumPy to 64-byte alignment
DOCUMENTS_IN_FLIGHT = 64  # documents encoded at once by encode_to_file's threads


def token_dtype(n_vocab: int) -> np.dtype:
    """The smallest unsigned dtype that holds every id below n_vocab."""
    if n_vocab <= 2 ** 16:
        return np.dtype(np.uint16)
    if n_vocab <= 2 ** 32:
        return np.dtype(np.uint32)
    raise ValueError(f"TokenDataset: {n_vocab} tokens do not fit in uint32")


def write_tokens(path: str | os.PathLike, documents: Iterable[Sequence[int] | np.ndarray], n_vocab: int) -> str:
    """Writes the documents' token ids end to end as a 1-D .npy file, atomically; returns the expanded path.

    The data streams to a temporary file beside `path` behind a reserved header; the header (which needs the
    final length) is written last, then the file is renamed over `path`.
    """
    path = expand_path(path)
    dtype = token_dtype(n_vocab)
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=os.path.basename(path) + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(b"\0" * NPY_HEADER_BYTES)
            count = 0
            for ids in documents:
                ids = np.asarray(ids)
                if ids.size and (ids.min() < 0 or ids.max() >= n_vocab):
                    raise ValueError(f"TokenDataset.write_tokens: token ids must be in [0, {n_vocab}), got "
                                     f"[{ids.min()}, {ids.max()}]")
                f.write(ids.astype(dtype, copy=False).tobytes())
                count += ids.size
            f.seek(0)
            np.lib.format.write_array_header_1_0(f, {"descr": dtype.str, "fortran_order": False, "shape": (count,)})
            if f.tell() != NPY_HEADER_BYTES:
                raise RuntimeError(f"TokenDataset.write_tokens: the .npy header took {f.tell()} bytes, not "
                                   f"{NPY_HEADER_BYTES}")
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
    return path


def _documents(text_or_files) -> Iterator[str]:
    if isinstance(text_or_files, str):
        yield text_or_files
        return
    files = [text_or_files] if isinstance(text_or_files, os.PathLike) else list(text_or_files)
    for file in files:
        if not isinstance(file, (str, os.PathLike)):
            raise TypeError(f"TokenDataset.encode_to_file: expected a text or file paths, got {type(file).__name__}")
        path = expand_path(file)
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except UnicodeDecodeError as error:
            raise ValueError(f"TokenDataset.encode_to_file: {path} is not UTF-8 text ({error})") from None
        yield text


def _batches(items: Iterator[str], size: int) -> Iterator[list[str]]:
    batch: list[str] = []
    for item in items:
        batch.append(item)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


class TokenDataset(Dataset):
    """dataset[i] = (tokens[i:i+block_size], tokens[i+1:i+block_size+1]) as int64 arrays."""

    def __init__(self, tokens, block_size: int) -> None:
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
        path = expand_path(path)
        tokens = read_npy(path, mmap_mode="r") if path.endswith(".npy") else np.memmap(path, dtype=dtype, mode="r")
        return cls(tokens, block_size)

    @staticmethod
    def encode_to_file(tokenizer, text_or_files, path: str | os.PathLike, *, separator: int | None = None,
                       allowed_special=None, num_threads: int | None = None) -> str:
        """Encodes a text, a file or a list of files (UTF-8) once into a token file for `from_file`.

        `tokenizer` is a frost.text.BPE or anything with `encode_ordinary(text)`, `encode(text,
        allowed_special=...)` and `n_vocab` (a tiktoken Encoding too). Each file is one document, encoded
        whole; `separator` (e.g. the id of <|endoftext|>) goes after each document. Special tokens' text is
        encoded as ordinary text unless `allowed_special` is given (then `encode` is called with it).
        Documents are encoded on `num_threads` threads (default: the machine's cores). Returns the path.
        """
        n_vocab = int(tokenizer.n_vocab)
        if separator is not None and not 0 <= separator < n_vocab:
            raise ValueError(f"TokenDataset.encode_to_file: separator {separator} is not a token id "
                             f"(0..{n_vocab - 1})")
        if allowed_special is None:
            encode = tokenizer.encode_ordinary
        else:
            def encode(text: str) -> list[int]:
                return tokenizer.encode(text, allowed_special=allowed_special)

        def encoded(texts: Iterator[str]) -> Iterator[Sequence[int]]:
            with ThreadPoolExecutor(num_threads or os.cpu_count() or 1, thread_name_prefix="frost-encode") as pool:
                for batch in _batches(texts, DOCUMENTS_IN_FLIGHT):
                    for ids in pool.map(encode, batch):
                        yield ids
                        if separator is not None:
                            yield [separator]

        return write_tokens(path, encoded(_documents(text_or_files)), n_vocab)

    def sample(self, batch_size: int, generator: np.random.Generator | None = None) -> tuple[np.ndarray, np.ndarray]:
        """`batch_size` windows at random starts (x, y), int64 (batch_size, block_size): nanoGPT's get_batch."""
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"TokenDataset.sample: batch_size must be a positive int, got {batch_size!r}")
        rng = generator if generator is not None else np.random.default_rng()
        return self.get_batch(rng.integers(0, len(self), size=batch_size))

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
