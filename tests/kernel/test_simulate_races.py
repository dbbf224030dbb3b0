"""The simulator's shared-memory race detector: two threads of a block touching one shared address, at least one
writing, with no barrier between, fail naming the kernel, the array, the index, both threads and both lines."""
import inspect

import ml_dtypes
import numpy as np
import pytest

from frost.kernel import (Array, SimulationError, atomic_add, bdx, bf16, bx, cp_async16, cp_commit, cp_wait, f32,
                          i32, kernel, lane, ldmatrix_x4, local, shared, shfl_xor, static_range, syncthreads, tx, ty)
from frost.kernel import simulate
from frost.kernel.simulate import SharedMemoryRaceError


def _line_of(k, text: str) -> int:
    """The file line of the first line of a kernel's source that contains text."""
    lines, first = inspect.getsourcelines(k.fn)
    return first + next(n for n, line in enumerate(lines) if text in line)


@kernel
def tree_sum_without_barriers(x: Array[f32], out: Array[f32]):
    s = shared(f32, 64)
    s[tx] = x[bx * 64 + tx]
    stride = 32
    while stride > 0:
        if tx < stride:
            s[tx] += s[tx + stride]
        stride //= 2
    if tx == 0:
        out[bx] = s[0]


@kernel
def tree_sum(x: Array[f32], out: Array[f32]):
    s = shared(f32, 64)
    s[tx] = x[bx * 64 + tx]
    syncthreads()
    stride = 32
    while stride > 0:
        if tx < stride:
            s[tx] += s[tx + stride]
        syncthreads()
        stride //= 2
    if tx == 0:
        out[bx] = s[0]


def _tree_sum_twin(x: np.ndarray) -> np.ndarray:
    """tree_sum in NumPy: the same pairwise order of f32 additions."""
    s = x.reshape(-1, 64).copy()
    stride = 32
    while stride:
        s[:, :stride] = s[:, :stride] + s[:, stride:2 * stride]
        stride //= 2
    return s[:, 0]


def test_missing_syncthreads_in_a_reduction_is_a_race():
    x = np.random.default_rng(0).standard_normal(128).astype(np.float32)
    write = _line_of(tree_sum_without_barriers, "s[tx] = x[bx * 64 + tx]")
    read = _line_of(tree_sum_without_barriers, "s[tx] += s[tx + stride]")
    # thread 0 runs first and reads s[32], s[16], ..., s[1]; thread 1 then writes s[1]
    with pytest.raises(SharedMemoryRaceError,
                       match=rf"tree_sum_without_barriers: block \(0, 0, 0\) thread \(1, 0, 0\) at "
                             rf".*test_simulate_races.py:{write}: data race on shared array 's' at index 1: this "
                             rf"thread writes it, and block \(0, 0, 0\) thread \(0, 0, 0\) read it at "
                             rf".*test_simulate_races.py:{read}, with no syncthreads\(\) between"):
        tree_sum_without_barriers.simulate[2, 64](x, np.zeros(2, np.float32))
    assert issubclass(SharedMemoryRaceError, SimulationError)


def test_the_reduction_with_syncthreads_matches_its_numpy_twin():
    x = np.random.default_rng(1).standard_normal(192).astype(np.float32)
    out = np.zeros(3, np.float32)
    tree_sum.simulate[3, 64](x, out)
    np.testing.assert_array_equal(out, _tree_sum_twin(x))
    np.testing.assert_allclose(out, x.reshape(3, 64).astype(np.float64).sum(1), rtol=1e-5)


def test_the_detector_can_be_turned_off(monkeypatch):
    monkeypatch.setattr(simulate, "race_check", False)
    x = np.ones(64, np.float32)
    out = np.zeros(1, np.float32)
    tree_sum_without_barriers.simulate[1, 64](x, out)
    assert np.isnan(out[0])  # thread 0 read s[32], s[16], ... before their threads wrote them: still NaN


