"""Tile views, cp.async, ldmatrix and mma.sync: compiled to sm_90 and simulated with the PTX fragment layouts."""
import ml_dtypes
import numpy as np
import pytest

from frost.kernel import (Array, Const, KernelError, SimulationError, bf16, bx, by, cp_async16, cp_commit, cp_wait,
                          f16, f32, i32, kernel, lane, ldmatrix_x2, ldmatrix_x2_trans, ldmatrix_x4, ldmatrix_x4_trans,
                          local, mma, mma_16x8x16, shared, static_range, syncthreads, tx, ty)

from examples_loader import load_example


def test_tile_views():
    @kernel
    def tiles(a: Array[f32, 2], out: Array[f32, 2]):
        t = a.tile((4, 8), (by, bx))
        u = out.tile((4, 8), (by, bx))
        u[ty, tx] = t[ty, tx] + 1.0
    tiles.compile("sm_90")
    a = np.arange(8 * 16, dtype=np.float32).reshape(8, 16)
    out = np.zeros_like(a)
    tiles.simulate[(2, 2), (8, 4)](a, out)
    np.testing.assert_array_equal(out, a + 1)
    with pytest.raises(SimulationError, match=r"index \(0, 8\) is out of bounds for array 'a.tile"):
        @kernel
        def over(a: Array[f32, 2]):
            t = a.tile((4, 8), (0, 0))
            t[0, 8] = 1.0
        over.simulate[1, 1](a)


