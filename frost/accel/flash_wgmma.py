"""Flash attention on Hopper's warpgroup MMA (bf16, sm_90): `flash_fwd_wgmma` is the forward, warpgroups of 64 query
rows, S = Q K^T and O += P V as wgmmas on 128-byte-swizzled shared panels (P stored there as bf16), the softmax, masks,
dropout stream and output the mma.sync forward's (shared device functions). `wgmma_backward`'s dQ kernel (S, dP, then dQ
+= dS K) and dK/dV kernel (S^T, dP^T, then dV += P^T dO and dK += dS^T Q) do the same for the backward (at head dim 128
the dK/dV kernel steps over 32 queries, half a panel: steps of 64 spill; WGMMA_BACKWARD_TILES). No tile is transposed:
the second operand of P V, dS K, P^T dO and dS^T Q is read MN-major (wgmma_bf16's B_MAJOR) from the row-major panels the
copies write. The two kernels are the backward for bf16 on sm_90 for short sequences (with the bulk forward:
flash_bulk.py); FROST_FLASH_WGMMA=1 runs this forward too. The host side is frost/accel/flash_attention.py."""
import functools

from frost.kernel import (Array, Const, bf16, cp_commit, device, dynamic_shared, f32, fence_proxy_async, i32, kernel,
                          lane, launch_bounds, local, static_range, syncthreads, tx, u8, u32, warp, wgmma_wait)
from frost.accel.flash_common import (ds_tile, dst_tile, key_tiles, query_tile, saved_lse, softmax_tile, start_rows,
                                      whole_tile, write_rows, write_scaled_rows, zero)
from frost.accel.flash_hopper import (key_block, load_panels, publish_tiles, step_tile, store_weights, wgmma_rows,
                                      wgmma_rows_mn)


@device
def panel_times(acc, sp, s, wg: i32, b_tiles, b_first: i32, D: Const[int], BC: Const[int]):
    """acc += (this warpgroup's rows of s) @ B: the block's weights or dS (C fragments) stored as bf16 in the shared
    panels sp, every warp's before any is read (the block's barrier), times the row-major tile b_tiles[b_first]
    (V or K), waited for."""
    store_weights(sp, 0, s, warp * 16 + lane // 4, BC)
    fence_proxy_async()
    syncthreads()
    wgmma_rows_mn(acc, sp, 0, wg * 64, b_tiles, b_first, D, BC, BC)
    wgmma_wait(0)


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
        start_rows(acc, m, lsum, D)
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
            panel_times(acc, sp, s, wg, sv, buf * DP, D, BC)
            jt += 1
            if jt >= tiles:
                break
        write_rows(o, lse, acc, m, lsum, qbase, 1, qbase, row0, lq, D)
    return flash_fwd_wgmma


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
            panel_times(acc, sds, s, wg, sk, buf * DP, D, BC)
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
