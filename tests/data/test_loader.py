"""Tests for frost/data/loader.py: order, determinism, workers, errors, shutdown (and dataset.py basics)."""
import gc
import os
import subprocess
import sys
import textwrap
import threading
import time
import types
import weakref
from pathlib import Path

import numpy as np
import pytest
import torch

import frost
from frost.data import (DataLoader, DataLoaderWorkerError, Dataset, IterableDataset, TensorDataset, get_worker_info,
                        transforms)
from frost.data.loader import DataLoaderTimeoutError

pytestmark = pytest.mark.timeout(20)


def loader_threads(ignore=()):
    return [t for t in threading.enumerate() if t.name.startswith("frost-loader") and t not in ignore]


def wait_no_loader_threads(limit=2.0, ignore=()):
    deadline = time.monotonic() + limit
    while loader_threads(ignore) and time.monotonic() < deadline:
        time.sleep(0.01)
    return loader_threads(ignore)


class Squares(Dataset):
    """Item i = (image filled with i, i*i): values make every sample recognisable."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return np.full((2, 3), i, np.uint16), i * i


def collect(loader):
    """Every batch, copied (CPU batches are views of buffers that get reused)."""
    return [tuple(t.numpy().copy() for t in batch) for batch in loader]


@pytest.mark.parametrize("workers", [0, 1, 3, 8])
def test_every_sample_exactly_once_in_the_same_order(workers):
    ds = Squares(103)
    reference = collect(DataLoader(ds, batch_size=10, shuffle=True, seed=7, num_workers=0))
    loader = DataLoader(ds, batch_size=10, shuffle=True, seed=7, num_workers=workers)
    assert len(loader) == 11
    batches = collect(loader)
    assert [len(x) for x, _ in batches] == [10] * 10 + [3]
    xs = np.concatenate([x for x, _ in batches])
    ys = np.concatenate([y for _, y in batches])
    idx = xs[:, 0, 0].astype(np.int64)
    assert sorted(idx.tolist()) == list(range(103))  # each sample once
    np.testing.assert_array_equal(ys, idx * idx)  # fields stay paired
    assert (xs == idx[:, None, None]).all()
    assert idx.tolist() != list(range(103))  # shuffled
    for (x0, y0), (x1, y1) in zip(reference, batches):  # identical to the inline loader
        np.testing.assert_array_equal(x0, x1)
        np.testing.assert_array_equal(y0, y1)
    assert xs.dtype == np.uint16 and ys.dtype == np.int64


def test_batches_are_frost_tensors_and_structure_is_kept():
    x, y = next(iter(DataLoader(Squares(4), batch_size=4, num_workers=2)))
    assert isinstance(x, frost.Tensor) and isinstance(y, frost.Tensor)
    assert x.shape == (4, 2, 3) and y.tolist() == [0, 1, 4, 9]

    class One(Dataset):
        def __len__(self):
            return 5

        def __getitem__(self, i):
            return np.array([i, -i], np.float32)

    for w in (0, 2):
        batches = list(DataLoader(One(), batch_size=5, num_workers=w))
        assert isinstance(batches[0], frost.Tensor)
        assert batches[0].tolist() == [[i, -i] for i in range(5)]


class MixedDtypes(Dataset):
    """Sample 0's fields are the narrowest: an int target among floats, a uint8 image before int64 ones."""

    targets = [0, 1.5, 2.25, 3.75, 5, 6.5]

    def __len__(self):
        return 6

    def __getitem__(self, i):
        return (np.array([7], np.uint8) if i == 0 else np.array([300 + i], np.int64)), self.targets[i]


@pytest.mark.parametrize("workers", [0, 1, 2])
def test_a_later_sample_of_a_wider_dtype_widens_the_batch_as_np_stack_does(workers):
    batches = list(DataLoader(MixedDtypes(), batch_size=3, num_workers=workers))
    (x0, y0), (x1, y1) = batches
    assert x0.numpy().ravel().tolist() == [7, 301, 302] and x0.dtype == "int64"
    assert y0.numpy().tolist() == [0.0, 1.5, 2.25] and y0.dtype == "float64"
    assert x1.numpy().ravel().tolist() == [303, 304, 305] and y1.numpy().tolist() == [3.75, 5.0, 6.5]


class Listed(Dataset):
    def __init__(self, items):
        self.items = items

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i]


@pytest.mark.parametrize("workers", [0, 1, 2])
def test_widening_a_buffer_leaves_a_batch_not_taken_yet_and_each_batch_has_its_own_dtype(workers):
    """A worker widens only the slot it fills (the other may hold a batch queued for the caller), and each batch
    has np.stack's dtype of its own samples, for every number of workers."""
    made = threading.Event()

    class Signalling(Listed):
        def __getitem__(self, i):
            if i == 3:
                made.set()
            return super().__getitem__(i)
    it = iter(DataLoader(Signalling([0, 1, 2.5, 3, 4, 5]), batch_size=2, num_workers=workers))
    if workers:
        assert made.wait(10)  # the worker makes (and widens for) batch 1 before batch 0 is taken
        time.sleep(0.05)  # its last row written (no later sample is read: both buffers are full until we take one)
    batches = [b.numpy().copy() for b in it]  # a batch is a view of a worker's buffer until the next one
    assert [b.tolist() for b in batches] == [[0, 1], [2.5, 3.0], [4, 5]]
    assert [str(b.dtype) for b in batches] == ["int64", "float64", "int64"]


