"""DataLoader: batches from worker threads or processes filling ping-pong buffers, in a deterministic order.

How it works (num_workers = W > 0):

- Each epoch the sample order is a permutation drawn from `numpy.random.default_rng((seed, epoch))`
  (or 0..N-1 without shuffle, or what a `sampler` yields); batch i is `order[i*B:(i+1)*B]` (or the i-th
  list a `batch_sampler` yields). Batch i is always built by worker
  i % W and the consumer takes batches in order 0, 1, 2, ..., so the stream of batches is the same
  for every W (and for W = 0, which loads in the calling thread).
- Every worker owns `prefetch_factor` batch buffers (2 by default: ping-pong; so it loads up to that many
  batches ahead, as PyTorch's prefetch_factor; NumPy arrays, pinned host memory when the target
  is a GPU), made at its first batch, each taking its batch's np.stack shape and dtype and made
  again when a batch differs. It fills a free one sample by sample and announces it on its
  Channel; the consumer hands a buffer back when it is done with it: on the CPU at the next
  batch request, on a GPU when the asynchronous copy out of it has finished.
- CPU batches are zero-copy views of those buffers, valid until you ask for the next batch (the
  usual `for x, y in loader:` loop is fine). To keep a batch longer, copy it (`x.numpy().copy()`).
  With `device="cuda"` each batch is copied to the GPU on a separate copy stream and the current
  stream waits on that batch's event only, so no host buffer is ever aliased by what you hold.
- Device look-ahead (`device="cuda"`, W > 0): when you ask for batch i, the copies (and the
  `finish_on_device` work) of batches i+1 .. i+prefetch_to_device-1 are queued on the copy stream too,
  as far as their workers have them ready (the loader never waits on a worker for a batch ahead), so the
  GPU copies and decodes the next batches while your step i runs. Each batch has its own events; a host
  buffer goes back to its worker once the copy out of it has finished. prefetch_to_device=1 issues a
  batch's copy only when you ask for it.
- A worker's exception stops every worker (a stop flag plus closing every channel wakes them)
  and is raised in the loop as `DataLoaderWorkerError` chained to the original (its traceback
  shows the worker's frames). Abandoning the iterator (break, garbage collection) stops the
  workers too; they are daemon threads and never outlive the process.
- `timeout` (seconds, as PyTorch's; 0, the default, waits for ever): when the batch the caller waits for has not
  come from its worker within `timeout` seconds, iteration raises `DataLoaderTimeoutError` naming the worker and
  the batch (and sample) it is loading, and stops the other workers as a failure does. A thread cannot be
  killed: the stuck worker runs on until its call returns (then it ends, seeing the stop), and as a daemon
  thread it never holds up the interpreter's exit. With num_workers=0 the caller's own thread loads, so there
  is no timeout.
- A dataset may define `get_batch(indices)` returning a whole batch (arrays with a leading
  dimension len(indices)); it is then called once per batch instead of __getitem__ per sample
  (in-memory datasets gather a batch with one fancy-indexing copy, which releases the GIL).
- A dataset may define `finish_on_device(fields, defer=None) -> fields`: with device="cuda" it is called on
  each batch's device arrays right after the copy (on the copy stream, the current stream inside the
  call, before the consumer's stream waits on it), e.g. to decode images on the GPU
  (frost.data.png_device.DevicePNGList). It must not synchronize with the host: anything it has to check
  on the host (a decode status) it copies asynchronously on the current stream into host memory and hands
  over as `defer(check)`: `check()` takes no argument and raises to report a bad batch. The loader calls
  it once the copy stream has passed that batch's work: at the latest when the caller asks for the NEXT
  batch (or at the end of the epoch, or in the iterator's close()), so such an error surfaces one batch
  after the batch holding it. Called without `defer` (the W = 0 path, direct calls) the hook checks
  before returning. A hook without a `defer` parameter is called as `finish_on_device(fields)`.
  A dataset may also define `for_device(device) -> dataset`: the loader then reads that dataset instead, and
  `host_fields` (a tuple of field positions): those fields are not copied, finish_on_device receives the host
  arrays themselves (a decoder that reads host memory, frost.data.jpeg_device.DeviceJPEGList), held by the
  loader until the batch's work on the copy stream is done.
- An IterableDataset has one order, so it is read by one worker thread (still overlapping loading
  with training); shuffle needs a map-style Dataset.
- Randomness, as PyTorch's scheme but independent of W: each iteration (epoch) has a base seed, a function of
  (seed, epoch), or drawn from `generator` when one is given (as PyTorch draws it from its generator at each
  iterator start); the shuffle order comes from the same key. Batch i is built (dataset reads, get_batch,
  collate_fn) under a CPU generator of its own, seeded by (base seed, i): Frost's draws there (the random
  transforms of frost.data.transforms, frost.rand, ...) depend on the seed and the batch only, never on which
  worker built it or when, so W = 0 and every W give the same batches, bit for bit. Worker w's thread draws
  from a generator seeded base seed + w outside batches (in worker_init_fn(w)), and get_worker_info() there
  tells its id, the number of workers, that seed and the dataset. Draws from NumPy's or Python's global
  generators are shared by all threads, so not reproducible with workers: draw from Frost's.

Threads share the GIL: they speed up loading where the per-sample work releases it (Pillow's
decoders, file reads, NumPy copies) and on free-threaded Python builds. Where it does not (decoding
small PNGs: ~15 us of Python per 32x32 image around a short GIL-free inflate), more threads give less.

Worker processes (`worker_type="process"`) scale there instead. Everything above holds for them (the
same batches bit for bit, batch i under its generator, failures in their place, timeout), except:
- Each worker has `prefetch_factor` slots, each a POSIX shared-memory segment (frost.data.shm) that
  the caller's process makes when the worker asks for one (its first batch, or a larger batch) and
  unlinks when the workers end: a crashed caller's segments are removed by multiprocessing's
  resource tracker, and a batch the caller still holds stays valid (its mapping outlives the name).
  Each epoch the caller sends every worker its share (its batches' sample indices, the epoch's base
  seed, its free slots) on its pipe. The worker builds a batch as num_workers=0 does (np.stack, or
  get_batch), copies it into a free slot, and sends its layout (shapes, dtypes, offsets) on its pipe;
  the caller maps views of the slot (CPU batches are zero-copy, as with threads) and hands the slot
  back at the next request. With collate_fn, its result comes back pickled on the pipe.
- Without persistent_workers the workers (and their slots) last one epoch. With persistent_workers=True
  they serve every epoch of the loader, keeping their copy of the dataset and their slots: each new
  iter() first ends the epoch before (an iterator not finished is ended: reading it further raises),
  then reads each worker's remaining messages up to its end mark and drops them, so no batch of an
  abandoned epoch is ever handed out; a worker told to stop mid-epoch does so before its next batch (a
  flag in shared memory, and a pipe message for one waiting for a slot). The batch held when an epoch
  was abandoned keeps its slot until the next request, as within an epoch. worker_init_fn runs once per
  worker process, as PyTorch's with persistent workers, and get_worker_info().seed stays the first
  epoch's base seed + id (PyTorch's too); each batch's generator is still (base seed of its epoch, i).
  A worker's exception ends the epoch as above and the workers stay for the next one; a timeout, a dead
  worker or Ctrl-C ends them at once (a pipe may be mid-message), and the next epoch starts new ones (so
  worker_init_fn runs again, in the new processes). A new epoch that waits more than `timeout` (5 s when
  0) for a worker to finish its old batch also starts new ones. The workers end when the loader is
  collected (or at the interpreter's exit).
- Workers start in the forkserver context unless `multiprocessing_context` says otherwise: a forked
  worker would inherit the caller's threads' locks and its GPU context (CuPy objects whose __del__
  then fails in the child). The fork server has preloaded Frost, so a worker does not import it again; still,
  starting 8 workers took 0.4-0.55 s on a 2-core machine (fork: about 0.1 s), which persistent_workers pays once.
  Outside fork the dataset, collate_fn and worker_init_fn are pickled to each worker (our own objects,
  to our own child); the caller never unpickles anything but its workers' messages.
- A worker's exception comes back as text (type names, message, traceback) and is rebuilt in the
  caller: the same builtin class, or a class of the same name under its nearest builtin base, with
  the worker's traceback as its __cause__. A worker that dies (a signal, os._exit) is a
  DataLoaderWorkerError naming it and the batch and sample it was loading.
- Stopping (the end, an error, a timeout, break, garbage collection, Ctrl-C in the caller; with
  persistent_workers, a timeout, a dead worker, Ctrl-C, or the loader's collection) closes the pipes,
  terminates the workers still running (a stuck one too: unlike a thread, it can be), joins them and
  unlinks the segments. Workers ignore SIGINT: Ctrl-C is the caller's.
- With device="cuda" batches are copied from the segments, which are not pinned.
- Draws from NumPy's or Python's global generators in a worker process repeat across workers (with fork
  they inherit the caller's state): as with threads, draw from Frost's.
"""
from __future__ import annotations

import builtins
import collections
import contextlib
import inspect
import itertools
import math
import multiprocessing
import os
import signal
import threading
import time
import traceback
import weakref
from typing import Any, Callable, Iterable, Iterator, Sequence

import numpy as np

from frost.backend import CPU, Device, cpu, cuda
from frost.data import shm
from frost.data.dataset import is_iterable_dataset
from frost.parallel import Channel, ChannelClosed
from frost.tensor import Tensor

__all__ = ["DataLoader", "DataLoaderWorkerError", "DataLoaderTimeoutError", "WorkerInfo", "get_worker_info"]

