"""Flash attention's forward on Hopper as FlashAttention-3 arranges it (`flash_fwd_bulk`, bf16, sm_90): a producer warp
(one thread) has the copy engine bring each tile's K and V into STAGES-deep rings of shared memory, counted on
mbarriers, while the consumer warpgroups multiply, wait only for their tile, release it on the ring's empty barrier and
meet on their own named barrier (not the block's) before P V. K and V come through tensor maps (cp_async_bulk_tensor:
boxes of BC keys x 64 columns, swizzled as wgmma reads them, zeros past the last key), read where they lie (laying them
out as the shared tiles' images first for plain bulk copies cost 0.07 ms more at 4 x 16 x 4096 x 128, tree a1cdd95).
Settings, each tested in the simulator and timed by benchmarks/flash_forward_tiles.py: STAGES, PINGPONG (the two
consumer warpgroups take turns at the tensor cores, FlashAttention-3's inter-warpgroup schedule) and RS (P kept in
registers as the A operand of P V, wgmma_bf16_rs, instead of shared memory), WGS (2 or 3 consumer warpgroups). PERSIST:
a grid of at most one block an SM, each taking query tile after query tile in a snake order (next_tile, so that under
causal masking long and short tiles even out), the producer's ring running on across tiles (not with dropout, whose
Philox counters are the grid's heads). The default forward for bf16 on sm_90 (flash_attention.py's BULK_TILES: 0.91x
PyTorch's cuDNN backend at 4 x 16 x 4096 x 128 on an H100, benchmarks/RESULTS.md); FROST_FLASH_BULK=0 runs the mma.sync
kernels instead."""
import functools

from frost.kernel import (Array, Const, TensorMap, bar_arrive, bar_sync, bf16, bx, cdiv, cp_async16,
                          cp_async_bulk_tensor, cp_commit, cp_wait, device, dynamic_shared, f32, fence_proxy_async, gdx,
                          i32, i64, kernel, lane, launch_bounds, local, mbarrier_arrive, mbarrier_arrive_expect_tx,
                          mbarrier_init, mbarrier_wait, setmaxnreg_dec, setmaxnreg_inc, shared, static_range, swizzle,
                          syncthreads, tx, u8, u32, warp, wgmma_wait)
from frost.accel.flash_common import (key_tiles, query_head, rescale, softmax_tile, softmax_weights, start_rows, to_a,
                                      whole_tile, write_rows)
from frost.accel.flash_hopper import load_panels, store_weights, weights_times_values, wgmma_rows


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
                start_rows(acc, m, lsum, D)
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