@pytest.mark.parametrize("workers", [0, 2])
def test_nested_and_dict_samples_collate_as_pytorch(workers):
    """Tuples, lists and dicts are walked as torch's default_collate walks them, each leaf stacked."""
    samples = [(np.full(2, i, np.float32), {"label": i, "weight": i / 2, "pair": [i, -i]}) for i in range(6)]
    ours = list(DataLoader(Listed(samples), batch_size=3, num_workers=workers))
    theirs = list(torch.utils.data.DataLoader(samples, batch_size=3))
    for (x, d), (tx, td) in zip(ours, theirs):
        np.testing.assert_array_equal(x.numpy(), tx.numpy())
        assert sorted(d) == sorted(td) and isinstance(d["pair"], list)
        for key in ("label", "weight"):
            assert d[key].tolist() == td[key].tolist() and d[key].dtype.name == str(td[key].dtype)[6:]
        assert [p.tolist() for p in d["pair"]] == [p.tolist() for p in td["pair"]]
    with pytest.raises((TypeError, DataLoaderWorkerError), match="a sample holds a string"):
        list(DataLoader(Listed([("a", 1)] * 2), batch_size=2, num_workers=workers))
    with pytest.raises((TypeError, DataLoaderWorkerError), match=r"shaped tuple\(a value, a value.*use collate_fn"):
        list(DataLoader(Listed([(1, 2), (1, 2, 3)]), batch_size=2, num_workers=workers))


def test_each_epoch_reshuffles_and_seed_fixes_the_sequence():
    ds = Squares(50)
    order = lambda batches: np.concatenate([x[:, 0, 0] for x, _ in batches]).tolist()  # noqa: E731
    a = DataLoader(ds, batch_size=8, shuffle=True, seed=1, num_workers=3)
    b = DataLoader(ds, batch_size=8, shuffle=True, seed=1, num_workers=0)
    a0, a1 = order(collect(a)), order(collect(a))
    b0, b1 = order(collect(b)), order(collect(b))
    assert a0 == b0 and a1 == b1
    assert a0 != a1 and sorted(a0) == sorted(a1)
    assert order(collect(DataLoader(ds, batch_size=8, shuffle=True, seed=2))) != a0
    b.set_epoch(0)
    assert order(collect(b)) == a0


def test_seed_none_follows_frost_manual_seed():
    frost.manual_seed(11)
    a = DataLoader(Squares(30), batch_size=30, shuffle=True)
    frost.manual_seed(11)
    b = DataLoader(Squares(30), batch_size=30, shuffle=True)
    assert a.seed == b.seed
    np.testing.assert_array_equal(collect(a)[0][0], collect(b)[0][0])


def test_no_shuffle_is_in_order_and_drop_last():
    loader = DataLoader(Squares(23), batch_size=5, drop_last=True, num_workers=3)
    assert len(loader) == 4
    batches = collect(loader)
    assert [len(x) for x, _ in batches] == [5, 5, 5, 5]
    assert np.concatenate([x[:, 0, 0] for x, _ in batches]).tolist() == list(range(20))
    assert len(DataLoader(Squares(23), batch_size=5)) == 5


def test_tensor_dataset():
    x = frost.randn(10, 3)
    y = frost.arange(10)
    ds = TensorDataset(x, y)
    assert len(ds) == 10
    (xb, yb), = list(DataLoader(ds, batch_size=10, num_workers=2))
    np.testing.assert_array_equal(xb.numpy(), x.numpy())
    assert yb.tolist() == list(range(10))
    with pytest.raises(ValueError, match=r"different lengths \[10, 9\]"):
        TensorDataset(x, frost.arange(9))


def test_collate_fn_is_used_by_workers():
    loader = DataLoader(Squares(9), batch_size=4, num_workers=2, collate_fn=lambda items: [y for _, y in items])
    assert list(loader) == [[0, 1, 4, 9], [16, 25, 36, 49], [64]]
    assert list(DataLoader(Squares(3), batch_size=2, collate_fn=len)) == [2, 1]


def test_iterable_dataset_inline_and_threaded():
    class Stream(IterableDataset):
        def __iter__(self):
            return iter(np.array([i, i + 1]) for i in range(11))

    for w in (0, 2):
        batches = [b.numpy().copy() for b in DataLoader(Stream(), batch_size=4, num_workers=w)]
        assert [len(b) for b in batches] == [4, 4, 3]
        assert np.concatenate(batches)[:, 0].tolist() == list(range(11))
    assert len(list(DataLoader(Stream(), batch_size=4, drop_last=True, num_workers=1))) == 2
    for option in (dict(shuffle=True), dict(sampler=[0, 1]), dict(batch_sampler=[[0]])):
        with pytest.raises(ValueError, match="shuffle, sampler and batch_sampler need a map-style dataset"):
            DataLoader(Stream(), **option)


def test_irregular_samples_raise_clearly():
    class Ragged(Dataset):
        def __len__(self):
            return 4

        def __getitem__(self, i):
            return np.zeros(3 if i < 2 else 4)

    with pytest.raises(DataLoaderWorkerError, match=r"sample 2 field 0 has shape \(4,\) but the batch's first "
                                                   r"sample had \(3,\)"):
        list(DataLoader(Ragged(), batch_size=4, num_workers=1))
    # uniform within each batch, different between batches (length buckets): as np.stack, for every worker count
    for w in (0, 1, 2):
        assert [b.shape for b in DataLoader(Ragged(), batch_size=2, num_workers=w)] == [(2, 3), (2, 4)]


def test_bad_arguments():
    with pytest.raises(ValueError, match="batch_size must be a positive int"):
        DataLoader(Squares(3), batch_size=0)
    with pytest.raises(ValueError, match="num_workers must be a non-negative int"):
        DataLoader(Squares(3), num_workers=-1)


def test_pin_memory_without_gpu_still_loads():
    (x, y), = collect(DataLoader(Squares(3), batch_size=3, num_workers=1, pin_memory=True))
    assert y.tolist() == [0, 1, 4]


class Failing(Dataset):
    """Raises on one index; other items may be slow."""

    def __init__(self, n, bad, slow=None, delay=0.0):
        self.n, self.bad, self.slow, self.delay = n, bad, slow, delay
        self.raised_at = None

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if i == self.bad:
            self.raised_at = time.monotonic()
            raise ValueError(f"cannot load item {i}")
        if self.slow is not None and i == self.slow:
            time.sleep(self.delay)
        return np.zeros(2), i


