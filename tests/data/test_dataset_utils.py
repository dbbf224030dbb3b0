"""Subset, random_split, ConcatDataset and iterable datasets by protocol against torch.utils.data; the DataLoader's
prefetch_factor and persistent_workers."""
import threading
import time
import warnings

import numpy as np
import pytest

import frost
from frost.data import (ConcatDataset, DataLoader, Dataset, IterableDataset, Subset, TensorDataset,
                        is_iterable_dataset, random_split)

torch = pytest.importorskip("torch")
tud = torch.utils.data


class Squares(Dataset):
    """Sample i is (i, i * i), as NumPy values."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __getitem__(self, i: int):
        if not 0 <= i < self.n:
            raise IndexError(i)
        return np.int64(i), np.float64(i * i)

    def __len__(self) -> int:
        return self.n


class TorchStream(tud.IterableDataset):
    """A PyTorch IterableDataset (it inherits a __getitem__ that only raises): tensors (i, 2 i) for i < n."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self):
        return ((torch.tensor(i), torch.tensor([2.0 * i, -1.0])) for i in range(self.n))


def batches(loader) -> list[list[np.ndarray]]:
    """Each batch's fields as NumPy copies (a batch of single values is one field)."""
    return [[t.numpy().copy() for t in (batch if isinstance(batch, (list, tuple)) else [batch])] for batch in loader]


def torch_batches(loader) -> list[list[np.ndarray]]:
    return [[t.numpy().copy() for t in batch] for batch in loader]


def assert_same_batches(got, want) -> None:
    assert len(got) == len(want)
    for i, (a, b) in enumerate(zip(got, want)):
        for x, y in zip(a, b):
            np.testing.assert_array_equal(x, y, err_msg=f"batch {i}")


# ---------------------------------------------------------------- Subset
def test_subset_reads_its_indices_as_torch_subset():
    data = Squares(10)
    indices = [7, 0, 3, 3, 9]
    ours, theirs = Subset(data, indices), tud.Subset(data, indices)
    assert len(ours) == len(theirs) == 5
    assert [ours[i] for i in range(5)] == [theirs[i] for i in range(5)]
    assert ours[[1, 4]] == [theirs[1], theirs[4]]  # a list of samples (torch hands the list to the dataset)
    assert ours[-1] == data[9]
    assert Subset(data, [-1, -10])[0] == data[9] and Subset(data, [-1, -10])[1] == data[0]  # rows from the end


def test_subset_passes_get_batch_through_to_the_loader():
    values = np.arange(20.0).reshape(10, 2)
    sub = Subset(TensorDataset(values), np.array([9, 2, 5, 5, 0]))
    np.testing.assert_array_equal(sub.get_batch(np.array([0, 3]))[0], values[[9, 5]])
    assert_same_batches(batches(DataLoader(sub, batch_size=2, num_workers=2)),
                        [[values[[9, 2]]], [values[[5, 5]]], [values[[0]]]])
    assert not hasattr(Subset(Squares(4), [1]), "get_batch")  # the loader then reads sample by sample


def test_subset_bad_indices_are_named():
    with pytest.raises(IndexError, match="Subset: index 10 is out of range for a dataset of 10 samples"):
        Subset(Squares(10), [1, 10])
    with pytest.raises(IndexError, match="Subset: index -11"):
        Subset(Squares(10), [-11])
    with pytest.raises(TypeError, match="Subset: indices must be a flat sequence of ints"):
        Subset(Squares(10), [0.5, 1.0])
    with pytest.raises(TypeError, match="Subset: TorchStream is an iterable dataset"):
        Subset(TorchStream(3), [0])


# ---------------------------------------------------------------- random_split
@pytest.mark.parametrize("n,fractions", [(10, [0.3, 0.7]), (11, [0.5, 0.25, 0.25]), (7, [0.1, 0.1, 0.8]),
                                         (103, [0.6, 0.2, 0.2]), (5, [1.0])])
def test_random_split_fractions_give_torchs_lengths(n, fractions):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a split may be empty, as torch warns too
        ours = random_split(Squares(n), fractions, generator=np.random.default_rng(0))
        theirs = tud.random_split(Squares(n), fractions)
    assert [len(s) for s in ours] == [len(s) for s in theirs]
    assert sorted(i for s in ours for i in s.indices) == list(range(n))  # disjoint, and covering the dataset


