"""A tensor-core bf16 GEMM in the kernel language: a cp.async pipeline, ldmatrix and mma.sync.

C[M, N] (f32) = A[M, K] (bf16, row-major) @ B[K, N] (bf16, row-major). A block computes a BM x BN tile of C
with (BM / WM) x (BN / WN) warps; each warp owns a WM x WN tile made of 16x8 mma tiles. The K loop keeps
STAGES - 1 slices of A and B in flight (cp.async into a ring of shared-memory stages; STAGES=2 is double
buffering) while the tensor cores work on the current one. Shared rows are padded by 8 elements so that the
8 rows an ldmatrix reads fall in 8 different bank groups. gemm_wgmma.py takes the next step on Hopper: warpgroup
MMA (wgmma, sm_90a).
"""
import numpy as np

import frost
from frost.backend import cuda
from frost.kernel import (Array, Const, bf16, bx, by, cp_async16, cp_commit, cp_wait, dynamic_shared, f32, gdx, gdy,
                          i32, i64, lane, launch_bounds, ldmatrix_x4, ldmatrix_x4_trans, local, static_range,
                          store2, swizzle, syncthreads, tx, warp)


@frost.kernel.device
def load_tile(src: Array[bf16, 2], dst: Array[bf16, 2], r0: i32, c0: i32, ROWS: Const[int], COLS: Const[int],
              THREADS: Const[int]):
    """Start copying src[r0:r0+ROWS, c0:c0+COLS] into the shared tile dst, 16 bytes per cp.async."""
    for u in static_range(ROWS * COLS // 8 // THREADS):
        chunk = tx + u * THREADS
        r = chunk // (COLS // 8)
        col = chunk % (COLS // 8) * 8
        cp_async16(dst, (r, col), src, (r0 + r, c0 + col))


@frost.kernel.device
def block_origin(BM: Const[int], BN: Const[int], GROUP: Const[int]) -> (i32, i32):
    """(m0, n0): the first row and column of this block's tile of C. Blocks run in groups of GROUP block-rows,
    column by column, so that the A and B panels they share stay in L2."""
    pid = by * gdx + bx
    in_group = GROUP * gdx
    first_m = pid // in_group * GROUP
    group_m = min(gdy - first_m, GROUP)
    return (first_m + pid % in_group % group_m) * BM, pid % in_group // group_m * BN


@frost.kernel
def gemm_bf16(a: Array[bf16, 2], b: Array[bf16, 2], c: Array[f32, 2], BM: Const[int] = 128, BN: Const[int] = 128,
              BK: Const[int] = 32, WM: Const[int] = 64, WN: Const[int] = 64, STAGES: Const[int] = 3,
              GROUP: Const[int] = 8):
    THREADS: Const[int] = (BM // WM) * (BN // WN) * 32
    sa = dynamic_shared(bf16, (STAGES, BM, BK + 8))
    sb = dynamic_shared(bf16, (STAGES, BK, BN + 8), STAGES * BM * (BK + 8) * 2)
    acc = local(f32, (WM // 16, WN // 8, 4))   # this warp's WM x WN tile of C, as 16x8 mma fragments
    af = local(bf16, (WM // 16, 8))
    bq = local(bf16, (WN // 16, 2, 4))
    wm = warp // (BN // WN)
    wn = warp % (BN // WN)
    m0, n0 = block_origin(BM, BN, GROUP)
    for i in static_range(WM // 16):
        for j in static_range(WN // 8):
            for q in static_range(4):
                acc[i, j, q] = 0.0
    ktiles = i32(a.shape[1]) // BK
    for st in static_range(STAGES - 1):   # prologue: the first STAGES - 1 slices in flight
        if st < ktiles:
            load_tile(a, sa[st], m0, st * BK, BM, BK, THREADS)
            load_tile(b, sb[st], st * BK, n0, BK, BN, THREADS)
        cp_commit()
    for kt in range(ktiles):
        cp_wait(STAGES - 2)   # slice kt has landed (for this thread) ...
        syncthreads()         # ... for every thread; and everyone is done with the stage reloaded below
        nk = kt + STAGES - 1
        if nk < ktiles:
            load_tile(a, sa[nk % STAGES], m0, nk * BK, BM, BK, THREADS)
            load_tile(b, sb[nk % STAGES], nk * BK, n0, BK, BN, THREADS)
        cp_commit()
        s = kt % STAGES
        for kk in static_range(BK // 16):
            for i in static_range(WM // 16):
                ldmatrix_x4(af[i], sa[s], (wm * WM + i * 16 + lane % 16, kk * 16 + lane // 16 * 8))
            for j in static_range(WN // 16):
                ldmatrix_x4_trans(bq[j], sb[s], (kk * 16 + lane % 16, wn * WN + j * 16 + lane // 16 * 8))
            acc += af @ bq   # mma_tile: (WM/16) x (WN/8) mma.sync.m16n8k16 on the tensor cores
    g = lane // 4
    t = lane % 4
    for i in static_range(WM // 16):
        for j in static_range(WN // 8):
            for q in static_range(4):
                row = m0 + wm * WM + i * 16 + g + 8 * (q // 2)
                col = n0 + wn * WN + j * 8 + 2 * t + q % 2
                c[row, col] = acc[i, j, q]


@frost.kernel.device
def load_tile_swizzled(src: Array[bf16, 2], dst: Array[bf16, 2], r0: i32, c0: i32, ROWS: Const[int],
                       COLS: Const[int], THREADS: Const[int]):
    """load_tile into an unpadded shared tile whose 16-byte chunks are XOR-swizzled (see frost.kernel.swizzle)."""
    for u in static_range(ROWS * COLS // 8 // THREADS):
        chunk = tx + u * THREADS
        r = chunk // (COLS // 8)
        col = chunk % (COLS // 8) * 8
        cp_async16(dst, (r, swizzle(r, col, COLS)), src, (r0 + r, c0 + col))


@frost.kernel.device
def load_fragments(af, bq, sa, sb, kk: i32, wm: i32, wn: i32, WM: Const[int], WN: Const[int], BK: Const[int],
                   BN: Const[int]):
    """The A and B fragments of one 16-deep k step from the swizzled shared tiles (ldmatrix)."""
    for i in static_range(WM // 16):
        r = wm * WM + i * 16 + lane % 16
        ldmatrix_x4(af[i], sa, (r, swizzle(r, kk * 16 + lane // 16 * 8, BK)))
    for j in static_range(WN // 16):
        r = kk * 16 + lane % 16
        ldmatrix_x4_trans(bq[j], sb, (r, swizzle(r, wn * WN + j * 16 + lane // 16 * 8, BN)))


@frost.kernel
def gemm_bf16_fast(a: Array[bf16, 2], b: Array[bf16, 2], c: Array[f32], BM: Const[int] = 128,
                   BN: Const[int] = 128, BK: Const[int] = 32, WM: Const[int] = 64, WN: Const[int] = 64,
                   STAGES: Const[int] = 4, GROUP: Const[int] = 8, MIN_BLOCKS: Const[int] = 1):
    """gemm_bf16 tuned: XOR-swizzled unpadded shared tiles (less shared memory, so more stages fit),
    fragments double-buffered in registers (the next k step's ldmatrix overlaps this step's mma),
    __launch_bounds__ so ptxas budgets registers for MIN_BLOCKS blocks per SM, and 8-byte stores of C
    (row-major, contiguous, passed flat) so that every 32-byte sector written is written whole."""
    THREADS: Const[int] = (BM // WM) * (BN // WN) * 32
    launch_bounds(THREADS, MIN_BLOCKS)
    sa = dynamic_shared(bf16, (STAGES, BM, BK))
    sb = dynamic_shared(bf16, (STAGES, BK, BN), STAGES * BM * BK * 2)
    acc = local(f32, (WM // 16, WN // 8, 4))
    af = local(bf16, (2, WM // 16, 8))      # two k steps of fragments: one multiplies while the other loads
    bq = local(bf16, (2, WN // 16, 2, 4))
    wm = warp // (BN // WN)
    wn = warp % (BN // WN)
    m0, n0 = block_origin(BM, BN, GROUP)
    for i in static_range(WM // 16):
        for j in static_range(WN // 8):
            for q in static_range(4):
                acc[i, j, q] = 0.0
    ktiles = i32(a.shape[1]) // BK
    for st in static_range(STAGES - 1):
        if st < ktiles:
            load_tile_swizzled(a, sa[st], m0, st * BK, BM, BK, THREADS)
            load_tile_swizzled(b, sb[st], st * BK, n0, BK, BN, THREADS)
        cp_commit()
    for kt in range(ktiles):
        cp_wait(STAGES - 2)
        syncthreads()
        nk = kt + STAGES - 1
        if nk < ktiles:
            load_tile_swizzled(a, sa[nk % STAGES], m0, nk * BK, BM, BK, THREADS)
            load_tile_swizzled(b, sb[nk % STAGES], nk * BK, n0, BK, BN, THREADS)
        cp_commit()
        s = kt % STAGES
        load_fragments(af[0], bq[0], sa[s], sb[s], 0, wm, wn, WM, WN, BK, BN)
        for kk in static_range(BK // 16):
            if kk + 1 < BK // 16:
                load_fragments(af[(kk + 1) % 2], bq[(kk + 1) % 2], sa[s], sb[s], kk + 1, wm, wn, WM, WN, BK, BN)
            acc += af[kk % 2] @ bq[kk % 2]
    ldc = i32(b.shape[1])
    g = lane // 4
    t = lane % 4
    for i in static_range(WM // 16):
        for j in static_range(WN // 8):
            for h in static_range(2):   # a fragment holds 2 adjacent columns of rows g and g + 8
                row = m0 + wm * WM + i * 16 + g + 8 * h
                col = n0 + wn * WN + j * 8 + 2 * t
                store2(c, i64(row) * ldc + col, acc[i, j, 2 * h], acc[i, j, 2 * h + 1])


DEFAULT = dict(BM=128, BN=128, BK=32, WM=64, WN=64, STAGES=3)
FAST_DEFAULT = dict(BM=128, BN=128, BK=32, WM=64, WN=64, STAGES=4, MIN_BLOCKS=1)


def smem_bytes(BM, BN, BK, STAGES, **_) -> int:
    return STAGES * (BM * (BK + 8) + BK * (BN + 8)) * 2


def smem_bytes_swizzled(BM, BN, BK, STAGES, **_) -> int:
    return STAGES * (BM * BK + BK * BN) * 2


# kernel variant -> (kernel, default tiles, shared-memory bytes for tiles)
KERNELS = {"padded": (gemm_bf16, DEFAULT, smem_bytes), "swizzled": (gemm_bf16_fast, FAST_DEFAULT, smem_bytes_swizzled)}


def gemm(a, b, c, simulate: bool = False, kernel: str = "padded", **tiles) -> None:
    """C = A @ B for bf16 A [M, K], B [K, N] and f32 C [M, N]; sizes must be multiples of the block tile.
    kernel: "padded" (gemm_bf16) or "swizzled" (gemm_bf16_fast)."""
    kern, default, smem = KERNELS[kernel]
    cfg = dict(default, **tiles)
    BM, BN, BK, WM, WN = (cfg[k] for k in ("BM", "BN", "BK", "WM", "WN"))
    (M, K), (K2, N) = a.shape, b.shape
    if K != K2 or M % BM or N % BN or K % BK or tuple(c.shape) != (M, N):
        raise ValueError(f"gemm: shapes {a.shape} @ {b.shape} -> {c.shape} must agree and be multiples of "
                         f"({BM}, {BN}, {BK})")
    threads = (BM // WM) * (BN // WN) * 32
    for what, rows, cols in (("A", BM, BK), ("B", BK, BN)):
        if rows * cols // 8 % threads:
            raise ValueError(f"gemm: a {rows}x{cols} tile of {what} is {rows * cols // 8} 16-byte chunks, not a "
                             f"multiple of the {threads} threads that load it")
    k = kern.simulate if simulate else kern
    if kern is gemm_bf16_fast:  # C goes in flat (row-major and contiguous)
        if not c.flags.c_contiguous:
            raise ValueError("gemm: the swizzled kernel writes a contiguous row-major C")
        c = c.reshape(-1)
    k[(N // BN, M // BM), threads, smem(**cfg)](a, b, c, **cfg)


SMALL = dict(BM=64, BN=64, BK=32, WM=32, WN=32, STAGES=3)  # 4 warps: small enough for the simulator
SMALL_FAST = dict(BM=64, BN=64, BK=64, WM=32, WN=32, STAGES=3, MIN_BLOCKS=1)


def main(m: int = 64, n: int = 64, k: int = 64) -> None:
    import ml_dtypes
    rng = np.random.default_rng(0)
    a = rng.standard_normal((m, k)).astype(ml_dtypes.bfloat16)
    b = rng.standard_normal((k, n)).astype(ml_dtypes.bfloat16)
    want = a.astype(np.float64) @ b.astype(np.float64)
    if cuda.is_available():
        import cupy as cp
        ag, bg = cp.asarray(a.view(np.uint16)), cp.asarray(b.view(np.uint16))  # bf16 bits
        for kernel, tiles in (("padded", SMALL), ("swizzled", SMALL_FAST)):
            c = cp.zeros((m, n), cp.float32)
            gemm(ag, bg, c, kernel=kernel, **tiles)
            np.testing.assert_allclose(cp.asnumpy(c), want, rtol=1e-4, atol=1e-3)
    else:
        for kernel, tiles in (("padded", SMALL), ("swizzled", SMALL_FAST)):
            c = np.zeros((m, n), np.float32)
            gemm(a, b, c, simulate=True, kernel=kernel, **tiles)
            np.testing.assert_allclose(c, want, rtol=1e-4, atol=1e-3)
    print(f"bf16 tensor-core GEMM {m}x{n}x{k} (padded and swizzled kernels): matches NumPy")


if __name__ == "__main__":
    main()