def test_worker_exception_reaches_the_caller_quickly_with_its_traceback():
    ds = Failing(40, bad=13)
    with pytest.raises(DataLoaderWorkerError, match=r"worker 1 failed on batch 3, sample 13: ValueError") as info:
        for _ in DataLoader(ds, batch_size=4, num_workers=2):
            pass
    assert time.monotonic() - ds.raised_at < 1.0
    cause = info.value.__cause__
    assert isinstance(cause, ValueError) and "cannot load item 13" in str(cause)
    frames = []
    tb = cause.__traceback__
    while tb is not None:
        frames.append(tb.tb_frame.f_code.co_name)
        tb = tb.tb_next
    assert "__getitem__" in frames  # the worker's own frames are kept
    assert wait_no_loader_threads() == []


@pytest.mark.parametrize("workers", [0, 1, 2, 4])
def test_a_failing_batch_comes_after_every_batch_before_it(workers):
    """As PyTorch's loader: the batches before the failing one are delivered (the others workers go on), then the
    error, whatever the number of workers. Batch 0 is slow: the caller waits for it, it does not hear early."""
    ds = Failing(24, bad=17, slow=0, delay=0.3)
    got = []
    with pytest.raises((DataLoaderWorkerError, ValueError), match="cannot load item 17") as info:
        for _, i in DataLoader(ds, batch_size=4, num_workers=workers):
            got.append(i.tolist())
    assert got == [list(range(4 * b, 4 * b + 4)) for b in range(4)]
    if workers:
        assert "failed on batch 4, sample 17" in str(info.value)
    assert wait_no_loader_threads() == []


def test_inline_loader_raises_the_original_error():
    with pytest.raises(ValueError, match="cannot load item 2"):
        list(DataLoader(Failing(4, bad=2), batch_size=2))


def test_abandoned_iterator_stops_its_threads():
    older = set(loader_threads())  # e.g. a worker of an earlier test still finishing a slow item
    it = iter(DataLoader(Squares(1000), batch_size=4, num_workers=4))
    next(it)
    next(it)
    assert len(loader_threads(older)) == 4
    del it
    gc.collect()
    assert wait_no_loader_threads(ignore=older) == []
    for batch in DataLoader(Squares(1000), batch_size=4, num_workers=3, shuffle=True):
        break
    del batch
    gc.collect()
    assert wait_no_loader_threads(ignore=older) == []
    never_started = iter(DataLoader(Squares(1000), batch_size=4, num_workers=2))
    assert len(loader_threads(older)) == 2
    del never_started
    assert wait_no_loader_threads(ignore=older) == []
    closed = iter(DataLoader(Squares(1000), batch_size=4, num_workers=2))
    next(closed)
    closed.close()
    assert wait_no_loader_threads(ignore=older) == []
    with pytest.raises(StopIteration):
        next(closed)


@pytest.mark.cuda
def test_cuda_device_batches_match_the_cpu_loader():
    ds = Squares(37)
    cpu = collect(DataLoader(ds, batch_size=8, shuffle=True, seed=4, num_workers=3))
    gpu = DataLoader(ds, batch_size=8, shuffle=True, seed=4, num_workers=3, device="cuda")
    n = 0
    for (x, y), (cx, cy) in zip(gpu, cpu):
        assert x.device == "cuda:0" and y.device == "cuda:0"
        np.testing.assert_array_equal(x.numpy(), cx)
        np.testing.assert_array_equal(y.numpy(), cy)
        n += 1
    assert n == len(cpu) == 5
    # a kept batch is never overwritten by later loading: it lives in its own device memory
    kept = [x for x, _ in DataLoader(ds, batch_size=8, shuffle=True, seed=4, num_workers=2, device="cuda")]
    for x, (cx, _) in zip(kept, cpu):
        np.testing.assert_array_equal(x.numpy(), cx)


class FakeCupy:
    """Just enough of CuPy to drive the DataLoader's GPU path on the CPU: copies are numpy copies,
    and an event only reports done after a few queries, so buffers must wait for their copies."""

    def __init__(self):
        self.log = []
        fake = self

        class Event:
            def __init__(self):
                self.queries = 0
                self._done = False

            @property
            def done(self):
                self.queries += 1
                self._done = self._done or self.queries > 10
                return self._done

            def synchronize(self):
                fake.log.append("sync")
                self._done = True

        class Stream:
            def __init__(self, non_blocking=False):
                pass

            def __enter__(self):
                return self

            def __exit__(self, *exc):
                return False

            def record(self):
                return Event()

            def wait_event(self, event):
                fake.log.append("wait")

        class Device:
            def __init__(self, index=0):
                pass

            __enter__ = Stream.__enter__
            __exit__ = Stream.__exit__

        class DeviceArray(np.ndarray):
            def set(self, host, stream=None):
                assert stream is not None, "copies must go on the copy stream"
                fake.log.append("copy")
                self[...] = host

        class cuda:  # noqa: N801 - mirrors cupy.cuda
            pass

        cuda.Device, cuda.Stream, cuda.Event = Device, Stream, Event
        cuda.runtime = types.SimpleNamespace(getDevice=lambda: 0)
        cuda.get_current_stream = staticmethod(lambda: Stream())
        self.cuda = cuda
        self.DeviceArray = DeviceArray

    def empty(self, shape, dtype):
        return np.empty(shape, dtype).view(self.DeviceArray)


def test_gpu_path_logic_with_a_fake_cupy(monkeypatch):
    import sys
    from frost.backend import cuda
    fake = FakeCupy()
    pinned = []
    cupyx = types.SimpleNamespace(empty_pinned=lambda shape, dtype: pinned.append(shape) or np.empty(shape, dtype))
    monkeypatch.setattr(cuda, "cupy", lambda: fake)
    monkeypatch.setattr(cuda, "is_available", lambda: True)
    monkeypatch.setattr(cuda, "_kept_streams", {})  # the fake's streams must not outlive the test
    monkeypatch.setitem(sys.modules, "cupyx", cupyx)
    ds = Squares(45)
    reference = collect(DataLoader(ds, batch_size=4, shuffle=True, seed=5, num_workers=0))
    kept = list(DataLoader(ds, batch_size=4, shuffle=True, seed=5, num_workers=3, device="cuda"))
    assert len(kept) == len(reference) == 12
    for (x, y), (rx, ry) in zip(kept, reference):  # kept batches stay intact: each has its own memory
        np.testing.assert_array_equal(x.numpy(), rx)
        np.testing.assert_array_equal(y.numpy(), ry)
    assert len(pinned) == 3 * 2 * 2  # 3 workers x 2 buffers x 2 fields, all pinned
    # the caller's stream waits once per batch; at the end each of the 2 copy streams waits once for the caller's
    # (the batches' memory goes back to those streams' pools while the caller's stream may still read it)
    assert fake.log.count("copy") == 24 and fake.log.count("wait") == 12 + 2
    assert fake.log[-2:] == ["wait", "wait"]
    assert "sync" in fake.log  # a worker's buffer was handed back only after its copy had finished