def test_random_split_counts_and_reproducibility():
    data = Squares(12)
    first = random_split(data, [5, 4, 3], generator=np.random.default_rng(7))
    again = random_split(data, [5, 4, 3], generator=np.random.default_rng(7))
    other = random_split(data, [5, 4, 3], generator=np.random.default_rng(8))
    assert [s.indices for s in first] == [s.indices for s in again] != [s.indices for s in other]
    assert [len(s) for s in first] == [5, 4, 3]
    assert first[0][0] == data[first[0].indices[0]]
    frost.manual_seed(3)
    a = random_split(data, [0.5, 0.5])
    frost.manual_seed(3)
    b = random_split(data, [0.5, 0.5])
    assert [s.indices for s in a] == [s.indices for s in b]


def test_random_split_bad_lengths_are_named():
    data = Squares(10)
    with pytest.raises(ValueError, match=r"random_split: the lengths \[5, 4\] sum to 9, but the dataset has 10"):
        random_split(data, [5, 4])
    with pytest.raises(ValueError, match="random_split: fraction at index 0 is -0.5, not between 0 and 1"):
        random_split(data, [-0.5, 1.5])
    with pytest.raises(ValueError, match="random_split: lengths is empty"):
        random_split(data, [])
    with pytest.raises(TypeError, match="random_split: generator must be a numpy.random.Generator"):
        random_split(data, [5, 5], generator=torch.Generator())
    with pytest.warns(UserWarning, match="random_split: the splits at index 1, 2 have length 0"):
        random_split(Squares(3), [0.9, 0.05, 0.05])


# ---------------------------------------------------------------- ConcatDataset
def test_concat_dataset_as_torchs_including_negative_indices():
    parts = [Squares(3), Squares(0), Squares(5), Subset(Squares(9), [8, 1])]
    ours, theirs = ConcatDataset(parts), tud.ConcatDataset(parts)
    assert len(ours) == len(theirs) == 10 and ours.cumulative_sizes == theirs.cumulative_sizes
    assert [ours[i] for i in range(-10, 10)] == [theirs[i] for i in range(-10, 10)]
    plus = Squares(2) + Squares(3)
    assert isinstance(plus, ConcatDataset) and [plus[i][0] for i in range(5)] == [0, 1, 0, 1, 2]


def test_concat_dataset_in_a_shuffled_threaded_loader_equals_the_inline_one():
    data = ConcatDataset([Squares(7), Squares(6)])
    inline = batches(DataLoader(data, batch_size=4, shuffle=True, seed=5))
    threaded = batches(DataLoader(data, batch_size=4, shuffle=True, seed=5, num_workers=3))
    assert_same_batches(threaded, inline)
    assert sorted(np.concatenate([b[0] for b in inline]).tolist()) == sorted([*range(7), *range(6)])


def test_concat_dataset_errors_are_named():
    with pytest.raises(ValueError, match="ConcatDataset: datasets is empty"):
        ConcatDataset([])
    with pytest.raises(TypeError, match=r"ConcatDataset: dataset 1 \(TorchStream\) is an iterable dataset"):
        ConcatDataset([Squares(2), TorchStream(2)])
    with pytest.raises(IndexError, match="ConcatDataset: index 5 is out of range for 5 samples"):
        (Squares(2) + Squares(3))[5]
    with pytest.raises(IndexError, match="ConcatDataset: index -6"):
        (Squares(2) + Squares(3))[-6]


# ---------------------------------------------------------------- iterable datasets, by protocol
class PlainStream:
    """No base class at all: __iter__ and no __getitem__ make it a stream."""

    def __iter__(self):
        return iter([np.array([i, i + 1]) for i in range(5)])


def test_streams_are_recognized_by_protocol():
    assert is_iterable_dataset(TorchStream(1)) and is_iterable_dataset(PlainStream())
    assert is_iterable_dataset(IterableDataset())
    assert not is_iterable_dataset(Squares(1)) and not is_iterable_dataset([1, 2]) and not is_iterable_dataset(
        tud.TensorDataset(torch.zeros(2)))


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("drop_last", [False, True])
def test_a_torch_iterable_dataset_batches_as_torchs_loader(num_workers, drop_last):
    want = torch_batches(tud.DataLoader(TorchStream(10), batch_size=4, drop_last=drop_last))
    got = batches(DataLoader(TorchStream(10), batch_size=4, drop_last=drop_last, num_workers=num_workers))
    assert_same_batches(got, want)
    assert len(got) == (2 if drop_last else 3)