_END = object()  # a worker's "no more batches"
_FAILED = object()  # a worker's "the next batch failed": (_FAILED, (worker, batch, sample, error)) in its place


class DataLoaderWorkerError(RuntimeError):
    """A DataLoader worker failed; the original exception is chained as __cause__."""


class DataLoaderTimeoutError(DataLoaderWorkerError):
    """A DataLoader worker did not deliver a batch within the loader's `timeout`."""


# ---------------------------------------------------------------- workers and their randomness
class WorkerInfo:
    """A worker thread's description (get_worker_info() inside it), as PyTorch's: its id, the number of workers,
    its seed (the iteration's base seed + id) and the dataset it reads."""

    __slots__ = ("id", "num_workers", "seed", "dataset")

    def __init__(self, id: int, num_workers: int, seed: int, dataset: Any) -> None:
        self.id, self.num_workers, self.seed, self.dataset = id, num_workers, seed, dataset

    def __repr__(self) -> str:
        return f"WorkerInfo(id={self.id}, num_workers={self.num_workers}, seed={self.seed})"


_this_worker = threading.local()  # .info: the WorkerInfo of a loader's worker thread


def get_worker_info() -> WorkerInfo | None:
    """In a DataLoader worker thread (and its worker_init_fn), that worker's WorkerInfo; None in any other thread,
    so with num_workers=0 too, as PyTorch's."""
    return getattr(_this_worker, "info", None)


def _base_seed(key: tuple) -> int:
    """An iteration's base seed (63 bits), from the key its shuffle order is drawn with but a stream apart."""
    return int(np.random.SeedSequence(key, spawn_key=(1,)).generate_state(1, np.uint64)[0] >> np.uint64(1))


def _batch_generator(base_seed: int, batch: int) -> np.random.Generator:
    """The CPU generator batch number `batch` of an iteration is built under: a function of the two numbers only,
    so the same whichever worker builds the batch, and with any number of workers."""
    return np.random.default_rng(np.random.SeedSequence(base_seed, spawn_key=(batch,)))


# ---------------------------------------------------------------- samples and buffers
def _fields(sample: Any) -> tuple[Any, list]:
    """A sample as (structure, leaves): nested tuples, lists and dicts flattened, as PyTorch's default_collate walks
    them (a batch of them is then the same structure with each leaf stacked); tensors become arrays. The structure
    is None for a single leaf, else (kind, children) in nested tuples, so that two samples' structures compare."""
    leaves: list = []

    def flatten(x):
        if isinstance(x, dict):
            return "dict", tuple((key, flatten(value)) for key, value in x.items())
        if isinstance(x, (tuple, list)):
            return ("tuple" if isinstance(x, tuple) else "list"), tuple(flatten(item) for item in x)
        if isinstance(x, str):
            raise TypeError(f"DataLoader: a sample holds a string ({x[:20]!r}); batches hold numbers and arrays, so "
                            f"map strings to numbers in the dataset, or pass collate_fn")
        leaves.append(x.detach().numpy() if isinstance(x, Tensor) else x)  # a batch is new data, off any graph
        return None
    return flatten(sample), leaves


def _restructure(structure: Any, leaves: list) -> Any:
    """The inverse of _fields: the leaves put back into the structure."""
    remaining = iter(leaves)

    def build(node):
        if node is None:
            return next(remaining)
        kind, children = node
        if kind == "dict":
            return {key: build(child) for key, child in children}
        items = [build(child) for child in children]
        return tuple(items) if kind == "tuple" else items
    return build(structure)


def _flat(structure: Any, n: int) -> Any:
    """The structure of n values in the sample's top-level container: finish_on_device's arrays (it may change
    their number, e.g. PNG bytes and lengths in, images out)."""
    kind = structure[0] if structure is not None else None
    if kind is None and n == 1:
        return None
    return ("list" if kind == "list" else "tuple"), (None,) * n


def _describe(structure: Any) -> str:
    """A sample's structure in words: 'a value', or e.g. "tuple(value, dict('y': value))"."""
    if structure is None:
        return "a value"
    kind, children = structure
    if kind == "dict":
        return "dict(" + ", ".join(f"{key!r}: {_describe(child)}" for key, child in children) + ")"
    return f"{kind}(" + ", ".join(_describe(child) for child in children) + ")"


def _check_structure(structure: Any, first: Any, what: str) -> None:
    """A sample must be shaped as the first one (the same structure also means the same number of values)."""
    if structure != first:
        raise TypeError(f"DataLoader: {what} is shaped {_describe(structure)}, but the first sample was "
                        f"{_describe(first)}; use collate_fn for irregular samples")


def _empty(shape: tuple, dtype, pinned_device: Device | None) -> np.ndarray:
    if pinned_device is None:
        return np.empty(shape, dtype)
    import cupyx
    with cuda.cupy().cuda.Device(pinned_device.index or 0):
        return cupyx.empty_pinned(shape, dtype)


class _BatchBuffers:
    """One worker's batch buffers (slots: the loader's prefetch_factor, 2 by default), each taking its batch's shape
    and dtype: np.stack's, so the batches are the same for every number of workers. A slot is reallocated when a
    batch differs from the slot's last one (say, length-bucketed batches) and widened mid-batch when a later sample
    needs a wider dtype; only the slot being filled: the others may hold batches the caller has not taken yet."""

    def __init__(self, kind: str, n_fields: int, rows: int, pinned_device: Device | None, slots: int = 2) -> None:
        self.kind, self.rows, self.pinned_device = kind, rows, pinned_device
        self.slots: list[list] = [[None] * n_fields for _ in range(slots)]

    def _field(self, slot: int, k: int, row: int, shape: tuple, dtype) -> np.ndarray:
        """Field k's buffer in `slot` for a value of this shape and dtype at `row` (rows before it kept)."""
        buf = self.slots[slot][k]
        if row:
            dtype = np.result_type(buf.dtype, dtype)
        if buf is None or buf.shape[1:] != shape or buf.dtype != dtype:
            new = _empty((self.rows, *shape), dtype, self.pinned_device)
            if row:
                new[:row] = buf[:row]
            self.slots[slot][k] = buf = new
        return buf

    def put(self, slot: int, row: int, kind: str, fields: list, index: int) -> None:
        _check_structure(kind, self.kind, f"sample {index}")
        for k, f in enumerate(fields):
            shape = np.shape(f)
            if row and shape != self.slots[slot][k].shape[1:]:
                raise ValueError(f"DataLoader: sample {index} field {k} has shape {shape} but the batch's first "
                                 f"sample had {self.slots[slot][k].shape[1:]}; use collate_fn for variable sizes")
            self._field(slot, k, row, shape, np.asarray(f).dtype)[row] = f

    def put_batch(self, slot: int, kind: str, fields: list, n: int) -> None:
        """Copy a whole batch from get_batch (fields with a leading dimension n) into a buffer."""
        _check_structure(kind, self.kind, "get_batch's batch")
        for k, f in enumerate(fields):
            if np.shape(f)[:1] != (n,):
                raise ValueError(f"DataLoader: get_batch field {k} has shape {np.shape(f)}, expected {n} rows")
            self._field(slot, k, 0, np.shape(f)[1:], np.asarray(f).dtype)[:n] = f


def _stacked_fields(samples: list[Any]) -> tuple[Any, list[np.ndarray]]:
    """Samples stacked field by field into fresh arrays: (structure, arrays)."""
    kinds_fields = [_fields(s) for s in samples]
    kind = kinds_fields[0][0]
    for i, (other, _) in enumerate(kinds_fields):
        _check_structure(other, kind, f"sample {i} of the batch")
    columns = zip(*(f for _, f in kinds_fields))
    return kind, [np.stack([np.asarray(x) for x in col]) for col in columns]


def _stack(samples: list[Any]) -> Any:
    """Stack samples field by field into fresh arrays (the inline, W = 0 path)."""
    return _restructure(*_stacked_fields(samples))


def _stream_groups(dataset: Any, batch_size: int, drop_last: bool,
                   base_seed: int) -> Iterator[tuple[None, Iterator[Any], np.random.Generator]]:
    """An IterableDataset's batches: (None, an iterator over its samples, its generator); each batch's samples are
    read under that batch's generator."""
    it = iter(dataset)
    for i in itertools.count():
        rng = _batch_generator(base_seed, i)
        with cpu.use_generator(rng):
            group = [s for _, s in zip(range(batch_size), it)]
        if not group or (drop_last and len(group) < batch_size):
            return
        yield None, iter(group), rng