def test_get_batch_is_used_once_per_batch_and_checked():
    class Batched(Squares):
        calls = 0

        def get_batch(self, idx):
            Batched.calls += 1
            return np.stack([self[i][0] for i in idx]), idx.astype(np.int64) ** 2

    ref = collect(DataLoader(Squares(30), batch_size=8, shuffle=True, seed=2, num_workers=3))
    got = collect(DataLoader(Batched(30), batch_size=8, shuffle=True, seed=2, num_workers=3))
    assert Batched.calls == 4
    for (x, y), (rx, ry) in zip(got, ref):
        np.testing.assert_array_equal(x, rx)
        np.testing.assert_array_equal(y, ry)

    class Wrong(Squares):
        def get_batch(self, idx):
            return np.zeros((len(idx) + 1, 2, 3)), idx

    with pytest.raises(DataLoaderWorkerError, match=r"batch 0, samples 0, 1, 2, 3, 4, 5, 6, 7: ValueError: "
                                                   r"DataLoader: get_batch field 0 has shape \(9, 2, 3\), "
                                                   r"expected 8 rows"):
        list(DataLoader(Wrong(30), batch_size=8, num_workers=2))


def test_prefetch_to_device_is_checked():
    for bad in (0, -1, 1.5, True, None):
        pattern = r"prefetch_to_device must be an int >= 1.*got " + repr(bad).replace(".", r"\.")
        with pytest.raises(ValueError, match=pattern):
            DataLoader(Squares(3), prefetch_to_device=bad)
    assert DataLoader(Squares(3)).prefetch_to_device == 2


# ---------------------------------------------------------------- the device look-ahead's bookkeeping, with models
from frost.data.loader import _END, _BatchBuffers, _fields, _Flight, _GpuCopier, _Lookahead  # noqa: E402


class ModelEvent:
    """A copy-stream event: done after `after` queries (None: only once synchronized)."""

    def __init__(self, log, name, after=None):
        self.log, self.name, self.after, self.queries, self.finished = log, name, after, 0, False

    @property
    def done(self):
        self.queries += 1
        self.finished = self.finished or (self.after is not None and self.queries > self.after)
        return self.finished

    def synchronize(self):
        if not self.finished:
            self.log.append(("sync", self.name))
        self.finished = True


class ModelPipeline:
    """W workers with two buffers each, making batches w, w+W, ... in order whenever they hold a free buffer
    (`ready(batch)` says whether a worker has got round to it yet), and a copy stream whose events finish after
    a few queries (`copy_after`, `done_after`; None: only when synchronized).

    wait(w) on a worker that has no free buffer would block forever in the loader: here it fails the test."""

    def __init__(self, workers, n, ready=lambda b: True, copy_after=None, done_after=None, checks=None):
        self.workers, self.n, self.ready = workers, n, ready
        self.copy_after, self.done_after, self.checks = copy_after, done_after, checks or {}
        self.free = [[0, 1] for _ in range(workers)]
        self.made = list(range(workers))  # the next batch each worker makes
        self.log = []
        self.issued = []  # batch numbers, in issue order
        self.flights = {}  # (worker, slot) -> the flight copying out of that buffer
        self.handed = 0

    def _make(self, w):
        b = self.made[w]
        if b >= self.n:
            return _END
        if not self.free[w]:
            return None
        self.made[w] += self.workers
        return b, self.free[w].pop(0), 1, b

    def poll(self, w):
        if self.made[w] < self.n and not self.ready(self.made[w]):
            return None
        return self._make(w)

    def wait(self, w):
        msg = self._make(w)
        assert msg is not None, f"deadlock: waiting on worker {w} for batch {self.made[w]} but it holds no buffer"
        self.log.append(("wait", w))
        return msg

    def issue(self, payload, slot, n):
        b = payload
        self.issued.append(b)
        checks = [self.checks[b]] if b in self.checks else []
        flight = _Flight("one", [b], ModelEvent(self.log, f"copy {b}", self.copy_after),
                         ModelEvent(self.log, f"done {b}", self.done_after), checks)
        self.flights[(b % self.workers, slot)] = flight
        return flight

    def give_back(self, w, slot):
        assert slot not in self.free[w], f"buffer {slot} of worker {w} given back twice"
        flight = self.flights.pop((w, slot))
        assert flight.copied.finished, f"buffer {slot} of worker {w} given back before its copy finished"
        self.log.append(("give back", flight.arrays[0]))
        self.free[w].append(slot)

    def lookahead(self, depth):
        return _Lookahead(self.workers, depth, self.poll, self.wait, self.issue, self.give_back)


def run_model(model, depth):
    """Every batch the look-ahead hands out, checking the depth and the order on the way."""
    ahead = model.lookahead(depth)
    out = []
    while (flight := ahead.next()) is not None:
        b = flight.arrays[0]
        out.append(b)
        in_flight = len(model.issued) - len(out)  # issued, not handed out yet
        assert 0 <= in_flight <= depth - 1, (b, in_flight)
    return out, ahead


