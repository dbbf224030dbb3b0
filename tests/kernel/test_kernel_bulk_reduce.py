"""Bulk reductions into global memory (cp_reduce_async_bulk_add, cp_async_bulk_commit / _wait / _wait_read): blocks
that each hold a part of a sum in shared memory add it into one float32 accumulator, one instruction a block, as
FlashAttention-3's backward adds dQ. The simulator reads the shared source at the wait that retires its group (the
latest time the hardware may), so a kernel that rewrites the source too early computes a wrong sum."""
import numpy as np
import pytest

from frost.kernel import (Array, Const, KernelError, SimulationError, bx, cp_async_bulk_commit, cp_async_bulk_wait,
                          cp_async_bulk_wait_read, cp_reduce_async_bulk_add, f32, fence_proxy_async, i32, kernel,
                          shared, syncthreads, tx)
from frost.kernel.simulate import SharedMemoryRaceError

N = 256   # f32 elements a block adds


def _summing():
    @kernel
    def rows_summed(x: Array[f32], out: Array[f32], rounds: i32, EARLY: Const[int]):
        """Block b adds rows b * rounds ... b * rounds + rounds - 1 of x (N wide, scaled by round + 1) into out, a
        row at a time through a shared buffer; with EARLY the buffer is rewritten before the previous add has read
        it."""
        buf = shared(f32, N)
        for r in range(rounds):
            if tx == 0 and not EARLY:
                cp_async_bulk_wait_read(0)   # the previous round's add has read buf
            syncthreads()
            for i in range(tx, N, 128):
                buf[i] = x[(bx * rounds + r) * N + i] * (r + 1)
            fence_proxy_async()
            syncthreads()
            if tx == 0:
                cp_reduce_async_bulk_add(out, 0, buf, 0, N * 4)
                cp_async_bulk_commit()
        if tx == 0:
            cp_async_bulk_wait(0)
    return rows_summed


def _want(x, blocks, rounds):
    rows = x.reshape(blocks, rounds, N).astype(np.float64)
    return (rows * np.arange(1, rounds + 1)[None, :, None]).sum(axis=(0, 1))


def test_blocks_add_their_rows_into_one_accumulator():
    blocks, rounds = 3, 4
    x = np.random.default_rng(0).standard_normal(blocks * rounds * N).astype(np.float32)
    out = np.full(N, 0.5, np.float32)
    _summing().simulate[blocks, 128](x, out, rounds, EARLY=0)
    np.testing.assert_allclose(out, _want(x, blocks, rounds) + 0.5, rtol=1e-5, atol=1e-5)


def test_rewriting_the_source_before_a_wait_retired_it_is_an_error():
    x = np.random.default_rng(1).standard_normal(2 * 3 * N).astype(np.float32)
    with pytest.raises(SimulationError, match=r"rows_summed: .*cp_reduce_async_bulk_add: its source buf\[0:256\] was "
                                              r"written before a cp_async_bulk_wait_read or cp_async_bulk_wait "
                                              r"retired it"):
        _summing().simulate[2, 128](x, np.zeros(N, np.float32), 3, EARLY=1)


def test_issuing_before_the_other_threads_stores_are_ordered_is_a_race():
    @kernel
    def unordered(out: Array[f32]):
        buf = shared(f32, 64)
        if tx < 64:
            buf[tx] = 1.0
        if tx == 0:   # no barrier: the copy engine may read buf before threads 1..63 wrote it
            cp_reduce_async_bulk_add(out, 0, buf, 0, 256)
            cp_async_bulk_commit()
            cp_async_bulk_wait(0)
    with pytest.raises(SharedMemoryRaceError):
        unordered.simulate[1, 64](np.zeros(64, np.float32))