# ---------------------------------------------------------------- the loader
class DataLoader:
    """Batches of a Dataset as frost Tensors, loaded by worker threads or processes. See the module docstring.

    seed=None draws one from frost's CPU generator (so frost.manual_seed fixes it); generator (a NumPy Generator,
    instead of seed) gives each iteration's base seed and order instead, one draw per iteration, as PyTorch's.
    worker_init_fn(worker_id) runs in each worker thread before its first batch (get_worker_info() works there).
    See the module docstring for how every batch's random draws are seeded. With collate_fn,
    workers build each batch with it and its result is passed through as it is (no buffers, no
    device copy). prefetch_to_device (>= 1; device="cuda" with worker threads only): how many batches,
    counting the one you are handed, have their copy to the GPU (and finish_on_device) queued at once;
    each costs one batch of device memory. As in PyTorch, `sampler` (an iterable of sample indices, read
    once per epoch: the order is then its own, not shuffle's) replaces shuffle, and `batch_sampler` (an
    iterable of index lists, one per batch) replaces batch_size, shuffle, sampler and drop_last. timeout (seconds,
    with worker threads; 0 waits for ever): the longest wait for a batch before DataLoaderTimeoutError.
    prefetch_factor (worker threads only; None: 2, as PyTorch's): each worker's number of batch buffers, so the
    batches it may load ahead of the consumer. persistent_workers (num_workers > 0, as PyTorch checks): with worker
    processes, as PyTorch's, the workers (their copies of the dataset, their slots) serve every epoch instead of
    starting anew each epoch (hundreds of ms for 8 workers from the fork server, which a short epoch notices), and
    worker_init_fn runs once per process; see the module docstring. With worker threads it has nothing to change:
    threads start in microseconds and share the one dataset, so its state persists across epochs anyway; each
    epoch starts fresh threads, and worker_init_fn runs in them each epoch. worker_type: "thread" (the default) or
    "process" (see the module docstring: for per-sample Python work that holds the GIL, such as decoding small
    images); multiprocessing_context (worker processes only; a start-method name or a multiprocessing context, as
    PyTorch's; None: forkserver) says how worker processes start."""

    def __init__(self, dataset, batch_size: int = 1, shuffle: bool = False, drop_last: bool = False,
                 num_workers: int = 0, seed: int | None = None, pin_memory: bool = False,
                 device: str | Device | None = None, collate_fn: Callable[[list], Any] | None = None,
                 prefetch_to_device: int = 2, sampler: Iterable[int] | None = None,
                 batch_sampler: Iterable[Sequence[int]] | None = None, generator: np.random.Generator | None = None,
                 worker_init_fn: Callable[[int], None] | None = None, timeout: float = 0,
                 prefetch_factor: int | None = None, persistent_workers: bool = False, worker_type: str = "thread",
                 multiprocessing_context: str | Any | None = None) -> None:
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"DataLoader: batch_size must be a positive int, got {batch_size!r}")
        if not isinstance(num_workers, int) or num_workers < 0:
            raise ValueError(f"DataLoader: num_workers must be a non-negative int, got {num_workers!r}")
        if isinstance(prefetch_to_device, bool) or not isinstance(prefetch_to_device, int) or prefetch_to_device < 1:
            raise ValueError(f"DataLoader: prefetch_to_device must be an int >= 1 (batches queued on the GPU, counting "
                             f"the one handed out), got {prefetch_to_device!r}")
        self.dataset, self.batch_size, self.shuffle, self.drop_last = dataset, batch_size, shuffle, drop_last
        self.num_workers, self.collate_fn, self.prefetch_to_device = num_workers, collate_fn, prefetch_to_device
        self.is_stream = is_iterable_dataset(dataset)
        if self.is_stream and (shuffle or sampler is not None or batch_sampler is not None):
            raise ValueError("DataLoader: shuffle, sampler and batch_sampler need a map-style dataset; an "
                             "IterableDataset has its own order")
        if sampler is not None and shuffle:
            raise ValueError("DataLoader: sampler option is mutually exclusive with shuffle (the sampler's order is "
                             "the order)")
        if batch_sampler is not None and (batch_size != 1 or shuffle or sampler is not None or drop_last):
            raise ValueError("DataLoader: batch_sampler option is mutually exclusive with batch_size, shuffle, "
                             "sampler, and drop_last")
        self.sampler, self.batch_sampler = sampler, batch_sampler
        if generator is not None and not isinstance(generator, np.random.Generator):
            raise TypeError(f"DataLoader: generator must be a numpy.random.Generator (frost's CPU generator is one), "
                            f"got {type(generator).__name__}")
        if generator is not None and seed is not None:
            raise ValueError("DataLoader: seed and generator are mutually exclusive (each fixes the base seed)")
        if worker_init_fn is not None and not callable(worker_init_fn):
            raise TypeError(f"DataLoader: worker_init_fn must be callable, got {worker_init_fn!r}")
        self.timeout = _check_timeout(timeout, num_workers)
        self.worker_type = _check_worker_type(worker_type, multiprocessing_context, num_workers)
        self.multiprocessing_context = multiprocessing_context
        self.prefetch_factor = _check_prefetch_factor(prefetch_factor, num_workers)
        if persistent_workers and num_workers == 0:
            raise ValueError("DataLoader: persistent_workers=True needs num_workers > 0 (as in PyTorch)")
        self.persistent_workers = bool(persistent_workers)
        if seed is None and generator is None:
            seed = int(cpu.generator().integers(2**62))  # follows frost.manual_seed
        self.seed, self.generator, self.worker_init_fn = seed, generator, worker_init_fn
        self.epoch = 0
        self.device = Device(device) if device is not None else CPU
        if hasattr(dataset, "for_device"):  # a dataset that loads differently per target (DevicePNGList)
            self.dataset = dataset.for_device(self.device)
        self.pin_memory = pin_memory or self.device.type == "cuda"
        self._pinned_device = self._pinned_target()
        self._pool: _WorkerPool | None = None  # persistent worker processes, from the first epoch on

    def _pinned_target(self) -> Device | None:
        if not self.pin_memory:
            return None
        if not cuda.is_available():
            if self.device.type == "cuda":
                raise RuntimeError(f"DataLoader: device={self.device} but no GPU with CuPy is available")
            return None  # pin_memory on a CPU-only machine: ordinary memory, as PyTorch does
        return self.device if self.device.type == "cuda" else Device("cuda:0")

    # ------------------------------------------------------------ order
    def __len__(self) -> int:
        if self.batch_sampler is not None:
            return len(self.batch_sampler)
        # TypeError for a stream (or a sampler) without __len__, as it should be
        n = len(self.sampler if self.sampler is not None else self.dataset)
        return n // self.batch_size if self.drop_last else math.ceil(n / self.batch_size)

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch (and so the shuffle) the next iteration uses."""
        self.epoch = epoch

    def _key(self, epoch: int) -> tuple:
        """What an iteration's order and base seed are drawn from: (seed, epoch), or one draw of `generator`."""
        if self.generator is not None:
            return (int(self.generator.integers(2**63)),)
        return (self.seed, epoch)

    def batch_indices(self, epoch: int) -> list[np.ndarray]:
        """The sample indices of every batch of an epoch, in order (with a generator: of a new draw)."""
        return self._batch_indices(self._key(epoch))

    def _batch_indices(self, key: tuple) -> list[np.ndarray]:
        if self.batch_sampler is not None:
            return [np.asarray(list(batch), dtype=np.int64).reshape(-1) for batch in self.batch_sampler]
        if self.sampler is not None:
            order = np.fromiter((int(i) for i in self.sampler), dtype=np.int64)
            n = len(order)
        else:
            n = len(self.dataset)
            order = np.random.default_rng(key).permutation(n) if self.shuffle else np.arange(n)
        stop = n - n % self.batch_size if self.drop_last else n
        return [order[i:i + self.batch_size] for i in range(0, stop, self.batch_size)]

    # ------------------------------------------------------------ iteration
    def __iter__(self) -> Iterator[Any]:
        epoch, self.epoch = self.epoch, self.epoch + 1
        key = self._key(epoch)
        if self.num_workers == 0:
            return self._inline(key)
        return self._threaded(key)

    def _sample_groups(self, key: tuple) -> Iterator[tuple[list[int] | None, Iterator[Any], np.random.Generator]]:
        """Per batch: (indices or None for a stream, an iterator over its samples, the generator to build it under).
        A stream's samples are read here, under that generator; a map-style dataset's when the iterator is read."""
        base_seed = _base_seed(key)
        if not self.is_stream:
            for i, idx in enumerate(self._batch_indices(key)):
                yield idx.tolist(), (self.dataset[int(j)] for j in idx), _batch_generator(base_seed, i)
            return
        yield from _stream_groups(self.dataset, self.batch_size, self.drop_last, base_seed)

    def _batch_getter(self) -> Callable[[np.ndarray], Any] | None:
        """dataset.get_batch(indices), used instead of one __getitem__ per sample where it exists."""
        if self.is_stream or self.collate_fn is not None:
            return None
        return getattr(self.dataset, "get_batch", None)

    def _finisher(self) -> Callable[[list], list] | None:
        """dataset.finish_on_device(device arrays) -> device arrays, run on each batch once it is on the GPU."""
        if self.device.type != "cuda" or self.collate_fn is not None:
            return None
        return getattr(self.dataset, "finish_on_device", None)

    def _host_fields(self) -> frozenset[int]:
        """The fields finish_on_device takes on the host (not copied to the device)."""
        if self._finisher() is None:
            return frozenset()
        return frozenset(getattr(self.dataset, "host_fields", ()))

    def _inline(self, key: tuple) -> Iterator[Any]:
        # each batch is built under its own generator, and handed out after it: the caller's draws stay its own
        get_batch = self._batch_getter()
        if get_batch is not None:
            base_seed = _base_seed(key)
            for i, idx in enumerate(self._batch_indices(key)):
                with cpu.use_generator(_batch_generator(base_seed, i)):
                    batch = get_batch(idx)
                yield self._to_tensors(batch)
            return
        for _, samples, rng in self._sample_groups(key):
            with cpu.use_generator(rng):
                samples = list(samples)
                batch = self.collate_fn(samples) if self.collate_fn is not None else _stack(samples)
            yield batch if self.collate_fn is not None else self._to_tensors(batch)

    def _to_tensors(self, batch: Any) -> Any:
        kind, fields = _fields(batch)
        finish, host = self._finisher(), self._host_fields()
        if finish is not None:
            out = finish([f if k in host else Tensor(f).to(self.device).data for k, f in enumerate(fields)])
            return _restructure(_flat(kind, len(out)), [Tensor(a) for a in out])
        return _restructure(kind, [Tensor(f) if self.device.type == "cpu" else Tensor(f).to(self.device)
                                   for f in fields])

    def _threaded(self, key: tuple) -> Iterator[Any]:
        workers = 1 if self.is_stream else self.num_workers  # a stream has one order: one reader
        if self.worker_type == "process":
            return _EpochIterator(_ProcessRun(self, key, workers))
        return _EpochIterator(_Run(self, key, workers))

    def _worker_pool(self, workers: int, base_seed: int) -> _WorkerPool:
        """The worker processes for this epoch: the persistent ones, once the epoch before has ended (its unread
        batches dropped), or new ones (each epoch's without persistent_workers; after a timeout, a dead worker or
        Ctrl-C, which leave the workers unusable)."""
        pool, self._pool = self._pool, None
        if pool is not None and not pool.settle(self.timeout or _SETTLE_WAIT):
            pool.close()
            pool = None
        if pool is None:
            pool = _WorkerPool(self, workers, base_seed)  # each worker's own seed: base seed + its id
        if self.persistent_workers:
            self._pool = pool
        return pool

    def _mp_context(self) -> Any:
        """The multiprocessing context worker processes start in: forkserver unless the caller chose one.

        Not fork by default: a forked worker inherits the caller's threads' locks and its GPU context (CuPy objects
        whose __del__ then fails in the child), and Python 3.12+ warns about fork with threads running. The fork
        server forks workers from a clean process that has imported Frost once (preloaded below, with __main__ as
        multiprocessing preloads it by default); spawn re-imports everything per worker."""
        ctx = self.multiprocessing_context
        if ctx is None:
            ctx = multiprocessing.get_context("forkserver")
            ctx.set_forkserver_preload(["__main__", __name__])  # read only when the server starts
        elif isinstance(ctx, str):
            ctx = multiprocessing.get_context(ctx)
        return ctx

    def __repr__(self) -> str:
        return (f"DataLoader({type(self.dataset).__name__}, batch_size={self.batch_size}, shuffle={self.shuffle}, "
                f"num_workers={self.num_workers}, device={self.device}, prefetch_to_device={self.prefetch_to_device})")