@pytest.mark.parametrize("workers", [1, 2, 3])
@pytest.mark.parametrize("depth", [1, 2, 3, 4])
def test_lookahead_is_in_order_bounded_and_never_deadlocks(workers, depth):
    rng = np.random.default_rng(workers * 10 + depth)
    for copy_after, done_after in ((0, 0), (3, 5), (None, None), (12, 1)):
        late = set(rng.choice(40, 15, replace=False).tolist())  # batches whose worker is slow the first time
        seen = set()

        def ready(b):
            if b in late and b not in seen:
                seen.add(b)
                return False
            return True

        model = ModelPipeline(workers, 40, ready, copy_after, done_after)
        out, _ = run_model(model, depth)
        assert out == list(range(40)) and model.issued == list(range(40))


@pytest.mark.parametrize("workers", [1, 2, 3])
@pytest.mark.parametrize("depth", [1, 2, 3, 4])
def test_lookahead_keeps_depth_batches_in_flight_when_workers_are_ready(workers, depth):
    model = ModelPipeline(workers, 30, copy_after=0, done_after=0)  # copies finish at once: buffers are free
    ahead = model.lookahead(depth)
    for i in range(30):
        assert ahead.next().arrays[0] == i
        # batches i+1 .. i+depth-1 are issued too; at the start a worker holds only two buffers, which come
        # back at the next request (W = 1, depth 4: 2, then 4, then 5 issued)
        assert len(model.issued) <= min(i + depth, 30)
        if i >= depth or depth <= 2 * workers:
            assert len(model.issued) == min(i + depth, 30)
    assert ahead.next() is None


def test_lookahead_gives_buffers_back_only_after_their_copy_and_syncs_before_waiting():
    # copies never finish on their own: a buffer goes back only when its event is synchronized, and that
    # happens only when the worker needs it for the batch the caller waits for
    model = ModelPipeline(2, 12, copy_after=None, done_after=None)
    out, _ = run_model(model, 4)
    assert out == list(range(12))
    assert all(kind != "give back" or ("sync", f"copy {b}") in model.log[:k]
               for k, (kind, b) in enumerate(model.log))
    # with 2 workers x 2 buffers and copies that never finish, look-ahead stops at 4 batches held; batch 4 needs
    # worker 0's buffers back: the copies of batches 0 and 2 are synchronized, and only then is batch 4 awaited
    first_wait_for_4 = model.log.index(("wait", 0), 1)
    assert {("sync", "copy 0"), ("sync", "copy 2")} <= set(model.log[:first_wait_for_4])
    assert ("sync", "copy 1") not in model.log[:first_wait_for_4]  # worker 1's buffers are not needed yet


def bad_file(name):
    def check():
        raise RuntimeError(f"DevicePNGList: cannot decode {name} on the GPU: Adler-32 checksum mismatch")
    return check


@pytest.mark.parametrize("depth", [1, 3])
def test_deferred_check_raises_at_the_next_request(depth):
    model = ModelPipeline(2, 10, copy_after=2, done_after=None, checks={4: bad_file("bad.png")})
    ahead = model.lookahead(depth)
    for i in range(5):
        assert ahead.next().arrays[0] == i  # batch 4 itself is handed out: its decode has not been checked yet
    assert ("sync", "done 4") not in model.log
    with pytest.raises(RuntimeError, match="cannot decode bad.png on the GPU"):
        ahead.next()
    assert ("sync", "done 4") in model.log  # its work was waited for (it would not finish on its own here)
    ahead.check_handed_out()  # raised once, not again


def test_deferred_check_of_the_last_batch_raises_at_the_end_and_in_close():
    model = ModelPipeline(3, 7, copy_after=1, done_after=1, checks={6: bad_file("last.png")})
    ahead = model.lookahead(2)
    assert [ahead.next().arrays[0] for _ in range(7)] == list(range(7))
    with pytest.raises(RuntimeError, match="last.png"):
        ahead.next()  # instead of the end of the epoch
    model = ModelPipeline(3, 7, copy_after=1, done_after=1, checks={2: bad_file("two.png")})
    ahead = model.lookahead(3)
    for _ in range(3):
        ahead.next()
    with pytest.raises(RuntimeError, match="two.png"):
        ahead.check_handed_out()  # what the iterator's close() runs
    ahead.drain()  # waits for the last issued batch's work
    assert ("sync", f"done {model.issued[-1]}") in model.log
    good = ModelPipeline(1, 3, copy_after=0, done_after=None)  # no checks: nothing waits on `done`
    run_model(good, 2)
    assert not [e for e in good.log if e[0] == "sync" and e[1].startswith("done")]


# ---------------------------------------------------------------- the device path end to end, with a fake CuPy
def fake_cupy(monkeypatch):
    import sys
    import types
    from frost.backend import cuda
    fake = FakeCupy()
    monkeypatch.setattr(cuda, "cupy", lambda: fake)
    monkeypatch.setattr(cuda, "is_available", lambda: True)
    monkeypatch.setattr(cuda, "_kept_streams", {})  # copy streams of this fake, not of an earlier test's
    pinned = types.SimpleNamespace(empty_pinned=lambda shape, dtype: np.empty(shape, dtype))
    monkeypatch.setitem(sys.modules, "cupyx", pinned)
    return fake


@pytest.mark.parametrize("workers", [1, 2, 3])
@pytest.mark.parametrize("prefetch", [1, 2, 3, 4])
def test_device_lookahead_with_worker_threads_keeps_order(monkeypatch, workers, prefetch):
    fake = fake_cupy(monkeypatch)
    older = set(loader_threads())  # e.g. a worker of an earlier test still sleeping in a slow item
    ds = Squares(97)
    reference = collect(DataLoader(ds, batch_size=3, shuffle=True, seed=9, num_workers=0))
    loader = DataLoader(ds, batch_size=3, shuffle=True, seed=9, num_workers=workers, device="cuda",
                        prefetch_to_device=prefetch)
    got = [tuple(t.numpy().copy() for t in batch) for batch in loader]
    assert len(got) == len(reference) == 33
    for (x, y), (rx, ry) in zip(got, reference):
        np.testing.assert_array_equal(x, rx)
        np.testing.assert_array_equal(y, ry)
    # a wait per batch on the caller's stream, and one per copy stream at the end (the batches' memory goes back)
    assert fake.log.count("copy") == 2 * 33 and fake.log.count("wait") == 33 + prefetch
    assert wait_no_loader_threads(ignore=older) == []


