"""The device functions the flash-attention kernels share (flash_mma, flash_wgmma, flash_bulk,
flash_fused_backward): where a block's queries and keys lie (head_rows, query_tile, key_tiles), which keys a query
sees (visible, whole_tile, hide_scores), the online softmax in log2 units (start_rows, softmax_tile, softmax_weights,
rescale), the backward's recomputed weights and dS (weights_of_keys, ds_tile, ds_of_keys), dropout's Philox stream
(dropout_pair, keep_pair), and the rows of O, the log-sum-exp and the gradients (write_rows, write_scaled_rows). Their
fragments are mma.sync's C layout, which wgmma's accumulators share, so both families call them.

Masking: key j is visible to query i when j < Lk, the key-padding mask keeps j, and (causal) j <= i: top-left
aligned also when Lq != Lk, as PyTorch's is_causal and the composed path (tril of an Lq x Lk matrix of ones). Rows
with no visible key give zeros (as the composed path), and their log-sum-exp is -inf."""
import math

from frost.kernel import (Const, bx, by, bz, cdiv, device, f32, fast_exp2, gdx, gdy, i32, inf, lane, local, log,
                          shfl_xor, static_range, u32, warp, warp_sum)
from frost.accel.philox import philox_block

LOG2E = math.log2(math.e)
LN2 = math.log(2.0)
STREAM = 0x464C4153   # xor-ed into the key's high word: dropout masks are a stream apart from the generator's draws


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
def key_tiles(q0: i32, lk: i32, BR: Const[int], BC: Const[int], CAUSAL: Const[int]) -> i32:
    """The tiles of BC keys that the BR queries from q0 see: all lk keys, or under causal masking those up to the
    tile's last query."""
    return cdiv(min(lk, q0 + BR) if CAUSAL else lk, BC)


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
def zero(acc, N: Const[int]):
    for j in static_range(N // 8):
        for q in static_range(4):
            acc[j, q] = 0.0


@device
def start_rows(acc, m, lsum, D: Const[int]):
    """A query tile's running state before its first key: O zero, each row's maximum -inf and sum 0."""
    zero(acc, D)
    for h in static_range(2):
        m[h] = -inf
        lsum[h] = 0.0


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
def keep_pair(rng, query: i32, key: i32, drop_p: f32, keep_scale: f32, DROPOUT: Const[int]) -> (f32, f32):
    """The factors of a query's weights for keys key and key + 1: keep_scale each without dropout, with it the
    mask's (dropout_pair: 0 for a dropped weight)."""
    keep0 = keep_scale
    keep1 = keep_scale
    if DROPOUT:
        keep0, keep1 = dropout_pair(rng, query_head(), query, key, drop_p, keep_scale)
    return keep0, keep1


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
            keep0, keep1 = keep_pair(rng, row0 + 8 * h, k0 + j * 8 + 2 * t, drop_p, keep_scale, DROPOUT)
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
            keep0, keep1 = keep_pair(rng, row0 + 8 * h, k0 + j * 8 + 2 * t, drop_p, keep_scale, DROPOUT)
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


@device
def row_dot(o, do, row: i32, D: Const[int]) -> f32:
    """sum over the head dim of dO[row] * O[row] in float32, by the 32 lanes of a warp (every lane gets it)."""
    acc = 0.0
    for c in static_range(D // 32):
        acc += f32(o[row, lane + 32 * c]) * f32(do[row, lane + 32 * c])
    return warp_sum(acc)
