"""Flash attention (FlashAttention-2) on mma.sync tensor cores, any GPU from sm_80, bf16 and f16: the forward
(flash_fwd), the row deltas (flash_bwd_dot), and the backward as two kernels (flash_bwd_dq, flash_bwd_dkdv), one set
per element type (kernels_for). The host side is frost/accel/flash_attention.py.

A block has WARPS = BR // 16 warps; each warp owns 16 rows of the block's tile (queries in the forward and dQ
kernels, keys in the dK/dV kernel) and every column of D, so the softmax statistics of a row stay within the 4 lanes
of a quad (two shuffles). Scores live in mma C fragments and are turned into the A fragments of the next mma in
registers (P @ V, dS @ K, ...), never through shared memory.

Out-of-range rows of a tile (ragged lengths) are loaded from the last valid row (cp.async cannot zero-fill) and
masked out of the softmax; they are never written.

Backward: D = rowsum(dO * O) first, then one kernel per key tile accumulating dK and dV over every query tile (and,
under grouped-query attention, every query head of the group) and one kernel per query tile accumulating dQ over the
key tiles: both recompute P = exp(S - L) from the saved log-sum-exp. No atomics, so the gradients are deterministic.

Speed. The forward copies K and V in turns, as FlashAttention-2 does: V(j) while S = Q K(j)^T and the softmax run,
K(j + 1) while O += P V(j), one buffer each. Tiles whose every key is visible to every query of the block (no mask,
in range, wholly before the block's first query when causal) skip the per-element visibility test. Dropout draws
one Philox block per pair of weights in every kernel. Untuned: the backward kernels' copies do not overlap their
math, padded shared rows rather than swizzled."""
import functools
from dataclasses import dataclass

from frost.kernel import (Array, Const, bf16, bx, by, bz, cdiv, cp_async16, cp_commit, cp_wait, device, dynamic_shared,
                          f16, f32, i32, kernel, lane, launch_bounds, ldmatrix_x4, ldmatrix_x4_trans, local, mma,
                          static_range, syncthreads, tx, u8, u32, warp)
from frost.accel.flash_common import (ds_tile, dst_tile, head_rows, key_tiles, row_dot, saved_lse, softmax_tile,
                                      start_rows, to_a, whole_tile, write_rows, write_scaled_rows, zero)

PAD = 8   # elements after each shared row: the 8 rows an ldmatrix reads fall in 8 different bank groups


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
        start_rows(acc, m, lsum, D)
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
