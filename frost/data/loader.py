"""DataLoader: batches from worker threads filling ping-pong buffers, in a deterministic order.

How it works (num_workers = W > 0):

- Each epoch the sample order is a permutation drawn from `numpy.random.default_rng((seed, epoch))`
  (or 0..N-1 without shuffle); batch i is `order[i*B:(i+1)*B]`. Batch i is always built by worker
  i % W and the consumer takes batches in order 0, 1, 2, ..., so the stream of batches is the same
  for every W (and for W = 0, which loads in the calling thread).
- Every worker owns two preallocated batch buffers (ping-pong; NumPy arrays, pinned host memory
  when the target is a GPU). It fills a free one sample by sample and announces it on its
  Channel; the consumer hands a buffer back when it is done with it: on the CPU at the next
  batch request, on a GPU when the asynchronous copy out of it has finished.
- CPU batches are zero-copy views of those buffers, valid until you ask for the next batch (the
  usual `for x, y in loader:` loop is fine). To keep a batch longer, copy it (`x.numpy().copy()`).
  With `device="cuda"` each batch is copied to the GPU on a separate copy stream and the current
  stream waits on the copy's event, so no host buffer is ever aliased by what you hold.
- A worker's exception stops every worker (a stop flag plus closing every channel wakes them)
  and is raised in the loop as `DataLoaderWorkerError` chained to the original (its traceback
  shows the worker's frames). Abandoning the iterator (break, garbage collection) stops the
  workers too; they are daemon threads and never outlive the process.
- A dataset may define `get_batch(indices)` returning a whole batch (arrays with a leading
  dimension len(indices)); it is then called once per batch instead of __getitem__ per sample
  (in-memory datasets gather a batch with one fancy-indexing copy, which releases the GIL).
- A dataset may define `finish_on_device(fields) -> fields`: with device="cuda" it is called on each
  batch's device arrays right after the copy (on the copy stream, before the consumer's stream waits
  on it), e.g. to decode images on the GPU (frost.data.png_device.DevicePNGList). A dataset may also
  define `for_device(device) -> dataset`: the loader then reads that dataset instead.
- An IterableDataset has one order, so it is read by one worker thread (still overlapping loading
  with training); shuffle needs a map-style Dataset.
- Random transforms inside a dataset see samples in a worker-dependent interleaving; for
  augmentation that is reproducible regardless of W, apply batch transforms with draws from an
  explicit Generator in the training loop (frost.data.transforms).

Threads share the GIL: they speed up loading where the per-sample work releases it (Pillow's
decoders, file reads, NumPy copies) and on free-threaded Python builds.
"""
from __future__ import annotations

import math
import threading
import time
from typing import Any, Callable, Iterator

import numpy as np

from frost.backend import CPU, Device
from frost.data.dataset import IterableDataset
from frost.parallel import Channel, ChannelClosed
from frost.tensor import Tensor

__all__ = ["DataLoader", "DataLoaderWorkerError"]

_END = object()  # a worker's "no more batches"


class DataLoaderWorkerError(RuntimeError):
    """A DataLoader worker failed; the original exception is chained as __cause__."""


# ---------------------------------------------------------------- samples and buffers
def _fields(sample: Any) -> tuple[str, list]:
    """A sample as (kind, list of NumPy-compatible fields); kind is 'one', 'tuple' or 'list'."""
    if isinstance(sample, (tuple, list)):
        kind, items = ("tuple" if isinstance(sample, tuple) else "list"), list(sample)
    else:
        kind, items = "one", [sample]
    return kind, [x.numpy() if isinstance(x, Tensor) else x for x in items]


def _restructure(kind: str, fields: list) -> Any:
    if kind == "one":
        return fields[0]
    return tuple(fields) if kind == "tuple" else list(fields)


