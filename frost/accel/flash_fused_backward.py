"""FlashAttention-3's backward on Hopper (`fused_backward`, bf16, sm_90), the default from 1024 queries at head dim 128
and 512 at 64 (FUSED_FROM_LENGTH): one kernel per block of 64 WGS keys computes S^T, dP^T, dV, dK and that block's share
of dQ (five products where the two kernels recompute S and dP: seven), adding dQ into a float32 accumulator by one bulk
reduction a step (cp_reduce_async_bulk_add), then a small kernel converts it; dQ's sum is then in an order the GPU
chooses (not deterministic bit for bit: frost.backends.deterministic keeps the two kernels). RS takes P^T and dS^T to
the dV and dK products from registers instead of shared memory; Q and dO come through tensor maps and their statistics
(flash_bwd_tile_stats) by a bulk copy, one thread issuing, an mbarrier a buffer. FUSED_BACKWARD_TILES. Every kernel's
grid is (tiles, heads, batch), a head's tiles side by side in launch order (query_head). The host side is
frost/accel/flash_attention.py."""
import functools

from frost.kernel import (MN_MAJOR, Array, Const, TensorMap, bar_arrive, bar_sync, bf16, bx, cdiv, cp_async_bulk,
                          cp_async_bulk_commit, cp_async_bulk_tensor, cp_async_bulk_wait, cp_async_bulk_wait_read,
                          cp_commit, cp_reduce_async_bulk_add, device, dynamic_shared, f32, fence_proxy_async, gdx, i32,
                          i64, kernel, lane, launch_bounds, local, mbarrier_arrive_expect_tx, mbarrier_init,
                          mbarrier_wait, shared, static_range, syncthreads, tx, u8, u32, warp, wgmma_bf16, wgmma_commit,
                          wgmma_desc, wgmma_discard, wgmma_fence, wgmma_wait)
from frost.accel.flash_common import (ds_of_keys, query_head, row_dot, saved_lse, to_a, weights_of_keys, whole_tile,
                                      write_scaled_rows, zero)
from frost.accel.flash_hopper import (key_block, load_panels, publish_tiles, step_tile, store_weights,
                                      weights_times_values, wgmma_rows, wgmma_rows_mn)


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