def test_a_plain_stream_batches_and_refuses_shuffle():
    got = batches(DataLoader(PlainStream(), batch_size=2))
    assert_same_batches(got, [[np.array([[0, 1], [1, 2]])], [np.array([[2, 3], [3, 4]])], [np.array([[4, 5]])]])
    with pytest.raises(ValueError, match="DataLoader: shuffle, sampler and batch_sampler need a map-style dataset"):
        DataLoader(TorchStream(4), shuffle=True)


# ---------------------------------------------------------------- prefetch_factor, persistent_workers
class Recorded(Dataset):
    """Squares that count the samples read so far (the worker's progress)."""

    def __init__(self, n: int) -> None:
        self.n, self.read, self.lock = n, 0, threading.Lock()

    def __getitem__(self, i: int):
        with self.lock:
            self.read += 1
        return np.float64(i)

    def __len__(self) -> int:
        return self.n


def read_after_first_batch(prefetch_factor: int) -> int:
    """Samples one worker has read once the first batch (of 2) is taken and the worker has had time to run on."""
    data = Recorded(40)
    it = iter(DataLoader(data, batch_size=2, num_workers=1, prefetch_factor=prefetch_factor))
    next(it)
    deadline = time.monotonic() + 5
    while data.read < 2 * prefetch_factor and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.1)  # were it to go further, it would have by now
    it.close()
    return data.read


@pytest.mark.parametrize("prefetch_factor", [1, 2, 4])
def test_prefetch_factor_is_how_many_batches_a_worker_loads_ahead(prefetch_factor):
    assert read_after_first_batch(prefetch_factor) == 2 * prefetch_factor  # the batch held and the ones ahead


@pytest.mark.parametrize("prefetch_factor", [1, 3])
def test_prefetch_factor_keeps_the_batches(prefetch_factor):
    data = Squares(23)
    want = batches(DataLoader(data, batch_size=3, shuffle=True, seed=1))
    assert_same_batches(batches(DataLoader(data, batch_size=3, shuffle=True, seed=1, num_workers=3,
                                           prefetch_factor=prefetch_factor)), want)


def test_persistent_workers_keep_every_epoch_the_same():
    data = Squares(11)
    calls = []
    plain = DataLoader(data, batch_size=4, shuffle=True, seed=2, num_workers=2)
    persistent = DataLoader(data, batch_size=4, shuffle=True, seed=2, num_workers=2, persistent_workers=True,
                            worker_init_fn=calls.append)
    for _ in range(2):
        assert_same_batches(batches(persistent), batches(plain))
    assert sorted(calls) == [0, 0, 1, 1]  # threads start per epoch: worker_init_fn runs in each (documented)


@pytest.mark.parametrize("kwargs,match", [
    (dict(prefetch_factor=2), r"DataLoader: prefetch_factor=2 needs num_workers > 0"),
    (dict(prefetch_factor=0, num_workers=1), r"DataLoader: prefetch_factor must be an int >= 1 .*got 0"),
    (dict(prefetch_factor=1.5, num_workers=1), r"DataLoader: prefetch_factor must be an int >= 1 .*got 1.5"),
    (dict(persistent_workers=True), r"DataLoader: persistent_workers=True needs num_workers > 0"),
])
def test_bad_loader_options_are_named(kwargs, match):
    with pytest.raises(ValueError, match=match):
        DataLoader(Squares(4), **kwargs)


@pytest.mark.cuda
@pytest.mark.parametrize("prefetch_factor", [1, 3])
def test_subset_and_concat_on_the_gpu_equal_the_cpu_batches(prefetch_factor):
    # (an int64 and a float64 value) per sample, as Squares gives
    firsts, seconds = np.arange(30, dtype=np.int64), np.arange(30, dtype=np.float64) * 0.5
    data = ConcatDataset([Subset(TensorDataset(firsts, seconds), list(range(29, -1, -2))), Squares(5)])
    cpu = batches(DataLoader(data, batch_size=4, shuffle=True, seed=3))
    gpu = [[t.cpu().numpy() for t in batch] for batch in
           DataLoader(data, batch_size=4, shuffle=True, seed=3, num_workers=2, prefetch_factor=prefetch_factor,
                      device="cuda")]
    assert_same_batches(gpu, cpu)