def _empty(shape: tuple, dtype, pinned_device: Device | None) -> np.ndarray:
    if pinned_device is None:
        return np.empty(shape, dtype)
    from frost.backend import cuda
    import cupyx
    with cuda.cupy().cuda.Device(pinned_device.index or 0):
        return cupyx.empty_pinned(shape, dtype)


class _BatchBuffers:
    """One worker's two batch buffers, allocated from the first sample it sees."""

    def __init__(self, kind: str, first: list, batch_size: int, pinned_device: Device | None) -> None:
        self.kind = kind
        arrays = [np.asarray(f) for f in first]
        self.shapes = [a.shape for a in arrays]
        self.slots = [[_empty((batch_size, *a.shape), a.dtype, pinned_device) for a in arrays] for _ in range(2)]

    def put(self, slot: int, row: int, kind: str, fields: list, index: int) -> None:
        if kind != self.kind or len(fields) != len(self.shapes):
            raise TypeError(f"DataLoader: sample {index} has {len(fields)} field(s) ({kind}) but the first sample "
                            f"had {len(self.shapes)} ({self.kind}); use collate_fn for irregular samples")
        for k, (buf, f) in enumerate(zip(self.slots[slot], fields)):
            if (f.shape if isinstance(f, (np.ndarray, np.generic)) else np.shape(f)) != self.shapes[k]:
                raise ValueError(f"DataLoader: sample {index} field {k} has shape {np.shape(f)} but the batch buffer "
                                 f"expects {self.shapes[k]} (from the first sample); use collate_fn for variable sizes")
            buf[row] = f

    def put_batch(self, slot: int, kind: str, fields: list, n: int) -> None:
        """Copy a whole batch from get_batch (fields with a leading dimension n) into a buffer."""
        if kind != self.kind or len(fields) != len(self.shapes):
            raise TypeError(f"DataLoader: get_batch gave {len(fields)} field(s) ({kind}) but expected "
                            f"{len(self.shapes)} ({self.kind})")
        for k, (buf, f) in enumerate(zip(self.slots[slot], fields)):
            if np.shape(f) != (n, *self.shapes[k]):
                raise ValueError(f"DataLoader: get_batch field {k} has shape {np.shape(f)}, expected {(n, *self.shapes[k])}")
            buf[:n] = f


def _stack(samples: list[Any]) -> Any:
    """Stack samples field by field into fresh arrays (the inline, W = 0 path)."""
    kinds_fields = [_fields(s) for s in samples]
    kind = kinds_fields[0][0]
    columns = zip(*(f for _, f in kinds_fields))
    return _restructure(kind, [np.stack([np.asarray(x) for x in col]) for col in columns])