def _check_timeout(timeout: Any, num_workers: int) -> float:
    """The timeout in seconds: a number >= 0, and 0 without worker threads (nothing to wait for)."""
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 <= timeout < math.inf:
        raise ValueError(f"DataLoader: timeout must be a number of seconds >= 0 (0 waits for ever), got {timeout!r}")
    if timeout and num_workers == 0:
        raise ValueError(f"DataLoader: timeout={timeout} needs num_workers > 0: with num_workers=0 the batches are "
                         f"loaded in the calling thread, which nothing can interrupt")
    return float(timeout)


def _check_worker_type(worker_type: Any, context: Any, num_workers: int) -> str:
    """'thread' or 'process'; a multiprocessing context only with worker processes, which need shared memory (when
    there are any: with num_workers=0 the caller's thread loads)."""
    if worker_type not in ("thread", "process"):
        raise ValueError(f"DataLoader: worker_type must be 'thread' or 'process', got {worker_type!r}")
    if context is not None and worker_type != "process":
        raise ValueError("DataLoader: multiprocessing_context needs worker_type='process' (worker threads start no "
                         "processes)")
    if worker_type == "process" and num_workers > 0 and not shm.available():
        raise RuntimeError("DataLoader: worker_type='process' needs POSIX shared memory, which this system lacks; "
                           "use worker threads")
    return worker_type


def _check_prefetch_factor(prefetch_factor: Any, num_workers: int) -> int:
    """Batch buffers per worker: an int >= 1, only with worker threads (PyTorch's rule), 2 when not given."""
    if prefetch_factor is None:
        return 2
    if num_workers == 0:
        raise ValueError(f"DataLoader: prefetch_factor={prefetch_factor!r} needs num_workers > 0 (with "
                         f"num_workers=0 nothing loads ahead); leave it None")
    if isinstance(prefetch_factor, bool) or not isinstance(prefetch_factor, int) or prefetch_factor < 1:
        raise ValueError(f"DataLoader: prefetch_factor must be an int >= 1 (batches each worker loads ahead), got "
                         f"{prefetch_factor!r}")
    return prefetch_factor


def _place(batch: int, index: Any) -> str:
    """Where a worker is, in words: 'batch 3, sample 17', or get_batch's samples."""
    if batch < 0:
        return "its start (worker_init_fn, or before its first batch)"
    where = f"batch {batch}"
    if isinstance(index, list):  # get_batch's: one of these samples
        where += ", samples " + ", ".join(map(str, index[:8])) + (", ..." if len(index) > 8 else "")
    elif index is not None:
        where += f", sample {index}"
    return where


class _Where:
    """Where a worker is: the batch and the sample (or get_batch's samples) it loads, so that a failure names them."""

    __slots__ = ("batch", "index")

    def __init__(self) -> None:
        self.batch: int = -1
        self.index: Any = None


class _Consumer:
    """One epoch's consumer side, shared by worker threads (_Run) and worker processes (_ProcessRun): batches are
    taken from worker i % W in order; a worker's message is (batch, slot, n, payload), _END, or (_FAILED, failure)
    in the place of the batch that failed. Subclasses provide _wait, _poll, _give_back, shutdown, _join and
    _position."""

    stuck_note = "The other workers are stopped; the stuck thread cannot be killed and ends when its call returns"

    def __init__(self, loader: DataLoader, key: tuple, workers: int) -> None:
        self.loader, self.workers = loader, workers
        self.base_seed = _base_seed(key)
        self.error: tuple[int, int, Any, BaseException] | None = None  # worker, batch, sample, error
        self.depth = loader.prefetch_factor  # batch buffers per worker: batches it may load ahead
        self.plan = None if loader.is_stream else loader._batch_indices(key)
        # rows of each batch buffer: a batch_sampler's batches may be larger than batch_size
        self.rows = max([loader.batch_size, *(len(b) for b in self.plan or ())])
        self.lookahead: _Lookahead | None = None  # the device path's bookkeeping, once it has started
        self.held: tuple[int, int] | None = None  # (worker, slot) of the CPU batch the caller holds

    def _raise_if_failed(self, failure: tuple | None = None) -> None:
        failure = failure or self.error
        if failure is not None:
            w, batch, index, e = failure
            raise DataLoaderWorkerError(f"DataLoader: worker {w} failed on {_place(batch, index)}: "
                                        f"{type(e).__name__}: {e}") from e

    def _timed_out(self, w: int) -> None:
        """Raise the timeout of a wait for worker w's next batch, saying where that worker is."""
        (batch, index), timeout = self._position(w), self.loader.timeout
        doing = (f"loading {_place(batch, index)}" if batch >= 0 else
                 "still before its first batch (in worker_init_fn?)")
        raise DataLoaderTimeoutError(
            f"DataLoader: worker {w} has delivered no batch within timeout={timeout:g} s; it is {doing}. "
            f"{self.stuck_note}")

    def batches(self) -> Iterator[Any]:
        try:
            if self.loader.device.type == "cuda" and self.loader.collate_fn is None:
                yield from self._device_batches()
            else:
                yield from self._host_batches()
        except BaseException as e:
            self._interrupted(e)
            raise
        finally:
            self.shutdown()
            self._join()

    def _interrupted(self, error: BaseException) -> None:
        """The epoch's reading ended by `error` (GeneratorExit: the iterator was closed or dropped)."""

    def _host_batches(self) -> Iterator[Any]:
        """CPU batches (views of the workers' buffers) or collate_fn results, in order."""
        i = 0
        while True:
            if self.held is not None:  # the caller asks for the next batch: it is done with this one
                self._give_back(*self.held)
            self.held = None
            msg = self._wait(i % self.workers)
            if msg is _END:
                return
            if msg[0] is _FAILED:
                self._raise_if_failed(msg[1])
            batch, slot, n, payload = msg
            self.held = (i % self.workers, slot)
            if self.loader.collate_fn is not None:
                yield payload
            else:
                yield _restructure(payload.kind, [Tensor(buf[:n]) for buf in payload.slots[slot]])
            i += 1

    def _device_batches(self) -> Iterator[Any]:
        """GPU batches in order, up to prefetch_to_device of them queued on the copy stream (see _Lookahead)."""
        copier = _GpuCopier(self.loader.device, self.loader._finisher(), streams=self.loader.prefetch_to_device,
                            host_fields=self.loader._host_fields())
        self.lookahead = _Lookahead(self.workers, self.loader.prefetch_to_device, poll=self._poll, wait=self._wait,
                                    issue=copier.issue, give_back=self._give_back, fail=self._raise_if_failed)
        try:
            while True:
                copier.release_last()  # the caller is done with the previous batch
                flight = self.lookahead.next()
                if flight is None:
                    return
                yield copier.hand_over(flight)
        finally:
            try:
                self.lookahead.drain()
            finally:   # a Ctrl-C in drain is raised after this too
                copier.retire()

    def check_handed_out(self) -> None:
        """Run the deferred checks of the batches already handed out (the iterator's close)."""
        if self.lookahead is not None:
            self.lookahead.check_handed_out()


