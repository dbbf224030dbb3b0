"""Shared, dynamic and register arrays, barriers, atomics, warp shuffles and warp reductions: compiled and simulated."""
import numpy as np
import pytest

import frost
from frost.kernel import (Array, SimulationError, atomic_add, atomic_cas, atomic_max, ballot, bdx, bx,
                          dynamic_shared, f32, i32, kernel, lane, local, shared, shfl_down, shfl_idx, shfl_xor,
                          static_range, syncthreads, tx, ty, u32, warp, warp_max, warp_sum)

ARCH = "sm_90"


def test_block_reduction_with_shared_memory():
    @kernel
    def block_sum(x: Array[f32], out: Array[f32], n: i32):
        s = shared(f32, 64)
        i = bx * 64 + tx
        s[tx] = x[i] if i < n else 0.0
        syncthreads()
        stride = 32
        while stride > 0:
            if tx < stride:
                s[tx] += s[tx + stride]
            syncthreads()
            stride //= 2
        if tx == 0:
            out[bx] = s[0]
    block_sum.compile(ARCH)
    x = np.random.default_rng(0).standard_normal(150).astype(np.float32)
    out = np.zeros(3, np.float32)
    block_sum.simulate[3, 64](x, out, 150)
    np.testing.assert_allclose(out, [x[:64].sum(), x[64:128].sum(), x[128:].sum()], rtol=1e-5)


def test_missing_barrier_is_visible_and_shared_is_2d():
    @kernel
    def transpose_tile(a: Array[f32, 2], b: Array[f32, 2]):
        t = shared(f32, (8, 9))
        t[ty, tx] = a[ty, tx]
        syncthreads()
        b[ty, tx] = t[tx, ty]
    transpose_tile.compile(ARCH)
    a = np.arange(64, dtype=np.float32).reshape(8, 8)
    b = np.zeros_like(a)
    transpose_tile.simulate[1, (8, 8)](a, b)
    np.testing.assert_array_equal(b, a.T)


def test_dynamic_shared_and_local_arrays():
    @kernel
    def rev(x: Array[f32], y: Array[f32]):
        s = dynamic_shared(f32)
        r = local(f32, (2, 3))
        for i in static_range(2):
            for j in static_range(3):
                r[i, j] = f32(i * 3 + j)
        s[tx] = x[tx] + r[1, 2]
        syncthreads()
        y[tx] = s[len(s) - 1 - tx]
    rev.compile(ARCH)
    x = np.arange(16, dtype=np.float32)
    y = np.zeros(16, np.float32)
    rev.simulate[1, 16, 16 * 4](x, y)
    np.testing.assert_array_equal(y, x[::-1] + 5)


def test_atomics():
    @kernel
    def hist(x: Array[i32], h: Array[i32], mx: Array[f32], first: Array[i32]):
        i = bx * bdx + tx
        atomic_add(h, x[i], 1)
        atomic_max(mx, 0, f32(x[i]) * 0.5)
        atomic_cas(first, 0, -1, i)
    hist.compile(ARCH)
    x = np.random.default_rng(1).integers(0, 5, 96).astype(np.int32)
    h, mx, first = np.zeros(5, np.int32), np.full(1, -np.inf, np.float32), np.full(1, -1, np.int32)
    hist.simulate[3, 32](x, h, mx, first)
    np.testing.assert_array_equal(h, np.bincount(x, minlength=5))
    assert mx[0] == x.max() * 0.5 and first[0] == 0


def test_shuffles_ballot_and_warp_reductions():
    @kernel
    def warps(x: Array[f32], out: Array[f32], bits: Array[u32]):
        v = x[tx]
        out[tx] = shfl_xor(v, 1)
        out[64 + tx] = shfl_down(v, 4)
        out[128 + tx] = shfl_idx(v, 3)
        out[192 + tx] = warp_sum(v)
        out[256 + tx] = warp_max(v)
        b = ballot(v > 0.0)
        if lane == 0:
            bits[warp] = b
    src = warps.source
    assert "__shfl_xor_sync" in src and "warp_sum_" in src
    warps.compile(ARCH)
    x = np.random.default_rng(2).standard_normal(64).astype(np.float32)
    out, bits = np.zeros(320, np.float32), np.zeros(2, np.uint32)
    warps.simulate[1, 64](x, out, bits)
    lanes = np.arange(64)
    w = x.reshape(2, 32)
    np.testing.assert_array_equal(out[:64], x[lanes ^ 1])
    down = np.where(lanes % 32 + 4 < 32, lanes + 4, lanes)
    np.testing.assert_array_equal(out[64:128], x[down])
    np.testing.assert_array_equal(out[128:192], x[(lanes // 32) * 32 + 3])
    np.testing.assert_allclose(out[192:256], np.repeat(w.sum(1), 32), rtol=1e-5)
    np.testing.assert_array_equal(out[256:320], np.repeat(w.max(1), 32))
    want_bits = [sum(1 << k for k in range(32) if w[r, k] > 0) for r in range(2)]
    np.testing.assert_array_equal(bits, want_bits)


def test_integer_warp_sum_is_generic():
    @kernel
    def isum(x: Array[i32], out: Array[i32]):
        out[tx] = warp_sum(x[tx])
    isum.compile(ARCH)
    x = np.arange(32, dtype=np.int32)
    out = np.zeros(32, np.int32)
    isum.simulate[1, 32](x, out)
    assert (out == x.sum()).all()


def test_barrier_in_divergent_code_deadlocks_with_a_message():
    @kernel
    def bad(x: Array[f32]):
        if tx < 4:
            syncthreads()
        else:
            x[tx] = 2.0
            syncthreads()
        x[tx] = 1.0
    with pytest.raises(SimulationError, match="divergent barrier"):
        bad.simulate[1, 8](np.zeros(8, np.float32))


def test_warp_operation_after_lanes_exit_is_an_error():
    @kernel
    def bad(x: Array[f32]):
        if tx >= 20:
            return
        x[tx] = warp_sum(x[tx])
    with pytest.raises(SimulationError, match="lanes .* have exited"):
        bad.simulate[1, 32](np.zeros(32, np.float32))


def test_cuda_source_compiles_and_caches(tmp_path, monkeypatch):
    from frost.kernel import compile as kc
    monkeypatch.setenv("FROST_CACHE_DIR", str(tmp_path))
    code = 'extern "C" __global__ void scale(float* x, float a, int n) {' \
           ' int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) x[i] *= a; }'
    k = frost.cuda_source(code, "scale")
    n0 = kc.stats["nvrtc_compiles"]
    assert k.compile(ARCH)[:4] == b"\x7fELF"
    assert frost.cuda_source(code, "scale").compile(ARCH) == k.compile(ARCH)
    assert kc.stats["nvrtc_compiles"] == n0 + 1
    with pytest.raises(frost.kernel.KernelError, match="no kernel named 'nope'"):
        frost.cuda_source(code, "nope")
    assert k.params == [("x", "float*"), ("a", "float"), ("n", "int")]
