"""Flash attention (FlashAttention-2) in the kernel language: fused forward and backward kernels on mma.sync tensor
cores, the host functions that launch them, and the op `flash_attention`, registered with frost.dispatch for
scaled_dot_product_attention (frost/ops/attention.py) on CUDA where `supported` says it applies
(FROST_FLASH_ATTENTION=0 switches it off); the composed path (matmul, softmax, matmul) runs wherever it declines.

Layout. q, k, v, o and their gradients are rows of D values (D, the head dim, 64 or 128, a compile-time constant),
bf16 or f16: (batch b, head h, position t) is row b * sb + h * sh + t * st of its tensor's layout, so heads sliced
out of one (B, T, 3 x C) projection are read where they lie, O is written (B, T, H, D) (as PyTorch's flash
attention writes it: transpose(1, 2).reshape(B, T, C) is then a view), and the gradients of q, k and v sliced
out of one tensor are written into one buffer of that tensor's layout (the backward of the split a view too).
A block has WARPS = BR // 16 warps; each warp owns 16 rows of the block's tile (queries in the forward and dQ
kernels, keys in the dK/dV kernel) and every column of D, so the softmax statistics of a row stay within the 4 lanes
of a quad (two shuffles). Scores live in mma C fragments and are
turned into the A fragments of the next mma in registers (P @ V, dS @ K, ...), never through shared memory.

Masking: key j is visible to query i when j < Lk, the key-padding mask keeps j, and (causal) j <= i: top-left
aligned also when Lq != Lk, as PyTorch's is_causal and the composed path (tril of an Lq x Lk matrix of ones). Rows
with no visible key give zeros (as the composed path), and their log-sum-exp is -inf.

Out-of-range rows of a tile (ragged lengths) are loaded from the last valid row (cp.async cannot zero-fill) and
masked out of the softmax; they are never written.

Backward: D = rowsum(dO * O) first, then one kernel per key tile accumulating dK and dV over every query tile (and,
under grouped-query attention, every query head of the group) and one kernel per query tile accumulating dQ over the
key tiles: both recompute P = exp(S - L) from the saved log-sum-exp. No atomics, so the gradients are deterministic.

Dropout (on the attention weights, as PyTorch's dropout_p): element (bh, query, key) is kept when the uniform from
word 2 (query % 2) + key % 2 of Philox4x32-10 at counter (key // 2, query // 2, bh, offset) under the key (seed_lo,
seed_hi ^ STREAM) is >= p, and kept weights are scaled by 1 / (1 - p). One block covers two queries by two keys,
so every kernel draws one block for two weights (the forward and dQ kernels hold pairs of keys, the dK/dV kernels
pairs of queries). The forward reads seed and offset from a 4-word snapshot of the
CUDA generator's state (frost/accel/philox.py) taken at the call, after which the generator's offset advances by one;
the backward regenerates the same mask from the snapshot, so nothing L x S is stored. The row sums (and the saved
log-sum-exp) are those of the undropped weights; D = rowsum(dO * O) holds as without dropout. `dropout_keep_numpy` is
the NumPy twin of the mask.

Speed. The forward copies K and V in turns, as FlashAttention-2 does: V(j) while S = Q K(j)^T and the softmax run,
K(j + 1) while O += P V(j), one buffer each. Tiles whose every key is visible to every query of the block (no mask,
in range, wholly before the block's first query when causal) skip the per-element visibility test. Dropout draws
one Philox block per pair of weights in every kernel. Untuned: the backward kernels' copies do not overlap their
math, padded shared rows rather than swizzled.

Hopper. `flash_fwd_wgmma` is the forward on warpgroup MMA (bf16): warpgroups of 64 query rows, S = Q K^T and O += P V
as wgmmas on 128-byte-swizzled shared panels (P stored there as bf16), the softmax, masks, dropout stream and output
the mma.sync forward's (shared device functions). `wgmma_backward`'s dQ kernel (S, dP, then dQ += dS K) and dK/dV
kernel (S^T, dP^T, then dV += P^T dO and dK += dS^T Q) do the same for the backward (at head dim 128 the dK/dV kernel
steps over 32 queries, half a panel: steps of 64 spill; WGMMA_BACKWARD_TILES). No tile is transposed: the second
operand of P V, dS K, P^T dO and dS^T Q is read MN-major (wgmma_bf16's B_MAJOR) from the row-major panels the copies
write.
The two kernels are the backward for bf16 on sm_90 (with the bulk forward below) for short sequences;
FROST_FLASH_WGMMA=1 runs this forward too. `fused_backward` is FlashAttention-3's backward, the default from 1024
queries at head dim 128 and 512 at 64 (FUSED_FROM_LENGTH): one kernel per block of 64 WGS keys computes S^T, dP^T,
dV, dK and that block's share of dQ (five products where the two kernels recompute S and dP: seven), adding dQ into
a float32 accumulator by one bulk reduction a step (cp_reduce_async_bulk_add), then a small kernel converts it; dQ's
sum is then in an order the GPU chooses (not deterministic bit for bit: frost.backends.deterministic keeps the two
kernels). RS takes P^T and dS^T to the dV and dK products from registers instead of shared memory; Q and dO come
through tensor maps and their statistics (flash_bwd_tile_stats) by a bulk copy, one thread issuing, an mbarrier a
buffer. FUSED_BACKWARD_TILES. Every kernel's grid is (tiles, heads, batch), a head's tiles side by side in launch
order (query_head).
The simulator and the tests check them against float64 and against the mma.sync kernels (the two-kernel backward's
gradients agree bit for bit in the simulator at equal key order).

Warp-specialized. `flash_fwd_bulk` is the Hopper forward as FlashAttention-3 arranges it: a producer warp (one
thread) has the copy engine bring each tile's K and V into STAGES-deep rings of shared memory, counted on mbarriers,
while the consumer warpgroups multiply, wait only for their tile, release it on the ring's empty barrier and meet on
their own named barrier (not the block's) before P V. K and V come through tensor maps (cp_async_bulk_tensor: boxes
of BC keys x 64 columns, swizzled as wgmma reads them, zeros past the last key), read where they lie (laying them
out as the shared tiles' images first for plain bulk copies cost 0.07 ms more at 4 x 16 x 4096 x 128, tree
a1cdd95). Settings, each tested in the simulator and timed by benchmarks/flash_forward_tiles.py: STAGES, PINGPONG
(the two consumer warpgroups take turns at the tensor cores, FlashAttention-3's inter-warpgroup schedule) and RS (P
kept in registers as the A operand of P V, wgmma_bf16_rs, instead of shared memory), WGS (2 or 3 consumer
warpgroups). The default forward for bf16 on sm_90: 0.88x PyTorch's cuDNN backend at 4 x 16 x 4096 x 128 on an
H100 (benchmarks/RESULTS.md); FROST_FLASH_BULK=0 runs the mma.sync kernels instead.

Not yet (each falls back to the composed path): float32 inputs, other head dims, float or general boolean
masks, scales that are not positive (check_scale).
"""
import functools
import math
import os
from dataclasses import dataclass

import numpy as np

from frost import backends, dispatch, layout
from frost.backend import cpu, cuda
from frost.kernel import (MN_MAJOR, Array, Const, TensorMap, bar_arrive, bar_sync, bf16, bx, by, bz, cdiv, cp_async16,
                          cp_async_bulk, cp_async_bulk_commit, cp_async_bulk_tensor, cp_async_bulk_wait,
                          cp_async_bulk_wait_read, cp_commit, cp_reduce_async_bulk_add, cp_wait, device, dynamic_shared,
                          f16, f32, fast_exp2, fence_proxy_async, gdx, gdy, i32, i64, inf, kernel, lane, launch_bounds,
                          ldmatrix_x4, ldmatrix_x4_trans, local, log, mbarrier_arrive, mbarrier_arrive_expect_tx,
                          mbarrier_init, mbarrier_wait, mma, setmaxnreg_dec, setmaxnreg_inc, shared, shfl_xor,
                          static_range, swizzle, syncthreads, tx, u8, u32, warp, warp_sum, wgmma_bf16,
                          wgmma_bf16_rs, wgmma_commit, wgmma_desc, wgmma_discard, wgmma_fence, wgmma_wait)
from frost.kernel.compile import device_arch, has_mma, multiprocessor_count
from frost.kernel.tma import tensor_map
from frost.accel.philox import philox4x32, philox_block
from frost.tensor import Tensor, capturing, from_op

LOG2E = math.log2(math.e)
HOPPER_SHARED_BYTES = 227 * 1024   # a block's dynamic shared memory on sm_90
LN2 = math.log(2.0)
HEAD_DIMS = (64, 128)
STREAM = 0x464C4153   # xor-ed into the key's high word: dropout masks are a stream apart from the generator's draws
DTYPES = ("bfloat16", "float16")
PAD = 8   # elements after each shared row: the 8 rows an ldmatrix reads fall in 8 different bank groups
# (BR, BC) per head dim, untuned (to be measured on the H200). The dK/dV kernel takes the backward's tiles swapped:
# its blocks own BC keys (4 warps) and step over BR queries, so at head dim 128 both backward kernels hold 32-column
# score tiles (64-column ones spill there: dK, dV and the K, V fragments already take ~190 registers a thread).
FORWARD_TILES = {64: dict(BR=64, BC=64), 128: dict(BR=64, BC=64)}
BACKWARD_TILES = {64: dict(BR=64, BC=64), 128: dict(BR=64, BC=32)}
# the Hopper forward's (warpgroups of 64 query rows, keys a tile), untimed. S and O take BC / 2 + D / 2 registers a
# thread: at head dim 128 BC is 64; at 64, with dropout's Philox on top, BC = 128 spills (12 bytes), so 64 there too
WGMMA_TILES = {64: dict(WGS=2, BC=128), 128: dict(WGS=2, BC=64)}


# the Hopper backward's: dQ blocks of 64 WGS queries stepping over BC keys, dK/dV blocks of 64 WGS keys stepping over
# BR queries. At head dim 128 the dK/dV kernel's steps of 64 spill (S^T, dP^T and two D-wide accumulators pass 255
# registers a thread), steps of 32 (half a 64-column panel) fit; the dQ kernel's steps of 64 fit (187 registers) and
# made the backward 7 % faster than 32 on an H100 (4 x 16 x 4096 x 128: 5.24 against 5.63 ms, tree 5a9727e)
WGMMA_BACKWARD_TILES = {64: dict(WGS=2, BC=64, BR=64), 128: dict(WGS=2, BC=64, BR=32)}
# The fused backward's settings by head dim: WGS warpgroups (64 keys each), RS (P^T and dS^T from registers); its
# query steps are 64 (one wgmma's M for dQ), Q and dO come through tensor maps. On an H100 at 4 x 16 x 4096 x 128
# (tree 12caac9): RS=1 3.74 ms (2.28 causal), RS=0 3.97 (2.43); tree 05dcf19: RS=1 3.38 (2.16), OVERLAP_EXP=1 3.40
# (2.11) (05dcf19 had a race, fixed at 7f75e73: 3.31 ms at 6a7acae, another lease). Tensor maps made it 1.14x
# faster than every thread's cp.async (tree a1cdd95: 4.16 against 4.75 ms) and free of spills at head dim 128 (36
# bytes before); the queries-as-rows layout (5.31 at tree 6e25189) has gone. OVERLAP_EXP=1 (P^T's exponentials while
# dP^T multiplies) over two leases (trees 6501b32 and 015f5f3, flash_backward_h100_*.json): faster in 14 of 17 cells at
# 512-4096 queries, both head dims (by up to 6 %: causal 8 x 16 x 2048 x 128 1.475 -> 1.435 ms), within 1 % slower
# in the others
FUSED_BACKWARD_TILES = {64: dict(WGS=2, RS=1, OVERLAP_EXP=1), 128: dict(WGS=2, RS=1, OVERLAP_EXP=1)}
# where the fused backward is the default: head dim -> the shortest query length. On an H100 (tree 12caac9,
# flash_backward_h100_12caac9.json) it beat the two kernels at every shape timed from 2048 (3.74 against 5.21 ms at
# 4 x 16 x 4096 x 128); at tree 05dcf19 (flash_backward_h100_05dcf19_1024.json, _512.json) also at 1024 queries,
# head dim 128 (1.47 against 1.76 ms, causal 1.16 against 1.22) and at 512, head dim 64 (1.13 against 1.33, causal
# 1.00 against 1.06), but not at 512, head dim 128 causal (1.06 against 0.97)
FUSED_FROM_LENGTH = {64: 512, 128: 1024}