class _Run(_Consumer):
    """One epoch of a DataLoader with worker threads: the threads, their channels and the consumer."""

    def __init__(self, loader: DataLoader, key: tuple, workers: int) -> None:
        super().__init__(loader, key, workers)
        self.stop = threading.Event()
        self.error_lock = threading.Lock()
        self.ready = [Channel(self.depth) for _ in range(workers)]
        self.free = [Channel(self.depth) for _ in range(workers)]
        for ch in self.free:
            for slot in range(self.depth):
                ch.send(slot)
        self.groups = loader._sample_groups(key) if loader.is_stream else None  # read by its one worker
        self.where = [_Where() for _ in range(workers)]  # what each worker loads now: errors and timeouts name it
        self.threads = [threading.Thread(target=self._work, args=(w,), daemon=True, name=f"frost-loader-{w}")
                        for w in range(workers)]
        for t in self.threads:
            t.start()

    # ------------------------------------------------------------ workers
    def _my_groups(self, w: int) -> Iterator[tuple[int, list | None, Iterator[Any] | None, np.random.Generator]]:
        """(batch number, sample indices, None, generator) for a map-style dataset; (n, None, samples, generator)
        for a stream."""
        if self.plan is not None:
            for i in range(w, len(self.plan), self.workers):
                yield i, self.plan[i].tolist(), None, _batch_generator(self.base_seed, i)
            return
        for i, (_, samples, rng) in enumerate(self.groups):
            yield i, None, samples, rng

    def _work(self, w: int) -> None:
        seed = self.base_seed + w
        _this_worker.info = WorkerInfo(w, self.workers, seed, self.loader.dataset)
        where = self.where[w]
        try:
            with cpu.use_generator(np.random.default_rng(seed)):  # the worker's own, as PyTorch seeds each worker
                if self.loader.worker_init_fn is not None:
                    self.loader.worker_init_fn(w)
                self._load(w, where)
        except ChannelClosed as e:
            if not self.stop.is_set():
                self._fail(w, where.batch, where.index, e)
        except BaseException as e:  # noqa: BLE001 - handed to the consumer
            self._fail(w, where.batch, where.index, e)

    def _load(self, w: int, where: "_Where") -> None:
        """Worker w's batches, each built under its batch's generator, then the end mark."""
        loader, dataset = self.loader, self.loader.dataset
        get_batch = loader._batch_getter()
        buffers: _BatchBuffers | None = None

        def samples_of(idx, stream) -> Iterator[Any]:
            if idx is not None:
                for j in idx:
                    where.index = j  # known before loading, so that a failure names the sample
                    yield dataset[j]
            else:
                for sample in stream:
                    where.index = None
                    yield sample

        for where.batch, idx, stream, rng in self._my_groups(w):
            slot = self.free[w].recv()
            if self.stop.is_set():
                return
            with cpu.use_generator(rng):
                if loader.collate_fn is not None:
                    gathered = list(samples_of(idx, stream))
                    self.ready[w].send((where.batch, slot, len(gathered), loader.collate_fn(gathered)))
                    continue
                if get_batch is not None:
                    where.index = idx  # one of these samples
                    kind, fields = _fields(get_batch(np.asarray(idx)))
                    if buffers is None:
                        buffers = _BatchBuffers(kind, len(fields), self.rows, loader._pinned_device, self.depth)
                    buffers.put_batch(slot, kind, fields, len(idx))
                    self.ready[w].send((where.batch, slot, len(idx), buffers))
                    continue
                n = 0
                for row, sample in enumerate(samples_of(idx, stream)):
                    if self.stop.is_set():
                        return
                    kind, fields = _fields(sample)
                    if buffers is None:
                        buffers = _BatchBuffers(kind, len(fields), self.rows, loader._pinned_device, self.depth)
                    buffers.put(slot, row, kind, fields, where.index if where.index is not None else row)
                    n = row + 1
                self.ready[w].send((where.batch, slot, n, buffers))
        self.ready[w].send(_END)

    def _fail(self, w: int, batch: int, index: Any, error: BaseException) -> None:
        """Record the failure and put it in worker w's place in the batch order: the caller gets every batch
        before it (the other workers go on), then the error, as PyTorch's loader does."""
        with self.error_lock:
            if self.error is None:
                self.error = (w, batch, index, error)
        with contextlib.suppress(ChannelClosed):  # closed: the caller has stopped iterating
            self.ready[w].send((_FAILED, (w, batch, index, error)))

    def shutdown(self) -> None:
        self.stop.set()
        for ch in (*self.ready, *self.free):
            ch.close()

    def _join(self) -> None:
        deadline = time.monotonic() + 0.25  # best effort: a worker mid-item ends on its own
        for t in self.threads:
            t.join(max(0.0, deadline - time.monotonic()))

    def _position(self, w: int) -> tuple[int, Any]:
        return self.where[w].batch, self.where[w].index

    # ------------------------------------------------------------ consumer
    def _wait(self, w: int) -> Any:
        """Worker w's next message, waiting for it up to the loader's timeout: (batch, slot, n, payload), or _END
        (also when stopped)."""
        try:
            msg = self.ready[w].recv(self.loader.timeout or None)
        except ChannelClosed:
            msg = _END
        except TimeoutError:
            self._timed_out(w)
        if msg is _END:
            self._raise_if_failed()  # a batch may be missing: say why
        return msg  # a failure marker too: the caller raises it in its place in the batch order

    def _poll(self, w: int) -> Any:
        """Worker w's next message if it is there now, else None (never waits)."""
        ready = self.ready[w]
        if len(ready) == 0 and not ready.closed:
            return None
        return self._wait(w)  # an item is there (only this thread receives), or the channel is closed

    def _give_back(self, w: int, slot: int) -> None:
        try:
            self.free[w].send(slot)
        except ChannelClosed:
            self._raise_if_failed()

# ---------------------------------------------------------------- worker processes
class _SharedBatch:
    """A batch in a worker's shared-memory slot, shaped as _BatchBuffers for the consumer: .kind, .slots[slot]."""

    __slots__ = ("kind", "slots")

    def __init__(self, kind: Any, slot: int, arrays: list[np.ndarray]) -> None:
        self.kind, self.slots = kind, {slot: arrays}


class _RemoteTraceback(Exception):
    """A worker process's traceback, as text (the __cause__ of the error rebuilt in the caller)."""

    def __str__(self) -> str:
        return self.args[0]


def _rebuilt_error(names: list[str], module: str, message: str, text: str) -> BaseException:
    """A worker process's exception in the caller, never unpickled: the same class where it is a builtin one, else
    a class of the same name under its nearest builtin base (so `except ValueError` still catches it), with the
    worker's traceback text chained as its cause."""
    base = next((c for c in (getattr(builtins, n, None) for n in names)
                 if isinstance(c, type) and issubclass(c, BaseException)), RuntimeError)
    cls = base if base.__name__ == names[0] else type(names[0], (base,), {"__module__": module})
    try:
        error = cls(message)
    except Exception:  # noqa: BLE001 - a builtin that takes other arguments (UnicodeDecodeError)
        error = type(names[0], (RuntimeError,), {"__module__": module})(message)
    error.__cause__ = _RemoteTraceback(f"\n\nThe worker process's traceback:\n{text}")
    return error


_CONTROL = 3  # int64s per worker in the control segment: the batch and sample it loads, the last epoch cancelled
_SETTLE_WAIT = 5.0  # seconds a new epoch waits for a persistent worker to finish the batch it was building


class _ProcessTask:
    """What worker process w is given once (pickled to it, except with fork): the dataset and hooks, its id and seed,
    and the control segment where it reports its place. Each epoch's batches come later, over its pipe."""

    def __init__(self, loader: DataLoader, w: int, workers: int, seed: int, control: str) -> None:
        self.id, self.workers, self.seed, self.control = w, workers, seed, control
        self.dataset, self.collate_fn, self.worker_init_fn = loader.dataset, loader.collate_fn, loader.worker_init_fn
        self.use_get_batch = loader._batch_getter() is not None
        self.batch_size, self.drop_last = loader.batch_size, loader.drop_last


def _worker_plan(plan: list[np.ndarray] | None, w: int, workers: int) -> tuple[np.ndarray, np.ndarray] | None:
    """Worker w's share of an epoch (batches w, w + W, ...) as two arrays, the sample indices end to end and each
    batch's length: one small pickle, however many batches. None for a stream (the worker reads it itself)."""
    if plan is None:
        return None
    mine = plan[w::workers]
    flat = np.concatenate(mine) if mine else np.zeros(0, np.int64)
    return flat.astype(np.int64, copy=False), np.array([len(b) for b in mine], np.int64)


class _Stopped(Exception):
    """The caller closed the worker's pipe: the worker ends."""


class _Cancelled(Exception):
    """The caller ended the worker's epoch early (break, an error elsewhere): the worker waits for the next one."""


