"""POSIX shared-memory segments for the DataLoader's worker processes: made and unlinked by the loader only.

multiprocessing.shared_memory.SharedMemory is not used directly because of two of its rules on Python < 3.13:
attaching a segment registers it with the resource tracker again (from a worker, a segment the loader later
unlinks can then be reported as leaked, or unlinked behind the loader's back), and close() raises BufferError
while NumPy views of it exist (the caller may still hold the last batch). Here the loader's process creates each
segment (registered with the resource tracker, so a crashed loader's segments are still removed), unlinks it
when its workers end (after one epoch, or with persistent workers when the loader goes), and lets the mapping go
when the last view of it does; workers attach without registering.
The segments are the same POSIX objects (shm_open) that SharedMemory makes.
"""
from __future__ import annotations

import math
import mmap
import os
import secrets

import numpy as np

try:  # CPython's own module behind multiprocessing.shared_memory on POSIX systems
    import _posixshmem
    from multiprocessing import resource_tracker
except ImportError:  # Windows: no POSIX shared memory
    _posixshmem = None

__all__ = ["available", "Segment", "create", "attach", "unlink", "layout", "ALIGN"]

ALIGN = 64  # each field of a batch starts on a cache line (and any dtype's alignment)
_PREFIX = "/frost_"  # /frost_<pid>_<random>: a leftover in /dev/shm (there should be none) says whose it was


def available() -> bool:
    """Whether this system has POSIX shared memory (worker processes need it)."""
    return _posixshmem is not None


class Segment:
    """One mapped segment: its name and a uint8 array over the whole of it."""

    __slots__ = ("name", "size", "array")

    def __init__(self, name: str, size: int, array: np.ndarray) -> None:
        self.name, self.size, self.array = name, size, array

    def view(self, offset: int, shape: tuple, dtype: np.dtype) -> np.ndarray:
        """An array of this shape and dtype at `offset` bytes into the segment (no copy)."""
        count = math.prod(shape)  # np.prod costs microseconds per call; this runs per field per batch
        return self.array[offset:offset + count * dtype.itemsize].view(dtype).reshape(shape)


def _map(name: str, flags: int, size: int) -> Segment:
    fd = _posixshmem.shm_open(name, flags, mode=0o600)
    try:
        if flags & os.O_CREAT:
            os.ftruncate(fd, size)
        size = os.fstat(fd).st_size
        memory = mmap.mmap(fd, size)
    finally:
        os.close(fd)  # the mapping keeps the memory; the name keeps it findable until unlink
    # the array holds the mmap: the mapping ends when the last view of the segment is dropped, never under one
    return Segment(name, size, np.frombuffer(memory, np.uint8))


def create(size: int) -> Segment:
    """A new segment of at least `size` bytes, registered with the resource tracker until unlink(name)."""
    while True:
        name = f"{_PREFIX}{os.getpid()}_{secrets.token_hex(8)}"
        try:
            segment = _map(name, os.O_CREAT | os.O_EXCL | os.O_RDWR, max(size, 1))
        except FileExistsError:
            continue
        resource_tracker.register(name, "shared_memory")
        return segment


def attach(name: str) -> Segment:
    """A segment another process created (a worker's side; not registered: its creator unlinks it)."""
    return _map(name, os.O_RDWR, 0)


def unlink(name: str) -> None:
    """Remove a segment's name (existing mappings stay valid until dropped) and stop tracking it."""
    try:
        _posixshmem.shm_unlink(name)
    except FileNotFoundError:
        pass
    resource_tracker.unregister(name, "shared_memory")


def layout(arrays: list[np.ndarray]) -> tuple[list[tuple[tuple, str, int]], int]:
    """Where each array goes in a segment: [(shape, dtype string, byte offset)], and the bytes needed."""
    places, offset = [], 0
    for a in arrays:
        places.append((a.shape, a.dtype.str, offset))
        offset += -(-a.nbytes // ALIGN) * ALIGN
    return places, offset
