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


def test_ctrl_c_in_the_caller_stops_the_workers_without_hanging(tmp_path):
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
                for _ in DataLoader(Slow(), batch_size=2, num_workers=2, worker_type="process"):
                    print("batch", flush=True)
            except KeyboardInterrupt:
                print("interrupted", flush=True)
    """)
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
def test_cuda_batches_from_worker_processes_match_the_cpu_loader():
    """device="cuda" with worker processes: each batch copied from its shared-memory slot, kept batches intact."""
    ds = Augmented()
    cpu = collect(DataLoader(ds, batch_size=8, shuffle=True, seed=4))
    gpu = DataLoader(ds, batch_size=8, shuffle=True, seed=4, num_workers=2, worker_type="process", device="cuda")
    kept = [list(batch.values()) for batch in gpu]
    assert kept[0][0].device == "cuda:0"
    assert_same([[t.numpy() for t in batch] for batch in kept], cpu)