def test_the_adds_land_at_the_full_wait_not_at_the_read_wait():
    @kernel
    def read_then_full(out: Array[f32], seen: Array[f32]):
        buf = shared(f32, 4)
        if tx < 4:
            buf[tx] = 2.0
        fence_proxy_async()
        syncthreads()
        if tx == 0:
            cp_reduce_async_bulk_add(out, 0, buf, 0, 16)
            cp_async_bulk_commit()
            cp_async_bulk_wait_read(0)
            seen[0] = out[0]   # PTX promises only that buf was read: the add may not have landed
            cp_async_bulk_wait(0)
            seen[1] = out[0]
    out, seen = np.ones(4, np.float32), np.zeros(2, np.float32)
    read_then_full.simulate[1, 32](out, seen)
    assert list(seen) == [1.0, 3.0] and list(out) == [3.0] * 4


def test_exiting_with_reductions_in_flight_is_an_error():
    @kernel
    def unwaited(out: Array[f32]):
        buf = shared(f32, 4)
        if tx < 4:
            buf[tx] = 1.0
        fence_proxy_async()
        syncthreads()
        if tx == 0:
            cp_reduce_async_bulk_add(out, 0, buf, 0, 16)
            cp_async_bulk_commit()
    with pytest.raises(SimulationError, match=r"ended with bulk reductions in flight \(not waited for\): call "
                                              r"cp_async_bulk_commit\(\) and cp_async_bulk_wait\(0\)"):
        unwaited.simulate[1, 32](np.zeros(4, np.float32))


def _bad_size(out: Array[f32]):
    buf = shared(f32, 8)
    cp_reduce_async_bulk_add(out, 0, buf, 0, 24)


def _bad_direction(out: Array[f32]):
    buf = shared(f32, 8)
    cp_reduce_async_bulk_add(buf, 0, out, 0, 16)


def _bad_arguments(out: Array[f32]):
    buf = shared(f32, 8)
    cp_reduce_async_bulk_add(out, 0, buf, 0)


def _bad_wait(out: Array[f32]):
    cp_async_bulk_wait(64)


@pytest.mark.parametrize("bad, message", [
    (_bad_size, r"24 bytes is not a positive multiple of 16"),
    (_bad_direction, r"adds a 1-D shared f32 array into a 1-D global f32 one"),
    (_bad_arguments, r"takes 5 arguments"),
    (_bad_wait, r"cp_async_bulk_wait\(64\): n must be 0..63"),
])
def test_bad_reductions_are_refused_when_the_kernel_is_built(bad, message):
    with pytest.raises(KernelError, match=message):
        kernel(bad).source


def test_misaligned_source_is_an_error_at_run_time():
    @kernel
    def misaligned(out: Array[f32], at: i32):
        buf = shared(f32, 16)
        if tx == 0:
            cp_reduce_async_bulk_add(out, 0, buf, at, 16)
            cp_async_bulk_commit()
            cp_async_bulk_wait(0)
    with pytest.raises(SimulationError, match=r"buf\[1\] is not 16-byte aligned in shared memory"):
        misaligned.simulate[1, 32](np.zeros(16, np.float32), 1)


def test_reductions_become_ptx_and_compile_for_sm_90a():
    kern = _summing()
    source = kern.source_for(EARLY=0)
    assert "cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32" in source
    assert "cp.async.bulk.commit_group;" in source and "cp.async.bulk.wait_group.read 0;" in source
    assert "cp.async.bulk.wait_group 0;" in source
    info = kern.inspect("sm_90", EARLY=0)
    assert "cp.reduce.async.bulk" in info["ptx"]   # sm_90 has it (no 'a' features needed)


@pytest.mark.cuda
def test_gpu_blocks_add_their_rows_into_one_accumulator():
    import cupy as cp
    blocks, rounds = 64, 5
    x = np.random.default_rng(2).standard_normal(blocks * rounds * N).astype(np.float32)
    out = cp.full(N, 0.5, cp.float32)
    _summing()[blocks, 128](cp.asarray(x), out, rounds, EARLY=0)
    np.testing.assert_allclose(cp.asnumpy(out), _want(x, blocks, rounds) + 0.5, rtol=1e-4, atol=1e-4)