def test_device_lookahead_copies_ahead_of_the_caller(monkeypatch):
    fake = fake_cupy(monkeypatch)
    it = iter(DataLoader(Squares(60), batch_size=4, num_workers=3, device="cuda", prefetch_to_device=3))
    deadline = time.monotonic() + 5
    while not all(len(ch) == 2 for ch in it._run.ready) and time.monotonic() < deadline:
        time.sleep(0.005)  # let every worker fill both its buffers
    x, _ = next(it)
    assert x.numpy()[:, 0, 0].tolist() == [0, 1, 2, 3]
    assert fake.log.count("copy") == 3 * 2  # batches 0, 1 and 2 (2 fields each) issued when batch 0 is handed out
    x, _ = next(it)
    assert x.numpy()[:, 0, 0].tolist() == [4, 5, 6, 7]
    assert fake.log.count("copy") == 4 * 2  # and batch 3 with batch 1
    it.close()


def test_a_finish_hook_without_defer_is_still_called(monkeypatch):
    fake_cupy(monkeypatch)

    class Doubled(Squares):
        def finish_on_device(self, fields):
            return [fields[0] * 2, fields[1]]

    got = collect(DataLoader(Doubled(10), batch_size=4, num_workers=2, device="cuda"))
    assert np.concatenate([x[:, 0, 0] for x, _ in got]).tolist() == [2 * i for i in range(10)]


class TorchSquares(torch.utils.data.Dataset):
    def __len__(self):
        return 12

    def __getitem__(self, i):
        return np.full((2, 3), i, np.uint16).astype(np.int32), i * i


@pytest.mark.parametrize("workers", [0, 2])
def test_sampler_and_batch_sampler_give_torchs_batches(workers):
    sampler = [5, 0, 11, 3, 3, 7, 1]  # any iterable of indices: repeats and a subset allowed
    batches = [[4, 2, 9], [0], [1, 2, 3, 10, 11]]  # sizes differ; one is larger than batch_size's default
    cases = [(dict(sampler=sampler, batch_size=3), dict(sampler=sampler, batch_size=3)),
             (dict(sampler=sampler, batch_size=3, drop_last=True), dict(sampler=sampler, batch_size=3, drop_last=True)),
             (dict(batch_sampler=batches), dict(batch_sampler=batches))]
    for ours, theirs in cases:
        loader = DataLoader(Squares(12), num_workers=workers, **ours)
        got = [(x.numpy().astype(np.int32).tolist(), y.numpy().tolist()) for x, y in loader]
        want = [(x.numpy().tolist(), y.numpy().tolist()) for x, y in torch.utils.data.DataLoader(TorchSquares(),
                                                                                                 **theirs)]
        assert got == want and len(loader) == len(want), ours


def test_sampler_and_batch_sampler_exclude_the_options_they_replace():
    with pytest.raises(ValueError, match="sampler option is mutually exclusive with shuffle"):
        DataLoader(Squares(4), sampler=[0, 1], shuffle=True)
    for bad in (dict(batch_size=2), dict(shuffle=True), dict(sampler=[0]), dict(drop_last=True)):
        with pytest.raises(ValueError, match="batch_sampler option is mutually exclusive with batch_size, shuffle"):
            DataLoader(Squares(4), batch_sampler=[[0, 1]], **bad)


def test_the_device_path_raises_a_failure_after_the_batches_before_it():
    """The GPU path polls ahead of the batch it hands out; a failure met ahead waits for its turn (CPU fakes)."""
    from frost.data.loader import _Run

    class FailsAtFive(Dataset):
        def __len__(self):
            return 8

        def __getitem__(self, i):
            if i == 5:
                raise ValueError("bad sample 5")
            return np.full(3, i, np.float32)

    class Done:
        done = True

        def synchronize(self):
            pass

    run = _Run(DataLoader(FailsAtFive(), batch_size=1, num_workers=2), 0, 2)
    lookahead = _Lookahead(2, 2, poll=run._poll, wait=run._wait, give_back=run._give_back, fail=run._raise_if_failed,
                           issue=lambda buffers, slot, n: _Flight(buffers.kind, [buffers.slots[slot][0][:n].copy()],
                                                                  Done(), Done(), []))
    time.sleep(0.2)  # the workers run ahead, as they do while the GPU computes
    handed = []
    try:
        with pytest.raises(DataLoaderWorkerError, match="failed on batch 5, sample 5: ValueError: bad sample 5"):
            while (flight := lookahead.next()) is not None:
                handed.append(int(flight.arrays[0][0, 0]))
    finally:
        run.shutdown()
    assert handed == [0, 1, 2, 3, 4]


# ---------------------------------------------------------------- reproducible randomness with workers
class Augmented(Dataset):
    """Generated 8x8 RGB images under a random pad-crop and flip (frost.data.transforms, which draw from Frost's CPU
    generator); item i sleeps a little, so that workers finish in a scrambled order."""

    def __init__(self, n=48):
        self.images = np.random.default_rng(0).integers(0, 256, (n, 8, 8, 3), dtype=np.uint8)
        self.labels = np.arange(n) % 4
        self.augment = transforms.Compose([transforms.RandomCrop(8, padding=2), transforms.RandomHorizontalFlip(),
                                           transforms.ToFloat()])

    def __len__(self):
        return len(self.images)

    def __getitem__(self, i):
        time.sleep(0.0005 * (i % 3))
        return self.augment(self.images[i]), self.labels[i]


