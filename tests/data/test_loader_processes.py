"""DataLoader(worker_type="process"): the same batches as threads and num_workers=0, failures naming the sample,
timeouts naming the worker, and no child process or shared-memory segment left behind."""
import gc
import multiprocessing
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

import frost
from frost.data import DataLoader, DataLoaderWorkerError, Dataset, ImageList, IterableDataset, transforms
from frost.data import shm
from frost.data.loader import DataLoaderTimeoutError

pytestmark = [pytest.mark.timeout(60),
              pytest.mark.skipif(not shm.available(), reason="worker processes need POSIX shared memory")]

SHM = Path("/dev/shm")


def frost_segments() -> set[str]:
    """This process's segments (other test runs on the machine make their own)."""
    return {p.name for p in SHM.glob(f"frost_{os.getpid()}_*")} if SHM.is_dir() else set()


def children() -> list:
    return [p for p in multiprocessing.active_children() if p.name.startswith("frost-loader")]


def wait_no_children(limit: float = 3.0) -> list:
    deadline = time.monotonic() + limit
    while children() and time.monotonic() < deadline:
        time.sleep(0.02)
    return children()


@pytest.fixture(autouse=True)
def nothing_left_behind():
    """Every test here: no worker process and no shared-memory segment of Frost's outlives its loader."""
    before = frost_segments()
    yield
    gc.collect()
    assert wait_no_children() == []
    assert frost_segments() - before == set()


class Augmented(Dataset):
    """Random crops and flips from Frost's CPU generator, labels and a float field: batch i depends on its seed."""

    def __init__(self, n=45):
        self.images = np.random.default_rng(0).integers(0, 256, (n, 8, 8, 3), dtype=np.uint8)
        self.augment = transforms.Compose([transforms.RandomCrop(8, padding=2), transforms.RandomHorizontalFlip()])

    def __len__(self):
        return len(self.images)

    def __getitem__(self, i):
        return {"x": self.augment(self.images[i]), "y": np.int64(i), "noise": frost.rand(2).numpy()}


class Batched(Augmented):
    """The same through get_batch (one call per batch, as ImageList's)."""

    def get_batch(self, indices):
        return np.stack([self.augment(self.images[i]) for i in indices]), np.asarray(indices) * 10


class Failing(Dataset):
    def __init__(self, n, bad):
        self.n, self.bad = n, bad

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if i == self.bad:
            raise ValueError(f"cannot load item {i}")
        return np.full(2, i, np.int32)


class Hangs(Dataset):
    def __len__(self):
        return 12

    def __getitem__(self, i):
        if i == 5:
            time.sleep(60)
        return np.full(2, i, np.int64)


class Stream(IterableDataset):
    def __iter__(self):
        for i in range(23):
            yield np.full(3, i, np.int16), frost.rand(1).numpy()


class Custom(Exception):
    pass


class RaisesCustom(Failing):
    def __getitem__(self, i):
        raise Custom(f"custom trouble at {i}")


def collect(loader):
    return [[t.numpy().copy() for t in (b.values() if isinstance(b, dict) else b)] for b in loader]