class _WorkerProcess:
    """The loop of a worker process: worker_init_fn once, then epoch after epoch as the caller sends them; in each,
    batch i under its generator, written into a free shared-memory slot and announced on the pipe, then an end mark.
    Segments are made by the caller on request ("grow") and kept across epochs; slots come back as "free"."""

    def __init__(self, task: _ProcessTask, conn: Any) -> None:
        self.task, self.conn = task, conn
        self.free: collections.deque[int] = collections.deque()
        self.segments: dict[int, shm.Segment] = {}
        control = shm.attach(task.control).view(0, (task.workers, _CONTROL), np.dtype(np.int64))
        self.where = control[task.id]  # batch, sample (so that the caller can say where a failure was), cancelled
        self.epoch = -1
        self.kind: Any = _END  # the epoch's first batch's structure: every later one must match it

    def run(self) -> None:
        task = self.task
        _this_worker.info = WorkerInfo(task.id, task.workers, task.seed, task.dataset)
        with cpu.use_generator(np.random.default_rng(task.seed)):  # the worker's own, as in a worker thread
            try:
                if task.worker_init_fn is not None:
                    task.worker_init_fn(task.id)
            except BaseException as e:  # noqa: BLE001 - handed to the caller
                self._fail(e, goes_on=False)
                return
            with contextlib.suppress(_Stopped):  # the caller closed the pipe: no more epochs
                while True:
                    self._epoch(*self._next_epoch())

    def _next_epoch(self) -> tuple:
        """Wait for the caller's next epoch; what comes before it ("free", "cancel") is of an epoch already over."""
        while True:
            msg = self._recv()
            if msg[0] == "epoch":
                return msg[1:]

    def _epoch(self, epoch: int, base_seed: int, free: list[int], plan: tuple | None) -> None:
        self.epoch, self.free, self.kind = epoch, collections.deque(free), _END
        try:
            for i, idx, samples, rng in self._groups(base_seed, plan):
                slot = self._free_slot()
                with cpu.use_generator(rng):
                    self._deliver(i, slot, idx, samples)
        except _Cancelled:
            pass
        except _Stopped:
            raise
        except BaseException as e:  # noqa: BLE001 - handed to the caller; the worker waits for the next epoch
            self._fail(e, goes_on=True)
            return
        self._send(("end",))

    def _groups(self, base_seed: int,
                plan: tuple | None) -> Iterator[tuple[int, list | None, Iterator[Any] | None, np.random.Generator]]:
        task = self.task
        if plan is not None:
            flat, lengths = plan
            ends = np.cumsum(lengths).tolist()
            for k, (start, stop) in enumerate(zip([0, *ends], ends)):
                i = task.id + k * task.workers
                yield i, flat[start:stop].tolist(), None, _batch_generator(base_seed, i)
            return
        for i, (_, samples, rng) in enumerate(_stream_groups(task.dataset, task.batch_size, task.drop_last,
                                                             base_seed)):
            yield i, None, samples, rng

    def _samples(self, idx: list | None, stream: Iterator[Any] | None) -> list:
        if idx is None:
            self.where[1] = -2
            return list(stream)
        out = []
        for j in idx:
            self.where[1] = j  # known before loading, so that a failure names the sample
            out.append(self.task.dataset[j])
        return out

    def _deliver(self, i: int, slot: int, idx: list | None, stream: Iterator[Any] | None) -> None:
        task = self.task
        self.where[0] = i
        if task.collate_fn is not None:
            samples = self._samples(idx, stream)
            self._send(("object", i, slot, len(samples), task.collate_fn(samples)))
            return
        if task.use_get_batch:
            self.where[1] = -1  # one of the batch's samples
            kind, fields = _fields(task.dataset.get_batch(np.asarray(idx)))
            for k, f in enumerate(fields):
                if np.shape(f)[:1] != (len(idx),):
                    raise ValueError(f"DataLoader: get_batch field {k} has shape {np.shape(f)}, expected {len(idx)} "
                                     f"rows")
        else:
            kind, fields = _stacked_fields(self._samples(idx, stream))
        if self.kind is _END:
            self.kind = kind
        _check_structure(kind, self.kind, f"batch {i}")
        arrays = [np.asarray(f) for f in fields]
        if any(a.dtype.hasobject for a in arrays):
            raise TypeError("DataLoader: a batch field holds Python objects (dtype object), which cannot go "
                            "through shared memory; return numbers and arrays, or pass collate_fn")
        places, nbytes = shm.layout(arrays)
        segment = self._segment(slot, nbytes)
        for a, (shape, _, offset) in zip(arrays, places):
            segment.view(offset, shape, a.dtype)[...] = a
        self._send(("batch", i, slot, len(arrays[0]), kind, places))

    def _segment(self, slot: int, nbytes: int) -> shm.Segment:
        """Slot's segment, asking the caller for a larger one when the batch does not fit."""
        segment = self.segments.get(slot)
        if segment is None or segment.size < nbytes:
            self._send(("grow", slot, nbytes))
            name = self._receive("segment")
            self.segments[slot] = segment = shm.attach(name)
        return segment

    def _free_slot(self) -> int:
        # the caller marks a cancelled epoch in shared memory too: seen here without a system call per batch
        if self.where[2] == self.epoch:
            raise _Cancelled()
        while not self.free:
            self._receive(None)
        return self.free.popleft()

    def _receive(self, wanted: str | None) -> Any:
        """Read the caller's messages until `wanted` comes (None: until one slot is free); this epoch's cancel
        ends the epoch here."""
        while True:
            kind, value = self._recv()
            if kind == "free":
                self.free.append(value)
                if wanted is None:
                    return value
            elif kind == "cancel":
                if value == self.epoch:  # else one sent after an epoch that had ended by itself
                    raise _Cancelled()
            elif kind == wanted:
                return value

    def _recv(self) -> tuple:
        try:
            return self.conn.recv()
        except (EOFError, OSError) as e:
            raise _Stopped() from e

    def _send(self, msg: tuple) -> None:
        try:
            self.conn.send(msg)
        except (EOFError, OSError) as e:
            raise _Stopped() from e

    def _fail(self, e: BaseException, goes_on: bool) -> None:
        """Report e; goes_on: whether this worker takes further epochs (not after a failed worker_init_fn)."""
        batch, index = int(self.where[0]), int(self.where[1])
        names = [c.__name__ for c in type(e).__mro__]
        text = "".join(traceback.format_exception(e))
        with contextlib.suppress(_Stopped):
            self._send(("fail", batch, index, names, type(e).__module__, str(e), text, goes_on))


