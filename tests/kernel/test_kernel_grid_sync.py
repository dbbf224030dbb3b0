"""grid_sync(counter): a barrier over the whole grid, in the simulator, in the generated CUDA and on the GPU."""
import numpy as np
import pytest

from frost.kernel import Array, KernelError, bdx, block_sum, bx, f32, gdx, grid_sync, kernel, shared, tx, u32


@kernel
def normalize_by_grid_sum(x: Array[f32], partial: Array[f32], y: Array[f32], counter: Array[u32], n: int):
    """y = x / sum(x) in one launch: each block sums its slice, waits for every block, then reads all the sums."""
    i = bx * bdx + tx
    v = x[i] if i < n else 0.0
    scratch = shared(f32, 32)
    s = block_sum(v, scratch)
    if tx == 0:
        partial[bx] = s
    grid_sync(counter)
    total = 0.0
    for b in range(gdx):  # the same order in every block: the same total everywhere
        total += partial[b]
    if i < n:
        y[i] = v / total


@kernel
def two_rounds(x: Array[f32], counter: Array[u32], n: int):
    """x[i] += x[the next block's first element] twice, a grid_sync before each read and after each write."""
    i = bx * bdx + tx
    for _ in range(2):
        grid_sync(counter)
        nxt = x[((bx + 1) % gdx) * bdx] if i < n else 0.0
        grid_sync(counter)
        if i < n:
            x[i] += nxt


@kernel
def early_exit(x: Array[f32], counter: Array[u32]):
    if bx == 1:
        return
    grid_sync(counter)
    x[bx * bdx + tx] = 1.0


def _normalize_inputs(n=1000, threads=128):
    rng = np.random.default_rng(0)
    x = rng.uniform(0.5, 1.5, n).astype(np.float32)
    blocks = -(-n // threads)
    return x, np.zeros(blocks, np.float32), np.zeros(n, np.float32), np.zeros(1, np.uint32), blocks, threads


def test_simulator_runs_every_block_up_to_the_barrier():
    x, partial, y, counter, blocks, threads = _normalize_inputs()
    normalize_by_grid_sum.simulate[blocks, threads](x, partial, y, counter, len(x))
    np.testing.assert_allclose(y, x / x.astype(np.float64).sum(), rtol=1e-5)


def test_simulator_keeps_blocks_in_step_over_several_barriers():
    n, threads = 4 * 32, 32
    x = np.arange(n, dtype=np.float32)
    two_rounds.simulate[4, threads](x, np.zeros(1, np.uint32), n)
    expect = np.arange(n, dtype=np.float64)
    for _ in range(2):
        firsts = expect[::threads].copy()
        expect = expect + np.repeat(np.roll(firsts, -1), threads)
    np.testing.assert_array_equal(x, expect)


def test_a_block_that_exits_before_the_barrier_is_a_deadlock():
    with pytest.raises(Exception, match="grid_sync.*exited"):
        early_exit.simulate[3, 32](np.zeros(96, np.float32), np.zeros(1, np.uint32))


def test_counter_must_be_a_u32_array_parameter():
    @kernel
    def wrong_counter(x: Array[f32], counter: Array[f32]):
        grid_sync(counter)

    with pytest.raises(KernelError, match=r"grid_sync\(counter\) needs a 1-D Array\[u32\]"):
        wrong_counter.simulate[1, 32](np.zeros(1, np.float32), np.zeros(1, np.float32))


def test_generated_cuda_compiles():
    source = normalize_by_grid_sum.source
    assert "frost_grid_sync((unsigned*)counter)" in source
    assert normalize_by_grid_sum.compile("sm_90")[:4] == b"\x7fELF"


@pytest.mark.cuda
def test_gpu_barrier_matches_numpy_and_needs_no_reset():
    import cupy as cp
    x, partial, y, counter, blocks, threads = _normalize_inputs(100_000, 256)
    dx, dp, dy, dc = (cp.asarray(a) for a in (x, partial, y, counter))
    expect = x / x.astype(np.float64).sum()
    for _ in range(50):  # the counter is left ready for the next launch: never zeroed again
        dy.fill(0)
        normalize_by_grid_sum[blocks, threads](dx, dp, dy, dc, len(x))
    np.testing.assert_allclose(cp.asnumpy(dy), expect, rtol=1e-5)
    assert int(cp.asnumpy(dc)[0]) & 0x7FFFFFFF == 0  # the low bits unchanged, bit 31 flipped 50 times