def assert_same(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert len(x) == len(y)
        for u, v in zip(x, y):
            assert u.dtype == v.dtype
            np.testing.assert_array_equal(u, v)


@pytest.mark.parametrize("dataset", [Augmented, Batched])
def test_processes_give_the_batches_of_threads_and_of_num_workers_0_bit_for_bit(dataset):
    ds = dataset()
    reference = collect(DataLoader(ds, batch_size=4, shuffle=True, seed=3))
    assert_same(collect(DataLoader(ds, batch_size=4, shuffle=True, seed=3, num_workers=2)), reference)
    for workers in (1, 3):
        assert_same(collect(DataLoader(ds, batch_size=4, shuffle=True, seed=3, num_workers=workers,
                                       worker_type="process")), reference)


def test_fork_context_and_epochs_and_an_iterable_dataset():
    ds = Augmented()
    loader = DataLoader(ds, batch_size=5, shuffle=True, seed=1, num_workers=2, worker_type="process",
                        multiprocessing_context="fork", prefetch_factor=3)
    inline = DataLoader(ds, batch_size=5, shuffle=True, seed=1)
    for _ in range(2):  # each epoch its own order and draws, the same in both
        assert_same(collect(loader), collect(inline))
    assert_same(collect(DataLoader(Stream(), batch_size=4, seed=2, num_workers=2, worker_type="process")),
                collect(DataLoader(Stream(), batch_size=4, seed=2)))


def test_png_files_decode_the_same_in_processes(tmp_path):
    from PIL import Image
    images = np.random.default_rng(1).integers(0, 256, (20, 6, 5, 3), dtype=np.uint8)
    paths = []
    for i, image in enumerate(images):
        paths.append(tmp_path / f"{i}.png")
        Image.fromarray(image).save(paths[-1])
    ds = ImageList(paths, np.arange(20))
    got = collect(DataLoader(ds, batch_size=8, num_workers=2, worker_type="process"))
    np.testing.assert_array_equal(np.concatenate([x for x, _ in got]), images)
    (tmp_path / "13.png").write_bytes(b"not a png")
    with pytest.raises(DataLoaderWorkerError, match=r"worker 1 failed on batch 1, samples 8, 9, .*: RuntimeError: "
                                                     r"decode_image: cannot decode .*13\.png"):
        list(DataLoader(ds, batch_size=8, num_workers=2, worker_type="process"))


def test_a_failing_worker_names_the_sample_after_every_batch_before_it():
    got = []
    with pytest.raises(DataLoaderWorkerError, match=r"worker 0 failed on batch 4, sample 17: ValueError: cannot load "
                                                     r"item 17") as info:
        for x in DataLoader(Failing(24, bad=17), batch_size=4, num_workers=2, worker_type="process"):
            got.append(x.numpy()[:, 0].tolist())
    assert got == [list(range(4 * b, 4 * b + 4)) for b in range(4)]
    cause = info.value.__cause__
    assert isinstance(cause, ValueError) and "cannot load item 17" in str(cause)
    assert "__getitem__" in str(cause.__cause__)  # the worker's traceback, as text


def test_an_exception_class_of_the_dataset_keeps_its_name_and_builtin_base():
    with pytest.raises(DataLoaderWorkerError, match="Custom: custom trouble at 0") as info:
        list(DataLoader(RaisesCustom(4, bad=0), batch_size=2, num_workers=1, worker_type="process"))
    assert isinstance(info.value.__cause__, Exception) and type(info.value.__cause__).__name__ == "Custom"


def test_a_stuck_worker_times_out_naming_it_and_is_terminated():
    got, start = [], time.monotonic()
    with pytest.raises(DataLoaderTimeoutError, match=r"worker 0 has delivered no batch within timeout=1 s; it is "
                                                     r"loading batch 2, sample 5\. The workers are stopped"):
        for x in DataLoader(Hangs(), batch_size=2, num_workers=2, timeout=1, worker_type="process"):
            got.append(x.numpy()[:, 0].tolist())
    assert got == [[0, 1], [2, 3]]
    assert time.monotonic() - start < 10


def test_a_worker_that_dies_is_an_error_naming_it():
    with pytest.raises(DataLoaderWorkerError, match=r"worker 0 \(process \d+\) exited unexpectedly with exit code"):
        list(DataLoader(Dies(), batch_size=2, num_workers=1, worker_type="process"))


class Dies(Dataset):
    def __len__(self):
        return 4

    def __getitem__(self, i):
        os._exit(3)


def test_abandoned_and_closed_iterators_leave_no_process_or_segment():
    ds = Augmented(400)
    it = iter(DataLoader(ds, batch_size=4, num_workers=3, worker_type="process"))
    batch = next(it)
    assert len(children()) == 3 and frost_segments()
    del it
    gc.collect()
    assert wait_no_children() == []
    assert batch["x"].numpy().shape == (4, 8, 8, 3)  # the batch held stays readable after its segment is unlinked
    never_started = iter(DataLoader(ds, batch_size=4, num_workers=2, worker_type="process"))
    del never_started
    closed = iter(DataLoader(ds, batch_size=4, num_workers=2, worker_type="process"))
    next(closed)
    closed.close()
    with pytest.raises(StopIteration):
        next(closed)


def test_collate_fn_results_come_back():
    batches = list(DataLoader(Failing(10, bad=-1), batch_size=4, num_workers=2, worker_type="process",
                              collate_fn=collate_sum))
    assert batches == [sum(range(4)) * 2, sum(range(4, 8)) * 2, (8 + 9) * 2]


def collate_sum(samples):
    return int(sum(s.sum() for s in samples))


def test_arguments_and_unpicklable_datasets_are_refused_clearly():
    with pytest.raises(ValueError, match="worker_type must be 'thread' or 'process'"):
        DataLoader(Augmented(), num_workers=2, worker_type="processes")
    with pytest.raises(ValueError, match="multiprocessing_context needs worker_type='process'"):
        DataLoader(Augmented(), num_workers=2, multiprocessing_context="fork")

    class Local(Augmented):  # a local class cannot be pickled to a forkserver worker
        pass

    with pytest.raises(TypeError, match="could not start worker 0 .forkserver start method.*define them at module"):
        list(DataLoader(Local(), batch_size=4, num_workers=1, worker_type="process"))


@pytest.mark.parametrize("persistent_workers", [False, True])
def test_ctrl_c_in_the_caller_stops_the_workers_without_hanging(tmp_path, persistent_workers):
    """SIGINT to the whole process group (as a terminal's Ctrl-C): the caller gets KeyboardInterrupt, the workers
    ignore it and are stopped by the caller; nothing is printed by them and the process ends."""
    code = textwrap.dedent("""
        import sys, time
        import numpy as np
        from frost.data import DataLoader, Dataset

        class Slow(Dataset):
            def __len__(self):
                return 10_000

            def __getitem__(self, i):
                time.sleep(0.01)
                return np.zeros(4, np.float32)

        if __name__ == "__main__":
            try:
                for _ in DataLoader(Slow(), batch_size=2, num_workers=2, worker_type="process",
                                    persistent_workers=PERSISTENT):
                    print("batch", flush=True)
            except KeyboardInterrupt:
                print("interrupted", flush=True)
    """).replace("PERSISTENT", str(persistent_workers))
    script = tmp_path / "ctrl_c.py"
    script.write_text(code)
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    proc = subprocess.Popen([sys.executable, str(script)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        assert proc.stdout.readline().strip() == "batch"
        os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, err
    assert out.strip().endswith("interrupted")
    assert "Traceback" not in err, err


@pytest.mark.cuda
@pytest.mark.parametrize("persistent_workers", [False, True])
def test_cuda_batches_from_worker_processes_match_the_cpu_loader(persistent_workers):
    """device="cuda" with worker processes: each batch copied from its shared-memory slot, kept batches intact;
    with persistent workers, epoch after epoch, after a break too."""
    ds = Augmented()
    inline = DataLoader(ds, batch_size=8, shuffle=True, seed=4)
    gpu = DataLoader(ds, batch_size=8, shuffle=True, seed=4, num_workers=2, worker_type="process", device="cuda",
                     persistent_workers=persistent_workers)
    for epoch in range(3):
        cpu = collect(inline)
        kept = [list(batch.values()) for batch in gpu]
        assert kept[0][0].device == "cuda:0"
        assert_same([[t.numpy() for t in batch] for batch in kept], cpu)
        if epoch == 0:
            for i, _ in enumerate(gpu):  # an epoch left after two batches
                if i == 1:
                    break
            collect(inline)


# ---------------------------------------------------------------- persistent_workers=True
INITS = []  # in a worker process: the worker ids its worker_init_fn has run for


def count_init(worker_id):
    INITS.append(worker_id)


class WhoLoads(Dataset):
    """Each sample says which process loaded it, how often worker_init_fn ran there, and the worker's seed."""

    def __len__(self):
        return 16

    def __getitem__(self, i):
        from frost.data import get_worker_info
        return np.array([os.getpid(), len(INITS), get_worker_info().seed, i], np.int64)


class FailsOnce(Dataset):
    """Each worker's copy counts its reads (it lives across epochs): the 9th read of worker 1's copy fails, which
    is in epoch 2 (6 reads per worker per epoch)."""

    def __init__(self):
        self.reads = 0

    def __len__(self):
        return 12

    def __getitem__(self, i):
        from frost.data import get_worker_info
        self.reads += 1
        if get_worker_info().id == 1 and self.reads == 9:
            raise ValueError(f"second-epoch trouble at {i}")
        return np.full(2, i, np.int32)


def persistent(ds, **kwargs):
    return DataLoader(ds, num_workers=kwargs.pop("num_workers", 2), worker_type="process", persistent_workers=True,
                      **kwargs)


@pytest.mark.parametrize("dataset", [Augmented, Batched])
def test_persistent_workers_give_every_epoch_of_num_workers_0_bit_for_bit(dataset):
    ds = dataset()
    inline = DataLoader(ds, batch_size=4, shuffle=True, seed=3)
    loader = persistent(ds, batch_size=4, shuffle=True, seed=3, num_workers=3)
    for _ in range(3):
        assert_same(collect(loader), collect(inline))
    assert len(children()) == 3  # the same workers wait for the next epoch
    loader.set_epoch(7)
    inline.set_epoch(7)
    assert_same(collect(loader), collect(inline))


def test_persistent_workers_with_fork_a_stream_and_collate_fn():
    ds = Augmented()
    loader = persistent(ds, batch_size=5, shuffle=True, seed=1, multiprocessing_context="fork", prefetch_factor=3)
    inline = DataLoader(ds, batch_size=5, shuffle=True, seed=1)
    stream, inline_stream = persistent(Stream(), batch_size=4, seed=2), DataLoader(Stream(), batch_size=4, seed=2)
    collated = persistent(Failing(10, bad=-1), batch_size=4, collate_fn=collate_sum)
    for _ in range(2):
        assert_same(collect(loader), collect(inline))
        assert_same(collect(stream), collect(inline_stream))
        assert list(collated) == [sum(range(4)) * 2, sum(range(4, 8)) * 2, (8 + 9) * 2]


def test_worker_init_fn_runs_once_per_persistent_worker_process():
    loader = persistent(WhoLoads(), batch_size=2, worker_init_fn=count_init, seed=5)
    epochs = [np.concatenate([b.numpy().copy() for b in loader]) for _ in range(3)]
    pids = {int(p) for p in epochs[0][:, 0]}
    assert len(pids) == 2
    for rows in epochs:
        assert {int(p) for p in rows[:, 0]} == pids  # the same two processes every epoch
        assert (rows[:, 1] == 1).all()  # worker_init_fn has run once in each, before its first epoch
        assert len(set(rows[:, 2].tolist())) == 2  # a seed per worker: the first epoch's base seed + id (PyTorch's)
        np.testing.assert_array_equal(rows[:, 2], epochs[0][:, 2])
        np.testing.assert_array_equal(rows[:, 3], np.arange(16))


def test_break_mid_epoch_then_full_epochs_with_no_batch_of_the_old_epoch():
    ds = Augmented(60)
    inline = DataLoader(ds, batch_size=4, shuffle=True, seed=2)
    reference = [collect(inline) for _ in range(4)]
    loader = persistent(ds, batch_size=4, shuffle=True, seed=2, num_workers=3)
    for i, _ in enumerate(loader):
        if i == 1:
            break
    assert_same(collect(loader), reference[1])
    abandoned = iter(loader)  # an epoch begun, then taken over by a later iter()
    next(abandoned)
    assert_same(collect(loader), reference[3])
    with pytest.raises(RuntimeError, match="ended by a later iter"):
        next(abandoned)
    assert len(children()) == 3  # drained, not restarted


def test_the_batch_held_at_a_break_stays_intact_until_the_next_request():
    """One worker with one slot: the batch held at the break is in the only slot, which the next epoch's worker
    gets back only when the caller asks for the next batch."""
    ds = Augmented(20)
    loader = persistent(ds, batch_size=4, num_workers=1, prefetch_factor=1, seed=1)
    for batch in loader:
        break
    kept = batch["x"].numpy().copy()
    it = iter(loader)
    time.sleep(0.3)  # time enough for the worker to overwrite the slot, were it free
    np.testing.assert_array_equal(batch["x"].numpy(), kept)
    first = next(it)
    assert first["y"].numpy().tolist() == [0, 1, 2, 3]


def test_a_failure_in_epoch_2_is_raised_in_its_place_and_epoch_3_works_with_the_same_workers():
    loader = persistent(FailsOnce(), batch_size=2, num_workers=2)
    expected = [[2 * b, 2 * b + 1] for b in range(6)]
    assert [x.numpy()[:, 0].tolist() for x in loader] == expected
    pids = {p.pid for p in children()}
    got = []
    with pytest.raises(DataLoaderWorkerError, match=r"worker 1 failed on batch 3, sample 6: ValueError: "
                                                     r"second-epoch trouble at 6"):
        for x in loader:
            got.append(x.numpy()[:, 0].tolist())
    assert got == expected[:3]
    assert [x.numpy()[:, 0].tolist() for x in loader] == expected
    assert {p.pid for p in children()} == pids


def test_a_timeout_or_a_dead_worker_ends_persistent_workers_at_once():
    with pytest.raises(DataLoaderTimeoutError, match=r"worker 0 has delivered no batch within timeout=1 s"):
        list(persistent(Hangs(), batch_size=2, timeout=1))
    assert wait_no_children() == []  # terminated by the error, not when the loader is collected
    loader = persistent(Dies(), batch_size=2, num_workers=1)
    for _ in range(2):  # each epoch starts new workers, which die again
        with pytest.raises(DataLoaderWorkerError, match=r"worker 0 \(process \d+\) exited unexpectedly"):
            list(loader)
        assert wait_no_children() == []


def failing_init(worker_id):
    raise KeyError(f"no setup for worker {worker_id}")


def test_a_failing_worker_init_fn_ends_the_persistent_workers_and_the_next_epoch_starts_new_ones():
    loader = persistent(Augmented(), batch_size=4, worker_init_fn=failing_init)
    for _ in range(2):
        with pytest.raises(DataLoaderWorkerError, match=r"worker 0 failed on its start \(worker_init_fn, or before "
                                                         r"its first batch\): KeyError"):
            list(loader)
        assert wait_no_children() == []


def test_persistent_workers_end_with_their_loader():
    loader = persistent(Augmented(), batch_size=4, num_workers=2)
    list(loader)
    list(loader)
    assert len(children()) == 2 and frost_segments()
    it = iter(loader)
    next(it)
    del loader, it  # mid-epoch
    gc.collect()
    assert wait_no_children() == []