def test_a_race_after_a_barrier_in_the_second_phase():
    @kernel
    def shift_left(x: Array[f32], y: Array[f32]):
        s = shared(f32, 32)
        s[tx] = x[tx]
        syncthreads()
        s[tx] = s[tx] * 2.0
        y[tx] = s[(tx + 1) % 32]
    write = _line_of(shift_left, "s[tx] = s[tx] * 2.0")
    read = _line_of(shift_left, "y[tx] = s[(tx + 1) % 32]")
    with pytest.raises(SharedMemoryRaceError,
                       match=rf"shift_left: block \(0, 0, 0\) thread \(1, 0, 0\) at .*:{write}: data race on shared "
                             rf"array 's' at index 1: this thread writes it, and block \(0, 0, 0\) thread "
                             rf"\(0, 0, 0\) read it at .*:{read}"):
        shift_left.simulate[1, 32](np.arange(32, dtype=np.float32), np.zeros(32, np.float32))


def test_read_read_sharing_is_not_a_race():
    @kernel
    def broadcast(x: Array[f32], y: Array[f32]):
        s = shared(f32, 2)
        if tx == 0:
            s[0] = x[0]
            s[1] = x[1]
        syncthreads()
        y[tx] = s[0] * f32(tx) + s[1]  # every thread reads both, no barrier between the reads
    x = np.array([2.0, 0.5], np.float32)
    y = np.zeros(64, np.float32)
    broadcast.simulate[1, 64](x, y)
    np.testing.assert_array_equal(y, 2.0 * np.arange(64, dtype=np.float32) + 0.5)


@kernel
def shared_histogram(x: Array[i32], hist: Array[i32], n: i32):
    h = shared(i32, 8)
    if tx < 8:
        h[tx] = 0
    syncthreads()
    i = bx * bdx + tx
    if i < n:
        atomic_add(h, x[i], 1)  # many threads, one address, no barrier between: atomics do not race
    syncthreads()
    if tx < 8:
        atomic_add(hist, tx, h[tx])


def test_atomic_add_on_shared_memory_is_not_a_race():
    x = np.random.default_rng(2).integers(0, 8, 300).astype(np.int32)
    hist = np.zeros(8, np.int32)
    shared_histogram.simulate[3, 128](x, hist, 300)
    np.testing.assert_array_equal(hist, np.bincount(x, minlength=8))


def test_a_plain_read_of_an_atomically_updated_address_is_a_race():
    @kernel
    def count_then_read(out: Array[i32]):
        c = shared(i32, 1)
        if tx == 0:
            c[0] = 0
        syncthreads()
        atomic_add(c, 0, 1)
        out[tx] = c[0]  # the count so far: other threads may still be adding
    add = _line_of(count_then_read, "atomic_add(c, 0, 1)")
    read = _line_of(count_then_read, "out[tx] = c[0]")
    with pytest.raises(SharedMemoryRaceError, match=rf"thread \(1, 0, 0\) at .*:{add}: data race on shared array "
                                                    r"'c' at index 0: this thread atomically updates it, and block "
                                                    rf"\(0, 0, 0\) thread \(0, 0, 0\) read it at .*:{read}"):
        count_then_read.simulate[1, 32](np.zeros(32, np.int32))


def test_warp_shuffles_do_not_order_shared_memory():
    # CUDA's __shfl_sync implies no memory barrier: a shuffle between a write and a neighbour's read is no fence
    @kernel
    def neighbour(x: Array[f32], y: Array[f32]):
        s = shared(f32, 32)
        s[lane] = x[lane]
        v = shfl_xor(x[lane], 1)
        y[lane] = s[lane ^ 1] + v
    # every lane writes, all meet at the shuffle, then lane 0 reads lane 1's element
    with pytest.raises(SharedMemoryRaceError, match=r"thread \(0, 0, 0\) at .*: data race on shared array 's' at "
                                                    r"index 1: this thread reads it, and block \(0, 0, 0\) thread "
                                                    r"\(1, 0, 0\) wrote it"):
        neighbour.simulate[1, 32](np.arange(32, dtype=np.float32), np.zeros(32, np.float32))