def wgmma_dq_smem(d: int, br: int, bc: int) -> int:
    """Bytes of shared memory of flash_bwd_dq_wgmma: Q and dO, two K and two V tiles, and dS in panels of 64
    columns (a 32-key step uses half of one)."""
    panels = -(-bc // 64)
    return 4 * br * d + 8 * bc * d + panels * br * 128


def wgmma_dkdv_smem(d: int, bk: int, br: int) -> int:
    """Bytes of shared memory of flash_bwd_dkdv_wgmma: K and V, two Q and two dO tiles, P^T and dS^T (in panels of
    64 columns), and two buffers of the queries' log-sum-exp and delta."""
    panels = -(-br // 64)
    return 4 * bk * d + 8 * br * d + 2 * panels * bk * 128 + 16 * br


def wgmma_tiles(d: int, dropout: bool) -> dict:
    """The wgmma forward's default tiles for head dim d."""
    return dict(WGMMA_TILES[d], BC=64) if dropout else dict(WGMMA_TILES[d])


# ------------------------------------------------------------------ device functions (fragments and tiles)
@device
def load_rows(src, dst, base: i32, st: i32, r0: i32, n: i32, ROWS: Const[int], D: Const[int], THREADS: Const[int]):
    """Start copying positions r0 ... r0 + ROWS - 1 of one head of src (rows base + position * st) into the shared
    tile dst (16 bytes per cp.async); a position at or past n (the sequence length) repeats n - 1, which the softmax
    masks out."""
    for u in static_range(ROWS * D // 8 // THREADS):
        chunk = tx + u * THREADS
        r = chunk // (D // 8)
        col = chunk % (D // 8) * 8
        cp_async16(dst, (r, col), src, (base + min(r0 + r, n - 1) * st, col))


@device
def query_tile(lq: i32, lk: i32, heads: i32, group: i32, BR: Const[int], CAUSAL: Const[int]) -> (i32, i32, i32, i32,
                                                                                                i32):
    """head_rows for the wgmma kernels' C-order q and k/v: the batch, the first row of the head's queries and of its
    key/value head, the block's first query, and this lane's first row."""
    b, lbase, q0, row0, qbase, kbase, obase = head_rows(lq, heads, group, heads * lq, lq, heads // group * lk, lk,
                                                        heads * lq, lq, BR, CAUSAL)
    return b, qbase, kbase, q0, row0


@device
def query_head() -> i32:
    """The (batch, head) index of a block of the grid (query or key tiles, heads, batch): batch x heads + head. The
    tiles of one head are neighbours in launch order, so the blocks running at once share their K and V (forward)
    or Q and dO (backward) in L2, as FlashAttention's grids order them."""
    return bz * gdy + by


@device
def tile_at(t: i32, tiles_a_head: i32, lq: i32, lk: i32, heads: i32, group: i32, BR: Const[int],
            CAUSAL: Const[int]) -> (i32, i32, i32, i32, i32):
    """Query tile t of a forward's work, numbered as a grid (query tiles, heads, batch) launches its blocks (the query
    tiles of one (batch, head) neighbours, heads, then batches), for C-order q and k/v: (batch, first q row of the
    head, first k/v row of its key/value head, first query, this lane's first row)."""
    x = t % tiles_a_head
    bh = t // tiles_a_head
    b = bh // heads
    h = bh % heads
    q0 = (tiles_a_head - 1 - x if CAUSAL else x) * BR   # causal: the longest tiles of a head first, as FA3 orders them
    return b, bh * lq, (b * (heads // group) + h // group) * lk, q0, q0 + warp * 16 + lane // 4


@device
def key_tiles(q0: i32, lk: i32, BR: Const[int], BC: Const[int], CAUSAL: Const[int]) -> i32:
    """The tiles of BC keys that the BR queries from q0 see: all lk keys, or under causal masking those up to the
    tile's last query."""
    return cdiv(min(lk, q0 + BR) if CAUSAL else lk, BC)


@device
def next_tile(rounds: i32) -> i32:
    """A persistent block's tile after `rounds` rounds over the grid: rounds alternate direction (a snake), so that
    under causal masking, where a head's tiles shorten in launch order, a block's long and short tiles even out."""
    return rounds * gdx + (bx if rounds % 2 == 0 else gdx - 1 - bx)


@device
def load_warpgroup_queries(q, sq, qbase: i32, q0: i32, lq: i32, wg: i32, D: Const[int]):
    """Start copying warpgroup wg's 64 queries of the tile from q0 into its rows of the panels sq (load_panels'
    layout) by its own 128 threads: a persistent block's next queries, while the other warpgroups still read theirs."""
    for u in static_range(64 * D // 8 // 128):
        chunk = tx % 128 + u * 128
        r = wg * 64 + chunk // (D // 8)
        col = chunk % (D // 8) * 8
        cp_async16(sq, (col // 64, r, swizzle(r, col % 64, 64)), q, (qbase + min(q0 + r, lq - 1), col))


@device
def head_rows(lq: i32, heads: i32, group: i32, qsb: i32, qsh: i32, ksb: i32, ksh: i32, osb: i32, osh: i32,
              BR: Const[int], CAUSAL: Const[int]) -> (i32, i32, i32, i32, i32, i32, i32):
    """For the block of BR queries of one (batch, head) that the forward and dQ kernels run, q, k/v and o (dO) rows
    each of its own layout: the batch, the head's first log-sum-exp entry, the block's first query, this lane's first
    row of the two it holds in C fragments (the other is 8 below), and the first rows of q, of the key/value head
    (grouped-query attention) and of o."""
    b = bz
    h = by
    q0 = (gdx - 1 - bx if CAUSAL else bx) * BR   # causal: the longest tiles (the last) start first, as FA3 orders them
    return (b, (b * heads + h) * lq, q0, q0 + warp * 16 + lane // 4, b * qsb + h * qsh, b * ksb + h // group * ksh,
            b * osb + h * osh)


@device
def load_kv_tile(k, v, sk, sv, kbase: i32, kst: i32, k0: i32, lk: i32, BC: Const[int], D: Const[int],
                 THREADS: Const[int]):
    """Keys and values k0 ... k0 + BC - 1 into the shared tiles sk and sv, once every warp is done with the
    previous tile; returns with them in place for every warp."""
    syncthreads()
    load_rows(k, sk, kbase, kst, k0, lk, BC, D, THREADS)
    load_rows(v, sv, kbase, kst, k0, lk, BC, D, THREADS)
    cp_commit()
    cp_wait(0)
    syncthreads()


@device
def load_a(frags, tile, r0: i32, K: Const[int]):
    """The A fragments (16 x 16 each, K // 16 of them) of rows r0 ... r0 + 15 of a row-major shared tile."""
    for kk in static_range(K // 16):
        ldmatrix_x4(frags[kk], tile, (r0 + lane % 16, kk * 16 + lane // 16 * 8))


@device
def zero(acc, N: Const[int]):
    for j in static_range(N // 8):
        for q in static_range(4):
            acc[j, q] = 0.0


@device
def mma_rows(acc, a, tile, bq, N: Const[int], K: Const[int]):
    """acc (16 x N, C fragments) += A (16 x K, fragments a) @ tile[0:N, 0:K]^T: B is stored as rows of K values
    (keys in a K tile, queries in a Q tile), so ldmatrix reads it without .trans."""
    for kk in static_range(K // 16):
        for jp in static_range(N // 16):
            ldmatrix_x4(bq[jp], tile, (jp * 16 + lane // 16 * 8 + lane % 8, kk * 16 + lane // 8 % 2 * 8))
        for j in static_range(N // 8):
            mma(acc[j], a[kk], bq[j // 2, j % 2])


@device
def mma_cols(acc, a, tile, bq, N: Const[int], K: Const[int]):
    """acc (16 x N, C fragments) += A (16 x K, fragments a) @ tile[0:K, 0:N]: B stored row-major (.trans)."""
    for kk in static_range(K // 16):
        for jp in static_range(N // 16):
            ldmatrix_x4_trans(bq[jp], tile, (kk * 16 + lane % 16, jp * 16 + lane // 16 * 8))
        for j in static_range(N // 8):
            mma(acc[j], a[kk], bq[j // 2, j % 2])


@device
def to_a(frags, acc, K: Const[int]):
    """The 16 x K tile in C fragments (f32) as the A fragments (16-bit) of the next mma: for a 16-column step kk,
    A's registers are those of C tiles 2kk and 2kk + 1, so the tile never leaves the registers."""
    for kk in static_range(K // 16):
        for i in static_range(8):
            frags[kk, i] = acc[2 * kk + i // 4, i % 4]


@device
def quad_max(v):
    """The maximum over the 4 lanes (one quad) that hold the same rows of a C fragment."""
    v = max(v, shfl_xor(v, 1))
    return max(v, shfl_xor(v, 2))


@device
def quad_sum(v):
    v += shfl_xor(v, 1)
    return v + shfl_xor(v, 2)


@device
def visible(query: i32, key: i32, lq: i32, lk: i32, kmask, mbase: i32, CAUSAL: Const[int],
            MASKED: Const[int]) -> bool:
    """Whether query attends key (both in range, the key kept by the padding mask, and not after the query when
    causal)."""
    ok = query < lq and key < lk
    if ok and CAUSAL:
        ok = key <= query
    if ok and MASKED:
        ok = kmask[mbase + key] != 0
    return ok


@device
def saved_lse(lse, row: i32, n: i32) -> f32:
    """The forward's log-sum-exp of a row in log2 units for exp2; +inf for a row with no visible key (its -inf would
    make exp2(-inf - -inf) a NaN: with +inf every P of the row is 0) and 0 for a row past the end."""
    v = 0.0
    if row < n:
        v = lse[row] * LOG2E
        if v == -inf:
            v = inf
    return v


@device
def _keep(w: u32, drop_p: f32, keep_scale: f32) -> f32:
    """keep_scale where the uniform of word w (its top 24 bits) is at least drop_p, else 0."""
    return keep_scale if f32(w >> u32(8)) / 16777216.0 >= drop_p else 0.0


@device
def dropout_pair(rng, bh: i32, query: i32, key: i32, drop_p: f32, keep_scale: f32) -> (f32, f32):
    """The dropout multipliers of keys `key` (even) and key + 1 of one query: words 2 (query % 2) and 2 (query % 2)
    + 1 of their block, one draw for both (the forward and dQ kernels hold keys in such pairs)."""
    w0, w1, w2, w3 = philox_block(u32(key // 2), u32(query // 2), u32(bh), rng[2], rng[0], rng[1] ^ u32(STREAM))
    if query % 2 == 0:
        return _keep(w0, drop_p, keep_scale), _keep(w1, drop_p, keep_scale)
    return _keep(w2, drop_p, keep_scale), _keep(w3, drop_p, keep_scale)


@device
def dropout_pair_of_queries(rng, bh: i32, query: i32, key: i32, drop_p: f32, keep_scale: f32) -> (f32, f32):
    """The dropout multipliers of queries `query` (even) and query + 1 for one key: words key % 2 and 2 + key % 2
    of their block, one draw for both (the dK/dV kernels hold queries in such pairs)."""
    w0, w1, w2, w3 = philox_block(u32(key // 2), u32(query // 2), u32(bh), rng[2], rng[0], rng[1] ^ u32(STREAM))
    if key % 2 == 0:
        return _keep(w0, drop_p, keep_scale), _keep(w2, drop_p, keep_scale)
    return _keep(w1, drop_p, keep_scale), _keep(w3, drop_p, keep_scale)


@device
def whole_tile(q0: i32, k0: i32, lk: i32, BC: Const[int], CAUSAL: Const[int], MASKED: Const[int]) -> bool:
    """Whether every key of the tile k0 ... k0 + BC - 1 is visible to every query from q0 on (in range, no padding
    mask, not after the first query when causal): the per-element checks can be skipped. Rows past the end are
    never written by the forward and dQ kernels, so they need no check."""
    whole = k0 + BC <= lk and not MASKED
    if CAUSAL:
        whole = whole and k0 + BC - 1 <= q0
    return whole


@device
def softmax_tile(s, acc, m, lsum, row0: i32, k0: i32, whole: bool, lq: i32, lk: i32, kmask, mbase: i32, rng,
                 scale_log2: f32, drop_p: f32, keep_scale: f32, D: Const[int], BC: Const[int], CAUSAL: Const[int],
                 MASKED: Const[int], DROPOUT: Const[int]):
    """The forward's online softmax over one tile of scores s (C fragments: this lane's rows row0 and row0 + 8,
    keys k0 + 8j + 2t + e): invisible scores to -inf, the running max m and sum lsum (log2 units) updated, the
    output accumulator acc rescaled, and s turned into the (dropped) weights P of this tile."""
    alpha = local(f32, 2)
    softmax_weights(s, alpha, m, lsum, row0, k0, whole, lq, lk, kmask, mbase, rng, scale_log2, drop_p, keep_scale, BC,
                    CAUSAL, MASKED, DROPOUT)
    rescale(acc, alpha, D)


@device
def rescale(acc, alpha, D: Const[int]):
    """acc's rows row0 and row0 + 8 (C fragments) times alpha[0] and alpha[1]: the output under a new running max."""
    for h in static_range(2):
        for d in static_range(D // 8):
            acc[d, 2 * h] *= alpha[h]
            acc[d, 2 * h + 1] *= alpha[h]


@device
def softmax_weights(s, alpha, m, lsum, row0: i32, k0: i32, whole: bool, lq: i32, lk: i32, kmask, mbase: i32, rng,
                    scale_log2: f32, drop_p: f32, keep_scale: f32, BC: Const[int], CAUSAL: Const[int],
                    MASKED: Const[int], DROPOUT: Const[int]):
    """softmax_tile without touching the output: the factors its rows must be rescaled by go to alpha (so that a
    kernel can compute them while a wgmma still accumulates into the output). The maximum is taken over the raw
    scores and scaled once (scale_log2 > 0: `applies` sends other scales to the composed path), so that a weight
    costs one fused multiply-add and one fast_exp2; only a tile that is not whole tests each score's visibility."""
    t = lane % 4
    if not whole:
        hide_scores(s, row0, k0, lq, lk, kmask, mbase, BC, CAUSAL, MASKED)
    for h in static_range(2):
        top = -inf
        for j in static_range(BC // 8):
            top = max(top, s[j, 2 * h], s[j, 2 * h + 1])
        m_new = max(m[h], quad_max(top) * scale_log2)
        m_use = 0.0 if m_new == -inf else m_new   # no visible key yet: exp2(-inf - 0) = 0 everywhere
        alpha[h] = fast_exp2(m[h] - m_use)
        part = 0.0
        for j in static_range(BC // 8):
            keep0 = keep_scale
            keep1 = keep_scale
            if DROPOUT:
                keep0, keep1 = dropout_pair(rng, query_head(), row0 + 8 * h, k0 + j * 8 + 2 * t, drop_p, keep_scale)
            for e in static_range(2):
                p = fast_exp2(s[j, 2 * h + e] * scale_log2 - m_use)
                part += p   # the undropped weights' sum: softmax normalizes before dropout
                if DROPOUT:
                    p *= keep0 if e == 0 else keep1
                s[j, 2 * h + e] = p
        lsum[h] = lsum[h] * alpha[h] + part   # this lane's share; the quad's sum is taken at the end
        m[h] = m_new


@device
def hide_scores(s, row0: i32, k0: i32, lq: i32, lk: i32, kmask, mbase: i32, BC: Const[int], CAUSAL: Const[int],
                MASKED: Const[int]):
    """The scores of this lane's C fragments (rows row0 and row0 + 8, keys k0 + 8j + 2t + e) that their query does
    not see set to -inf."""
    t = lane % 4
    for h in static_range(2):
        for j in static_range(BC // 8):
            for e in static_range(2):
                if not visible(row0 + 8 * h, k0 + j * 8 + 2 * t + e, lq, lk, kmask, mbase, CAUSAL, MASKED):
                    s[j, 2 * h + e] = -inf


@device
def hide_scores_of_keys(st, key0: i32, q0: i32, lq: i32, lk: i32, kmask, mbase: i32, BR: Const[int],
                        CAUSAL: Const[int], MASKED: Const[int]):
    """hide_scores of transposed scores S^T (C fragments: this lane's keys key0 and key0 + 8, queries q0 + 8j + 2t
    + e)."""
    t = lane % 4
    for h in static_range(2):
        for j in static_range(BR // 8):
            for e in static_range(2):
                if not visible(q0 + j * 8 + 2 * t + e, key0 + 8 * h, lq, lk, kmask, mbase, CAUSAL, MASKED):
                    st[j, 2 * h + e] = -inf


@device
def ds_tile(s, dp, lrow, drow, row0: i32, k0: i32, whole: bool, lq: i32, lk: i32, kmask, mbase: i32, rng,
            scale_log2: f32, drop_p: f32, keep_scale: f32, BC: Const[int], CAUSAL: Const[int], MASKED: Const[int],
            DROPOUT: Const[int]):
    """The dQ kernels' step from S and dP (C fragments, this lane's rows row0 and row0 + 8, keys k0 + 8j + 2t + e)
    to dS = P (dP - delta) in s, P = exp2(S - L) recomputed from the saved log-sum-exp lrow (log2 units)."""
    t = lane % 4
    if not whole:
        hide_scores(s, row0, k0, lq, lk, kmask, mbase, BC, CAUSAL, MASKED)   # their weights: fast_exp2(-inf) = 0
    for h in static_range(2):
        for j in static_range(BC // 8):
            keep0 = keep_scale
            keep1 = keep_scale
            if DROPOUT:
                keep0, keep1 = dropout_pair(rng, query_head(), row0 + 8 * h, k0 + j * 8 + 2 * t, drop_p, keep_scale)
            for e in static_range(2):
                p = fast_exp2(s[j, 2 * h + e] * scale_log2 - lrow[h])
                dpv = dp[j, 2 * h + e]
                if DROPOUT:   # dP of the undropped weights: the dropped ones' times the mask's scale
                    dpv *= keep0 if e == 0 else keep1
                s[j, 2 * h + e] = p * (dpv - drow[h])


@device
def weights_of_keys(st, sl, q0: i32, key0: i32, whole: bool, lq: i32, lk: i32, kmask, mbase: i32, scale_log2: f32,
                    BR: Const[int], CAUSAL: Const[int], MASKED: Const[int]):
    """The first half of dst_tile, which needs S^T alone: st (C fragments: this lane's keys key0 and key0 + 8,
    queries q0 + 8j + 2t + e, whose log-sum-exp is sl[]) becomes the undropped P^T = exp2(S^T - L)."""
    t = lane % 4
    if not whole:
        hide_scores_of_keys(st, key0, q0, lq, lk, kmask, mbase, BR, CAUSAL, MASKED)
    for h in static_range(2):
        for j in static_range(BR // 8):
            for e in static_range(2):
                st[j, 2 * h + e] = fast_exp2(st[j, 2 * h + e] * scale_log2 - sl[j * 8 + 2 * t + e])


@device
def ds_of_keys(st, dpt, sd, q0: i32, key0: i32, bh: i32, rng, drop_p: f32, keep_scale: f32, BR: Const[int],
               DROPOUT: Const[int]):
    """The second half of dst_tile, from P^T in st and dP^T in dpt (queries' delta in sd[]): dpt becomes dS^T =
    P^T (dP^T - delta) and st the dropped P^T (for dV)."""
    t = lane % 4
    for h in static_range(2):
        for j in static_range(BR // 8):
            keep0 = keep_scale
            keep1 = keep_scale
            if DROPOUT:
                keep0, keep1 = dropout_pair_of_queries(rng, bh, q0 + j * 8 + 2 * t, key0 + 8 * h, drop_p,
                                                       keep_scale)
            for e in static_range(2):
                p = st[j, 2 * h + e]
                dpv = dpt[j, 2 * h + e]
                if DROPOUT:   # dP of the undropped weights: the dropped ones' times the mask's scale
                    keep = keep0 if e == 0 else keep1
                    st[j, 2 * h + e] = p * keep
                    dpv *= keep
                dpt[j, 2 * h + e] = p * (dpv - sd[j * 8 + 2 * t + e])


@device
def dst_tile(st, dpt, sl, sd, q0: i32, key0: i32, bh: i32, whole: bool, lq: i32, lk: i32, kmask, mbase: i32, rng,
             scale_log2: f32, drop_p: f32, keep_scale: f32, BR: Const[int], CAUSAL: Const[int], MASKED: Const[int],
             DROPOUT: Const[int]):
    """The dK/dV kernels' step from S^T and dP^T (C fragments: this lane's keys key0 and key0 + 8, queries q0 + 8j +
    2t + e, whose log-sum-exp and delta are sl[] and sd[]): st becomes the dropped P^T (for dV), dpt dS^T."""
    weights_of_keys(st, sl, q0, key0, whole, lq, lk, kmask, mbase, scale_log2, BR, CAUSAL, MASKED)
    ds_of_keys(st, dpt, sd, q0, key0, bh, rng, drop_p, keep_scale, BR, DROPOUT)


@device
def write_scaled_rows(out, acc, base: i32, st: i32, row0: i32, n: i32, scale: f32, D: Const[int]):
    """out[base + r * st] = acc's rows times scale for this lane's positions r = row0 and row0 + 8 (C fragments of D
    columns), positions past n left alone: the backward kernels' dQ, dK and dV."""
    t = lane % 4
    for h in static_range(2):
        row = row0 + 8 * h
        if row < n:
            for d in static_range(D // 8):
                for e in static_range(2):
                    out[base + row * st, d * 8 + 2 * t + e] = acc[d, 2 * h + e] * scale


@device
def write_rows(o, lse, acc, m, lsum, obase: i32, ost: i32, lbase: i32, row0: i32, lq: i32, D: Const[int]):
    """This lane's two positions of O (acc over the row's sum; rows obase + position * ost) and their log-sum-exp
    (natural log; lse[lbase + position]), positions in range only."""
    t = lane % 4
    for h in static_range(2):
        total = quad_sum(lsum[h])
        row = row0 + 8 * h
        if row < lq:
            inv = 1.0 / total if total > 0.0 else 0.0
            for d in static_range(D // 8):
                for e in static_range(2):
                    o[obase + row * ost, d * 8 + 2 * t + e] = acc[d, 2 * h + e] * inv
            if t == 0:
                lse[lbase + row] = m[h] * LN2 + log(total) if total > 0.0 else -inf


# ------------------------------------------------------------------ kernels, one set per element type
@device
def row_dot(o, do, row: i32, D: Const[int]) -> f32:
    """sum over the head dim of dO[row] * O[row] in float32, by the 32 lanes of a warp (every lane gets it)."""
    acc = 0.0
    for c in static_range(D // 32):
        acc += f32(o[row, lane + 32 * c]) * f32(do[row, lane + 32 * c])
    return warp_sum(acc)


def _make_kernels(T):
    @kernel
    def flash_fwd(q: Array[T, 2], k: Array[T, 2], v: Array[T, 2], o: Array[T, 2], lse: Array[f32], kmask: Array[u8],
                  rng: Array[u32], lq: i32, lk: i32, heads: i32, group: i32, qsb: i32, qsh: i32, qst: i32, ksb: i32,
                  ksh: i32, kst: i32, osb: i32, osh: i32, ost: i32, scale_log2: f32, drop_p: f32,
                  keep_scale: f32, D: Const[int], BR: Const[int], BC: Const[int], CAUSAL: Const[int],
                  MASKED: Const[int], DROPOUT: Const[int]):
        """O and the log-sum-exp of BR queries of one (batch, head): K/V tiles of BC keys streamed through shared
        memory, softmax online (running max m and sum l per row, in log2 units). q, k, v and o are rows of D
        values: (batch b, head h, position t) is row b * sb + h * sh + t * st of its layout (qs*, ks* for k and v,
        os*), so that heads sliced out of one projection are read, and O written, where they lie."""
        THREADS: Const[int] = BR // 16 * 32
        launch_bounds(THREADS)
        sq = dynamic_shared(T, (BR, D + PAD))
        sk = dynamic_shared(T, (BC, D + PAD), BR * (D + PAD) * 2)
        sv = dynamic_shared(T, (BC, D + PAD), (BR + BC) * (D + PAD) * 2)
        qf = local(T, (D // 16, 8))
        kb = local(T, (BC // 16, 2, 4))
        vb = local(T, (D // 16, 2, 4))
        pf = local(T, (BC // 16, 8))
        s = local(f32, (BC // 8, 4))
        acc = local(f32, (D // 8, 4))
        m = local(f32, 2)
        lsum = local(f32, 2)
        b, lbase, q0, row0, qbase, kbase, obase = head_rows(lq, heads, group, qsb, qsh, ksb, ksh, osb, osh, BR, CAUSAL)
        load_rows(q, sq, qbase, qst, q0, lq, BR, D, THREADS)
        load_rows(k, sk, kbase, kst, 0, lk, BC, D, THREADS)
        cp_commit()
        zero(acc, D)
        for h in static_range(2):
            m[h] = -inf
            lsum[h] = 0.0
        tiles = key_tiles(q0, lk, BR, BC, CAUSAL)
        for jt in range(tiles):
            # K and V take turns (FlashAttention-2's order): V(jt) is copied while S = Q K(jt)^T and the softmax
            # run, K(jt + 1) while O += P V(jt); a barrier before each copy keeps it off a tile still being read
            k0 = jt * BC
            cp_wait(0)
            syncthreads()
            load_rows(v, sv, kbase, kst, k0, lk, BC, D, THREADS)
            cp_commit()
            if jt == 0:
                load_a(qf, sq, warp * 16, D)
            zero(s, BC)
            mma_rows(s, qf, sk, kb, BC, D)
            whole = whole_tile(q0, k0, lk, BC, CAUSAL, MASKED)
            softmax_tile(s, acc, m, lsum, row0, k0, whole, lq, lk, kmask, b * lk, rng, scale_log2, drop_p,
                         keep_scale, D, BC, CAUSAL, MASKED, DROPOUT)
            to_a(pf, s, BC)
            cp_wait(0)
            syncthreads()
            if jt + 1 < tiles:
                load_rows(k, sk, kbase, kst, k0 + BC, lk, BC, D, THREADS)
                cp_commit()
            mma_cols(acc, pf, sv, vb, D, BC)
        write_rows(o, lse, acc, m, lsum, obase, ost, lbase, row0, lq, D)

    @kernel
    def flash_bwd_dot(o: Array[T, 2], do: Array[T, 2], delta: Array[f32], rows: i32, lq: i32, heads: i32, osb: i32,
                      osh: i32, ost: i32, D: Const[int]):
        """delta[r] = sum over the head dim of dO[r] * O[r] (float32) for r = (batch, head, position) in that order,
        O and dO rows of the layout os*: one warp per row."""
        r = bx * 4 + warp
        if r >= rows:
            return
        bh = r // lq
        row = bh // heads * osb + bh % heads * osh + r % lq * ost
        acc = row_dot(o, do, row, D)
        if lane == 0:
            delta[r] = acc

    @kernel
    def flash_bwd_dq(q: Array[T, 2], k: Array[T, 2], v: Array[T, 2], do: Array[T, 2], lse: Array[f32],
                     delta: Array[f32], kmask: Array[u8], rng: Array[u32], dq: Array[T, 2], lq: i32, lk: i32,
                     heads: i32, group: i32, qsb: i32, qsh: i32, qst: i32, ksb: i32, ksh: i32, kst: i32, osb: i32,
                     osh: i32, ost: i32, scale_log2: f32, scale: f32, drop_p: f32, keep_scale: f32,
                     D: Const[int], BR: Const[int], BC: Const[int], CAUSAL: Const[int], MASKED: Const[int],
                     DROPOUT: Const[int]):
        """dQ of BR queries: over the K/V tiles, S = Q K^T and dP = dO V^T, P = exp(S - L), dS = P (dP - delta),
        dQ += dS K. Layouts as flash_fwd's: dq q's, dO o's."""
        THREADS: Const[int] = BR // 16 * 32
        launch_bounds(THREADS)
        ROW: Const[int] = (D + PAD) * 2
        sq = dynamic_shared(T, (BR, D + PAD))
        sdo = dynamic_shared(T, (BR, D + PAD), BR * ROW)
        sk = dynamic_shared(T, (BC, D + PAD), 2 * BR * ROW)
        sv = dynamic_shared(T, (BC, D + PAD), (2 * BR + BC) * ROW)
        qf = local(T, (D // 16, 8))
        dof = local(T, (D // 16, 8))
        kb = local(T, (BC // 16, 2, 4))
        db = local(T, (D // 16, 2, 4))
        dsf = local(T, (BC // 16, 8))
        s = local(f32, (BC // 8, 4))
        dp = local(f32, (BC // 8, 4))
        acc = local(f32, (D // 8, 4))
        lrow = local(f32, 2)
        drow = local(f32, 2)
        b, lbase, q0, row0, qbase, kbase, obase = head_rows(lq, heads, group, qsb, qsh, ksb, ksh, osb, osh, BR, CAUSAL)
        load_rows(q, sq, qbase, qst, q0, lq, BR, D, THREADS)
        load_rows(do, sdo, obase, ost, q0, lq, BR, D, THREADS)
        cp_commit()
        for h in static_range(2):
            lrow[h] = saved_lse(lse, lbase + row0 + 8 * h, lbase + lq)
            drow[h] = delta[lbase + row0 + 8 * h] if row0 + 8 * h < lq else 0.0
        zero(acc, D)
        for jt in range(key_tiles(q0, lk, BR, BC, CAUSAL)):
            k0 = jt * BC
            load_kv_tile(k, v, sk, sv, kbase, kst, k0, lk, BC, D, THREADS)
            if jt == 0:
                load_a(qf, sq, warp * 16, D)
                load_a(dof, sdo, warp * 16, D)
            zero(s, BC)
            zero(dp, BC)
            mma_rows(s, qf, sk, kb, BC, D)
            mma_rows(dp, dof, sv, kb, BC, D)
            whole = whole_tile(q0, k0, lk, BC, CAUSAL, MASKED)
            ds_tile(s, dp, lrow, drow, row0, k0, whole, lq, lk, kmask, b * lk, rng, scale_log2, drop_p, keep_scale,
                    BC, CAUSAL, MASKED, DROPOUT)
            to_a(dsf, s, BC)
            mma_cols(acc, dsf, sk, db, D, BC)
        write_scaled_rows(dq, acc, qbase, qst, row0, lq, scale, D)

    @kernel
    def flash_bwd_dkdv(q: Array[T, 2], k: Array[T, 2], v: Array[T, 2], do: Array[T, 2], lse: Array[f32],
                       delta: Array[f32], kmask: Array[u8], rng: Array[u32], dk: Array[T, 2], dv: Array[T, 2],
                       lq: i32, lk: i32, heads: i32, group: i32, qsb: i32, qsh: i32, qst: i32, ksb: i32, ksh: i32,
                       kst: i32, osb: i32, osh: i32, ost: i32, scale_log2: f32, scale: f32, drop_p: f32,
                       keep_scale: f32, D: Const[int], BR: Const[int], BC: Const[int], CAUSAL: Const[int],
                       MASKED: Const[int], DROPOUT: Const[int]):
        """dK and dV of BC keys of one (batch, kv head): over the query heads of its group and their query tiles,
        S^T = K Q^T and dP^T = V dO^T, P^T = exp(S^T - L), dV += P^T dO, dS^T = P^T (dP^T - delta), dK += dS^T Q.
        Here each warp owns 16 keys and the queries are the columns."""
        THREADS: Const[int] = BC // 16 * 32
        launch_bounds(THREADS)
        ROW: Const[int] = (D + PAD) * 2
        sk = dynamic_shared(T, (BC, D + PAD))
        sv = dynamic_shared(T, (BC, D + PAD), BC * ROW)
        sq = dynamic_shared(T, (BR, D + PAD), 2 * BC * ROW)
        sdo = dynamic_shared(T, (BR, D + PAD), (2 * BC + BR) * ROW)
        sl = dynamic_shared(f32, BR, (2 * BC + 2 * BR) * ROW)
        sd = dynamic_shared(f32, BR, (2 * BC + 2 * BR) * ROW + BR * 4)
        kf = local(T, (D // 16, 8))
        vf = local(T, (D // 16, 8))
        qb = local(T, (BR // 16, 2, 4))
        db = local(T, (D // 16, 2, 4))
        pf = local(T, (BR // 16, 8))
        st = local(f32, (BR // 8, 4))
        dpt = local(f32, (BR // 8, 4))
        dk_acc = local(f32, (D // 8, 4))
        dv_acc = local(f32, (D // 8, 4))
        b = bz
        kbase = b * ksb + by * ksh
        k0 = bx * BC
        g = lane // 4
        key0 = k0 + warp * 16 + g   # this lane's keys: key0 and key0 + 8
        load_rows(k, sk, kbase, kst, k0, lk, BC, D, THREADS)
        load_rows(v, sv, kbase, kst, k0, lk, BC, D, THREADS)
        cp_commit()
        zero(dk_acc, D)
        zero(dv_acc, D)
        first = k0 // BR if CAUSAL else 0   # causal: queries before k0 see none of these keys
        for hq in range(group):
            h = by * group + hq   # the query head
            bh = b * heads + h
            lbase = bh * lq
            qbase = b * qsb + h * qsh
            obase = b * osb + h * osh
            for it in range(first, cdiv(lq, BR)):
                q0 = it * BR
                syncthreads()
                load_rows(q, sq, qbase, qst, q0, lq, BR, D, THREADS)
                load_rows(do, sdo, obase, ost, q0, lq, BR, D, THREADS)
                cp_commit()
                for r in range(tx, BR, THREADS):
                    sl[r] = saved_lse(lse, lbase + q0 + r, lbase + lq)
                    sd[r] = delta[lbase + q0 + r] if q0 + r < lq else 0.0
                cp_wait(0)
                syncthreads()
                if hq == 0 and it == first:
                    load_a(kf, sk, warp * 16, D)
                    load_a(vf, sv, warp * 16, D)
                zero(st, BR)
                zero(dpt, BR)
                mma_rows(st, kf, sq, qb, BR, D)
                mma_rows(dpt, vf, sdo, qb, BR, D)
                # queries past the end would add to dK and dV here: the tile is whole only with all of them in range
                whole = q0 + BR <= lq and whole_tile(q0, k0, lk, BC, CAUSAL, MASKED)
                dst_tile(st, dpt, sl, sd, q0, key0, bh, whole, lq, lk, kmask, b * lk, rng, scale_log2, drop_p,
                         keep_scale, BR, CAUSAL, MASKED, DROPOUT)
                to_a(pf, st, BR)
                mma_cols(dv_acc, pf, sdo, db, D, BR)
                to_a(pf, dpt, BR)
                mma_cols(dk_acc, pf, sq, db, D, BR)
        write_scaled_rows(dk, dk_acc, kbase, kst, key0, lk, scale, D)
        write_scaled_rows(dv, dv_acc, kbase, kst, key0, lk, 1.0, D)

    return FlashKernels(flash_fwd, flash_bwd_dot, flash_bwd_dq, flash_bwd_dkdv)


# ------------------------------------------------------------------ the forward on Hopper's warpgroup MMA
@device
def load_panels(src, dst, first: i32, base: i32, r0: i32, n: i32, ROWS: Const[int], D: Const[int],
                THREADS: Const[int]):
    """Start copying rows base + r0 ... base + r0 + ROWS - 1 of src (D columns; a row at or past n repeats row
    n - 1) into the 128-byte-swizzled ROWS x 64 panels dst[first], dst[first + 1], ... (columns 64p ... 64p + 63
    in panel p): the K-major layout a wgmma descriptor reads."""
    for u in static_range(ROWS * D // 8 // THREADS):
        chunk = tx + u * THREADS
        r = chunk // (D // 8)
        col = chunk % (D // 8) * 8
        cp_async16(dst, (first + col // 64, r, swizzle(r, col % 64, 64)), src, (base + min(r0 + r, n - 1), col))


@device
def key_block(lq: i32, lk: i32, heads: i32, group: i32, BK: Const[int], BR: Const[int],
              CAUSAL: Const[int]) -> (i32, i32, i32, i32, i32, i32, i32):
    """The backward's block (bx: BK keys, by: key/value head, bz: batch): (batch, its first key row, its first key,
    the first query tile that sees them, query tiles a head, steps over the group's heads, the group's first query
    head's (batch, head) row block)."""
    b = bz
    k0 = bx * BK
    first = k0 // BR if CAUSAL else 0   # causal: queries before k0 see none of these keys
    per_head = cdiv(lq, BR) - first
    return b, (b * (heads // group) + by) * lk, k0, first, per_head, group * per_head, b * heads + by * group


@device
def step_tile(step: i32, head0: i32, first: i32, per_head: i32, BR: Const[int]) -> (i32, i32):
    """The fused backward's step over (query head, query tile) of a key block: (the head's (batch, head) row block,
    the step's first query)."""
    return head0 + step // per_head, (first + step % per_head) * BR


@device
def query_step(step: i32, head0: i32, first: i32, per_head: i32, lq: i32, BR: Const[int]) -> (i32, i32, i32, i32,
                                                                                              i32):
    """A key block's step over (query head, query tile): (buffer, the head's (batch, head) row block, the first query,
    the next step's head rows and first query)."""
    bh, q0 = step_tile(step, head0, first, per_head, BR)
    nbh, nq0 = step_tile(step + 1, head0, first, per_head, BR)
    return step % 2, bh, q0, nbh * lq, nq0


@device
def load_query_tiles(q, do, sq, sdo, first: i32, base: i32, q0: i32, lq: i32, BR: Const[int], D: Const[int],
                     THREADS: Const[int]):
    """Start copying the BR queries from q0 of Q and dO (rows base + ...) into panels sq[first...], sdo[first...]."""
    load_panels(q, sq, first, base, q0, lq, BR, D, THREADS)
    load_panels(do, sdo, first, base, q0, lq, BR, D, THREADS)
    cp_commit()


@device
def publish_tiles():
    """This thread's copies landed (cp.async) and its stores and theirs visible to wgmma (the async proxy), for every
    thread of the block: the tiles just written are ready to multiply, and every warpgroup is past its last wgmma."""
    cp_wait(0)
    fence_proxy_async()
    syncthreads()


@device
def store_weights(sp, first: i32, s, row: i32, BC: Const[int]):
    """This lane's weights P (C fragments of block rows row and row + 8) as bf16 into the swizzled panels sp[first],
    sp[first + 1], ... (keys 64p ... 64p + 63 in panel first + p): the A operand of P V."""
    t = lane % 4
    for h in static_range(2):
        r = row + 8 * h
        for j in static_range(BC // 8):
            for e in static_range(2):
                col = j * 8 + 2 * t + e
                sp[first + col // 64, r, swizzle(r, col % 64, 64)] = s[j, 2 * h + e]


@device
def wgmma_rows(acc, a_tiles, a_first: i32, a_row: i32, b_tiles, b_first: i32, N: Const[int], K: Const[int],
               ACCUMULATE: Const[int]):
    """acc (64 x N) = or += A[a_row: a_row + 64, 0:K] @ B[0:N, 0:K]^T, both K-major swizzled 64-column panels
    (a_tiles[a_first + k // 64], b_tiles[b_first + k // 64]): K / 16 wgmmas, issued (wgmma_fence before them) and
    committed as one group; the caller waits."""
    wgmma_fence()
    for kk in static_range(K // 16):
        wgmma_bf16(acc, wgmma_desc(a_tiles[a_first + kk // 4], (a_row, kk % 4 * 16), 128),
                   wgmma_desc(b_tiles[b_first + kk // 4], (0, kk % 4 * 16), 128), N, 1 if ACCUMULATE else kk)
    wgmma_commit()


@device
def row_major_b(b_tiles, first: i32, k: i32, ROWS: Const[int]) -> i64:
    """The descriptor of B[0:N, k:k + 16] for a wgmma reading it MN-major from a row-major [K, N] tile held as
    swizzled ROWS x 64 panels b_tiles[first], b_tiles[first + 1], ... (columns 64p ... 64p + 63 in panel p, as
    load_panels writes K, V, Q or dO): rows k ... k + 15 of the panels, the next 64 columns one panel (LBO) on,
    the next 8 rows 1024 bytes (SBO) on. No transpose: V for P V, K for dS K, Q and dO for the dK and dV products."""
    return wgmma_desc(b_tiles[first], (k, 0), 128, ROWS * 128, 1024)


@device
def wgmma_rows_mn(acc, a_tiles, a_first: i32, a_row: i32, b_tiles, b_first: i32, N: Const[int], K: Const[int],
                  ROWS: Const[int]):
    """acc (64 x N) += A[a_row: a_row + 64, 0:K] @ B[0:K, 0:N], A as in wgmma_rows, B a row-major tile in swizzled
    ROWS x 64 panels (row_major_b): K / 16 wgmmas issued and committed as one group; the caller waits."""
    wgmma_fence()
    for kk in static_range(K // 16):
        wgmma_bf16(acc, wgmma_desc(a_tiles[a_first + kk // 4], (a_row, kk % 4 * 16), 128),
                   row_major_b(b_tiles, b_first, kk * 16, ROWS), N, 1, MN_MAJOR)
    wgmma_commit()


@functools.cache
def wgmma_forward():
    """The Hopper forward (bf16): made on first use, as kernels_for's."""
    @kernel
    def flash_fwd_wgmma(q: Array[bf16, 2], k: Array[bf16, 2], v: Array[bf16, 2], o: Array[bf16, 2], lse: Array[f32],
                        kmask: Array[u8], rng: Array[u32], lq: i32, lk: i32, heads: i32, group: i32,
                        scale_log2: f32, drop_p: f32, keep_scale: f32, D: Const[int], WGS: Const[int],
                        BC: Const[int], CAUSAL: Const[int], MASKED: Const[int], DROPOUT: Const[int]):
        """flash_fwd with warpgroup MMA: WGS warpgroups of 64 query rows each share K and V tiles of BC keys. S = Q
        K^T and O += P V are wgmmas on 128-byte-swizzled shared panels (Q, K and P K-major, V read MN-major as it
        lies); the softmax, masking, dropout and the output are flash_fwd's, on the same fragment layout (each
        warp's 16 rows as mma.sync's C fragments), so the dropout mask and the log-sum-exp are those its backward
        expects. K(j + 1) and V(j + 1) are copied (cp.async) while tile j is multiplied; two buffers each."""
        BR: Const[int] = 64 * WGS
        THREADS: Const[int] = 128 * WGS
        DP: Const[int] = D // 64   # panels of a Q, K or V tile
        CP: Const[int] = BC // 64  # panels of a P tile
        launch_bounds(THREADS)
        sq = dynamic_shared(bf16, (DP, BR, 64))
        sk = dynamic_shared(bf16, (2 * DP, BC, 64), BR * D * 2)
        sv = dynamic_shared(bf16, (2 * DP, BC, 64), (BR + 2 * BC) * D * 2)
        sp = dynamic_shared(bf16, (CP, BR, 64), (BR + 4 * BC) * D * 2)
        s = local(f32, (BC // 8, 4))
        acc = local(f32, (D // 8, 4))
        m = local(f32, 2)
        lsum = local(f32, 2)
        wg = warp // 4
        b, qbase, kbase, q0, row0 = query_tile(lq, lk, heads, group, BR, CAUSAL)   # this lane's rows: row0 and row0 + 8
        load_panels(q, sq, 0, qbase, q0, lq, BR, D, THREADS)
        load_panels(k, sk, 0, kbase, 0, lk, BC, D, THREADS)
        load_panels(v, sv, 0, kbase, 0, lk, BC, D, THREADS)
        cp_commit()
        zero(acc, D)
        for h in static_range(2):
            m[h] = -inf
            lsum[h] = 0.0
        tiles = key_tiles(q0, lk, BR, BC, CAUSAL)
        jt = 0
        while True:   # a do-while (at least one tile): see examples/kernels/gemm_wgmma.py on ptxas and wgmma
            buf = jt % 2
            k0 = jt * BC
            publish_tiles()   # K(jt) and V(jt) in place; every warpgroup done with tile jt - 1
            if jt + 1 < tiles:
                load_panels(k, sk, (1 - buf) * DP, kbase, k0 + BC, lk, BC, D, THREADS)
                load_panels(v, sv, (1 - buf) * DP, kbase, k0 + BC, lk, BC, D, THREADS)
                cp_commit()
            wgmma_rows(s, sq, 0, wg * 64, sk, buf * DP, BC, D, 0)
            wgmma_wait(0)
            whole = whole_tile(q0, k0, lk, BC, CAUSAL, MASKED)
            softmax_tile(s, acc, m, lsum, row0, k0, whole, lq, lk, kmask, b * lk, rng, scale_log2, drop_p,
                         keep_scale, D, BC, CAUSAL, MASKED, DROPOUT)
            store_weights(sp, 0, s, warp * 16 + lane // 4, BC)
            fence_proxy_async()
            syncthreads()
            wgmma_rows_mn(acc, sp, 0, wg * 64, sv, buf * DP, D, BC, BC)
            wgmma_wait(0)
            jt += 1
            if jt >= tiles:
                break
        write_rows(o, lse, acc, m, lsum, qbase, 1, qbase, row0, lq, D)
    return flash_fwd_wgmma


# ------------------------------------------------------------------ the forward fed by the copy engine
@device
def produce_tiles(kmap, vmap, skf, svf, fullk, fullv, emptyk, emptyv, head: i32, kv_heads: i32, lk: i32, tiles: i32,
                  first: i32, BC: Const[int], D: Const[int], STAGES: Const[int]):
    """The producer (one thread): key/value head `head`'s tiles 0 ... tiles - 1 of K and V into the STAGES-deep rings
    skf and svf by the copy engine, from ring position `first` on (the tiles an earlier query tile of a persistent
    block took), each stage refilled once its consumers released it (emptyk / emptyv). K and V come through tensor
    maps over (batch, key/value head, key, column) with boxes of BC keys x 64 columns: a tile is D / 64 boxes,
    swizzled as the consumers' wgmmas read them, keys past lk zeros (the copy engine fills them)."""
    TILE: Const[int] = BC * D
    b = head // kv_heads
    hk = head % kv_heads
    for j in range(tiles):
        n = first + j
        stage = n % STAGES
        if n >= STAGES:
            mbarrier_wait(emptyk, stage, (n // STAGES - 1) % 2)
        mbarrier_arrive_expect_tx(fullk, stage, TILE * 2)
        for p in static_range(D // 64):
            cp_async_bulk_tensor(skf, stage * TILE + p * BC * 64, kmap, (b, hk, j * BC, p * 64), fullk, stage)
        if n >= STAGES:
            mbarrier_wait(emptyv, stage, (n // STAGES - 1) % 2)
        mbarrier_arrive_expect_tx(fullv, stage, TILE * 2)
        for p in static_range(D // 64):
            cp_async_bulk_tensor(svf, stage * TILE + p * BC * 64, vmap, (b, hk, j * BC, p * 64), fullv, stage)


@device
def release_stage(empty, stage: i32):
    """A consumer warpgroup's release of a ring stage its wgmmas have read (after its wgmma_wait): one arrival by
    the warpgroup's first thread, as CUTLASS's PipelineTmaAsync (the operation is the warpgroup's; 256 arrivals a
    stage were 256 shared-memory atomics on one address)."""
    if tx % 128 == 0:
        mbarrier_arrive(empty, stage)


@device
def hand_over_weights(sp, pa, s, wg: i32, BC: Const[int], RS: Const[int]):
    """This tile's weights P (s) to the P V wgmma: as A fragments in registers (RS), or through shared memory."""
    if RS:
        to_a(pa, s, BC)
    else:
        publish_weights(sp, s, wg, BC)


@device
def weights_times_values(acc, sp, pa, wg: i32, sv, first: i32, D: Const[int], BC: Const[int], RS: Const[int]):
    """Issue acc += P V (V's panels sv[first...], read MN-major) with P from registers (RS) or from this warpgroup's
    rows of sp."""
    if RS:
        wgmma_fence()
        for kk in static_range(BC // 16):
            wgmma_bf16_rs(acc, pa[kk], row_major_b(sv, first, kk * 16, BC), D, 1, MN_MAJOR)
        wgmma_commit()
    else:
        wgmma_rows_mn(acc, sp, 0, wg * 64, sv, first, D, BC, BC)


@device
def publish_weights(sp, s, wg: i32, BC: Const[int]):
    """This warp's weights P into sp, visible to wgmma, once all four warps of warpgroup wg have stored theirs (the
    warpgroup's own named barrier: the other warpgroups go on)."""
    store_weights(sp, 0, s, warp * 16 + lane // 4, BC)
    fence_proxy_async()
    bar_sync(1 + wg, 128)


@functools.cache
def bulk_forward():
    """The Hopper forward fed by the copy engine through tensor maps (bf16): made on first use."""
    @kernel
    def flash_fwd_bulk(q: Array[bf16, 2], kp: TensorMap[bf16, 4], vp: TensorMap[bf16, 4], o: Array[bf16, 2],
                       lse: Array[f32],
                       kmask: Array[u8], rng: Array[u32], lq: i32, lk: i32, heads: i32, group: i32, batch: i32,
                       scale_log2: f32, drop_p: f32, keep_scale: f32, D: Const[int], WGS: Const[int],
                       BC: Const[int], STAGES: Const[int], PINGPONG: Const[int], RS: Const[int], PERSIST: Const[int],
                       CAUSAL: Const[int], MASKED: Const[int], DROPOUT: Const[int]):
        """flash_fwd_wgmma, warp-specialized: a producer warpgroup (the block's last; one thread of it issues, and
        it gives its registers to the consumers with setmaxnreg, as FlashAttention-3's) has the copy engine bring
        each tile's K and V (tensor maps: produce_tiles) into STAGES-deep rings of shared memory, counted on mbarriers,
        while WGS consumer warpgroups multiply; a consumer waits only for its tile and releases K after
        S = Q K^T and V after O += P V, and the four warps of a warpgroup meet on their own named barrier before
        P V. S(j) = Q K(j)^T is issued with O += P(j - 1) V(j - 1), so that the softmax of tile j overlaps that
        product (FlashAttention-3's intra-warpgroup pipelining). RS=1 keeps P in registers as the A operand of
        P V (wgmma_bf16_rs) instead of storing it to shared memory. No thread copies K or V (P V reads V MN-major as
        it lies), and no barrier of the whole block runs in the loop.
        PERSIST=1: a grid of at most one block an SM, each taking query tile after query tile (next_tile); the
        producer goes on to the next tile's K and V as stages free up and each warpgroup fetches its next queries
        once its last S is in, so that a tile's start overlaps the end of the one before (the rings' positions run on
        across tiles). Not with dropout, whose Philox counters name the grid's (batch, head). PERSIST=0: one tile a
        block, the grid (query tiles, heads, batch)."""
        BR: Const[int] = 64 * WGS
        CONSUMERS: Const[int] = 128 * WGS
        DP: Const[int] = D // 64   # panels of a Q, K or V tile
        CP: Const[int] = 1 if RS else BC // 64   # panels of a P tile (RS keeps P in registers: a stub)
        P_ROWS: Const[int] = 16 if RS else BR
        TILE: Const[int] = BC * D
        launch_bounds(CONSUMERS + 128, 1)
        sq = dynamic_shared(bf16, (DP, BR, 64))
        sk = dynamic_shared(bf16, (STAGES * DP, BC, 64), BR * D * 2)
        skf = dynamic_shared(bf16, (STAGES * TILE,), BR * D * 2)
        sv = dynamic_shared(bf16, (STAGES * DP, BC, 64), (BR + STAGES * BC) * D * 2)
        svf = dynamic_shared(bf16, (STAGES * TILE,), (BR + STAGES * BC) * D * 2)
        sp = dynamic_shared(bf16, (CP, P_ROWS, 64), (BR + 2 * STAGES * BC) * D * 2)
        fullk = shared(i64, STAGES)
        fullv = shared(i64, STAGES)
        emptyk = shared(i64, STAGES)
        emptyv = shared(i64, STAGES)
        per_head = cdiv(lq, BR)
        work = per_head * heads * batch   # query tiles in all
        t0 = bx if PERSIST else query_head() * gdx + bx
        b, qbase, kbase, q0, row0 = tile_at(t0, per_head, lq, lk, heads, group, BR, CAUSAL)
        if tx == 0:
            for ring in range(STAGES):
                mbarrier_init(fullk, ring, 1)
                mbarrier_init(fullv, ring, 1)
                mbarrier_init(emptyk, ring, WGS)   # one arrival a consumer warpgroup (release_stage)
                mbarrier_init(emptyv, ring, WGS)
        if tx < CONSUMERS:
            load_panels(q, sq, 0, qbase, q0, lq, BR, D, CONSUMERS)
        cp_commit()
        cp_wait(0)
        fence_proxy_async()
        syncthreads()   # the barriers initialized, the first tile's Q in place for wgmma
        first = 0       # ring position of this tile's first K/V
        rounds = 0
        t = t0
        if tx >= CONSUMERS:   # the producer warpgroup: one thread issues, its registers go to the consumers
            if WGS == 2:       # three warpgroups start with 168 registers a thread: 40 + 2 x 232 of them fit
                setmaxnreg_dec(40)
            if WGS == 3:       # four start with 128: 24 + 3 x 160
                setmaxnreg_dec(24)
            if tx == CONSUMERS:
                while True:
                    b, qbase, kbase, q0, row0 = tile_at(t, per_head, lq, lk, heads, group, BR, CAUSAL)
                    tiles = key_tiles(q0, lk, BR, BC, CAUSAL)
                    produce_tiles(kp, vp, skf, svf, fullk, fullv, emptyk, emptyv, kbase // lk, heads // group, lk,
                                  tiles, first, BC, D, STAGES)
                    first += tiles
                    rounds += 1
                    t = next_tile(rounds)
                    if PERSIST == 0 or t >= work:
                        break
        else:
            if WGS == 2:
                setmaxnreg_inc(232)
            if WGS == 3:
                setmaxnreg_inc(160)
            wg = warp // 4
            s = local(f32, (BC // 8, 4))
            acc = local(f32, (D // 8, 4))
            m = local(f32, 2)
            lsum = local(f32, 2)
            alpha = local(f32, 2)
            pa = local(bf16, (BC // 16, 8))   # RS: this tile's weights P as wgmma's A fragments
            turns = PINGPONG == 1 and WGS == 2
            while True:
                b, qbase, kbase, q0, row0 = tile_at(t, per_head, lq, lk, heads, group, BR, CAUSAL)
                tiles = key_tiles(q0, lk, BR, BC, CAUSAL)
                rounds += 1
                t = next_tile(rounds)
                zero(acc, D)
                for h in static_range(2):
                    m[h] = -inf
                    lsum[h] = 0.0
                if PERSIST and rounds > 1:   # this warpgroup's queries, fetched during the last tile, in place
                    cp_wait(0)
                    fence_proxy_async()
                    bar_sync(1 + wg, 128)
                # tile 0: S = Q K^T, its weights P into sp
                mbarrier_wait(fullk, first % STAGES, first // STAGES % 2)
                wgmma_rows(s, sq, 0, wg * 64, sk, first % STAGES * DP, BC, D, 0)
                wgmma_wait(0)
                release_stage(emptyk, first % STAGES)
                softmax_tile(s, acc, m, lsum, row0, 0, whole_tile(q0, 0, lk, BC, CAUSAL, MASKED), lq, lk, kmask,
                             b * lk, rng, scale_log2, drop_p, keep_scale, D, BC, CAUSAL, MASKED, DROPOUT)
                hand_over_weights(sp, pa, s, wg, BC, RS)
                # tile jt: S(jt) = Q K(jt)^T and O += P(jt - 1) V(jt - 1) issued together; the softmax of S(jt) runs
                # while the tensor cores still add P V, and only the rescale of O waits for them. PINGPONG: the two
                # warpgroups take turns issuing (named barriers 3 and 4), so one's softmax runs while the other
                # multiplies
                if turns and wg == 1 and tiles > 1:
                    bar_arrive(3, 256)   # warpgroup 0 issues first
                for jt in range(1, tiles):
                    stage = (first + jt) % STAGES
                    prev = (first + jt - 1) % STAGES
                    k0 = jt * BC
                    mbarrier_wait(fullk, stage, (first + jt) // STAGES % 2)
                    if turns:
                        bar_sync(3 + wg, 256)
                    wgmma_rows(s, sq, 0, wg * 64, sk, stage * DP, BC, D, 0)
                    mbarrier_wait(fullv, prev, (first + jt - 1) // STAGES % 2)
                    weights_times_values(acc, sp, pa, wg, sv, prev * DP, D, BC, RS)
                    if turns and not (wg == 1 and jt == tiles - 1):   # every arrival has its bar_sync
                        bar_arrive(4 - wg, 256)
                    wgmma_wait(1)   # S(jt) is in
                    release_stage(emptyk, stage)
                    softmax_weights(s, alpha, m, lsum, row0, k0, whole_tile(q0, k0, lk, BC, CAUSAL, MASKED), lq, lk,
                                    kmask, b * lk, rng, scale_log2, drop_p, keep_scale, BC, CAUSAL, MASKED, DROPOUT)
                    wgmma_wait(0)   # O += P V(jt - 1) is in: V(jt - 1) and sp are free
                    release_stage(emptyv, prev)
                    rescale(acc, alpha, D)
                    hand_over_weights(sp, pa, s, wg, BC, RS)
                if PERSIST and t < work:   # every S of this tile is in: its queries' rows are free
                    nb, nqbase, nkbase, nq0, nrow0 = tile_at(t, per_head, lq, lk, heads, group, BR, CAUSAL)
                    load_warpgroup_queries(q, sq, nqbase, nq0, lq, wg, D)
                    cp_commit()
                last = (first + tiles - 1) % STAGES
                mbarrier_wait(fullv, last, (first + tiles - 1) // STAGES % 2)
                weights_times_values(acc, sp, pa, wg, sv, last * DP, D, BC, RS)
                wgmma_wait(0)
                release_stage(emptyv, last)
                write_rows(o, lse, acc, m, lsum, qbase, 1, qbase, row0, lq, D)
                first += tiles
                if PERSIST == 0 or t >= work:
                    break
    return flash_fwd_bulk


@device
def row_stats(sl, sd, lse, delta, qbase: i32, q0: i32, lq: i32, ROWS: Const[int], THREADS: Const[int]):
    """The saved log-sum-exp (log2 units) and delta of queries q0 ... q0 + ROWS - 1 into shared sl, sd."""
    for r in range(tx, ROWS, THREADS):
        sl[r] = saved_lse(lse, qbase + q0 + r, qbase + lq)
        sd[r] = delta[qbase + q0 + r] if q0 + r < lq else 0.0


@functools.cache
def wgmma_backward():
    """The Hopper backward (bf16): (dQ kernel, dK/dV kernel), made on first use."""
    @kernel
    def flash_bwd_dq_wgmma(q: Array[bf16, 2], k: Array[bf16, 2], v: Array[bf16, 2],
                           do: Array[bf16, 2], lse: Array[f32], delta: Array[f32], kmask: Array[u8], rng: Array[u32],
                           dq: Array[bf16, 2], lq: i32, lk: i32, heads: i32, group: i32, scale_log2: f32, scale: f32,
                           drop_p: f32, keep_scale: f32, D: Const[int], WGS: Const[int], BC: Const[int],
                           CAUSAL: Const[int], MASKED: Const[int], DROPOUT: Const[int]):
        """flash_bwd_dq with warpgroup MMA: S = Q K^T, dP = dO V^T, dQ += dS K (K read MN-major from its tile), the
        element-wise step flash_bwd_dq's (ds_tile). K(j + 1) and V(j + 1) are copied while tile j is multiplied;
        two buffers each."""
        BR: Const[int] = 64 * WGS
        THREADS: Const[int] = 128 * WGS
        DP: Const[int] = D // 64
        CP: Const[int] = (BC + 63) // 64   # panels along the keys (BC = 32 uses half of one)
        TILE: Const[int] = BC * D * 2
        AT_DS: Const[int] = 4 * BR * D + 4 * TILE   # byte offsets (wgmma_dq_smem adds them up for the launch)
        launch_bounds(THREADS)
        sq = dynamic_shared(bf16, (DP, BR, 64))
        sdo = dynamic_shared(bf16, (DP, BR, 64), BR * D * 2)
        sk = dynamic_shared(bf16, (2 * DP, BC, 64), 2 * BR * D * 2)
        sv = dynamic_shared(bf16, (2 * DP, BC, 64), 2 * BR * D * 2 + 2 * TILE)
        sds = dynamic_shared(bf16, (CP, BR, 64), AT_DS)
        s = local(f32, (BC // 8, 4))
        dp = local(f32, (BC // 8, 4))
        acc = local(f32, (D // 8, 4))
        lrow = local(f32, 2)
        drow = local(f32, 2)
        wg = warp // 4
        b, qbase, kbase, q0, row0 = query_tile(lq, lk, heads, group, BR, CAUSAL)   # this lane's rows: row0 and row0 + 8
        load_panels(q, sq, 0, qbase, q0, lq, BR, D, THREADS)
        load_panels(do, sdo, 0, qbase, q0, lq, BR, D, THREADS)
        load_panels(k, sk, 0, kbase, 0, lk, BC, D, THREADS)
        load_panels(v, sv, 0, kbase, 0, lk, BC, D, THREADS)
        cp_commit()
        for h in static_range(2):
            lrow[h] = saved_lse(lse, qbase + row0 + 8 * h, qbase + lq)
            drow[h] = delta[qbase + row0 + 8 * h] if row0 + 8 * h < lq else 0.0
        zero(acc, D)
        tiles = key_tiles(q0, lk, BR, BC, CAUSAL)
        jt = 0
        while True:
            buf = jt % 2
            k0 = jt * BC
            publish_tiles()
            if jt + 1 < tiles:
                load_panels(k, sk, (1 - buf) * DP, kbase, k0 + BC, lk, BC, D, THREADS)
                load_panels(v, sv, (1 - buf) * DP, kbase, k0 + BC, lk, BC, D, THREADS)
                cp_commit()
            wgmma_rows(s, sq, 0, wg * 64, sk, buf * DP, BC, D, 0)
            wgmma_rows(dp, sdo, 0, wg * 64, sv, buf * DP, BC, D, 0)
            wgmma_wait(0)
            whole = whole_tile(q0, k0, lk, BC, CAUSAL, MASKED)
            ds_tile(s, dp, lrow, drow, row0, k0, whole, lq, lk, kmask, b * lk, rng, scale_log2, drop_p, keep_scale,
                    BC, CAUSAL, MASKED, DROPOUT)
            store_weights(sds, 0, s, warp * 16 + lane // 4, BC)
            fence_proxy_async()
            syncthreads()
            wgmma_rows_mn(acc, sds, 0, wg * 64, sk, buf * DP, D, BC, BC)
            wgmma_wait(0)
            jt += 1
            if jt >= tiles:
                break
        write_scaled_rows(dq, acc, qbase, 1, row0, lq, scale, D)

    @kernel
    def flash_bwd_dkdv_wgmma(q: Array[bf16, 2], k: Array[bf16, 2], v: Array[bf16, 2],
                             do: Array[bf16, 2], lse: Array[f32], delta: Array[f32],
                             kmask: Array[u8], rng: Array[u32], dk: Array[bf16, 2], dv: Array[bf16, 2], lq: i32,
                             lk: i32, heads: i32, group: i32, scale_log2: f32, scale: f32, drop_p: f32,
                             keep_scale: f32, D: Const[int], WGS: Const[int], BR: Const[int], CAUSAL: Const[int],
                             MASKED: Const[int], DROPOUT: Const[int]):
        """flash_bwd_dkdv with warpgroup MMA: warpgroup w owns keys k0 + 64w ... + 63 of the block's 64 WGS; over the
        query heads of the group and their tiles of BR queries, S^T = K Q^T and dP^T = V dO^T, then dV += P^T dO and
        dK += dS^T Q with Q and dO read MN-major from their tiles; the element-wise step flash_bwd_dkdv's
        (dst_tile). The next tile's Q and dO are copied while tile j is multiplied, its statistics written while
        dV's and dK's wgmmas run; two buffers each."""
        BK: Const[int] = 64 * WGS
        THREADS: Const[int] = 128 * WGS
        DP: Const[int] = D // 64
        RP: Const[int] = (BR + 63) // 64   # panels along the queries (BR = 32 uses half of one)
        TILE: Const[int] = BR * D * 2
        AT_PT: Const[int] = 4 * BK * D + 4 * TILE   # byte offsets (wgmma_dkdv_smem adds them up for the launch)
        AT_STATS: Const[int] = AT_PT + 2 * RP * BK * 128
        launch_bounds(THREADS)
        sk = dynamic_shared(bf16, (DP, BK, 64))
        sv = dynamic_shared(bf16, (DP, BK, 64), BK * D * 2)
        sq = dynamic_shared(bf16, (2 * DP, BR, 64), 2 * BK * D * 2)
        sdo = dynamic_shared(bf16, (2 * DP, BR, 64), 2 * BK * D * 2 + 2 * TILE)
        spt = dynamic_shared(bf16, (RP, BK, 64), AT_PT)
        sdst = dynamic_shared(bf16, (RP, BK, 64), AT_PT + RP * BK * 128)
        stats = dynamic_shared(f32, (4, BR), AT_STATS)  # lse and delta, two buffers
        st = local(f32, (BR // 8, 4))
        dpt = local(f32, (BR // 8, 4))
        dk_acc = local(f32, (D // 8, 4))
        dv_acc = local(f32, (D // 8, 4))
        wg = warp // 4
        b, kbase, k0, first, per_head, steps, head0 = key_block(lq, lk, heads, group, BK, BR, CAUSAL)
        key0 = k0 + warp * 16 + lane // 4   # this lane's keys: key0 and key0 + 8
        load_panels(k, sk, 0, kbase, k0, lk, BK, D, THREADS)
        load_panels(v, sv, 0, kbase, k0, lk, BK, D, THREADS)
        load_query_tiles(q, do, sq, sdo, 0, head0 * lq, first * BR, lq, BR, D, THREADS)
        row_stats(stats[0], stats[1], lse, delta, head0 * lq, first * BR, lq, BR, THREADS)
        zero(dk_acc, D)
        zero(dv_acc, D)
        step = 0
        if steps > 0:   # causal keys after every query have no gradient (steps <= 0: zeros)
            while True:   # over (query head, query tile) of the group
                buf, bh, q0, nbase, nq0 = query_step(step, head0, first, per_head, lq, BR)
                publish_tiles()
                if step + 1 < steps:
                    load_query_tiles(q, do, sq, sdo, (1 - buf) * DP, nbase, nq0, lq, BR, D, THREADS)
                wgmma_rows(st, sk, 0, wg * 64, sq, buf * DP, BR, D, 0)
                wgmma_rows(dpt, sv, 0, wg * 64, sdo, buf * DP, BR, D, 0)
                wgmma_wait(0)
                # queries past the end would add to dK and dV here: the tile is whole only with all of them in range
                whole = q0 + BR <= lq and whole_tile(q0, k0, lk, BK, CAUSAL, MASKED)
                dst_tile(st, dpt, stats[2 * buf], stats[2 * buf + 1], q0, key0, bh, whole, lq, lk, kmask, b * lk, rng,
                         scale_log2, drop_p, keep_scale, BR, CAUSAL, MASKED, DROPOUT)
                store_weights(spt, 0, st, warp * 16 + lane // 4, BR)
                store_weights(sdst, 0, dpt, warp * 16 + lane // 4, BR)
                fence_proxy_async()
                syncthreads()
                wgmma_rows_mn(dv_acc, spt, 0, wg * 64, sdo, buf * DP, D, BR, BR)
                wgmma_rows_mn(dk_acc, sdst, 0, wg * 64, sq, buf * DP, D, BR, BR)
                if step + 1 < steps:
                    row_stats(stats[2 - 2 * buf], stats[3 - 2 * buf], lse, delta, nbase, nq0, lq, BR, THREADS)
                wgmma_wait(0)
                step += 1
                if step >= steps:
                    break
        write_scaled_rows(dk, dk_acc, kbase, 1, key0, lk, scale, D)
        write_scaled_rows(dv, dv_acc, kbase, 1, key0, lk, 1.0, D)
    return flash_bwd_dq_wgmma, flash_bwd_dkdv_wgmma


@device
def key_columns(sk, wg: i32, k: i32, DW: Const[int], BK: Const[int]) -> i64:
    """The MN-major descriptor of K's rows k ... k + 15, columns DW wg ... DW wg + DW - 1 (dQ's B for warpgroup wg)
    in K's row-major panels: a column offset within a panel is an offset of the descriptor's start (the swizzle acts
    on the whole address)."""
    return wgmma_desc(sk[wg * DW // 64], (k, wg * DW % 64), 128, BK * 128, 1024)


@device
def keys_times_ds(dq, sdst, panel: i32, sk, wg: i32, DW: Const[int], BK: Const[int]):
    """dq (64 queries x DW) = dS K[:, DW wg ... DW wg + DW - 1], both read MN-major: dS from dS^T's panel
    sdst[panel] (a row of the block's BK keys each), K's columns by key_columns. K / 16 wgmmas, one group; the
    caller waits."""
    wgmma_fence()
    for kk in static_range(BK // 16):
        wgmma_bf16(dq, wgmma_desc(sdst[panel], (kk * 16, 0), 128, BK * 128, 1024), key_columns(sk, wg, kk * 16, DW, BK),
                   DW, kk, MN_MAJOR, MN_MAJOR)
    wgmma_commit()


@device
def store_dq_tile(sdq, dq, DW: Const[int], THREADS: Const[int]):
    """This thread's dQ fragments into sdq in register order (value i of thread t at i * THREADS + t): stores without
    bank conflicts; the float32 accumulator in global memory keeps that order and flash_bwd_dq_convert undoes it."""
    for j in static_range(DW // 8):
        for e in static_range(4):
            sdq[(j * 4 + e) * THREADS + tx] = dq[j, e]


@device
def add_dq_tile(dq_acc, at: i64, sdq, nbytes: Const[int], THREADS: Const[int]):
    """The block's dQ tile in sdq added into dq_acc[at:] by one bulk reduction, issued by the block's last thread
    (the reducer) once every warp stored its part (named barrier 1: the last warp waits, the others arrive and go on
    to the next step, whose dS^T goes to the other buffer and whose first barrier waits for the reduction to have
    read sdq). Past this barrier every warp has retired the step's wgmmas, so the reducer also issues the copies
    that refill the step's buffers (flash_bwd_wgmma); no other warp waits here."""
    if warp == THREADS // 32 - 1:
        bar_sync(1, THREADS)
        if lane == 31:
            cp_reduce_async_bulk_add(dq_acc, at, sdq, 0, nbytes)
            cp_async_bulk_commit()
    else:
        bar_arrive(1, THREADS)


@device
def fetch_query_tiles(qmap, domap, tile_stats, sqf, sdof, statsf, full, buf: i32, bh: i32, q0: i32, lq: i32,
                      BR: Const[int], D: Const[int]):
    """The BR queries from q0 of Q and dO of (batch, head) row block bh into buffer buf of the fused backward's sq and
    sdo (flat: sqf, sdof), and their statistics (flash_bwd_tile_stats' 2 x BR values) into rows 2 buf and 2 buf + 1
    of statsf (flat), by the copy engine, issued by the calling thread: the D / 64 boxes of each (tensor maps over
    (batch x head, query, column)) and the statistics' bulk copy, counted on full[buf]; queries past lq land as
    zeros."""
    TILE: Const[int] = BR * D
    mbarrier_arrive_expect_tx(full, buf, 4 * TILE + 8 * BR)
    for p in static_range(D // 64):
        cp_async_bulk_tensor(sqf, buf * TILE + p * BR * 64, qmap, (bh, q0, p * 64), full, buf)
        cp_async_bulk_tensor(sdof, buf * TILE + p * BR * 64, domap, (bh, q0, p * 64), full, buf)
    cp_async_bulk(statsf, buf * 2 * BR, tile_stats, (i64(bh) * cdiv(lq, BR) + q0 // BR) * 2 * BR, 8 * BR, full, buf)


def fused_smem(d: int, wgs: int) -> int:
    """Bytes of shared memory of flash_bwd_wgmma: K and V (64 wgs keys), two Q and two dO tiles of 64 queries, P^T,
    two buffers of dS^T, the float32 dQ tile, and two buffers of the queries' log-sum-exp and delta."""
    bk = 64 * wgs
    return 4 * bk * d + 8 * 64 * d + 3 * bk * 128 + 4 * 64 * d + 16 * 64


@functools.cache
def fused_backward():
    """The Hopper backward in one kernel (bf16), FlashAttention-3's: (flash_bwd_wgmma, flash_bwd_dq_convert,
    flash_bwd_tile_stats), made on first use."""
    @kernel
    def flash_bwd_wgmma(q: TensorMap[bf16, 3], k: Array[bf16, 2], v: Array[bf16, 2], do: TensorMap[bf16, 3],
                        tile_stats: Array[f32], kmask: Array[u8], rng: Array[u32], dk: Array[bf16, 2],
                        dv: Array[bf16, 2], dq_acc: Array[f32], lq: i32, lk: i32, heads: i32, group: i32,
                        scale_log2: f32, scale: f32, drop_p: f32, keep_scale: f32, D: Const[int], WGS: Const[int],
                        RS: Const[int], OVERLAP_EXP: Const[int], CAUSAL: Const[int], MASKED: Const[int],
                        DROPOUT: Const[int]):
        """flash_bwd_dkdv_wgmma with 64-query steps that also compute dQ's share of the block's keys: after S^T,
        dP^T and the element-wise step, dV += P^T dO, dK += dS^T Q and dQ_tile = dS K (warpgroup w the D / WGS
        columns from D w / WGS), five products instead of the two kernels' seven. The dQ tile goes through shared
        memory (register order) into the float32 accumulator dq_acc (rows of each head padded to 64) by one bulk
        reduction a step, which the next step's stores wait to have read; dQ sums in an order the GPU chooses.
        RS: P^T and dS^T reach the dV and dK products as A fragments in registers, issued before the block's barrier
        (only dQ needs the other warpgroups' dS^T); otherwise both go through shared memory. OVERLAP_EXP: P^T's
        exponentials run while dP^T multiplies (S^T waited for alone; issuing dK after dQ, to store the dQ tile
        while dK multiplies as FlashAttention-3 does, was 2-3 % slower at tree 7cd0583). A step's queries come with
        their statistics (flash_bwd_tile_stats) by the copy engine, so that no thread waits on a load of global
        memory in the loop."""
        BK: Const[int] = 64 * WGS
        BR: Const[int] = 64
        THREADS: Const[int] = 128 * WGS
        DP: Const[int] = D // 64
        DW: Const[int] = D // WGS
        TILE: Const[int] = BR * D * 2
        AT_PT: Const[int] = 4 * BK * D + 4 * TILE   # byte offsets (fused_smem adds them up for the launch)
        AT_DQ: Const[int] = AT_PT + 3 * BK * 128
        AT_STATS: Const[int] = AT_DQ + BR * D * 4
        launch_bounds(THREADS)
        sk = dynamic_shared(bf16, (DP, BK, 64))
        sv = dynamic_shared(bf16, (DP, BK, 64), BK * D * 2)
        sq = dynamic_shared(bf16, (2 * DP, BR, 64), 2 * BK * D * 2)
        sdo = dynamic_shared(bf16, (2 * DP, BR, 64), 2 * BK * D * 2 + 2 * TILE)
        sqf = dynamic_shared(bf16, (TILE,), 2 * BK * D * 2)   # sq and sdo as the tensor maps' destinations
        sdof = dynamic_shared(bf16, (TILE,), 2 * BK * D * 2 + 2 * TILE)
        full = shared(i64, 2)   # buffer i's Q and dO landed
        spt = dynamic_shared(bf16, (1, BK, 64), AT_PT)
        sdst = dynamic_shared(bf16, (2, BK, 64), AT_PT + BK * 128)   # two buffers: steps alternate
        sdq = dynamic_shared(f32, BR * D, AT_DQ)
        stats = dynamic_shared(f32, (4, BR), AT_STATS)  # lse and delta, two buffers
        statsf = dynamic_shared(f32, (4 * BR,), AT_STATS)   # the same as the bulk copies' destination
        st = local(f32, (BR // 8, 4))
        dpt = local(f32, (BR // 8, 4))
        dq = local(f32, (DW // 8, 4))
        pa = local(bf16, (BR // 16, 8))
        dsa = local(bf16, (BR // 16, 8))
        dk_acc = local(f32, (D // 8, 4))
        dv_acc = local(f32, (D // 8, 4))
        wg = warp // 4
        b, kbase, k0, first, per_head, steps, head0 = key_block(lq, lk, heads, group, BK, BR, CAUSAL)
        key0 = k0 + warp * 16 + lane // 4   # this lane's keys: key0 and key0 + 8
        lq_pad = cdiv(lq, BR) * BR
        if tx == THREADS - 1:   # the reducer (add_dq_tile) issues every copy: past its barrier a buffer is free
            mbarrier_init(full, 0, 1)
            mbarrier_init(full, 1, 1)
            if steps > 0:
                fetch_query_tiles(q, do, tile_stats, sqf, sdof, statsf, full, 0, head0, first * BR, lq, BR, D)
        load_panels(k, sk, 0, kbase, k0, lk, BK, D, THREADS)
        load_panels(v, sv, 0, kbase, k0, lk, BK, D, THREADS)
        cp_commit()
        zero(dk_acc, D)
        zero(dv_acc, D)
        publish_tiles()   # K, V and the barriers in place for every thread
        step = 0
        if steps > 0:   # causal keys after every query have no gradient (steps <= 0: zeros)
            while True:   # over (query head, query tile) of the group
                buf = step % 2
                bh, q0 = step_tile(step, head0, first, per_head, BR)
                mbarrier_wait(full, buf, step // 2 % 2)   # this step's Q, dO and statistics landed
                # the next step's into the other buffer: the reducer passed the last step's add_dq_tile barrier, so
                # every warp has retired the wgmmas that read it (thread 0, which had not, raced them at 05dcf19)
                if tx == THREADS - 1 and step + 1 < steps:
                    nbh, nq0 = step_tile(step + 1, head0, first, per_head, BR)
                    fetch_query_tiles(q, do, tile_stats, sqf, sdof, statsf, full, 1 - buf, nbh, nq0, lq, BR, D)
                # S^T, dP^T and dQ start afresh each step: their registers are free between uses (dK and dV hold
                # 128 a thread at head dim 128)
                wgmma_discard(st, dpt, dq)
                wgmma_rows(st, sk, 0, wg * 64, sq, buf * DP, BR, D, 0)
                wgmma_rows(dpt, sv, 0, wg * 64, sdo, buf * DP, BR, D, 0)
                # queries past the end would add to dK and dV here: the tile is whole only with all of them in range
                whole = q0 + BR <= lq and whole_tile(q0, k0, lk, BK, CAUSAL, MASKED)
                if OVERLAP_EXP:   # P^T's exponentials while dP^T multiplies
                    wgmma_wait(1, st)
                else:
                    wgmma_wait(0, st, dpt)
                weights_of_keys(st, stats[2 * buf], q0, key0, whole, lq, lk, kmask, b * lk, scale_log2, BR, CAUSAL,
                                MASKED)
                if OVERLAP_EXP:
                    wgmma_wait(0, dpt)
                ds_of_keys(st, dpt, stats[2 * buf + 1], q0, key0, bh, rng, drop_p, keep_scale, BR, DROPOUT)
                store_weights(sdst, buf, dpt, warp * 16 + lane // 4, BR)
                if RS:   # P^T and dS^T as A fragments: dV and dK need no other warpgroup's rows, so go now
                    to_a(pa, st, BR)
                    to_a(dsa, dpt, BR)
                    weights_times_values(dv_acc, spt, pa, wg, sdo, buf * DP, D, BR, RS)
                    weights_times_values(dk_acc, sdst, dsa, wg, sq, buf * DP, D, BR, RS)
                else:
                    store_weights(spt, 0, st, warp * 16 + lane // 4, BR)
                if tx == THREADS - 1:
                    cp_async_bulk_wait_read(0)   # the last step's dQ tile has left sdq (the reducer's group)
                fence_proxy_async()
                syncthreads()   # every warpgroup's dS^T (for dQ), sdq free
                if not RS:
                    weights_times_values(dv_acc, spt, pa, wg, sdo, buf * DP, D, BR, RS)
                    wgmma_rows_mn(dk_acc, sdst, buf, wg * 64, sq, buf * DP, D, BR, BR)
                keys_times_ds(dq, sdst, buf, sk, wg, DW, BK)
                wgmma_wait(0, dv_acc, dk_acc, dq)
                store_dq_tile(sdq, dq, DW, THREADS)
                fence_proxy_async()
                add_dq_tile(dq_acc, (i64(bh) * lq_pad + q0) * D, sdq, BR * D * 4, THREADS)
                step += 1
                if step >= steps:
                    break
        if tx == THREADS - 1:
            cp_async_bulk_wait(0)
        write_scaled_rows(dk, dk_acc, kbase, 1, key0, lk, scale, D)
        write_scaled_rows(dv, dv_acc, kbase, 1, key0, lk, 1.0, D)

    @kernel
    def flash_bwd_dq_convert(dq_acc: Array[f32], dq: Array[bf16, 2], lq: i32, scale: f32, D: Const[int],
                             WGS: Const[int]):
        """dQ (rows bh * lq + query) = scale x the float32 accumulator of flash_bwd_wgmma, block (tile, head, batch)
        undoing the register order of that tile of head bh = query_head() (store_dq_tile)."""
        THREADS: Const[int] = 128 * WGS
        DW: Const[int] = D // WGS
        q0 = bx * 64
        bh = query_head()
        base = (i64(bh) * cdiv(lq, 64) * 64 + q0) * D   # past 2^31 elements at 16M (batch x heads x lq) rows
        w = warp % 4
        for i in static_range(DW // 2):
            row = q0 + 16 * w + lane // 4 + 8 * (i % 4 // 2)
            if row < lq:
                col = warp // 4 * DW + 8 * (i // 4) + 2 * (lane % 4) + i % 2
                dq[bh * lq + row, col] = dq_acc[base + i * THREADS + tx] * scale

    @kernel
    def flash_bwd_tile_stats(o: Array[bf16, 2], do: Array[bf16, 2], lse: Array[f32], tile_stats: Array[f32], lq: i32,
                             D: Const[int]):
        """The statistics flash_bwd_wgmma reads a step, 64 queries of head bh = query_head() (block (tile, head,
        batch), 8 warps of 8 rows): their log-sum-exps in log2 units (saved_lse) then their deltas rowsum(dO * O)
        (C-order rows), 512 contiguous bytes that one bulk copy brings in; queries past lq get 0 and 0."""
        bh = query_head()
        at = (i64(bh) * gdx + bx) * 128
        for i in static_range(8):
            r = warp * 8 + i
            query = bx * 64 + r
            acc = 0.0
            if query < lq:   # the same for the whole warp
                acc = row_dot(o, do, bh * lq + query, D)
            if lane == 0:
                tile_stats[at + r] = saved_lse(lse, bh * lq + query, bh * lq + lq)
                tile_stats[at + 64 + r] = acc
    return flash_bwd_wgmma, flash_bwd_dq_convert, flash_bwd_tile_stats


@dataclass(frozen=True)
class FlashKernels:
    forward: object
    dot: object
    dq: object
    dkdv: object


@functools.cache
def kernels_for(dtype: str) -> FlashKernels:
    """The kernels of one input dtype, made on first use: checking their source costs ~50 ms, which `import frost`
    should not pay for a program that never runs attention on a GPU."""
    return _make_kernels({"bfloat16": bf16, "float16": f16}[dtype])


# ------------------------------------------------------------------ host side: shapes, launches
@dataclass(frozen=True)
class Problem:
    """One attention call's sizes: q (batch, heads, lq, d), k and v (batch, heads // group, lk, d)."""
    batch: int
    heads: int
    group: int
    lq: int
    lk: int
    d: int
    causal: bool
    scale: float
    masked: bool
    dropout_p: float = 0.0

    def consts(self, tiles: dict) -> dict:
        return dict(D=self.d, BR=tiles["BR"], BC=tiles["BC"], CAUSAL=int(self.causal), MASKED=int(self.masked),
                    DROPOUT=int(self.dropout_p > 0.0))

    def dropout_args(self) -> tuple:
        return dropout_args(self.dropout_p)

    def sizes(self) -> tuple:
        return self.lq, self.lk, self.heads, self.group


def dropout_args(p: float) -> tuple:
    """(p, 1 / (1 - p)) in float32 as the kernels take them; 1 / (1 - p) is 0 at p = 1, where nothing is kept."""
    return np.float32(p), np.float32(1.0 / (1.0 - p) if p < 1.0 else 0.0)


def _row_bytes(d: int) -> int:
    return (d + PAD) * 2


def check_tiles(tiles: dict, d: int) -> None:
    """BR and BC multiples of 16 (a warp's 16 rows; 16-column mma steps) whose tiles the block's threads copy in
    whole 16-byte chunks."""
    br, bc = tiles["BR"], tiles["BC"]
    if br % 16 or bc % 16 or br <= 0 or bc <= 0:
        raise ValueError(f"flash_attention: tiles BR={br} and BC={bc} must be positive multiples of 16")
    for rows, threads in ((br, br * 2), (bc, br * 2), (bc, bc * 2), (br, bc * 2)):
        if rows * d // 8 % threads:
            raise ValueError(f"flash_attention: a {rows}x{d} tile is {rows * d // 8} 16-byte chunks, not a multiple "
                             f"of the {threads} threads that copy it (BR={br}, BC={bc})")


def _launcher(kern, xp):
    """The kernel on the GPU for CuPy arrays, its simulator for NumPy ones (CPU tests)."""
    return kern.simulate if xp is np else kern


def _rows(xp, a, d: int):
    """a (..., L, d) as a contiguous 2-D array of rows."""
    return xp.ascontiguousarray(a).reshape(-1, d)


def _row_strides(a, d: int) -> tuple | None:
    """The (batch, head, position) strides of a (B, H, L, d) array in rows of d values (0 for a dim of size 1), or
    None where its rows are not whole, 16-byte aligned runs of d values the kernels can copy."""
    row = d * a.itemsize
    if a.size == 0 or a.strides[3] != a.itemsize or layout.data_ptr(a) % 16 or any(
            s < 0 or s % row for s, n in zip(a.strides[:3], a.shape[:3]) if n > 1):
        return None
    return tuple(s // row if n > 1 else 0 for s, n in zip(a.strides[:3], a.shape[:3]))


def _row_view(xp, a, d: int) -> tuple:
    """(rows, layout): a (B, H, L, d) array as the 2-D array of rows (d values each) from its first element to its
    last, and the (batch, head, position) strides of its rows; a layout the kernels cannot read is copied into
    C order first."""
    a = _readable(xp, a, d)
    strides = _row_strides(a, d)
    count = 1 + sum((n - 1) * s for n, s in zip(a.shape[:3], strides))
    return xp.lib.stride_tricks.as_strided(a, (count, d), (d * a.itemsize, a.itemsize)), strides


def _dense(shape: tuple, strides: tuple, item: int) -> bool:
    """Whether (shape, strides) covers one gap-free block of memory (C order up to a permutation of the dims)."""
    expected = item
    for s, n in sorted((s, n) for s, n in zip(strides, shape) if n > 1):
        if s != expected:
            return False
        expected *= n
    return True


def _output_like(xp, a):
    """An uninitialized array of a's shape, dtype and (where a covers a gap-free block) memory layout."""
    if _dense(a.shape, a.strides, a.itemsize) and all(s >= 0 for s in a.strides):
        return xp.lib.stride_tricks.as_strided(xp.empty(a.size, a.dtype), a.shape, a.strides)
    return xp.empty(a.shape, a.dtype)


def gradients_like(xp, arrays: tuple) -> tuple:
    """Uninitialized gradients for `arrays`, each in its array's layout. Arrays of one shape and strides at equal
    steps through memory that together cover one gap-free block (q, k and v split out of one projection) get views
    of one new block laid out alike: the gradient of the projection is then that block, no copy."""
    first = arrays[0]
    step = layout.data_ptr(arrays[1]) - layout.data_ptr(first) if len(arrays) > 1 else 0
    alike = all(a.shape == first.shape and a.strides == first.strides and a.dtype == first.dtype and
                layout.data_ptr(a) - layout.data_ptr(first) == i * step for i, a in enumerate(arrays))
    tiles = _dense((len(arrays), *first.shape), (step, *first.strides), first.itemsize)
    if alike and step > 0 and step % 16 == 0 and tiles and all(s >= 0 for s in first.strides):
        block = xp.empty(len(arrays) * first.size, first.dtype)
        return tuple(xp.lib.stride_tricks.as_strided(block[i * step // first.itemsize:], first.shape, first.strides)
                     for i in range(len(arrays)))
    return tuple(_output_like(xp, a) for a in arrays)


def output_blhd(xp, p: "Problem", dtype):
    """O's (B, H, L, D) array laid out (B, L, H, D)."""
    return xp.empty((p.batch, p.lq, p.heads, p.d), dtype).transpose(0, 2, 1, 3)


_constants: dict = {}   # (device, what) -> a small read-only array the kernels take where there is nothing to pass


def _constant(xp, what: str, make):
    """make(xp), made once a GPU (creating it launched a fill kernel at every attention call); NumPy's each time, and
    during a capture (whose memory is the graph's, freed with it)."""
    if xp is np or capturing():
        return make(xp)
    key = (xp.cuda.Device().id, what)
    a = _constants.get(key)
    if a is None:
        a = _constants[key] = make(xp)
    return a


def _kmask(xp, mask):
    if mask is None:   # no key-padding mask: a stub the kernels do not read (MASKED=0)
        return _constant(xp, "no mask", lambda xp: xp.ones(1, np.uint8))
    return xp.ascontiguousarray(mask).astype(np.uint8).reshape(-1)


def _rng(xp, p: Problem, rng):
    """The 4-word (key_lo, key_hi, offset_lo, offset_hi) uint32 state the dropout mask is drawn from."""
    if rng is None:
        if p.dropout_p > 0.0:
            raise ValueError("flash_attention: dropout needs the generator state its mask is drawn from (rng)")
        return _constant(xp, "no dropout", lambda xp: xp.zeros(4, np.uint32))
    if tuple(rng.shape) != (4,) or rng.dtype != np.uint32:
        raise ValueError(f"flash_attention: rng must be 4 uint32 words, got {rng.dtype} {tuple(rng.shape)}")
    return rng


VARIANTS = ("mma", "wgmma", "bulk")


def forward_variant(xp, q, variant: str | None) -> str:
    """Which forward kernel runs: "mma" (mma.sync, any GPU), "wgmma" (Hopper's warpgroup MMA) or "bulk" (wgmma fed
    by the copy engine, warp-specialized); asked for by name, or by default "bulk" for bf16 on a Hopper GPU (2.0x
    the mma forward at 4 x 16 x 4096 x 128 on an H100, flash_forward_tiles_h100_5a9727e.json) and "mma" elsewhere.
    FROST_FLASH_WGMMA=1 asks for "wgmma" there, FROST_FLASH_BULK=0 for "mma"."""
    if variant is not None:
        if variant not in VARIANTS:
            raise ValueError(f"flash_attention: variant must be one of {', '.join(map(repr, VARIANTS))}, got "
                             f"{variant!r}")
        return variant
    hopper = xp is not np and str(q.dtype) == "bfloat16" and device_arch(q.device.id).startswith("sm_90")
    if not hopper:
        return "mma"
    if os.environ.get("FROST_FLASH_WGMMA") == "1":
        return "wgmma"
    return "mma" if os.environ.get("FROST_FLASH_BULK") == "0" else "bulk"


def backward_variant(xp, q, p: "Problem", variant: str | None) -> str:
    """Which backward runs: "mma" (after the mma.sync forward), "wgmma" (the two warpgroup-MMA kernels) or "fused"
    (one kernel per key block, dQ added in float32). After the "bulk" and default forwards the fused one runs at the
    head dims and lengths of FUSED_FROM_LENGTH unless frost.backends.deterministic (its dQ sums in an order the GPU
    chooses); FROST_FLASH_FUSED_BACKWARD=1 asks for it everywhere, =0 for the two kernels."""
    if variant == "fused":
        return "fused"
    if not uses_wgmma(xp, q, variant):
        return "mma"
    if variant == "wgmma":
        return "wgmma"
    asked = os.environ.get("FROST_FLASH_FUSED_BACKWARD", "")
    long = p.lq >= FUSED_FROM_LENGTH.get(p.d, math.inf)
    fused = asked == "1" or (asked == "" and long and not backends.deterministic)
    return "fused" if fused else "wgmma"


def uses_wgmma(xp, q, variant: str | None) -> bool:
    """Whether attention runs the warpgroup-MMA kernels (the backward's for the "wgmma" and "bulk" forwards)."""
    return forward_variant(xp, q, variant) != "mma"


def _hopper_outputs(xp, q, p: Problem, variant: str) -> tuple:
    """O (its rows in C order) and the log-sum-exp a Hopper forward writes, for bf16 q (the only type they take)."""
    if str(q.dtype) != "bfloat16":
        raise ValueError(f"flash_attention: the {variant} forward takes bf16, got {q.dtype}")
    return xp.empty((p.batch * p.heads * p.lq, p.d), q.dtype), xp.empty(p.batch * p.heads * p.lq, np.float32)


def forward_wgmma(xp, q, k, v, p: Problem, kmask=None, tiles: dict | None = None, rng=None):
    """forward_arrays by flash_fwd_wgmma (bf16; tiles: {"WGS": warpgroups, "BC": keys a tile})."""
    o, lse = _hopper_outputs(xp, q, p, "wgmma")
    tiles = dict(wgmma_tiles(p.d, p.dropout_p > 0.0), **(tiles or {}))
    wgs, bc = tiles["WGS"], tiles["BC"]
    if wgs not in (1, 2) or bc not in (64, 128):
        raise ValueError(f"flash_attention: the wgmma forward takes WGS 1 or 2 and BC 64 or 128, got {tiles}")
    br = 64 * wgs
    smem = (br + 4 * bc) * p.d * 2 + br * bc * 2
    grid = (cdiv(p.lq, br), p.heads, p.batch)
    _launcher(wgmma_forward(), xp)[grid, 128 * wgs, smem](
        _rows(xp, q, p.d), _rows(xp, k, p.d), _rows(xp, v, p.d), o, lse, _kmask(xp, kmask),
        _rng(xp, p, rng), *p.sizes(), p.scale * LOG2E, *p.dropout_args(), D=p.d, WGS=wgs, BC=bc,
        CAUSAL=int(p.causal), MASKED=int(p.masked), DROPOUT=int(p.dropout_p > 0.0))
    return o.reshape(p.batch, p.heads, p.lq, p.d), lse.reshape(p.batch, p.heads, p.lq)


# The bulk forward's tiles by head dim, non-causal and causal. H100, the kernel alone, two leases (tree 015f5f3 and
# that tree with the persistent kernel: flash_forward_tiles_h100_015f5f3.json,
# flash_forward_tiles_persistent_d{128,64}_h100_015f5f3-persistent.json in benchmarks/results): at head dim 128, two
# warpgroups taking turns over 128-key tiles (PINGPONG) beat three over 64-key tiles at every length from 512 to 8192
# (4 x 16 x 4096 x 128: 0.899 against 0.990 ms, causal 0.535 against 0.604; 2 x 16 x 8192 x 128 1.686 against 1.944);
# at head dim 64 three warpgroups over 128-key tiles without causal masking (4 x 32 x 4096 x 64: 1.211 against 1.446
# for 64-key tiles), the turns with it (causal 0.712 against 0.781), each persistent (16 x 32 x 1024 x 64: 0.393
# against 0.448, causal 0.299 against 0.335)
BULK_TILES = {64: dict(WGS=3, BC=128, STAGES=2, PINGPONG=0, RS=1, PERSIST=1),
              128: dict(WGS=2, BC=128, STAGES=2, PINGPONG=1, RS=1, PERSIST=0)}
CAUSAL_BULK_TILES = {64: dict(WGS=2, BC=128, STAGES=2, PINGPONG=1, RS=1, PERSIST=1), 128: BULK_TILES[128]}
# with dropout: two warpgroups over 64-key tiles (three spill at head dim 128, 128 keys at 64), not persistent (the
# dropout masks are counted by the grid's heads)
DROPOUT_BULK_TILES = dict(WGS=2, BC=64, STAGES=2, PINGPONG=0, RS=1, PERSIST=0)
# At head dim 128 below PERSIST_BELOW queries the blocks are persistent (PERSIST=1): a block's start and end are a
# larger part of its work there (32 x 16 x 512 x 128: 0.247 -> 0.235 ms, causal 0.203 -> 0.199; 16 x 16 x 1024 x 128
# 0.337 -> 0.331, causal 0.242 -> 0.233; at 2048 and longer no faster, or slower)
PERSIST_BELOW = 2048
SIMULATED_SMS = 3


def bulk_tiles(d: int, dropout: bool, causal: bool = False, lq: int | None = None) -> dict:
    """The bulk forward's tiles (a new dict) for lq queries (None: a long sequence)."""
    if dropout:
        return dict(DROPOUT_BULK_TILES)
    tiles = dict(CAUSAL_BULK_TILES[d] if causal else BULK_TILES[d])
    if d == 128 and lq is not None and lq < PERSIST_BELOW:
        tiles["PERSIST"] = 1
    return tiles


def kv_tensor_map(xp, a, p: Problem, bc: int):
    """A tensor map over K or V (B, H // group, Lk, D) where they lie, boxes of bc keys x 64 columns: a layout the
    copy engine cannot read (rows not whole, a dimension repeated by a zero stride) is copied into C order first."""
    a = _readable(xp, a, p.d)
    if any(s <= 0 for s, n in zip(a.strides[:3], a.shape[:3]) if n > 1):
        a = xp.ascontiguousarray(a)
    strides = list(a.strides)
    for i in (2, 1, 0):   # a dimension of one element is never stepped over: give it the stride C order would
        if a.shape[i] == 1:
            strides[i] = a.shape[i + 1] * strides[i + 1]
    if tuple(strides) != a.strides:
        a = xp.lib.stride_tricks.as_strided(a, a.shape, tuple(strides))
    return tensor_map(a, (1, 1, bc, 64))


def _multiprocessors(xp) -> int:
    """The SMs a persistent grid fills: the GPU's, or SIMULATED_SMS in the simulator (a few blocks, so that tests
    see blocks take several tiles)."""
    return SIMULATED_SMS if xp is np else multiprocessor_count(xp.cuda.runtime.getDevice())


def forward_bulk(xp, q, k, v, p: Problem, kmask=None, tiles: dict | None = None, rng=None):
    """forward_arrays by flash_fwd_bulk (bf16; tiles: {"WGS": consumer warpgroups, "BC": keys a tile, "STAGES":
    tiles in flight, "PINGPONG": 1 for the two warpgroups taking turns at the tensor cores, "RS": 1 for P kept in
    registers}), K and V read where they lie through tensor maps."""
    o, lse = _hopper_outputs(xp, q, p, "bulk")
    # a setting asked for fills its gaps from the long-sequence defaults, whatever the length (its names keep their
    # meaning); only the default itself depends on the length
    tiles = dict(bulk_tiles(p.d, p.dropout_p > 0.0, p.causal, None if tiles else p.lq), **(tiles or {}))
    wgs, bc, stages, rs, persist = tiles["WGS"], tiles["BC"], tiles["STAGES"], tiles["RS"], tiles["PERSIST"]
    if wgs not in (1, 2, 3) or bc not in (64, 128, 176, 192) or (bc % 64 and not rs) or stages not in (1, 2, 3, 4) \
            or tiles["PINGPONG"] not in (0, 1) or rs not in (0, 1) or persist not in (0, 1):
        raise ValueError(f"flash_attention: the bulk forward takes WGS 1 to 3, BC 64 or 128 (176 and 192 with RS=1), "
                         f"STAGES 1 to 4 and PINGPONG, RS and PERSIST 0 or 1, got {tiles}")
    if persist and p.dropout_p > 0.0:
        raise ValueError(f"flash_attention: the persistent bulk forward (PERSIST=1) does not take dropout (its masks "
                         f"are counted by the grid's heads), got dropout_p={p.dropout_p} with {tiles}")
    br = 64 * wgs
    smem = (br + 2 * stages * bc) * p.d * 2 + (16 * 64 * 2 if rs else br * bc * 2)   # P's panels, or a stub
    if smem > HOPPER_SHARED_BYTES:
        raise ValueError(f"flash_attention: the bulk forward's tiles {tiles} need {smem} bytes of shared memory (at "
                         f"most {HOPPER_SHARED_BYTES}) and K, V padded to whole tiles below 2^31 elements, at head dim "
                         f"{p.d}, {p.lk} keys")
    kp, vp = kv_tensor_map(xp, k, p, bc), kv_tensor_map(xp, v, p, bc)
    grid = (cdiv(p.lq, br), p.heads, p.batch)
    if persist:
        grid = (min(math.prod(grid), _multiprocessors(xp)), 1, 1)
    _launcher(bulk_forward(), xp)[grid, 128 * wgs + 128, smem](
        _rows(xp, q, p.d), kp, vp, o, lse, _kmask(xp, kmask), _rng(xp, p, rng), *p.sizes(), p.batch,
        p.scale * LOG2E, *p.dropout_args(), D=p.d, WGS=wgs, BC=bc, STAGES=stages, PINGPONG=tiles["PINGPONG"], RS=rs,
        PERSIST=persist, CAUSAL=int(p.causal), MASKED=int(p.masked), DROPOUT=int(p.dropout_p > 0.0))
    return o.reshape(p.batch, p.heads, p.lq, p.d), lse.reshape(p.batch, p.heads, p.lq)


def forward_arrays(xp, q, k, v, p: Problem, kmask=None, tiles: dict | None = None, rng=None,
                   variant: str | None = None):
    """(O, log-sum-exp) of the attention of q (B, H, Lq, D) over k, v (B, H // group, Lk, D): O in q's dtype,
    the log-sum-exp float32 (B, H, Lq). kmask: a boolean (B, Lk) key-padding mask (True = attend) or None. rng:
    with p.dropout_p > 0, the generator state snapshot (4 uint32 words) the dropout mask comes from. variant:
    "mma" (mma.sync), "wgmma" or "bulk" for the forward kernel, None for the default (forward_variant)."""
    if variant is None and tiles is not None and "BR" in tiles:
        variant = "mma"   # tiles naming query rows (BR) are the mma.sync forward's
    chosen = forward_variant(xp, q, variant)
    if chosen == "bulk":
        return forward_bulk(xp, q, k, v, p, kmask, tiles, rng)
    if chosen == "wgmma":
        return forward_wgmma(xp, q, k, v, p, kmask, tiles, rng)
    tiles = dict(FORWARD_TILES[p.d], **(tiles or {}))
    check_tiles(tiles, p.d)
    kern = kernels_for(str(q.dtype)).forward
    o = output_blhd(xp, p, q.dtype)
    lse = xp.empty(p.batch * p.heads * p.lq, np.float32)
    smem = (tiles["BR"] + 2 * tiles["BC"]) * _row_bytes(p.d)
    grid = (cdiv(p.lq, tiles["BR"]), p.heads, p.batch)
    (q2, q_layout), (o2, o_layout) = _row_view(xp, q, p.d), _row_view(xp, o, p.d)
    k, v = _readable_pair(xp, k, v, p.d)
    (k2, k_layout), (v2, _) = _row_view(xp, k, p.d), _row_view(xp, v, p.d)
    _launcher(kern, xp)[grid, tiles["BR"] * 2, smem](
        q2, k2, v2, o2, lse, _kmask(xp, kmask), _rng(xp, p, rng), *p.sizes(), *q_layout, *k_layout, *o_layout,
        p.scale * LOG2E, *p.dropout_args(), **p.consts(tiles))
    return o, lse.reshape(p.batch, p.heads, p.lq)


def backward_arrays(xp, q, k, v, o, lse, do, p: Problem, kmask=None, tiles: dict | None = None, rng=None,
                    variant: str | None = None):
    """(dQ, dK, dV) in q's dtype, from the forward's O and log-sum-exp and the output's gradient dO. tiles: the dQ
    kernel's (BR queries a block, BC keys a step); the dK/dV kernel's are these swapped. rng: the forward's.
    variant: as forward_arrays'. Each gradient has its input's layout (gradients_like)."""
    tiles = dict(BACKWARD_TILES[p.d], **(tiles or {}))
    check_tiles(tiles, p.d)
    lse = xp.ascontiguousarray(lse).reshape(-1)
    chosen = backward_variant(xp, q, p, variant)
    if chosen != "mma":
        run = _backward_fused if chosen == "fused" else _backward_wgmma
        return run(xp, q, k, v, o, lse, do, p, _kmask(xp, kmask), _rng(xp, p, rng))
    kernels = kernels_for(str(q.dtype))
    br, bc = tiles["BR"], tiles["BC"]
    q, k, v = _readable(xp, q, p.d), *_readable_pair(xp, k, v, p.d)
    grads = gradients_like(xp, (q, k, v))
    q, k, v = (_in_layout_of(xp, a, g) for a, g in zip((q, k, v), grads))
    do = _in_layout_of(xp, do, o)
    (q2, q_layout), (o2, o_layout), (do2, _) = (_row_view(xp, a, p.d) for a in (q, o, do))
    (k2, k_layout), (v2, _) = _row_view(xp, k, p.d), _row_view(xp, v, p.d)
    dq2, dk2, dv2 = (_row_view(xp, g, p.d)[0] for g in grads)
    mask = _kmask(xp, kmask)
    state = _rng(xp, p, rng)
    rows = p.batch * p.heads * p.lq
    delta = xp.empty(rows, np.float32)
    _launcher(kernels.dot, xp)[cdiv(rows, 4), 128](o2, do2, delta, rows, p.lq, p.heads, *o_layout, D=p.d)
    layouts = (*q_layout, *k_layout, *o_layout)
    scales = (p.scale * LOG2E, p.scale)
    _launcher(kernels.dq, xp)[(cdiv(p.lq, br), p.heads, p.batch), br * 2, (2 * br + 2 * bc) * _row_bytes(p.d)](
        q2, k2, v2, do2, lse, delta, mask, state, dq2, *p.sizes(), *layouts, *scales, *p.dropout_args(),
        **p.consts(tiles))
    smem = (2 * br + 2 * bc) * _row_bytes(p.d) + 2 * bc * 4
    _launcher(kernels.dkdv, xp)[(cdiv(p.lk, br), p.heads // p.group, p.batch), br * 2, smem](
        q2, k2, v2, do2, lse, delta, mask, state, dk2, dv2, *p.sizes(), *layouts, *scales, *p.dropout_args(),
        **p.consts(dict(BR=bc, BC=br)))
    return grads


def _readable(xp, a, d: int):
    """a, or a copy in C order where the kernels cannot read its rows where they lie."""
    return a if _row_strides(a, d) is not None else xp.ascontiguousarray(a)


def _readable_pair(xp, k, v, d: int) -> tuple:
    """k and v readable with one layout (the kernels take one for both)."""
    k, v = _readable(xp, k, d), _readable(xp, v, d)
    if k.strides != v.strides:
        return xp.ascontiguousarray(k), xp.ascontiguousarray(v)
    return k, v


def _in_layout_of(xp, a, like):
    """a, or a copy of it laid out as `like` (whose rows the kernels read): an input and its gradient, O and dO,
    share their layout arguments."""
    if a.strides == like.strides:
        return a
    out = _output_like(xp, like)
    out[...] = a
    return out


def _row_deltas(xp, q, o2, do2, p: Problem):
    """D = rowsum(dO * O) of each query row (C-order rows)."""
    delta = xp.empty(o2.shape[0], np.float32)
    c_order = (p.heads * p.lq, p.lq, 1)
    _launcher(kernels_for(str(q.dtype)).dot, xp)[cdiv(o2.shape[0], 4), 128](o2, do2, delta, o2.shape[0], p.lq,
                                                                            p.heads, *c_order, D=p.d)
    return delta


def check_fused(xp, q, d: int, wgs: int) -> None:
    """A ValueError naming what the fused backward does not take: other than bf16, a GPU other than Hopper, or
    warpgroups whose dQ columns or shared memory do not fit."""
    if str(q.dtype) != "bfloat16":
        raise ValueError(f"flash_attention: the fused backward takes bfloat16, got {q.dtype}")
    if xp is not np and not device_arch(q.device.id).startswith("sm_90"):
        raise ValueError(f"flash_attention: the fused backward needs a Hopper GPU (sm_90), got "
                         f"{device_arch(q.device.id)}")
    if wgs not in (1, 2) or fused_smem(d, wgs) > HOPPER_SHARED_BYTES:
        raise ValueError(f"flash_attention: the fused backward takes 1 or 2 warpgroups within "
                         f"{HOPPER_SHARED_BYTES} bytes of shared memory, got WGS={wgs} at head dim {d} "
                         f"({fused_smem(d, wgs)} bytes)")


def _backward_fused(xp, q, k, v, o, lse, do, p: Problem, mask, state) -> tuple:
    """backward_arrays by the one-kernel Hopper backward (C-order rows throughout): dQ summed in float32 across the
    key blocks, then converted."""
    tiles = FUSED_BACKWARD_TILES[p.d]
    wgs = tiles["WGS"]
    check_fused(xp, q, p.d, wgs)
    q2, k2, v2, o2, do2 = (_rows(xp, a, p.d) for a in (q, k, v, o, do))
    fused, convert, tile_stats = fused_backward()
    tiles_per_head = cdiv(p.lq, 64)
    stats = xp.empty(p.batch * p.heads * tiles_per_head * 128, np.float32)
    _launcher(tile_stats, xp)[(tiles_per_head, p.heads, p.batch), 256](o2, do2, lse, stats, p.lq, D=p.d)
    dk, dv = xp.empty_like(k2), xp.empty_like(v2)
    dq_acc = xp.zeros(p.batch * p.heads * cdiv(p.lq, 64) * 64 * p.d, np.float32)
    flags = dict(D=p.d, WGS=wgs, CAUSAL=int(p.causal), MASKED=int(p.masked), DROPOUT=int(p.dropout_p > 0.0),
                 **{name: tiles.get(name, 0) for name in ("RS", "OVERLAP_EXP")})
    qs = tuple(tensor_map(a.reshape(-1, p.lq, p.d), (1, 64, 64)) for a in (q2, do2))
    _launcher(fused, xp)[(cdiv(p.lk, 64 * wgs), p.heads // p.group, p.batch), 128 * wgs, fused_smem(p.d, wgs)](
        qs[0], k2, v2, qs[1], stats, mask, state, dk, dv, dq_acc, *p.sizes(), p.scale * LOG2E, p.scale,
        *p.dropout_args(), **flags)
    dq = xp.empty_like(q2)
    _launcher(convert, xp)[(cdiv(p.lq, 64), p.heads, p.batch), 128 * wgs](dq_acc, dq, p.lq, p.scale, D=p.d, WGS=wgs)
    return dq.reshape(q.shape), dk.reshape(k.shape), dv.reshape(v.shape)


def _backward_wgmma(xp, q, k, v, o, lse, do, p: Problem, mask, state) -> tuple:
    """backward_arrays by the two warpgroup-MMA kernels (C-order rows throughout)."""
    q2, k2, v2, o2, do2 = (_rows(xp, a, p.d) for a in (q, k, v, o, do))
    delta = _row_deltas(xp, q, o2, do2, p)
    dq, dk, dv = xp.empty_like(q2), xp.empty_like(k2), xp.empty_like(v2)
    scales = (p.scale * LOG2E, p.scale)
    flags = dict(CAUSAL=int(p.causal), MASKED=int(p.masked), DROPOUT=int(p.dropout_p > 0.0))
    wt = WGMMA_BACKWARD_TILES[p.d]
    dq_wgmma, dkdv_wgmma = wgmma_backward()
    wbr, wbc = 64 * wt["WGS"], wt["BC"]
    smem = wgmma_dq_smem(p.d, wbr, wbc)
    _launcher(dq_wgmma, xp)[(cdiv(p.lq, wbr), p.heads, p.batch), 128 * wt["WGS"], smem](
        q2, k2, v2, do2, lse, delta, mask, state, dq, *p.sizes(), *scales, *p.dropout_args(),
        D=p.d, WGS=wt["WGS"], BC=wbc, **flags)
    bk, wbr = 64 * wt["WGS"], wt["BR"]
    smem = wgmma_dkdv_smem(p.d, bk, wbr)
    _launcher(dkdv_wgmma, xp)[(cdiv(p.lk, bk), p.heads // p.group, p.batch), 128 * wt["WGS"], smem](
        q2, k2, v2, do2, lse, delta, mask, state, dk, dv, *p.sizes(), *scales,
        *p.dropout_args(), D=p.d, WGS=wt["WGS"], BR=wbr, **flags)
    return dq.reshape(q.shape), dk.reshape(k.shape), dv.reshape(v.shape)


# ------------------------------------------------------------------ the op and when it applies
def problem(query: Tensor, key: Tensor, value: Tensor, is_causal: bool, scale: float | None, enable_gqa: bool,
            masked: bool, dropout_p: float = 0.0, op: str = "flash_attention") -> Problem:
    """The call's Problem, or a ValueError naming `op` and the shapes or dtypes it does not take."""
    if query.ndim != 4 or key.ndim != 4 or value.ndim != 4:
        raise ValueError(f"{op}: query, key and value must be 4-D (batch, heads, length, head dim), got shapes "
                         f"{query.shape}, {key.shape}, {value.shape}")
    (b, h, lq, d), (bk, hk, lk, dk) = query.shape, key.shape
    if key.shape != value.shape or bk != b or dk != d:
        raise ValueError(f"{op}: key {key.shape} and value {value.shape} must have one shape, with query "
                         f"{query.shape}'s batch and head dim")
    if hk == 0 or h % hk or (hk != h and not enable_gqa):
        raise ValueError(f"{op}: query heads {h} must equal the key/value heads {hk}, or be a multiple of them "
                         f"with enable_gqa=True")
    if d not in HEAD_DIMS or query.dtype.name not in DTYPES or len({t.dtype.name for t in (query, key, value)}) > 1:
        raise ValueError(f"{op}: needs one dtype of {DTYPES} (got {query.dtype.name}, {key.dtype.name}, "
                         f"{value.dtype.name}) and a "
                         f"head dim in {HEAD_DIMS} (got {d})")
    if lq == 0 or lk == 0:
        raise ValueError(f"{op}: empty sequences (query {query.shape}, key {key.shape}) are the composed path's")
    if not 0.0 <= dropout_p <= 1.0:
        raise ValueError(f"{op}: dropout_p must be between 0 and 1, got {dropout_p}")
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    return Problem(b, h, h // hk, lq, lk, d, bool(is_causal), scale, masked, float(dropout_p))


def check_scale(p: Problem) -> Problem:
    """p, or a ValueError: the flash kernels' online softmax scales each row's maximum of the raw scores, which is the
    maximum of the scaled ones only for a positive scale, and a masked score times a zero scale would be NaN; the
    kernels get scale * log2(e) as a float32, which must be normal."""
    with np.errstate(over="ignore"):
        scale_log2 = np.float32(p.scale * LOG2E)
    if not 2.0 ** -126 <= scale_log2 < math.inf:
        raise ValueError(f"flash_attention: scale must be positive and finite (a normal float32 in log2 units), got "
                         f"{p.scale}; scaled_dot_product_attention takes such scales on its composed path")
    return p


def dropout_keep_numpy(rng, bh: int, lq: int, lk: int, p: float) -> np.ndarray:
    """The kernels' dropout multipliers as a float32 (bh, lq, lk) array: 1 / (1 - p) where a weight is kept, else
    0, from the 4-word state snapshot `rng` (the twin of dropout_pair and dropout_pair_of_queries)."""
    key, query, head = np.arange(lk), np.arange(lq), np.arange(bh)
    counters = ((key // 2)[None, None, :], (query // 2)[None, :, None], head[:, None, None], np.uint64(rng[2]))
    words = philox4x32(counters, (np.uint64(rng[0]), np.uint64(rng[1]) ^ np.uint64(STREAM)))
    word = 2 * (query % 2)[:, None] + (key % 2)[None, :]   # which of the block's four words, per (query, key)
    w = np.choose(word[None], words)
    u = (w >> np.uint32(8)).astype(np.float32) * np.float32(2.0 ** -24)
    drop_p, keep_scale = dropout_args(p)
    return np.where(u >= drop_p, keep_scale, np.float32(0.0))


def dropout_state(xp):
    """A snapshot of the generator's state to draw one call's dropout mask from, the generator then moved on by
    one offset: on CUDA a device-to-device copy of the Philox state and its advance kernel (no host read, so a
    captured step draws a new mask on each replay); on the CPU (the simulator) four words of NumPy's generator."""
    if xp is np:
        return cpu.generator().integers(0, 1 << 32, size=4, dtype=np.uint32)
    return cuda.generator().reserve(1)


def flash_attention(query: Tensor, key: Tensor, value: Tensor, is_causal: bool = False, scale: float | None = None,
                    enable_gqa: bool = False, key_padding_mask: Tensor | None = None,
                    tiles: dict | None = None, dropout_p: float = 0.0) -> Tensor:
    """dropout(softmax(query @ key^T * scale)) @ value by the fused kernels (on CUDA; in the kernel simulator for
    CPU tensors, which is slow: tests only). query (B, H, Lq, D), key and value (B, H // group, Lk, D), bf16 or
    f16, D 64 or 128. key_padding_mask: a boolean (B, Lk) tensor, True = attend. tiles: {"BR": ..., "BC": ...}.
    dropout_p: the probability of dropping each attention weight (the mask from Frost's generator)."""
    mask = None if key_padding_mask is None else key_padding_mask.data
    if mask is not None and tuple(mask.shape) != (query.shape[0], key.shape[-2]):
        raise ValueError(f"flash_attention: key_padding_mask must have shape (batch, key length) = "
                         f"{(query.shape[0], key.shape[-2])}, got {tuple(mask.shape)}")
    p = check_scale(problem(query, key, value, is_causal, scale, enable_gqa, mask is not None, dropout_p))
    xp = query.xp
    q, k, v = query.data, key.data, value.data
    rng = dropout_state(xp) if p.dropout_p > 0.0 else None
    o, lse = forward_arrays(xp, q, k, v, p, mask, tiles, rng)

    def backward(g):
        return backward_arrays(xp, q, k, v, o, lse, g, p, mask, tiles, rng)

    backward.fresh_gradients = True   # new arrays (gradients_like, the Hopper kernels' outputs): a leaf keeps them
    return from_op(o, (query, key, value), backward, "flash_attention")


def key_padding_mask(attn_mask: Tensor | None, query: Tensor, key: Tensor):
    """attn_mask as a (B, Lk) key-padding mask when it is one: boolean, shape (B, 1, 1, Lk) (or (B or 1 of it)
    broadcast over heads and queries); None for no mask; False when the mask is anything else."""
    if attn_mask is None:
        return None
    b, lk = query.shape[0], key.shape[-2]
    shape = tuple(attn_mask.shape)
    if attn_mask.dtype.name != "bool" or len(shape) != 4 or shape[1:3] != (1, 1) or shape[0] not in (1, b) \
            or shape[3] != lk:
        return False
    return Tensor(attn_mask.xp.broadcast_to(attn_mask.data.reshape(shape[0], lk), (b, lk)))


def supported(query: Tensor, key: Tensor, value: Tensor, attn_mask: Tensor | None = None, dropout_p: float = 0.0,
              is_causal: bool = False, scale: float | None = None, enable_gqa: bool = False) -> bool:
    """Whether flash_attention computes this scaled_dot_product_attention call: CUDA tensors on a GPU with bf16
    mma.sync (compute capability 8.0 or newer) for which `applies` holds. FROST_FLASH_ATTENTION=0 (read at each call)
    switches it off."""
    if os.environ.get("FROST_FLASH_ATTENTION", "1") == "0":
        return False
    if any(not isinstance(t, Tensor) or t.device.type != "cuda" for t in (query, key, value)):
        return False
    return has_mma(query.data) and applies(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)


def applies(query: Tensor, key: Tensor, value: Tensor, attn_mask: Tensor | None = None, dropout_p: float = 0.0,
            is_causal: bool = False, scale: float | None = None, enable_gqa: bool = False) -> bool:
    """The kernels' own rules, on any device: q, k and v 4-D of one dtype (bf16 or f16), head dim 64 or 128 for all
    three, dropout_p in [0, 1], a positive finite scale (the online softmax scales each row's maximum), no mask or a
    boolean key-padding mask ((B or 1, 1, 1, Lk)), non-empty sequences, equal heads or grouped ones with enable_gqa,
    fewer than 2^31 elements each."""
    tensors = (query, key, value)
    if not 0.0 <= dropout_p <= 1.0 or any(t.ndim != 4 or t.data.size >= 2**31 for t in tensors):
        return False
    if key_padding_mask(attn_mask, query, key) is False:
        return False
    try:
        check_scale(problem(query, key, value, is_causal, scale, enable_gqa, attn_mask is not None))
    except ValueError:
        return False
    return True


@dispatch.register("scaled_dot_product_attention", device="cuda", dtypes=DTYPES, applies=supported)
def scaled_dot_product_attention_flash(query: Tensor, key: Tensor, value: Tensor, attn_mask: Tensor | None = None,
                                       dropout_p: float = 0.0, is_causal: bool = False, scale: float | None = None,
                                       enable_gqa: bool = False) -> Tensor:
    """scaled_dot_product_attention by the fused kernels: no L x S matrix in memory (a boolean key-padding
    attn_mask at most: `supported` has checked)."""
    mask = key_padding_mask(attn_mask, query, key)
    return flash_attention(query, key, value, is_causal, scale, enable_gqa, mask, dropout_p=dropout_p)
