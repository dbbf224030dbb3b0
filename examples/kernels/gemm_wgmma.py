"""A Hopper bf16 GEMM in the kernel language: warpgroup MMA (wgmma, sm_90a) on 128-byte-swizzled shared tiles.

C[M, N] (f32) = A[M, K] (bf16, row-major) @ Bt[N, K]^T (bf16, row-major): B is given transposed, as [N, K] (the way
a Linear layer stores its weight [out, in]), so that both operands are K-major in shared memory, the layout wgmma
reads without transposition (imm-trans-a = imm-trans-b = 0).

A block computes a BM x BN tile of C with WGS warpgroups (128 threads each, BM = 64 * WGS): warpgroup w owns rows
64w..64w+63 and all BN columns, its accumulator being BN / 2 f32 registers per thread (wgmma's m64nNk16 fragment).
The K loop walks 64-deep slices. Each slice of A (BM x 64) and Bt (BN x 64) is a tile of 128-byte rows, written by
cp.async in the 128-byte swizzle (16-byte chunk j of row r at chunk j ^ (r % 8)), the layout a wgmma descriptor with
swizzle mode 128B reads: no bank conflicts on either side and no padding. A ring of STAGES shared slices keeps
STAGES - 2 slices in flight behind the one being multiplied, and one group of wgmmas stays in flight (wgmma_wait(1))
while the next slice's copies are issued, so the tensor cores always have queued work.

Per k slice, every thread:
    cp_wait(STAGES - 3)   this thread's copies of slice kt have landed
    fence_proxy_async()   ... and are visible to the async proxy that wgmma reads shared memory through
    syncthreads()         every thread's copies have; every warpgroup has retired slice kt - 2's wgmmas
    copy slice kt + STAGES - 2 into the stage slice kt - 2 used
    wgmma_fence(); 4 x wgmma_bf16 (k = 16 each); wgmma_commit(); wgmma_wait(1)
"""
import numpy as np

import frost
from frost.backend import cuda
from frost.kernel import (Array, Const, bf16, bx, by, cp_async16, cp_commit, cp_wait, dynamic_shared, f32,
                          fence_proxy_async, gdx, gdy, i32, i64, lane, launch_bounds, local, static_range, store2,
                          swizzle, syncthreads, tx, warp, wgmma_bf16, wgmma_commit, wgmma_desc, wgmma_fence,
                          wgmma_wait)