def _single_mma(kind):
    @kernel
    def mma_once(a: Array[kind, 2], b: Array[kind, 2], c: Array[f32, 2]):
        sa = shared(kind, (16, 16))
        sb = shared(kind, (16, 8))
        for k in static_range(8):
            sa[tx // 2, (tx % 2) * 8 + k] = a[tx // 2, (tx % 2) * 8 + k]
        for k in static_range(4):
            sb[tx // 2, (tx % 2) * 4 + k] = b[tx // 2, (tx % 2) * 4 + k]
        syncthreads()
        af = local(kind, 8)
        bf = local(kind, 4)
        acc = local(f32, 4)
        for q in static_range(4):
            acc[q] = 1.0
        ldmatrix_x4(af, sa, (lane % 16, lane // 16 * 8))
        ldmatrix_x2_trans(bf, sb, (lane % 16, 0))
        mma_16x8x16(acc, af, bf)
        g = lane // 4
        t = lane % 4
        for q in static_range(4):
            c[g + 8 * (q // 2), 2 * t + q % 2] = acc[q]
    return mma_once


@pytest.mark.parametrize("kind, np_type", [(bf16, ml_dtypes.bfloat16), (f16, np.float16)])
def test_single_warp_mma_matches_numpy(kind, np_type):
    k = _single_mma(kind)
    src = k.source
    assert "mma.sync.aligned.m16n8k16.row.col.f32." + kind.name in src and "ldmatrix.sync.aligned.m8n8.x2.trans" in src
    k.compile("sm_90")
    rng = np.random.default_rng(0)
    a = rng.standard_normal((16, 16)).astype(np_type)
    b = rng.standard_normal((16, 8)).astype(np_type)
    c = np.zeros((16, 8), np.float32)
    k.simulate[1, 32](a, b, c)
    np.testing.assert_allclose(c, a.astype(np.float64) @ b.astype(np.float64) + 1, rtol=1e-5, atol=1e-5)


def test_ldmatrix_non_transposed_b_layout():
    # B given transposed (N x K, "col" layout) is loaded with the plain ldmatrix.
    @kernel
    def mma_bt(a: Array[bf16, 2], bt: Array[bf16, 2], c: Array[f32, 2]):
        sa = shared(bf16, (16, 16))
        sb = shared(bf16, (8, 16))
        for k in static_range(8):
            sa[tx // 2, (tx % 2) * 8 + k] = a[tx // 2, (tx % 2) * 8 + k]
        for k in static_range(4):
            sb[tx // 4, (tx % 4) * 4 + k] = bt[tx // 4, (tx % 4) * 4 + k]
        syncthreads()
        af = local(bf16, 8)
        bf = local(bf16, 4)
        acc = local(f32, 4)
        for q in static_range(4):
            acc[q] = 0.0
        ldmatrix_x4(af, sa, (lane % 16, lane // 16 * 8))
        ldmatrix_x2(bf, sb, (lane % 8, (lane // 8) % 2 * 8))
        mma_16x8x16(acc, af, bf)
        for q in static_range(4):
            c[lane // 4 + 8 * (q // 2), 2 * (lane % 4) + q % 2] = acc[q]
    mma_bt.compile("sm_90")
    rng = np.random.default_rng(1)
    a = rng.standard_normal((16, 16)).astype(ml_dtypes.bfloat16)
    bt = rng.standard_normal((8, 16)).astype(ml_dtypes.bfloat16)
    c = np.zeros((16, 8), np.float32)
    mma_bt.simulate[1, 32](a, bt, c)
    np.testing.assert_allclose(c, a.astype(np.float64) @ bt.astype(np.float64).T, rtol=1e-5, atol=1e-5)


def tf32_mma_once():
    """One m16n8k8 TF32 step: A (16 x 8) through ldmatrix_x4 of a shared f32 tile, B (8 x 8) read into its
    fragment element by element as the PTX layout says (b0 = B[t, g], b1 = B[t + 4, g]), C starting at 1."""
    @kernel
    def tf32_once(a: Array[f32, 2], b: Array[f32, 2], c: Array[f32, 2]):
        sa = shared(f32, (16, 8))
        for k in static_range(4):
            sa[tx // 2, (tx % 2) * 4 + k] = a[tx // 2, (tx % 2) * 4 + k]
        syncthreads()
        af = local(f32, 4)
        bf = local(f32, 2)
        acc = local(f32, 4)
        for q in static_range(4):
            acc[q] = 1.0
        ldmatrix_x4(af, sa, (lane % 16, lane // 16 * 4))
        g = lane // 4
        t = lane % 4
        bf[0] = b[t, g]
        bf[1] = b[t + 4, g]
        mma(acc, af, bf)
        for q in static_range(4):
            c[g + 8 * (q // 2), 2 * t + q % 2] = acc[q]
    return tf32_once


def _tf32(v):
    return (v.astype(np.float32).view(np.uint32) & np.uint32(0xFFFFE000)).view(np.float32).astype(np.float64)


def test_tf32_mma_matches_numpy():
    k = tf32_mma_once()
    assert "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32" in k.source
    k.compile("sm_90")
    rng = np.random.default_rng(2)
    a = rng.standard_normal((16, 8)).astype(np.float32)
    b = rng.standard_normal((8, 8)).astype(np.float32)
    c = np.zeros((16, 8), np.float32)
    k.simulate[1, 32](a, b, c)
    np.testing.assert_allclose(c, _tf32(a) @ _tf32(b) + 1, rtol=1e-6, atol=1e-6)   # operands cut to TF32
    exact = a.astype(np.float64) @ b.astype(np.float64) + 1
    assert np.abs(c - exact).max() > 1e-6   # the cut is there ...
    np.testing.assert_allclose(c, exact, rtol=0, atol=8 * 2.0 ** -10 * np.abs(a).max() * np.abs(b).max())  # ... small


def test_mma_takes_bf16_fragments_as_mma_16x8x16():
    @kernel
    def both(a: Array[bf16, 2], c: Array[f32]):
        sa = shared(bf16, (16, 16))
        af = local(bf16, 8)
        bf = local(bf16, 4)
        acc = local(f32, 4)
        ldmatrix_x4(af, sa, (lane % 16, lane // 16 * 8))
        mma(acc, af, bf)
    assert "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32" in both.source


def test_cp_async_lands_only_after_wait():
    @kernel
    def copy(src: Array[f32], dst: Array[f32], early: Array[f32]):
        s = shared(f32, 128)
        for q in static_range(4):
            s[tx * 4 + q] = -1.0
        syncthreads()
        cp_async16(s, tx * 4, src, tx * 4)
        cp_commit()
        early[tx] = s[tx * 4]       # a race on the GPU; the simulator shows the stale value
        cp_wait(0)
        syncthreads()
        for q in static_range(4):
            dst[tx * 4 + q] = s[tx * 4 + q]
    assert "cp.async.cg.shared.global" in copy.source and "cp.async.wait_group 0" in copy.source
    copy.compile("sm_90")
    src = np.arange(128, dtype=np.float32)
    dst, early = np.zeros(128, np.float32), np.zeros(32, np.float32)
    copy.simulate[1, 32](src, dst, early)
    np.testing.assert_array_equal(dst, src)
    assert (early == -1).all()


def test_tensor_core_argument_errors():
    from frost.kernel import KernelError

    def bad(a: Array[bf16, 2]):
        s = shared(bf16, (16, 16))
        f = local(bf16, 4)
        ldmatrix_x4(f, s, (0, 0))
    with pytest.raises(KernelError, match="ldmatrix_x4.. writes a local bf16 or f16 fragment of 8 elements"):
        kernel(bad).source

    def bad_trans(a: Array[f32]):
        s = shared(f32, (16, 8))
        f = local(f32, 4)
        ldmatrix_x4_trans(f, s, (0, 0))
    with pytest.raises(KernelError, match=r"ldmatrix_x4_trans.. reads 16-bit elements of a shared array \(or, "
                                          r"without .trans, f32 ones\)"):
        kernel(bad_trans).source

    def bad_mma(a: Array[f32]):
        af = local(f32, 4)
        bf = local(bf16, 4)
        acc = local(f32, 4)
        mma(acc, af, bf)
    with pytest.raises(KernelError, match=r"mma.. takes fragments local\(f32, 4\) and either"):
        kernel(bad_mma).source

    def bad2(a: Array[f32]):
        s = shared(f32, 16)
        cp_async16(a, 0, s, 0)
    with pytest.raises(KernelError, match="copies from a global array to a shared one"):
        kernel(bad2).source


def test_tiled_gemm_example_simulated():
    gemm = load_example("gemm")
    assert gemm.gemm_bf16.compile("sm_90")[:4] == b"\x7fELF"            # the 128x128x32 tiles of the benchmark
    assert gemm.gemm_bf16.compile("sm_90", **gemm.SMALL)[:4] == b"\x7fELF"
    gemm.main(64, 64, 64)
    rng = np.random.default_rng(3)   # a non-square case: 2 x 1 blocks, 3 K slices
    a = rng.standard_normal((128, 96)).astype(ml_dtypes.bfloat16)
    b = rng.standard_normal((96, 64)).astype(ml_dtypes.bfloat16)
    c = np.zeros((128, 64), np.float32)
    gemm.gemm(a, b, c, simulate=True, **gemm.SMALL)
    np.testing.assert_allclose(c, a.astype(np.float64) @ b.astype(np.float64), rtol=1e-4, atol=1e-3)


def test_tiles_of_shared_and_global_arrays_pass_to_device_functions():
    import frost
    from frost.kernel import grid

    @frost.kernel.device
    def tile_sum(t: Array[f32, 2]) -> f32:
        s = 0.0
        for i, j in grid(t.shape[0], t.shape[1]):
            s += t[i, j]
        return s

    @kernel
    def sums(a: Array[f32, 2], out: Array[f32]):
        sh = shared(f32, (8, 8))
        sh[tx // 8, tx % 8] = a[tx // 8, tx % 8]
        syncthreads()
        if tx < 4:
            out[tx] = tile_sum(sh.tile((4, 4), (tx // 2, tx % 2))) + tile_sum(a.tile((2, 8), (tx, 0)))
    sums.compile("sm_90")
    a = np.arange(64, dtype=np.float32).reshape(8, 8)
    out = np.zeros(4, np.float32)
    sums.simulate[1, 64](a, out)
    want = [a[t // 2 * 4:t // 2 * 4 + 4, t % 2 * 4:t % 2 * 4 + 4].sum() + a[2 * t:2 * t + 2].sum() for t in range(4)]
    np.testing.assert_array_equal(out, want)


def test_gemm_block_order_covers_every_tile():
    # 3 x 2 blocks with groups of 2 block-rows: the swizzled order must still write every tile of C once.
    gemm = load_example("gemm")
    rng = np.random.default_rng(4)
    a = rng.standard_normal((192, 32)).astype(ml_dtypes.bfloat16)
    b = rng.standard_normal((32, 128)).astype(ml_dtypes.bfloat16)
    c = np.full((192, 128), np.nan, np.float32)
    gemm.gemm(a, b, c, simulate=True, **dict(gemm.SMALL, GROUP=2))
    np.testing.assert_allclose(c, a.astype(np.float64) @ b.astype(np.float64), rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("cols", [16, 32, 64, 128, 256])
def test_swizzle_is_a_bank_conflict_free_permutation(cols):
    from frost.kernel import swizzle

    @kernel
    def table(out: Array[i32, 2], COLS: Const[int]):
        for c in range(COLS):
            out[tx, c] = swizzle(tx, c, COLS)
    assert table.compile("sm_90", COLS=cols)[:4] == b"\x7fELF"
    out = np.full((64, cols), -1, np.int32)
    table.simulate[1, 64](out, COLS=cols)
    for r in range(64):
        assert sorted(out[r]) == list(range(cols))                       # a permutation of each row
        assert (out[r] % 8 == np.arange(cols) % 8).all()                 # chunks of 8 elements stay whole
    bank_group = (np.arange(64)[:, None] * cols + out) * 2 // 16 % 8     # 16-byte unit within a 128-byte line
    for r0 in range(0, 64, 8):
        for c in range(0, cols, 8):   # ldmatrix: 8 consecutive rows of one chunk hit 8 different bank groups
            assert len(set(bank_group[r0:r0 + 8, c])) == 8, (r0, c)


@pytest.mark.parametrize("tiles, shape", [
    (dict(BM=64, BN=64, BK=64, WM=32, WN=32, STAGES=3), (64, 64, 128)),       # 64-element rows: key = row % 8
    (dict(BM=64, BN=128, BK=32, WM=32, WN=64, STAGES=2), (64, 128, 96)),     # 32-element A rows, 128-element B rows
    (dict(BM=64, BN=64, BK=16, WM=32, WN=32, STAGES=4), (64, 64, 48)),       # 16-element A rows; more stages than tiles
])
def test_swizzled_gemm_simulated(tiles, shape):
    gemm = load_example("gemm")
    m, n, k = shape
    assert gemm.gemm_bf16_fast.compile("sm_90", **tiles)[:4] == b"\x7fELF"
    assert "__launch_bounds__(" in gemm.gemm_bf16_fast.source_for(**tiles)
    rng = np.random.default_rng(5)
    a = rng.standard_normal((m, k)).astype(ml_dtypes.bfloat16)
    b = rng.standard_normal((k, n)).astype(ml_dtypes.bfloat16)
    c = np.full((m, n), np.nan, np.float32)
    gemm.gemm(a, b, c, simulate=True, kernel="swizzled", **tiles)
    np.testing.assert_allclose(c, a.astype(np.float64) @ b.astype(np.float64), rtol=1e-4, atol=1e-3)


def test_gemm_rejects_tiles_its_threads_cannot_load():
    gemm = load_example("gemm")
    a, b = np.zeros((64, 64), ml_dtypes.bfloat16), np.zeros((64, 64), ml_dtypes.bfloat16)
    with pytest.raises(ValueError, match=r"gemm: a 32x16 tile of A is 64 16-byte chunks, not a multiple of the 128 "
                                         r"threads"):
        gemm.gemm(a, b, np.zeros((64, 64), np.float32), simulate=True, kernel="swizzled",
                  BM=32, BN=64, BK=16, WM=16, WN=32, STAGES=2)


def test_launch_bounds():
    from frost.kernel import launch_bounds

    @kernel
    def bounded(x: Array[f32]):
        launch_bounds(64, 4)
        x[tx] = 1.0
    assert 'extern "C" __global__ void __launch_bounds__(64, 4) bounded(' in bounded.source
    assert bounded.compile("sm_90")[:4] == b"\x7fELF"
    x = np.zeros(64, np.float32)
    bounded.simulate[1, 64](x)
    assert (x == 1).all()
    with pytest.raises(ValueError, match=r"bounded: a block of 128 threads exceeds the kernel's "
                                         r"launch_bounds\(64, 4\)"):
        bounded.simulate[1, 128](np.zeros(128, np.float32))

    @kernel
    def nested(x: Array[f32]):
        if tx == 0:
            launch_bounds(64)
        x[tx] = 1.0
    with pytest.raises(KernelError, match=r"launch_bounds\(\) must be a statement in the body of a kernel"):
        nested.source

    @kernel
    def too_many(x: Array[f32]):
        launch_bounds(2048)
    with pytest.raises(KernelError, match=r"max_threads must be 1..1024"):
        too_many.source