# ---------------------------------------------------------------- the loader
class DataLoader:
    """Batches of a Dataset as frost Tensors, loaded by worker threads. See the module docstring.

    seed=None draws one from frost's CPU generator (so frost.manual_seed fixes it). With collate_fn,
    workers build each batch with it and its result is passed through as it is (no buffers, no
    device copy)."""

    def __init__(self, dataset, batch_size: int = 1, shuffle: bool = False, drop_last: bool = False,
                 num_workers: int = 0, seed: int | None = None, pin_memory: bool = False,
                 device: str | Device | None = None, collate_fn: Callable[[list], Any] | None = None) -> None:
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"DataLoader: batch_size must be a positive int, got {batch_size!r}")
        if not isinstance(num_workers, int) or num_workers < 0:
            raise ValueError(f"DataLoader: num_workers must be a non-negative int, got {num_workers!r}")
        self.dataset, self.batch_size, self.shuffle, self.drop_last = dataset, batch_size, shuffle, drop_last
        self.num_workers, self.collate_fn = num_workers, collate_fn
        self.is_stream = isinstance(dataset, IterableDataset) or not hasattr(dataset, "__getitem__")
        if self.is_stream and shuffle:
            raise ValueError("DataLoader: shuffle=True needs a map-style dataset; an IterableDataset has its own order")
        if seed is None:
            from frost.backend import cpu
            seed = int(cpu.generator().integers(2**62))  # follows frost.manual_seed
        self.seed = seed
        self.epoch = 0
        self.device = Device(device) if device is not None else CPU
        if hasattr(dataset, "for_device"):  # a dataset that loads differently per target (DevicePNGList)
            self.dataset = dataset.for_device(self.device)
        self.pin_memory = pin_memory or self.device.type == "cuda"
        self._pinned_device = self._pinned_target()

    def _pinned_target(self) -> Device | None:
        if not self.pin_memory:
            return None
        from frost.backend import cuda
        if not cuda.is_available():
            if self.device.type == "cuda":
                raise RuntimeError(f"DataLoader: device={self.device} but no GPU with CuPy is available")
            return None  # pin_memory on a CPU-only machine: ordinary memory, as PyTorch does
        return self.device if self.device.type == "cuda" else Device("cuda:0")

    # ------------------------------------------------------------ order
    def __len__(self) -> int:
        n = len(self.dataset)  # TypeError for a stream without __len__, as it should be
        return n // self.batch_size if self.drop_last else math.ceil(n / self.batch_size)

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch (and so the shuffle) the next iteration uses."""
        self.epoch = epoch

    def batch_indices(self, epoch: int) -> list[np.ndarray]:
        """The sample indices of every batch of an epoch, in order."""
        n = len(self.dataset)
        order = np.random.default_rng((self.seed, epoch)).permutation(n) if self.shuffle else np.arange(n)
        stop = n - n % self.batch_size if self.drop_last else n
        return [order[i:i + self.batch_size] for i in range(0, stop, self.batch_size)]

    # ------------------------------------------------------------ iteration
    def __iter__(self) -> Iterator[Any]:
        epoch, self.epoch = self.epoch, self.epoch + 1
        if self.num_workers == 0:
            return self._inline(epoch)
        return self._threaded(epoch)

    def _sample_groups(self, epoch: int) -> Iterator[tuple[list[int] | None, Iterator[Any]]]:
        """Per batch: (indices or None for a stream, an iterator over its samples)."""
        if not self.is_stream:
            for idx in self.batch_indices(epoch):
                yield idx.tolist(), (self.dataset[int(j)] for j in idx)
            return
        it = iter(self.dataset)
        while True:
            group = [s for _, s in zip(range(self.batch_size), it)]
            if not group or (self.drop_last and len(group) < self.batch_size):
                return
            yield None, iter(group)

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

    def _inline(self, epoch: int) -> Iterator[Any]:
        get_batch = self._batch_getter()
        if get_batch is not None:
            for idx in self.batch_indices(epoch):
                yield self._to_tensors(get_batch(idx))
            return
        for _, samples in self._sample_groups(epoch):
            samples = list(samples)
            if self.collate_fn is not None:
                yield self.collate_fn(samples)
            else:
                yield self._to_tensors(_stack(samples))

    def _to_tensors(self, batch: Any) -> Any:
        kind, fields = _fields(batch) if isinstance(batch, (tuple, list)) else ("one", [batch])
        out = [Tensor(f) if self.device.type == "cpu" else Tensor(f).to(self.device) for f in fields]
        finish = self._finisher()
        if finish is not None:
            out = [Tensor(a) for a in finish([t.data for t in out])]
        return _restructure(kind, out)

    def _threaded(self, epoch: int) -> Iterator[Any]:
        workers = 1 if self.is_stream else self.num_workers  # a stream has one order: one reader
        return _EpochIterator(_Run(self, epoch, workers))

    def __repr__(self) -> str:
        return (f"DataLoader({type(self.dataset).__name__}, batch_size={self.batch_size}, shuffle={self.shuffle}, "
                f"num_workers={self.num_workers}, device={self.device})")


class _Run:
    """One epoch of a threaded DataLoader: the workers, their channels and the consumer."""

    def __init__(self, loader: DataLoader, epoch: int, workers: int) -> None:
        self.loader, self.workers = loader, workers
        self.stop = threading.Event()
        self.error: tuple[int, int, Any, BaseException] | None = None  # worker, batch, sample, error
        self.error_lock = threading.Lock()
        self.ready = [Channel(2) for _ in range(workers)]
        self.free = [Channel(2) for _ in range(workers)]
        for ch in self.free:
            ch << 0 << 1
        self.plan = None if loader.is_stream else loader.batch_indices(epoch)
        self.groups = loader._sample_groups(epoch) if loader.is_stream else None  # read by its one worker
        self.threads = [threading.Thread(target=self._work, args=(w,), daemon=True, name=f"frost-loader-{w}")
                        for w in range(workers)]
        for t in self.threads:
            t.start()

    # ------------------------------------------------------------ workers
    def _my_groups(self, w: int) -> Iterator[tuple[int, list | None, Iterator[Any] | None]]:
        """(batch number, sample indices, None) for a map-style dataset; (n, None, samples) for a stream."""
        if self.plan is not None:
            for i in range(w, len(self.plan), self.workers):
                yield i, self.plan[i].tolist(), None
            return
        for i, (_, samples) in enumerate(self.groups):
            yield i, None, samples

    def _work(self, w: int) -> None:
        loader, dataset = self.loader, self.loader.dataset
        get_batch = loader._batch_getter()
        buffers: _BatchBuffers | None = None
        batch, index = -1, None

        def samples_of(idx, stream) -> Iterator[Any]:
            nonlocal index
            if idx is not None:
                for j in idx:
                    index = j  # known before loading, so that a failure names the sample
                    yield dataset[j]
            else:
                for row, sample in enumerate(stream):
                    index = None
                    yield sample

        try:
            for batch, idx, stream in self._my_groups(w):
                slot = self.free[w].recv()
                if self.stop.is_set():
                    return
                if loader.collate_fn is not None:
                    gathered = list(samples_of(idx, stream))
                    self.ready[w].send((batch, slot, len(gathered), loader.collate_fn(gathered)))
                    continue
                if get_batch is not None:
                    index = f"{idx[0]}..{idx[-1]}"
                    kind, fields = _fields(get_batch(np.asarray(idx)))
                    if buffers is None:
                        buffers = _BatchBuffers(kind, [f[0] for f in fields], loader.batch_size, loader._pinned_device)
                    buffers.put_batch(slot, kind, fields, len(idx))
                    self.ready[w].send((batch, slot, len(idx), buffers))
                    continue
                n = 0
                for row, sample in enumerate(samples_of(idx, stream)):
                    if self.stop.is_set():
                        return
                    kind, fields = _fields(sample)
                    if buffers is None:
                        buffers = _BatchBuffers(kind, fields, loader.batch_size, loader._pinned_device)
                    buffers.put(slot, row, kind, fields, index if index is not None else row)
                    n = row + 1
                self.ready[w].send((batch, slot, n, buffers))
            self.ready[w].send(_END)
        except ChannelClosed as e:
            if not self.stop.is_set():
                self._fail(w, batch, index, e)
        except BaseException as e:  # noqa: BLE001 - handed to the consumer
            self._fail(w, batch, index, e)

    def _fail(self, w: int, batch: int, index: Any, error: BaseException) -> None:
        with self.error_lock:
            if self.error is None:
                self.error = (w, batch, index, error)
        self.shutdown()

    def shutdown(self) -> None:
        self.stop.set()
        for ch in (*self.ready, *self.free):
            ch.close()

    # ------------------------------------------------------------ consumer
    def _raise_if_failed(self) -> None:
        if self.error is not None:
            w, batch, index, e = self.error
            where = f"batch {batch}" + (f", sample {index}" if index is not None else "")
            raise DataLoaderWorkerError(f"DataLoader: worker {w} failed on {where}: {type(e).__name__}: {e}") from e

    def batches(self) -> Iterator[Any]:
        copier = _GpuCopier(self.loader.device, self.loader._finisher()) if self.loader.device.type == "cuda" else None
        held: tuple[int, int] | None = None  # (worker, slot) of the batch the caller holds
        i = 0
        try:
            while True:
                if held is not None:
                    self._give_back(*held)
                held = None
                w = i % self.workers
                if copier is not None:
                    copier.recycle(self, w)
                try:
                    msg = self.ready[w].recv()
                except ChannelClosed:
                    msg = None
                self._raise_if_failed()
                if msg is None or msg is _END:
                    return
                batch, slot, n, payload = msg
                held = (w, slot)
                if self.loader.collate_fn is not None:
                    out = payload
                elif copier is not None:
                    out = copier.copy(payload, slot, n, w)
                    held = None  # returned by copier.recycle once the copy is done
                else:
                    out = _restructure(payload.kind, [Tensor(buf[:n]) for buf in payload.slots[slot]])
                yield out
                i += 1
        finally:
            self.shutdown()
            deadline = time.monotonic() + 0.25  # best effort: a worker mid-item ends on its own
            for t in self.threads:
                t.join(max(0.0, deadline - time.monotonic()))

    def _give_back(self, w: int, slot: int) -> None:
        try:
            self.free[w].send(slot)
        except ChannelClosed:
            self._raise_if_failed()


class _EpochIterator:
    """The iterator of one threaded epoch; dropping it (even before the first next()) stops the workers."""

    def __init__(self, run: _Run) -> None:
        self._run, self._batches = run, run.batches()

    def __iter__(self) -> "_EpochIterator":
        return self

    def __next__(self) -> Any:
        return next(self._batches)

    def close(self) -> None:
        self._batches.close()
        self._run.shutdown()

    def __del__(self) -> None:
        self._run.shutdown()  # a generator never started has no finally to run


class _GpuCopier:
    """Host-to-GPU copies on a separate stream; host buffers go back to workers when a copy is done."""

    def __init__(self, device: Device, finish: Callable[[list], list] | None = None) -> None:
        from frost.backend import cuda
        self.finish = finish  # runs on the copy stream, so a status read waits for this batch, not for training
        self.cp = cuda.cupy()
        self.gpu = self.cp.cuda.Device(device.index or 0)
        with self.gpu:
            self.stream = self.cp.cuda.Stream(non_blocking=True)
        self.copying: list[tuple[Any, int, int]] = []  # (event, worker, slot)
        self.in_use: list[tuple[Any, list]] = []  # (event on the compute stream, device arrays)
        self.last: list | None = None

    def copy(self, buffers: _BatchBuffers, slot: int, n: int, w: int) -> Any:
        cp = self.cp
        with self.gpu:
            compute = cp.cuda.get_current_stream()
            with self.stream:
                out = [cp.empty((n, *buf.shape[1:]), buf.dtype) for buf in buffers.slots[slot]]
                for dev, host in zip(out, buffers.slots[slot]):
                    dev.set(host[:n], stream=self.stream)
                if self.finish is not None:
                    out = list(self.finish(out))
                done = self.stream.record()
            compute.wait_event(done)
        self.copying.append((done, w, slot))
        self.last = out
        return _restructure(buffers.kind, [Tensor(a) for a in out])

    def recycle(self, run: _Run, waiting_on: int) -> None:
        """Called at each batch request: the caller is done with the previous batch."""
        with self.gpu:
            if self.last is not None:
                # its device memory came from the copy stream's pool: keep it alive until the compute
                # stream has passed everything queued so far (what torch's record_stream does)
                self.in_use.append((self.cp.cuda.get_current_stream().record(), self.last))
                self.last = None
            self.in_use = [(e, a) for e, a in self.in_use if not e.done]
        still = []
        for event, w, slot in self.copying:
            if w == waiting_on and not event.done:
                event.synchronize()  # that worker may need this buffer to make the batch we wait for
            if event.done:
                run._give_back(w, slot)
            else:
                still.append((event, w, slot))
        self.copying = still