@frost.kernel
def wgmma_tile(a: Array[bf16, 2], b: Array[bf16, 2], c: Array[f32, 2], N: Const[int] = 64,
               ZERO_INIT: Const[int] = 1):
    """The smallest use, and the first thing to check on a new GPU: c[64, N] = a[64, 64] @ b[N, 64]^T by one
    warpgroup, four m64nNk16 wgmmas on 128B-swizzled shared tiles written with ordinary stores (hence
    fence_proxy_async). ZERO_INIT=0 zeroes nothing and passes scale_d = 0 on the first k step instead."""
    sa = dynamic_shared(bf16, (64, 64))
    sb = dynamic_shared(bf16, (N, 64), 64 * 64 * 2)
    for u in static_range(64 * 64 // 128):
        e = tx + u * 128
        sa[e // 64, swizzle(e // 64, e % 64, 64)] = a[e // 64, e % 64]
    for u in static_range(N * 64 // 128):
        e = tx + u * 128
        sb[e // 64, swizzle(e // 64, e % 64, 64)] = b[e // 64, e % 64]
    fence_proxy_async()
    syncthreads()
    acc = local(f32, N // 2)
    if ZERO_INIT:
        for i in static_range(N // 2):
            acc[i] = 0.0
    wgmma_fence()
    for kk in static_range(4):
        wgmma_bf16(acc, wgmma_desc(sa, (0, kk * 16), 128), wgmma_desc(sb, (0, kk * 16), 128), N,
                   1 if ZERO_INIT else kk)
    wgmma_commit()
    wgmma_wait(0)
    for i in static_range(N // 2):   # the m64nNk16 accumulator fragment (PTX ISA figure "WGMMA .m64nNk16 ... D")
        c[tx // 32 * 16 + lane // 4 + 8 * (i % 4 // 2), 8 * (i // 4) + 2 * (lane % 4) + i % 2] = acc[i]


def wrong_blocks(got, want, rows: int = 8, cols: int = 8, tol: float = 1e-2) -> str:
    """Which rows x cols blocks of a result are wrong ('X') or right ('.'): a layout mistake shows as a pattern."""
    bad = ~np.isclose(got, want, rtol=tol, atol=tol)
    m, n = got.shape
    lines = [f"max abs error {np.nanmax(np.abs(got - want)):.4g}, max |want| {np.abs(want).max():.4g}; "
             f"{int(bad.sum())} of {bad.size} elements wrong; {rows}x{cols} blocks (X wrong):"]
    for i in range(0, m, rows):
        lines.append(f"  rows {i:4}: " + "".join("X" if bad[i:i + rows, j:j + cols].any() else "."
                                                  for j in range(0, n, cols)))
    return "\n".join(lines)


def check_tile(n: int = 64, zero_init: int = 1, simulate: bool = False):
    """Run wgmma_tile once on random data: (max abs error against NumPy, the wrong_blocks map)."""
    import ml_dtypes
    rng = np.random.default_rng(0)
    a = rng.standard_normal((64, 64)).astype(ml_dtypes.bfloat16)
    b = rng.standard_normal((n, 64)).astype(ml_dtypes.bfloat16)
    want = a.astype(np.float64) @ b.astype(np.float64).T
    smem = (64 + n) * 64 * 2
    if simulate:
        got = np.full((64, n), np.nan, np.float32)
        wgmma_tile.simulate[1, 128, smem](a, b, got, N=n, ZERO_INIT=zero_init)
    else:
        import cupy as cp
        c = cp.full((64, n), cp.nan, cp.float32)
        wgmma_tile[1, 128, smem](cp.asarray(a.view(np.uint16)), cp.asarray(b.view(np.uint16)), c, N=n,
                                 ZERO_INIT=zero_init)
        got = cp.asnumpy(c)
    return float(np.nanmax(np.abs(got - want))) if not np.isnan(got).all() else float("nan"), wrong_blocks(got, want)


@frost.kernel.device
def load_tile_sw128(src: Array[bf16, 2], dst: Array[bf16, 2], r0: i32, c0: i32, ROWS: Const[int],
                    THREADS: Const[int]):
    """Start copying src[r0:r0+ROWS, c0:c0+64] into the shared tile dst (ROWS x 64 bf16: 128-byte rows) in the
    128-byte swizzle: frost.kernel.swizzle with 64 columns is exactly CUTLASS's Swizzle<3, 4, 3>."""
    for u in static_range(ROWS * 8 // THREADS):
        chunk = tx + u * THREADS
        r = chunk // 8
        col = chunk % 8 * 8
        cp_async16(dst, (r, swizzle(r, col, 64)), src, (r0 + r, c0 + col))


@frost.kernel
def gemm_wgmma(a: Array[bf16, 2], bt: Array[bf16, 2], c: Array[f32], BN: Const[int] = 256, WGS: Const[int] = 2,
               STAGES: Const[int] = 4, GROUP: Const[int] = 8, MIN_BLOCKS: Const[int] = 1):
    BM: Const[int] = 64 * WGS
    BK: Const[int] = 64   # one 128-byte swizzle row of bf16
    THREADS: Const[int] = 128 * WGS
    launch_bounds(THREADS, MIN_BLOCKS)
    sa = dynamic_shared(bf16, (STAGES, BM, BK))
    sb = dynamic_shared(bf16, (STAGES, BN, BK), STAGES * BM * BK * 2)
    acc = local(f32, BN // 2)   # this warpgroup's 64 x BN tile of C, in wgmma's accumulator fragment
    wg = warp // 4
    # Blocks run in groups of GROUP block-rows, column by column, so that the A and B panels they share stay in L2.
    pid = by * gdx + bx
    in_group = GROUP * gdx
    first_m = pid // in_group * GROUP
    group_m = min(gdy - first_m, GROUP)
    m0 = (first_m + pid % in_group % group_m) * BM
    n0 = pid % in_group // group_m * BN
    for i in static_range(BN // 2):
        acc[i] = 0.0
    ktiles = i32(a.shape[1]) // BK
    for st in static_range(STAGES - 2):   # prologue: the first STAGES - 2 slices in flight
        if st < ktiles:
            load_tile_sw128(a, sa[st], m0, st * BK, BM, THREADS)
            load_tile_sw128(bt, sb[st], n0, st * BK, BN, THREADS)
        cp_commit()
    # A do-while over the slices (K >= 64): were the loop allowed to run zero times, the zeroed accumulators would
    # reach the final wgmma_wait unchanged on that path, and ptxas would serialize every wgmma (its warning C7515).
    kt = 0
    while True:
        cp_wait(STAGES - 3)
        fence_proxy_async()
        syncthreads()
        nk = kt + STAGES - 2
        if nk < ktiles:
            load_tile_sw128(a, sa[nk % STAGES], m0, nk * BK, BM, THREADS)
            load_tile_sw128(bt, sb[nk % STAGES], n0, nk * BK, BN, THREADS)
        cp_commit()
        s = kt % STAGES
        wgmma_fence()
        for kk in static_range(BK // 16):   # the descriptor's start moves 32 bytes along the swizzled rows
            wgmma_bf16(acc, wgmma_desc(sa[s], (wg * 64, kk * 16), 128), wgmma_desc(sb[s], (0, kk * 16), 128), BN)
        wgmma_commit()
        wgmma_wait(1)   # slice kt - 1's wgmmas are done: its stage may be refilled after the next syncthreads
        kt += 1
        if kt >= ktiles:
            break
    wgmma_wait(0)
    ldc = i32(bt.shape[0])
    g = lane // 4
    t = lane % 4
    for j in static_range(BN // 8):
        for h in static_range(2):   # registers 4j + 2h, 4j + 2h + 1: row g + 8h, columns 8j + 2t, 8j + 2t + 1
            row = m0 + wg * 64 + warp % 4 * 16 + g + 8 * h
            col = n0 + j * 8 + 2 * t
            store2(c, i64(row) * ldc + col, acc[4 * j + 2 * h], acc[4 * j + 2 * h + 1])


DEFAULT = dict(BN=256, WGS=2, STAGES=4, GROUP=8, MIN_BLOCKS=1)


def smem_bytes(BN, WGS, STAGES, **_) -> int:
    return STAGES * (64 * WGS + BN) * 64 * 2


def gemm(a, bt, c, simulate: bool = False, **tiles) -> None:
    """C = A @ Bt^T for bf16 A [M, K], Bt [N, K] and a contiguous f32 C [M, N]; M, N, K multiples of the block tile
    (BM = 64 * WGS, BN, 64). On the GPU it needs a Hopper GPU (the kernel is compiled for sm_90a)."""
    cfg = dict(DEFAULT, **tiles)
    BN, WGS, STAGES = cfg["BN"], cfg["WGS"], cfg["STAGES"]
    BM = 64 * WGS
    (M, K), (N, K2) = a.shape, bt.shape
    if K != K2 or M % BM or N % BN or K % 64 or K < 64 or tuple(c.shape) != (M, N):
        raise ValueError(f"gemm_wgmma: shapes A {tuple(a.shape)} @ Bt {tuple(bt.shape)}^T -> C {tuple(c.shape)} must "
                         f"agree and be multiples of (BM={BM}, BN={BN}, BK=64)")
    if BN not in (64, 128, 256) or STAGES < 3:
        raise ValueError(f"gemm_wgmma: BN must be 64, 128 or 256 and STAGES >= 3, got BN={BN}, STAGES={STAGES}")
    if not c.flags.c_contiguous:
        raise ValueError("gemm_wgmma: C must be contiguous and row-major")
    k = gemm_wgmma.simulate if simulate else gemm_wgmma
    k[(N // BN, M // BM), 128 * WGS, smem_bytes(**cfg)](a, bt, c.reshape(-1), **cfg)


SMALL = dict(BN=64, WGS=2, STAGES=3, GROUP=8, MIN_BLOCKS=1)  # small enough for the simulator


def main(m: int = 128, n: int = 64, k: int = 128) -> None:
    import ml_dtypes
    rng = np.random.default_rng(0)
    a = rng.standard_normal((m, k)).astype(ml_dtypes.bfloat16)
    bt = rng.standard_normal((n, k)).astype(ml_dtypes.bfloat16)
    want = a.astype(np.float64) @ bt.astype(np.float64).T
    if cuda.is_available():
        import cupy as cp
        c = cp.zeros((m, n), cp.float32)
        gemm(cp.asarray(a.view(np.uint16)), cp.asarray(bt.view(np.uint16)), c, **SMALL)
        got = cp.asnumpy(c)
    else:
        got = np.zeros((m, n), np.float32)
        gemm(a, bt, got, simulate=True, **SMALL)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-3)
    print(f"wgmma bf16 GEMM {m}x{n}x{k} ({'GPU' if cuda.is_available() else 'simulated'}): matches NumPy")


if __name__ == "__main__":
    main()