def _process_worker(task: _ProcessTask, conn: Any) -> None:
    """A worker process's entry point."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is for the caller, which then stops the workers
    try:
        worker = _WorkerProcess(task, conn)
    except FileNotFoundError:  # the caller has ended already and unlinked the segments
        conn.close()
        return
    try:
        worker.run()
    finally:
        conn.close()


def _release_workers(creator: int, procs: list, conns: list, names: set[str]) -> None:
    """Close the pipes, terminate the workers still running (a stuck one too), join them, unlink every segment (the
    caller's batch views stay valid: the mappings outlive the names). A weakref.finalize of the pool: it runs once,
    at close(), when the pool is collected, or at the interpreter's exit."""
    if os.getpid() != creator:  # a forked worker collecting its copy of a pool: the workers and names are not its
        return
    for conn in conns:
        conn.close()
    for proc in procs:  # idle or ending already, or their work is not wanted
        if proc.is_alive():
            proc.terminate()  # a worker holds nothing to clean up: the caller unlinks the segments
    for proc in procs:
        proc.join(2.0)
        if proc.is_alive():
            proc.kill()
            proc.join()
        proc.close()
    for name in names:
        shm.unlink(name)
    names.clear()


class _WorkerPool:
    """Worker processes, their pipes and their shared-memory slots (worker w has `depth` of them, each a segment the
    caller made on the worker's request, sized by its batch): for one epoch, or with persistent_workers for every
    epoch of a loader, one epoch at a time. An epoch is one ("epoch", number, base seed, free slots, plan) message
    per worker; each answers with its batches, then "end" (or "fail"). `busy[w]`: worker w's end mark for the last
    epoch has not been read yet."""

    def __init__(self, loader: DataLoader, workers: int, seed: int) -> None:
        self.workers, self.depth = workers, loader.prefetch_factor
        self.names: set[str] = set()  # every segment made, unlinked when the pool is released
        self.procs: list[Any] = []
        self.conns: list[Any] = []
        self._release = weakref.finalize(self, _release_workers, os.getpid(), self.procs, self.conns, self.names)
        self.segments: list[list[shm.Segment | None]] = [[None] * self.depth for _ in range(workers)]
        self.busy = [False] * workers
        self.epochs = 0  # epochs begun; each worker's cancel check compares with the number of its epoch
        self.owner: _ProcessRun | None = None  # the run reading the workers now
        self.held: tuple[int, int] | None = None  # (worker, slot) of the batch an ended run handed out last
        self.control = self.create(8 * _CONTROL * workers)
        self.positions = self.control.view(0, (workers, _CONTROL), np.dtype(np.int64))
        self.positions[:] = (-1, -2, -1)
        try:
            self._start(loader, seed)
        except BaseException:
            self.close()
            raise

    def _start(self, loader: DataLoader, seed: int) -> None:
        ctx = loader._mp_context()
        for w in range(self.workers):
            mine, theirs = ctx.Pipe()
            task = _ProcessTask(loader, w, self.workers, seed + w, self.control.name)
            proc = ctx.Process(target=_process_worker, args=(task, theirs), daemon=True, name=f"frost-loader-{w}")
            self.conns.append(mine)
            try:
                proc.start()
            except Exception as e:  # noqa: BLE001 - pickling errors come in several types
                raise TypeError(f"DataLoader: worker_type='process' could not start worker {w} "
                                f"({ctx.get_start_method()} start method): {type(e).__name__}: {e}. Outside fork the "
                                f"dataset, collate_fn and worker_init_fn are pickled to each worker: define them at "
                                f"module level, or use worker threads") from e
            finally:
                theirs.close()
            self.procs.append(proc)

    @property
    def closed(self) -> bool:
        return not self._release.alive

    def close(self) -> None:
        self._release()

    def create(self, nbytes: int) -> shm.Segment:
        segment = shm.create(nbytes)
        self.names.add(segment.name)
        return segment

    def grow(self, w: int, slot: int, nbytes: int) -> None:
        """A larger segment for worker w's slot, made and named to it."""
        old = self.segments[w][slot]
        if old is not None:  # the slot is the worker's now: nobody reads the old segment any more
            shm.unlink(old.name)
            self.names.discard(old.name)
        self.segments[w][slot] = segment = self.create(nbytes)
        with contextlib.suppress(OSError):  # a worker that has ended: its pipe's end says so next
            self.conns[w].send(("segment", segment.name))

    def begin(self, base_seed: int, plans: list) -> tuple[int, int] | None:
        """Send every worker its share of a new epoch; returns the slot still held from the epoch before (the
        caller's last batch, valid until its next request), which its worker gets back at that request."""
        self.epochs += 1
        self.positions[:, :2] = (-1, -2)
        held, self.held = self.held, None
        for w in range(self.workers):
            free = [s for s in range(self.depth) if (w, s) != held]
            self.busy[w] = True
            with contextlib.suppress(OSError):  # a worker that has died: reading its pipe says so
                self.conns[w].send(("epoch", self.epochs, base_seed, free, plans[w]))
        return held

    def cancel(self) -> None:
        """End the current epoch early: each busy worker stops before its next batch (or at its next wait)."""
        for w in range(self.workers):
            if self.busy[w]:
                self.positions[w, 2] = self.epochs
                with contextlib.suppress(OSError):
                    self.conns[w].send(("cancel", self.epochs))

    def settle(self, wait: float) -> bool:
        """Make the workers ready for a new epoch: end the run still reading them (an iterator not finished), then
        read every busy worker's messages up to its end mark, dropping them: no batch of the old epoch is ever
        handed out in the new one. False when the workers cannot be reused: closed, one has exited, or one is still
        busy after `wait` seconds (a batch that takes that long: starting anew is cheaper than waiting)."""
        if self.owner is not None:
            self.owner.supersede()
        deadline = time.monotonic() + wait
        for w in range(self.workers):
            while self.busy[w] and not self.closed:
                if not self._drop_one(w, deadline):
                    return False
        return not self.closed

    def _drop_one(self, w: int, deadline: float) -> bool:
        try:
            if not self.conns[w].poll(max(0.0, deadline - time.monotonic())):
                return False
            msg = self.conns[w].recv()
        except (EOFError, OSError):
            return False
        if msg[0] in ("end", "fail"):
            self.busy[w] = False
        return msg[0] != "fail" or msg[-1]  # a worker whose worker_init_fn failed has exited


class _ProcessRun(_Consumer):
    """One epoch of a DataLoader with worker processes, read from a _WorkerPool: the pool's own (closed at the end)
    or, with persistent_workers, the loader's (kept: the workers wait for the next epoch)."""

    stuck_note = "The workers are stopped (the stuck process is terminated)"

    def __init__(self, loader: DataLoader, key: tuple, workers: int) -> None:
        super().__init__(loader, key, workers)  # the plan first: a sampler that raises starts no process
        self.pool = pool = loader._worker_pool(workers, self.base_seed)
        self.stopped = False
        self.broken = False  # a pipe may be mid-message or a worker gone: the pool cannot be reused
        self.failed = False  # a worker's exception ended the epoch: the pool is fine
        self.completed = False  # every batch was delivered: no worker has anything left to cancel
        self.superseded = False  # a later iter() of the loader took the workers
        pool.owner = self
        try:
            self.held = pool.begin(self.base_seed, [_worker_plan(self.plan, w, workers) for w in range(workers)])
        except BaseException:  # Ctrl-C mid-send: a pipe may hold half a message
            self.broken = True
            self.shutdown()
            raise

    def _position(self, w: int) -> tuple[int, Any]:
        batch, index = (int(v) for v in self.pool.positions[w, :2])
        if index == -1:  # get_batch's samples
            return batch, self.plan[batch].tolist()
        return batch, (None if index == -2 else index)

    def _interrupted(self, error: BaseException) -> None:
        if not isinstance(error, GeneratorExit) and not self.failed:
            self.broken = True  # Ctrl-C mid-recv, a timeout, a dead worker, a bug: no reuse

    def _raise_if_failed(self, failure: tuple | None = None) -> None:
        self.failed = self.failed or (failure or self.error) is not None
        super()._raise_if_failed(failure)

    def _timed_out(self, w: int) -> None:
        self.broken = True
        super()._timed_out(w)

    # ------------------------------------------------------------ messages
    def _wait(self, w: int) -> Any:
        """Worker w's next message, waiting for it up to the loader's timeout: (batch, slot, n, payload), _END or
        (_FAILED, failure)."""
        timeout = self.loader.timeout or None
        deadline = None if timeout is None else time.monotonic() + timeout
        conn = self.pool.conns[w]

        def ready() -> bool:
            # without a timeout recv waits by itself: no poll (a system call) per batch
            if deadline is not None and not conn.poll(max(0.0, deadline - time.monotonic())):
                self._timed_out(w)
            return True
        return self._receive(w, ready)

    def _poll(self, w: int) -> Any:
        """Worker w's next message if it is there now, else None (never waits for the worker)."""
        return self._receive(w, lambda: self.pool.conns[w].poll(0))

    def _receive(self, w: int, ready: Callable[[], bool]) -> Any:
        """Worker w's next message as the consumer takes it, read while ready() says one can be (None once it
        says not); a message answered here (a larger segment) is followed by the next."""
        conn = self.pool.conns[w]
        while not self.stopped:
            try:
                if not ready():
                    return None
                msg = conn.recv()
            except (EOFError, OSError):
                return self._died(w)
            out = self._handle(w, msg)
            if out is not None:
                return out
        return self._after_stop()

    def _after_stop(self) -> Any:
        if self.superseded:
            raise RuntimeError("DataLoader: this iterator's epoch was ended by a later iter() of the same loader "
                               "(persistent worker processes serve one epoch at a time)")
        return _END

    def _handle(self, w: int, msg: tuple) -> Any:
        """A worker's message as the consumer takes it; None for a request answered here (a larger segment)."""
        kind = msg[0]
        if kind == "grow":
            self.pool.grow(w, msg[1], msg[2])
            return None
        if kind == "batch":
            _, batch, slot, n, structure, places = msg
            segment = self.pool.segments[w][slot]
            arrays = [segment.view(offset, shape, np.dtype(dtype)) for shape, dtype, offset in places]
            return batch, slot, n, _SharedBatch(structure, slot, arrays)
        if kind == "object":
            return msg[1:]
        self.pool.busy[w] = False
        if kind == "fail":
            _, batch, index, names, module, message, text, goes_on = msg
            self.broken = self.broken or not goes_on
            index = None if index == -2 else (self.plan[batch].tolist() if index == -1 else index)
            self.error = (w, batch, index, _rebuilt_error(names, module, message, text))
            return _FAILED, self.error
        self.completed = True  # an end mark is read only once every batch has been
        return _END

    def _died(self, w: int) -> Any:
        """Worker w's pipe ended without its end mark."""
        if self.stopped:
            return self._after_stop()
        self.broken = True
        proc = self.pool.procs[w]
        proc.join(1.0)
        batch, index = self._position(w)
        where = f"while loading {_place(batch, index)}" if batch >= 0 else "before its first batch"
        raise DataLoaderWorkerError(f"DataLoader: worker {w} (process {proc.pid}) exited unexpectedly with exit code "
                                    f"{proc.exitcode} {where}")

    def _give_back(self, w: int, slot: int) -> None:
        if self.stopped:  # the slots are the next epoch's now (or gone)
            return
        with contextlib.suppress(OSError):  # a worker that has ended: its next message (or none) says why
            self.pool.conns[w].send(("free", slot))

    # ------------------------------------------------------------ ending
    def shutdown(self) -> None:
        """The end of this epoch's reading: a pool of its own, or one that cannot be reused, is released (workers
        terminated and joined, segments unlinked); a persistent one is told to end the epoch and kept."""
        if self.stopped:
            return
        self.stopped = True
        try:
            if self.lookahead is not None:
                self.lookahead.drain()  # no copy out of a slot may still run when its worker is given it again
        finally:   # a Ctrl-C in drain still releases the pool (it is raised after)
            self._release_pool()

    def _release_pool(self) -> None:
        pool = self.pool
        if pool.owner is not self:
            return
        pool.owner = None
        if self.broken or not self.loader.persistent_workers:
            pool.close()
            return
        pool.held = self.held  # the caller's last batch: its slot stays out until the next request
        if not self.completed:
            pool.cancel()

    def supersede(self) -> None:
        """A later iter() of the loader takes the workers: this iterator ends (reading it further raises)."""
        self.superseded = True
        self.shutdown()

    def _join(self) -> None:
        pass  # the pool's release joins the workers


class _EpochIterator:
    """The iterator of one threaded epoch; dropping it (even before the first next()) stops the workers."""

    def __init__(self, run: _Run) -> None:
        self._run, self._batches = run, run.batches()

    def __iter__(self) -> "_EpochIterator":
        return self

    def __next__(self) -> Any:
        return next(self._batches)

    def close(self) -> None:
        """Stop the workers; a deferred check (finish_on_device) of a batch already handed out raises here."""
        self._batches.close()
        self._run.shutdown()
        self._run.check_handed_out()

    def __del__(self) -> None:
        self._run.shutdown()  # a generator never started has no finally to run


# ---------------------------------------------------------------- device look-ahead
class _Flight:
    """One batch issued to the device: its arrays, its events on the copy stream, its deferred checks."""

    __slots__ = ("kind", "arrays", "copied", "done", "checks", "worker", "slot", "sources")

    def __init__(self, kind: str, arrays: list, copied: Any, done: Any, checks: list[Callable[[], None]],
                 sources: list | None = None) -> None:
        self.kind, self.arrays, self.checks = kind, arrays, checks
        self.copied = copied  # the host-to-device copies are finished: the host buffer may go back
        self.done = done  # the copies and finish_on_device's work are finished: its checks may run
        self.worker, self.slot = -1, -1
        # the host arrays the copies read, held until `copied`: a worker thread that ends drops its buffers, and
        # pinned memory goes back to CuPy's pool at once, where the next batch's buffer may take it before the
        # queued copy has read it (a batch then got the next one's lengths and indices, seen under GPU load)
        self.sources = sources

    def release_sources(self) -> None:
        """The copies are finished: the host arrays may be freed (or reused)."""
        self.sources = None


class _Lookahead:
    """Which batches are on their way to the device, in plain Python (the CPU tests drive it with fakes).

    poll(w) -> worker w's next message or None if it is not ready (never waits); wait(w) -> worker w's next
    message, waiting; both give _END at the end. A message is (batch, slot, n, payload). issue(payload, slot, n)
    queues a batch's copy and finish on the copy stream and returns its _Flight; give_back(w, slot) returns a
    host buffer to its worker. Events need `.done` (a non-blocking query) and `.synchronize()`.

    Why look-ahead cannot deadlock: worker w has prefetch_factor buffers and makes its batches w, w+W, ... in
    order. The only wait is for batch `pulled`, the oldest one not received, and only when nothing is ahead
    (everything issued is already handed out); polls never wait. If worker w has not made batch `pulled` yet, none
    of its later batches are made either (order), so none of its buffers sits in its ready channel: all are in
    flights already issued (batches before `pulled`). Before waiting, every copy out of worker w's buffers is
    synchronized and the buffers go back (`_recycle(sync_worker=w)`), so w has a free buffer for that batch.
    Buffers of other workers never hold w up."""

    def __init__(self, workers: int, depth: int, poll: Callable[[int], Any], wait: Callable[[int], Any],
                 issue: Callable[[Any, int, int], _Flight], give_back: Callable[[int, int], None],
                 fail: Callable[[Any], None] | None = None) -> None:
        self.workers, self.depth = workers, depth
        self.poll, self.wait, self.issue, self.give_back = poll, wait, issue, give_back
        self.fail = fail  # raises a worker's failure (a (_FAILED, failure) message) when its turn comes
        self.pulled = 0  # batches received from the workers (and issued) so far
        self.ended = False  # a worker said there are no more batches
        self.ahead: collections.deque[_Flight] = collections.deque()  # issued, not handed out yet, in order
        self.copying: list[_Flight] = []  # issued, host buffer not given back yet
        self.handed: collections.deque[_Flight] = collections.deque()  # handed out, checks not run yet

    def next(self) -> _Flight | None:
        """The next batch in order, with the following ones issued as far as they are ready; None at the end."""
        self.check_handed_out()  # the previous batch's deferred checks run now at the latest
        self._recycle()
        if not self.ahead:
            if self.ended:
                return None
            w = self.pulled % self.workers
            self._recycle(sync_worker=w)  # w may need a buffer back to make the batch we wait for
            if not self._take(self.wait(w)) and not self.ahead:
                return None
        self._fill()
        flight = self.ahead.popleft()
        if not isinstance(flight, _Flight):  # a failure, in the place of the batch that failed
            self.fail(flight[1])
        self.handed.append(flight)
        return flight

    def check_handed_out(self) -> None:
        """Run the deferred checks of every batch handed out so far, waiting for its work if need be."""
        while self.handed:
            flight = self.handed.popleft()
            if flight.checks:
                if not flight.done.done:
                    flight.done.synchronize()
                for check in flight.checks:
                    check()

    def drain(self) -> None:
        """Wait for everything issued (end of epoch, abandoned iterator): a host copy of a status that is still
        being written must not go back to the pinned pool. Best effort: an error here would hide the one that
        ended the epoch, and the next GPU call reports a broken device anyway. A Ctrl-C in the middle is raised
        after the other flights are waited for too (a GPU's queued work ends by itself; their buffers must not go
        back to a pool while it reads them)."""
        interrupted = None
        for flight in (*self.ahead, *self.handed, *self.copying):  # on several copy streams: each its own event
            if not isinstance(flight, _Flight):
                continue  # a worker's failure, not a batch
            try:
                flight.done.synchronize()
            except Exception:  # noqa: BLE001 - best effort, as above
                pass
            except BaseException as e:  # KeyboardInterrupt, SystemExit: finish draining, then raise it
                interrupted = interrupted or e
                with contextlib.suppress(Exception):
                    flight.done.synchronize()
            flight.release_sources()
        if interrupted is not None:
            raise interrupted

    def _fill(self) -> None:
        """Issue the following batches that are ready, up to `depth` in flight (counting the one handed out)."""
        while len(self.ahead) < self.depth and not self.ended:
            msg = self.poll(self.pulled % self.workers)
            if msg is None or not self._take(msg):
                return

    def _take(self, msg: Any) -> bool:
        if msg is _END:
            self.ended = True
            return False
        if msg[0] is _FAILED:  # queued as it came: every batch before it is handed out first
            self.ended = True
            self.ahead.append(msg)
            return False
        batch, slot, n, payload = msg
        if batch != self.pulled:  # workers are read round-robin: a mismatch is a bookkeeping bug, never data
            raise RuntimeError(f"DataLoader: received batch {batch} while expecting batch {self.pulled}")
        flight = self.issue(payload, slot, n)
        flight.worker, flight.slot = self.pulled % self.workers, slot
        self.pulled += 1
        self.ahead.append(flight)
        self.copying.append(flight)
        return True

    def _recycle(self, sync_worker: int | None = None) -> None:
        """Give back the host buffers whose copies are done (first waiting for those of `sync_worker`)."""
        still = []
        for flight in self.copying:
            if flight.worker == sync_worker and not flight.copied.done:
                flight.copied.synchronize()
            if flight.copied.done:
                flight.release_sources()
                self.give_back(flight.worker, flight.slot)
            else:
                still.append(flight)
        self.copying = still


def _takes_defer(finish: Callable) -> bool:
    """Whether a finish_on_device hook takes the `defer` keyword (see the module docstring)."""
    try:
        params = inspect.signature(finish).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.name == "defer" or p.kind is inspect.Parameter.VAR_KEYWORD for p in params)