def train_losses(workers, steps=12, **loader_args):
    """Losses of a small model trained on Augmented batches, with one draw of the caller's own per step (as dropout
    makes): the loader's draws must neither depend on its workers nor move the caller's generator."""
    frost.manual_seed(0)
    model = frost.nn.Linear(8 * 8 * 3, 4)
    opt = frost.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(Augmented(), batch_size=8, shuffle=True, drop_last=True, num_workers=workers, **loader_args)
    losses = []
    while len(losses) < steps:
        for x, y in loader:
            noise = frost.randn(*x.shape) * 0.01
            loss = frost.nn.functional.cross_entropy(model((x + noise).reshape(len(x), -1)), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
            if len(losses) == steps:
                break
    return losses


def test_training_with_random_augmentation_is_the_same_bitwise_with_any_number_of_workers():
    inline = train_losses(0)
    assert train_losses(4) == inline  # float equality: bit for bit
    assert train_losses(4) == inline
    assert train_losses(1) == inline
    assert train_losses(0, seed=1) != inline  # the losses do follow the seed (12 steps cover two epochs)


def test_each_batch_has_its_own_draws_and_each_epoch_new_ones():
    loader = DataLoader(Augmented(16), batch_size=4, num_workers=3, seed=5)
    first, second = collect(loader), collect(loader)
    assert [x.tobytes() for x, _ in first] == [x.tobytes() for x, _ in collect(DataLoader(Augmented(16), batch_size=4,
                                                                                        num_workers=0, seed=5))]
    # no shuffle: the same images each epoch, augmented anew (a pad-crop of 8x8 by 2 rarely repeats)
    assert all(not np.array_equal(a, b) for (a, _), (b, _) in zip(first, second))
    crops = {x[i].tobytes() for x, _ in first for i in range(len(x))}
    assert len(crops) == 16  # no two samples drew the same crop and flip (no generator is shared by accident)


def test_generator_gives_each_iteration_its_order_and_seeds():
    def run(g):
        loader = DataLoader(Augmented(16), batch_size=4, shuffle=True, num_workers=2, generator=g)
        return [collect(loader) for _ in range(2)]

    a, b = run(np.random.default_rng(3)), run(np.random.default_rng(3))
    for epoch_a, epoch_b in zip(a, b):
        assert [x.tobytes() for x, _ in epoch_a] == [x.tobytes() for x, _ in epoch_b]
    assert [x.tobytes() for x, _ in a[0]] != [x.tobytes() for x, _ in a[1]]
    g = np.random.default_rng(3)
    DataLoader(Squares(4), batch_size=2, generator=g)
    assert g.integers(2**63) == np.random.default_rng(3).integers(2**63)  # one draw per iteration, none at creation
    with pytest.raises(ValueError, match="seed and generator"):
        DataLoader(Squares(4), seed=1, generator=np.random.default_rng(0))
    with pytest.raises(TypeError, match="numpy.random.Generator"):
        DataLoader(Squares(4), generator=3)


def test_worker_init_fn_and_get_worker_info_as_pytorch():
    seen = {}
    lock = threading.Lock()

    def init(worker_id):
        info = get_worker_info()
        with lock:
            seen[worker_id] = (info.id, info.num_workers, info.seed, info.dataset, frost.rand(1).item())

    ds = Squares(12)
    loader = DataLoader(ds, batch_size=2, num_workers=3, seed=9, worker_init_fn=init)
    collect(loader)
    assert sorted(seen) == [0, 1, 2]
    base = seen[0][2]
    for w, (wid, n, seed, dataset, drawn) in seen.items():
        assert (wid, n, seed, dataset) == (w, 3, base + w, ds)
        # the worker's own generator: seeded base seed + id, as PyTorch seeds each worker process
        assert drawn == frost.tensor(np.random.default_rng(seed).random(1, dtype=np.float32)).item()
    assert get_worker_info() is None
    collect(loader)  # a new iteration, a new base seed
    assert seen[0][2] != base
    inline = []
    collect(DataLoader(ds, batch_size=2, worker_init_fn=inline.append))
    assert inline == []  # no worker, no worker_init_fn (PyTorch's num_workers=0)


def test_a_failing_worker_init_fn_is_a_worker_error():
    def init(worker_id):
        raise OSError(f"no device for worker {worker_id}")

    with pytest.raises(DataLoaderWorkerError, match="worker 0 failed.*OSError: no device for worker 0"):
        collect(DataLoader(Squares(4), batch_size=2, num_workers=1, worker_init_fn=init))


def test_an_iterable_dataset_draws_per_batch_too():
    class Noise(IterableDataset):
        def __iter__(self):
            for i in range(10):
                yield frost.rand(2).numpy(), get_worker_info() is not None

    inline = collect(DataLoader(Noise(), batch_size=3, seed=4))
    threaded = collect(DataLoader(Noise(), batch_size=3, seed=4, num_workers=2))
    assert [x.tobytes() for x, _ in inline] == [x.tobytes() for x, _ in threaded]
    assert not inline[0][1].any() and threaded[0][1].all()


# ---------------------------------------------------------------- timeout
class Hangs(Dataset):
    """Sample i is (i, i); sample `at` waits for `release` first: a read that hangs (a dead network mount)."""

    def __init__(self, n, at, release):
        self.n, self.at, self.release = n, at, release

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if i == self.at:
            self.release.wait()
        return np.full(2, i, np.int64)


def test_a_stuck_worker_times_out_naming_it_and_its_batch_and_the_others_stop():
    """Before, iteration waited for ever. Now: every batch before the stuck one, then the error; the other worker
    ends at once; the stuck thread runs on until its read returns, then ends too."""
    release, before = threading.Event(), loader_threads()
    loader = DataLoader(Hangs(12, 5, release), batch_size=2, num_workers=2, timeout=1)  # batch 2 is worker 0's
    got, start = [], time.monotonic()
    with pytest.raises(DataLoaderTimeoutError, match=r"DataLoader: worker 0 has delivered no batch within "
                                                     r"timeout=1 s; it is loading batch 2, sample 5\. The other "
                                                     r"workers are stopped"):
        for x in loader:
            got.append(x.numpy()[:, 0].tolist())
    assert time.monotonic() - start < 5
    assert got == [[0, 1], [2, 3]]
    try:
        assert [t.name for t in wait_no_loader_threads(limit=2.0, ignore=before)] == ["frost-loader-0"]
    finally:
        release.set()
    assert wait_no_loader_threads(ignore=before) == []


def test_a_worker_stuck_in_worker_init_fn_times_out_saying_so():
    release, before = threading.Event(), loader_threads()
    loader = DataLoader(Squares(8), batch_size=2, num_workers=2, timeout=0.5,
                        worker_init_fn=lambda w: w == 1 and release.wait())
    with pytest.raises(DataLoaderTimeoutError, match=r"worker 1 has delivered no batch within timeout=0.5 s; it is "
                                                     r"still before its first batch \(in worker_init_fn\?\)"):
        list(loader)
    release.set()
    assert wait_no_loader_threads(ignore=before) == []


def test_a_timeout_that_is_not_reached_changes_nothing():
    slow = TensorDataset(frost.arange(40))
    expected = [b[0].numpy().copy() for b in DataLoader(slow, batch_size=4, shuffle=True, seed=3)]
    got = [b[0].numpy().copy() for b in DataLoader(slow, batch_size=4, shuffle=True, seed=3, num_workers=3,
                                                   timeout=5)]
    assert len(got) == len(expected) == 10
    for a, b in zip(got, expected):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("timeout, workers, match", [
    (-1, 2, r"timeout must be a number of seconds >= 0 \(0 waits for ever\), got -1"),
    ("5", 2, r"timeout must be a number of seconds >= 0"),
    (True, 2, r"timeout must be a number of seconds >= 0"),
    (float("inf"), 2, r"timeout must be a number of seconds >= 0"),
    (1.5, 0, r"timeout=1.5 needs num_workers > 0"),
])
def test_timeout_must_be_seconds_and_needs_workers(timeout, workers, match):
    with pytest.raises(ValueError, match=r"DataLoader: " + match):
        DataLoader(Squares(4), num_workers=workers, timeout=timeout)


def test_a_stuck_worker_does_not_hold_up_the_interpreters_exit():
    """The stuck worker is a daemon thread: the process ends once the caller is done, the read still hanging."""
    code = textwrap.dedent("""
        import threading
        import numpy as np
        from frost.data import Dataset
        from frost.data.loader import DataLoader, DataLoaderTimeoutError

        class Hangs(Dataset):
            def __len__(self):
                return 8

            def __getitem__(self, i):
                if i == 3:
                    threading.Event().wait()  # for ever
                return np.float32(i)

        try:
            for _ in DataLoader(Hangs(), batch_size=1, num_workers=2, timeout=0.5):
                pass
        except DataLoaderTimeoutError as e:
            print(e)
    """)
    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ, PYTHONPATH=str(root))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=15)
    assert out.returncode == 0, out.stderr
    assert "worker 1 has delivered no batch within timeout=0.5 s; it is loading batch 3, sample 3" in out.stdout