def test_races_in_2d_views_and_landed_async_copies():
    @kernel
    def transpose_no_barrier(a: Array[f32, 2], b: Array[f32, 2]):
        t = shared(f32, (8, 9))
        t[ty, tx] = a[ty, tx]
        b[ty, tx] = t[tx, ty]
    # thread (1, 0) reads t[1, 0] before thread (0, 1) writes it
    with pytest.raises(SharedMemoryRaceError, match=r"thread \(0, 1, 0\) at .*: data race on shared array 't' at "
                                                    r"index \(1, 0\): this thread writes it, and block \(0, 0, 0\) "
                                                    r"thread \(1, 0, 0\) read it"):
        transpose_no_barrier.simulate[1, (8, 8)](np.ones((8, 8), np.float32), np.zeros((8, 8), np.float32))

    @kernel
    def copy_no_barrier(src: Array[f32], dst: Array[f32]):
        s = shared(f32, 128)
        cp_async16(s, tx * 4, src, tx * 4)
        cp_commit()
        cp_wait(0)
        dst[tx] = s[(tx * 4 + 4) % 128]  # the next thread's copy: it lands at that thread's cp_wait
    wait = _line_of(copy_no_barrier, "cp_wait(0)")
    with pytest.raises(SharedMemoryRaceError, match=rf"thread \(1, 0, 0\) at .*:{wait}: data race on shared array "
                                                    r"'s' at index 4: this thread writes it, and block \(0, 0, 0\) "
                                                    r"thread \(0, 0, 0\) read it"):
        copy_no_barrier.simulate[1, 32](np.arange(128, dtype=np.float32), np.zeros(32, np.float32))


def test_a_wait_with_uncommitted_copies_is_an_error():
    """cp.async.wait_group covers committed groups only: copies issued after the last cp_commit would land at any
    time on the GPU (the simulator used to land them at the thread's exit, after every read had seen NaN)."""
    @kernel
    def uncommitted(src: Array[f32], dst: Array[f32]):
        s = shared(f32, 128)
        cp_async16(s, tx * 4, src, tx * 4)
        cp_wait(0)
        dst[tx] = s[tx * 4]
    with pytest.raises(SimulationError, match=r"uncommitted: .*cp_wait\(0\): this thread has 1 cp_async16 copy not "
                                              r"yet committed, which the wait does not cover: call cp_commit\(\)"):
        uncommitted.simulate[1, 32](np.arange(128, dtype=np.float32), np.zeros(32, np.float32))


def test_ldmatrix_reads_are_each_lanes_own():
    @kernel
    def fragment_without_barrier(a: Array[bf16, 2], out: Array[f32]):
        sa = shared(bf16, (16, 16))
        for k in static_range(8):
            sa[tx // 2, (tx % 2) * 8 + k] = a[tx // 2, (tx % 2) * 8 + k]
        af = local(bf16, 8)
        ldmatrix_x4(af, sa, (lane % 16, lane // 16 * 8))
        out[tx] = f32(af[0])
    write = _line_of(fragment_without_barrier, "sa[tx // 2, (tx % 2) * 8 + k] =")
    load = _line_of(fragment_without_barrier, "ldmatrix_x4(af, sa,")
    # lane 1 loads row 1, which thread 2 wrote
    with pytest.raises(SharedMemoryRaceError, match=rf"thread \(1, 0, 0\) at .*:{load}: data race on shared array "
                                                    rf"'sa' at index \(1, 0\): this thread reads it, and block "
                                                    rf"\(0, 0, 0\) thread \(2, 0, 0\) wrote it at .*:{write}"):
        fragment_without_barrier.simulate[1, 32](np.ones((16, 16), ml_dtypes.bfloat16), np.zeros(32, np.float32))