class _GpuCopier:
    """Host-to-GPU copies (and finish_on_device) on copy streams of their own, batch i on stream i % streams (the
    batches in flight decode side by side: a decode kernel of a few blocks leaves most of the GPU idle, and on one
    stream each would wait for the one before); the caller's stream waits per batch."""

    def __init__(self, device: Device, finish: Callable[..., list] | None = None, streams: int = 1,
                 host_fields: frozenset[int] = frozenset()) -> None:
        self.finish = finish  # runs on the copy stream: its work overlaps the caller's steps
        self.host_fields = host_fields  # handed to finish as they are: its queued work may read them
        self.defers = finish is not None and _takes_defer(finish)
        self.cp = cuda.cupy()
        self.gpu = self.cp.cuda.Device(device.index or 0)
        with self.gpu:  # kept streams: a loader per epoch would otherwise make and drop streams (see kept_stream)
            self.streams = [cuda.kept_stream("copy", i) for i in range(max(1, streams))]
        self.issued = 0
        self.in_use: list[tuple[Any, list]] = []  # (event on the compute stream, device arrays)
        self.last: list | None = None
        self.consumer: Any = None  # the stream the batches were handed to (retire may run in another thread)

    def issue(self, buffers: _BatchBuffers, slot: int, n: int) -> _Flight:
        """Queue one batch's copies and finish on the copy stream; nothing here waits for the GPU."""
        cp = self.cp
        checks: list[Callable[[], None]] = []
        stream = self.streams[self.issued % len(self.streams)]
        self.issued += 1
        sources = [host[:n] for host in buffers.slots[slot]]  # what the copies read, held by the flight
        with self.gpu, stream:
            try:
                out = [host if k in self.host_fields else cp.empty((n, *host.shape[1:]), host.dtype)
                       for k, host in enumerate(sources)]
                for dev, host in zip(out, sources):
                    if dev is not host:
                        dev.set(host, stream=stream)
                copied = stream.record()
                kind = buffers.kind
                if self.finish is not None:
                    out = list(self.finish(out, defer=checks.append) if self.defers else self.finish(out))
                    kind = _flat(kind, len(out))
                done = stream.record()
                if self.host_fields:
                    copied = done  # finish's queued work reads the host fields: the buffer goes back after it
            except BaseException:
                # no flight will own what is queued (copies out of `sources`, a finish's copy into pinned memory):
                # let it finish before those buffers can go back to their pools
                with contextlib.suppress(Exception):
                    stream.synchronize()
                raise
        return _Flight(kind, out, copied, done, checks, sources=sources)

    def hand_over(self, flight: _Flight) -> Any:
        """The batch as Tensors; the caller's current stream waits for this batch's work, and only for it."""
        with self.gpu:
            self.consumer = self.cp.cuda.get_current_stream()
            self.consumer.wait_event(flight.done)
        self.last = flight.arrays
        return _restructure(flight.kind, [Tensor(a) for a in flight.arrays])

    def retire(self) -> None:
        """The epoch is over. The batches' device memory goes back to the copy streams' pools, where the next
        epoch's copies (on the same kept streams) may reuse it: those streams first wait for everything queued so far
        on the stream the batches went to (recorded at hand-over: an abandoned iterator may end in another thread),
        which may still read the last batches. No host sync. Best effort, as drain: an error here (a broken device)
        would hide the one that ended the epoch."""
        with contextlib.suppress(Exception), self.gpu:
            consumed = (self.consumer or self.cp.cuda.get_current_stream()).record()
            for stream in self.streams:
                stream.wait_event(consumed)
        self.in_use, self.last = [], None

    def release_last(self) -> None:
        """Called at each batch request: the caller is done with the previous batch."""
        with self.gpu:
            if self.last is not None:
                # its device memory came from the copy stream's pool: keep it alive until the compute
                # stream has passed everything queued so far (what torch's record_stream does)
                self.in_use.append((self.cp.cuda.get_current_stream().record(), self.last))
                self.last = None
            self.in_use = [(e, a) for e, a in self.in_use if not e.done]