def test_a_flight_keeps_the_host_buffers_it_copies_from_until_its_copy_is_done(monkeypatch):
    # a worker thread that ends drops its pinned buffers; CuPy's pinned pool hands freed memory out again at once,
    # so the next batch's buffer took it while a queued copy had not read it yet (a batch got the next one's
    # lengths and indices under GPU load): the flight holds its sources until `copied`
    fake_cupy(monkeypatch)
    kind, fields = _fields((np.arange(8).reshape(4, 2), np.arange(4)))
    buffers = _BatchBuffers(kind, len(fields), 4, None, 2)
    buffers.put_batch(0, kind, fields, 4)
    source = weakref.ref(buffers.slots[0][0])
    flight = _GpuCopier(frost.backend.Device("cuda")).issue(buffers, 0, 4)
    del buffers
    gc.collect()
    assert source() is not None  # the worker's buffers are gone, the copy's source is not
    flight.copied = HeldEvent()  # done only when the test says so
    flight.worker, flight.slot = 0, 0
    ahead = _Lookahead(1, 1, poll=None, wait=None, issue=None, give_back=lambda w, slot: None)
    ahead.copying = [flight]
    for _ in range(3):  # the copy is still queued: the buffer stays
        ahead._recycle()
        gc.collect()
        assert source() is not None and ahead.copying == [flight]
    flight.copied.done = True
    ahead._recycle()
    gc.collect()
    assert flight.sources is None and source() is None and ahead.copying == []


class HeldEvent:
    def __init__(self) -> None:
        self.done = False

    def synchronize(self) -> None:
        self.done = True


def test_drain_lets_go_of_the_host_buffers_once_the_copies_are_done():
    sources = [np.zeros(4)]
    flight = _Flight("one", [], HeldEvent(), HeldEvent(), [], sources=sources)
    source = weakref.ref(sources[0])
    del sources
    ahead = _Lookahead(1, 1, poll=None, wait=None, issue=None, give_back=lambda w, slot: None)
    ahead.copying = [flight]
    ahead.drain()
    gc.collect()
    assert flight.done.done and flight.sources is None and source() is None


def test_worker_processes_need_shared_memory_only_when_there_are_workers(monkeypatch):
    from frost.data import shm
    monkeypatch.setattr(shm, "available", lambda: False)
    with pytest.raises(RuntimeError, match=r"worker_type='process' needs POSIX shared memory, which this system "
                                           r"lacks; use worker threads"):
        DataLoader(Squares(5), batch_size=2, num_workers=2, worker_type="process")
    loader = DataLoader(Squares(5), batch_size=2, num_workers=0, worker_type="process")   # the caller's thread loads
    assert [tuple(y.numpy()) for _, y in loader] == [(0, 1), (4, 9), (16,)]


def test_a_ctrl_c_in_drain_is_raised_after_every_flight_is_waited_for():
    class InterruptedOnce(HeldEvent):
        calls = 0

        def synchronize(self) -> None:
            InterruptedOnce.calls += 1
            if InterruptedOnce.calls == 1:
                raise KeyboardInterrupt
            super().synchronize()

    flights = [_Flight(str(k), [], HeldEvent(), InterruptedOnce() if k == 0 else HeldEvent(), [],
                       sources=[np.zeros(2)]) for k in range(3)]
    ahead = _Lookahead(1, 1, poll=None, wait=None, issue=None, give_back=lambda w, slot: None)
    ahead.copying = flights
    with pytest.raises(KeyboardInterrupt):
        ahead.drain()
    # the interrupted flight is waited for again, the others as usual; every host buffer is let go after its wait
    assert all(f.done.done and f.sources is None for f in flights)
