"""A tensor-core bf16 GEMM in the kernel language: a cp.async pipeline, ldmatrix and mma.sync.

C[M, N] (f32) = A[M, K] (bf16, row-major) @ B[K, N] (bf16, row-major). A block computes a BM x BN tile of C
with (BM / WM) x (BN / WN) warps; each warp owns a WM x WN tile made of 16x8 mma tiles. The K loop keeps
STAGES - 1 slices of A and B in flight (cp.async into a ring of shared-memory stages; STAGES=2 is double
buffering) while the tensor cores work on the current one. Shared rows are padded by 8 elements so that the
8 rows an ldmatrix reads fall in 8 different bank groups. The next step on Hopper is wgmma (sm_90a) fed by TMA.
"""
import numpy as np

import frost
from frost.backend import cuda
from frost.kernel import (Array, Const, bf16, bx, by, cp_async16, cp_commit, cp_wait, dynamic_shared, f32, gdx, gdy,
                          i32, lane, ldmatrix_x4, ldmatrix_x4_trans, local, static_range, syncthreads, tx, warp)


@frost.kernel.device
def load_tile(src: Array[bf16, 2], dst: Array[bf16, 2], r0: i32, c0: i32, ROWS: Const[int], COLS: Const[int],
              THREADS: Const[int]):
    """Start copying src[r0:r0+ROWS, c0:c0+COLS] into the shared tile dst, 16 bytes per cp.async."""
    for u in static_range(ROWS * COLS // 8 // THREADS):
        chunk = tx + u * THREADS
        r = chunk // (COLS // 8)
        col = chunk % (COLS // 8) * 8
        cp_async16(dst, (r, col), src, (r0 + r, c0 + col))


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
    # Blocks run in groups of GROUP block-rows, column by column, so that the A and B panels they share stay in L2.
    pid = by * gdx + bx
    in_group = GROUP * gdx
    first_m = pid // in_group * GROUP
    group_m = min(gdy - first_m, GROUP)
    m0 = (first_m + pid % in_group % group_m) * BM
    n0 = pid % in_group // group_m * BN
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


DEFAULT = dict(BM=128, BN=128, BK=32, WM=64, WN=64, STAGES=3)


def smem_bytes(BM, BN, BK, STAGES, **_) -> int:
    return STAGES * (BM * (BK + 8) + BK * (BN + 8)) * 2


def gemm(a, b, c, simulate: bool = False, **tiles) -> None:
    """C = A @ B for bf16 A [M, K], B [K, N] and f32 C [M, N]; sizes must be multiples of the block tile."""
    cfg = dict(DEFAULT, **tiles)
    BM, BN, BK, WM, WN = (cfg[k] for k in ("BM", "BN", "BK", "WM", "WN"))
    (M, K), (K2, N) = a.shape, b.shape
    if K != K2 or M % BM or N % BN or K % BK or tuple(c.shape) != (M, N):
        raise ValueError(f"gemm: shapes {a.shape} @ {b.shape} -> {c.shape} must agree and be multiples of "
                         f"({BM}, {BN}, {BK})")
    k = gemm_bf16.simulate if simulate else gemm_bf16
    k[(N // BN, M // BM), (BM // WM) * (BN // WN) * 32, smem_bytes(**cfg)](a, b, c, **cfg)


SMALL = dict(BM=64, BN=64, BK=32, WM=32, WN=32, STAGES=3)  # 4 warps: small enough for the simulator


def main(m: int = 64, n: int = 64, k: int = 64) -> None:
    import ml_dtypes
    rng = np.random.default_rng(0)
    a = rng.standard_normal((m, k)).astype(ml_dtypes.bfloat16)
    b = rng.standard_normal((k, n)).astype(ml_dtypes.bfloat16)
    want = a.astype(np.float64) @ b.astype(np.float64)
    if cuda.is_available():
        import cupy as cp
        ag, bg = cp.asarray(a.view(np.uint16)), cp.asarray(b.view(np.uint16))  # bf16 bits
        c = cp.zeros((m, n), cp.float32)
        gemm(ag, bg, c, **SMALL)
        c = cp.asnumpy(c)
    else:
        c = np.zeros((m, n), np.float32)
        gemm(a, b, c, simulate=True, **SMALL)
    np.testing.assert_allclose(c, want, rtol=1e-4, atol=1e-3)
    print(f"bf16 tensor-core GEMM {m}x{n}x{k}: matches NumPy")


if __name__ == "__main__":
    main()
