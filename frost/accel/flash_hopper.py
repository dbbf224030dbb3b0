"""Warpgroup MMA (wgmma, sm_90) for the flash-attention kernels of flash_wgmma, flash_bulk and
flash_fused_backward: tiles copied into 128-byte-swizzled shared panels of 64 columns (load_panels, the K-major layout
a wgmma descriptor reads), products of a warpgroup's rows by such panels (wgmma_rows, and wgmma_rows_mn reading the
second operand MN-major, so no tile is ever transposed), weights stored as bf16 panels (store_weights) or kept in
registers (weights_times_values with RS), and the backward's key blocks and steps (key_block, step_tile)."""
from frost.kernel import (MN_MAJOR, Const, bx, by, bz, cdiv, cp_async16, cp_wait, device, fence_proxy_async, i32, i64,
                          lane, static_range, swizzle, syncthreads, tx, wgmma_bf16, wgmma_bf16_rs, wgmma_commit,
                          wgmma_desc, wgmma_fence)


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
