"""Batch norm (+ residual add, + ReLU) on the GPU: the kernels, their launch plans, and batch_norm_act's fast paths,
registered with frost.dispatch. The reference math, and the op that asks for these, is frost/ops/norm.py."""

import numpy as np

from frost import dispatch
from frost.autograd import GradientPair, grad_destination, is_grad_enabled
from frost.dtype import float32
from frost.kernel import (Array, Const, bdx, bf16, block_sum, bx, by, device, f32, grid_sync, grid_sync_counter, i32,
                          i64, kernel, lane, local, rsqrt, shared, shfl_xor, static_range, syncthreads, tx, u32, warp,
                          warp_sum)
from frost.kernel.compile import multiprocessor_count
from frost.layout import dense_like, empty_like_format, is_channels_last
from frost.ops import norm
from frost.ops.elementwise import cast
from frost.tensor import Tensor, from_op

# Four launches per layer instead of some twenty array ops. Forward: split statistics (grid (S, C): S blocks per
# channel, so that the small layers of a CIFAR ResNet still fill the GPU), then the normalize (fused with the
# residual add and the ReLU that follow it in a ResNet block), which first merges the partial statistics of the
# few channels its block touches (one warp per channel, into shared memory). Backward: split reduction of dy and
# dy * xhat, then dx, which merges those partial sums the same way. A launch costs ~2 us even inside a CUDA graph,
# so folding the merge into the elementwise kernels saves two launches per layer; one designated block per
# channel writes the merged values (mean, 1/std, running stats; dweight, dbias). When a block would touch more
# channels than it has warps (tiny H*W), a one-warp-per-channel finalize kernel merges instead (six launches).
# Partials go to small scratch arrays and are merged in a fixed order (no float atomics), so results are
# deterministic, and nothing reads back to the host, so the step can be captured in a CUDA graph. Each kernel's
# NumPy twin is the reference path (frost.ops.norm: batch_norm, then + residual, then relu); the tests compare
# them.

BN_THREADS = 256          # threads per block of the split reductions
BN_BLOCKS_PER_SM = 4      # the split reductions aim at this many blocks per SM (all resident: one wave)
BN_MAX_PER_THREAD = 16    # values a thread of a split reduction holds in registers (more splits beyond that)
BN_APPLY_THREADS = 256    # threads per block of the elementwise kernels
BN_APPLY_PER_THREAD = 1   # values per thread of the elementwise kernels (1 measured fastest at the seed shapes)
BN_MAX_CHANNELS_PER_BLOCK = 32  # shared slots of the merged statistics in an elementwise block (one per warp)
BN_NHWC_THREADS = 512     # threads per block of the channels-last kernels (all four)
BN_NHWC_BLOCKS_PER_SM = 2  # their grids aim at this many blocks per SM (one wave)
BN_NHWC_MERGE = 8         # splits one thread of a channels-last elementwise block merges (held in registers)
BN_NHWC_MAX_THREADS = 1024  # shared slots of the channels-last kernels (one per thread: the largest block)
BN_ONE_LAUNCH = True      # channels-last batch norm in one launch per direction where bn_plan_nhwc allows it
BN_ONE_LAUNCH_BLOCKS_PER_SM = 1  # its grid's blocks per SM (all must be resident: one always is)
BN_CONV_STATS_MERGE = 16  # a convolution's partials per merging lane the normalize kernel merges itself (else finalize)


@device
def _channel_position(k, c, hw, channels):
    """Where the k-th value (k over N*H*W) of channel c of a contiguous NCHW array is: flat index, column in its row."""
    col = k % hw
    return (k // hw) * channels * hw + c * hw + col, col


@device
def _next_in_channel(idx, col, step, col_step, hw, wrap):
    """(idx, col) advanced by one block stride within a channel; step and col_step are that stride's precomputed
    index and column increments, wrap the jump from a row's end to the channel's next row: no division."""
    col += col_step
    idx += step
    if col >= hw:
        col -= hw
        idx += wrap
    return idx, col


@device
def _next_flat(col, c, col_step, c_step, hw, channels):
    """(column, channel) of flat index i + stride given those of i; col_step = stride % hw and
    c_step = (stride // hw) % channels precomputed: no division per element."""
    col += col_step
    c += c_step
    if col >= hw:
        col -= hw
        c += 1
    if c >= channels:
        c -= channels
    return col, c


@device
def _flat_start(start, hw, channels):
    """An elementwise block's walk from flat index start: this thread's first index i, its column and channel,
    the column and channel steps of one block stride (for _next_flat), and the block's first row (N*C rows)."""
    i = start + tx
    return i, i % hw, (i // hw) % channels, bdx % hw, (bdx // hw) % channels, start // hw


@device
def _merged_stats(part_mean, part_m2, c, n, splits, chunk):
    """(mean, biased variance) of channel c from its splits' (count, mean, M2), in every lane of one warp: mean
    first, then M2 = sum(M2_s + count_s * (mean_s - mean)^2): exact, and a fixed order (the same bits wherever
    it runs, so blocks that merge the same channel agree)."""
    acc = 0.0
    for s in range(lane, splits, 32):
        acc += f32(min(chunk, n - s * chunk)) * part_mean[c * splits + s]
    mu = warp_sum(acc) / f32(n)
    acc2 = 0.0
    for s in range(lane, splits, 32):
        d = part_mean[c * splits + s] - mu
        acc2 += part_m2[c * splits + s] + f32(min(chunk, n - s * chunk)) * d * d
    return mu, warp_sum(acc2) / f32(n)


@device
def _merged_sums(part_g, part_gx, c, splits):
    """(sum dy, sum dy * (x - mean)) of channel c from its splits' partial sums, in every lane of one warp."""
    acc_g = 0.0
    acc_gx = 0.0
    for s in range(lane, splits, 32):
        acc_g += part_g[c * splits + s]
        acc_gx += part_gx[c * splits + s]
    return warp_sum(acc_g), warp_sum(acc_gx)


@device
def _store_stats(c, mu, inv, var, mean, invstd, running_mean, running_var, n, momentum, update_running):
    """Channel c's batch mean and 1/std (saved for backward) and its running statistics (unbiased variance)."""
    mean[c] = mu
    invstd[c] = inv
    if update_running != 0:
        running_mean[c] = (1 - momentum) * running_mean[c] + momentum * mu
        running_var[c] = (1 - momentum) * running_var[c] + momentum * var * f32(n) / f32(n - 1)


@kernel
def batch_norm_stats_partial(x: Array[f32], part_mean: Array[f32], part_m2: Array[f32], n: i32, hw: i32,
                             channels: i32, splits: i32, U: Const[int]):
    """Block (s, c) of grid (splits, C): mean and sum of squared deviations (M2) of channel c's values
    k = s*bdx*U ... (s+1)*bdx*U - 1 (k over N*H*W), held in registers: an exact two-pass over one read."""
    c = by
    s = bx
    chunk = bdx * U
    k = s * chunk + tx
    idx, col = _channel_position(k, c, hw, channels)
    step = (bdx // hw) * channels * hw + bdx % hw
    col_step = bdx % hw
    wrap = channels * hw - hw
    vals = local(f32, U)
    acc = 0.0
    for u in static_range(U):
        vals[u] = x[idx] if k + u * bdx < n else 0.0
        acc += vals[u]
        idx, col = _next_in_channel(idx, col, step, col_step, hw, wrap)
    scratch = shared(f32, 32)
    count = f32(min(chunk, n - s * chunk))
    mu = block_sum(acc, scratch) / count
    acc2 = 0.0
    for u in static_range(U):
        if k + u * bdx < n:
            d = vals[u] - mu
            acc2 += d * d
    m2 = block_sum(acc2, scratch)
    if tx == 0:
        part_mean[c * splits + s] = mu
        part_m2[c * splits + s] = m2


@kernel
def batch_norm_stats_finalize(part_mean: Array[f32], part_m2: Array[f32], mean: Array[f32], invstd: Array[f32],
                              running_mean: Array[f32], running_var: Array[f32], n: i32, splits: i32, chunk: i32,
                              momentum: f32, eps: f32, update_running: i32):
    """One warp per channel (grid C, block 32): merges its splits' statistics; writes mean, 1/std, running stats.
    Only for shapes batch_norm_apply cannot merge itself (bn_fusable false)."""
    c = bx
    mu, var = _merged_stats(part_mean, part_m2, c, n, splits, chunk)
    inv = rsqrt(var + eps)
    if lane == 0:
        _store_stats(c, mu, inv, var, mean, invstd, running_mean, running_var, n, momentum, update_running)


@kernel
def batch_norm_apply(x: Array[f32], y: Array[f32], part_mean: Array[f32], part_m2: Array[f32], mean: Array[f32],
                     invstd: Array[f32], running_mean: Array[f32], running_var: Array[f32], batches: Array[i64],
                     weight: Array[f32], bias: Array[f32], residual: Array[f32], total: i32, hw: i32, channels: i32,
                     n: i32, splits: i32, chunk: i32, momentum: f32, eps: f32, update_running: i32,
                     count_batch: i32, relu: Const[int], add_residual: Const[int], fused: Const[int],
                     U: Const[int] = BN_APPLY_PER_THREAD):
    """y = relu((x - mean) * invstd * weight + bias + residual): U values per thread, a block stride apart.

    fused=1: the block's warp w first merges the partial statistics of the w-th channel row its values touch into
    shared memory (needs rows <= warps: bn_fusable); the block holding a channel's first value (in sample 0) also
    stores its mean, 1/std and running statistics. fused=0: mean and invstd come from batch_norm_stats_finalize.
    count_batch != 0: block 0 adds one to batches[0] (the layer's num_batches_tracked)."""
    start = bx * bdx * U
    i, col, c, col_step, c_step, row0 = _flat_start(start, hw, channels)
    xs = local(f32, U)
    rs = local(f32, U)
    for u in static_range(U):  # loads issued before the merge: their latency overlaps it
        xs[u] = x[i + u * bdx] if i + u * bdx < total else 0.0
        if add_residual:
            rs[u] = residual[i + u * bdx] if i + u * bdx < total else 0.0
    s_mean = shared(f32, 32)
    s_invstd = shared(f32, 32)
    if fused:
        rows = (min(start + bdx * U, total) - 1) // hw - row0 + 1
        if warp < rows:
            row = row0 + warp
            cw = row % channels
            mu, var = _merged_stats(part_mean, part_m2, cw, n, splits, chunk)
            inv = rsqrt(var + eps)
            if lane == 0:
                s_mean[warp] = mu
                s_invstd[warp] = inv
                if row < channels and row * hw >= start:
                    _store_stats(cw, mu, inv, var, mean, invstd, running_mean, running_var, n, momentum,
                                 update_running)
        syncthreads()
    if count_batch != 0 and bx == 0 and tx == 0:
        batches[0] += 1
    for u in static_range(U):
        if i < total:
            m = 0.0
            inv_c = 0.0
            if fused:
                m = s_mean[i // hw - row0]
                inv_c = s_invstd[i // hw - row0]
            else:
                m = mean[c]
                inv_c = invstd[c]
            v = (xs[u] - m) * inv_c * weight[c] + bias[c]
            if add_residual:
                v += rs[u]
            if relu:
                v = max(v, 0.0)
            y[i] = v
        i += bdx
        col, c = _next_flat(col, c, col_step, c_step, hw, channels)


@kernel
def batch_norm_backward_partial(dy: Array[f32], x: Array[f32], y: Array[f32], mean: Array[f32],
                                part_g: Array[f32], part_gx: Array[f32], n: i32, hw: i32, channels: i32,
                                splits: i32, relu: Const[int], U: Const[int]):
    """Block (s, c) of grid (splits, C): sum(dy) and sum(dy * (x - mean)) over channel c's values
    k = s*bdx*U ... (s+1)*bdx*U - 1, dy masked by the ReLU (y > 0)."""
    c = by
    s = bx
    k = s * bdx * U + tx
    idx, col = _channel_position(k, c, hw, channels)
    step = (bdx // hw) * channels * hw + bdx % hw
    col_step = bdx % hw
    wrap = channels * hw - hw
    m = mean[c]
    sum_g = 0.0
    sum_gx = 0.0
    for u in static_range(U):
        if k + u * bdx < n:
            g = dy[idx]
            if relu:
                g = g if y[idx] > 0 else 0.0
            sum_g += g
            sum_gx += g * (x[idx] - m)
        idx, col = _next_in_channel(idx, col, step, col_step, hw, wrap)
    scratch = shared(f32, 32)
    sum_g = block_sum(sum_g, scratch)
    sum_gx = block_sum(sum_gx, scratch)
    if tx == 0:
        part_g[c * splits + s] = sum_g
        part_gx[c * splits + s] = sum_gx


@kernel
def batch_norm_backward_finalize(part_g: Array[f32], part_gx: Array[f32], invstd: Array[f32], dweight: Array[f32],
                                 dbias: Array[f32], splits: i32):
    """One warp per channel (grid C, block 32): dbias = sum(dy), dweight = sum(dy * xhat) from the partials.
    Only for shapes batch_norm_backward_input cannot merge itself (bn_fusable false)."""
    c = bx
    acc_g, acc_gx = _merged_sums(part_g, part_gx, c, splits)
    if lane == 0:
        dbias[c] = acc_g
        dweight[c] = acc_gx * invstd[c]


@kernel
def batch_norm_backward_input(dy: Array[f32], x: Array[f32], y: Array[f32], mean: Array[f32],
                              invstd: Array[f32], weight: Array[f32], part_g: Array[f32], part_gx: Array[f32],
                              dweight: Array[f32], dbias: Array[f32], dx: Array[f32], dresidual: Array[f32],
                              total: i32, hw: i32, channels: i32, n: i32, splits: i32, relu: Const[int],
                              add_residual: Const[int], fused: Const[int], U: Const[int] = BN_APPLY_PER_THREAD):
    """dx = weight * invstd * (g - mean(g) - xhat * mean(g * xhat)), g = dy masked by the ReLU (also the
    residual's gradient): U values per thread, a block stride apart.

    fused=1: warp w first merges the partial sums of the w-th channel row the block touches into shared memory;
    the block holding a channel's first value (in sample 0) stores its dbias and dweight. fused=0: dbias and
    dweight come from batch_norm_backward_finalize."""
    start = bx * bdx * U
    i, col, c, col_step, c_step, row0 = _flat_start(start, hw, channels)
    gs = local(f32, U)
    xs = local(f32, U)
    for u in static_range(U):  # loads issued before the merge: their latency overlaps it
        if i + u * bdx < total:
            gs[u] = dy[i + u * bdx]
            if relu:
                gs[u] = gs[u] if y[i + u * bdx] > 0 else 0.0
            xs[u] = x[i + u * bdx]
    s_db = shared(f32, 32)
    s_dw = shared(f32, 32)
    if fused:
        rows = (min(start + bdx * U, total) - 1) // hw - row0 + 1
        if warp < rows:
            row = row0 + warp
            cw = row % channels
            acc_g, acc_gx = _merged_sums(part_g, part_gx, cw, splits)
            dw = acc_gx * invstd[cw]
            if lane == 0:
                s_db[warp] = acc_g
                s_dw[warp] = dw
                if row < channels and row * hw >= start:
                    dbias[cw] = acc_g
                    dweight[cw] = dw
        syncthreads()
    for u in static_range(U):
        if i < total:
            db = 0.0
            dw_c = 0.0
            if fused:
                db = s_db[i // hw - row0]
                dw_c = s_dw[i // hw - row0]
            else:
                db = dbias[c]
                dw_c = dweight[c]
            g = gs[u]
            if add_residual:
                dresidual[i] = g
            xhat = (xs[u] - mean[c]) * invstd[c]
            dx[i] = weight[c] * invstd[c] * (g - db / f32(n) - xhat * dw_c / f32(n))
        i += bdx
        col, c = _next_flat(col, c, col_step, c_step, hw, channels)


# ------------------------------------------------------------------ the same kernels for channels-last arrays
# A channels-last array (NCHW shape, NHWC memory: frost.layout) is a (rows, C) matrix, rows = N*H*W: channel c of
# row r sits at r*C + c. Each kernel runs on grid (S, G) of bdx threads: block (s, g) covers rows s*R*U ...
# (s+1)*R*U - 1 of the cb channels g*cb ... g*cb+cb-1 (cb = min(C, bdx), G = ceil(C / cb), R = bdx // cb rows at a
# time, U per thread); thread t stays on channel g*cb + t % cb and walks rows t // cb, t // cb + R, ..., so a warp
# reads consecutive addresses and a thread divides nothing per value. The threads of a channel combine their sums in
# shared memory (a pairwise tree over the R rows: a fixed order). The partials keep the NCHW kernels' layout
# [c * S + s] and count (min(R*U, n - s*R*U)), so the finalize kernels above serve both layouts. An elementwise block
# touches all its cb channels, so its merge reads cb * S partials: `lanes` threads per channel, each holding at most
# BN_NHWC_MERGE splits in registers (all its loads in flight at once); bn_split_nhwc keeps S <= lanes * BN_NHWC_MERGE
# where more values per thread get there (four launches), else the finalize kernels merge (six launches).

@device
def _channel_pair(fused, shared_a, shared_b, slot, a, b, c):
    """Channel c's two merged values (mean and 1/std, or dbias and dweight): from the block's shared slot when
    the elementwise kernel merged them itself (fused), else from the finalize kernel's arrays."""
    if fused:
        return shared_a[slot], shared_b[slot]
    return a[c], b[c]

@device
def _nhwc_thread(cb, channels):
    """This thread's place in a channels-last block: channel slot cl, row offset j, rows at a time R, channel c,
    and whether it has values (j < R and c < C)."""
    cl = tx % cb
    j = tx // cb
    rows = bdx // cb
    c = by * cb + cl
    return cl, j, rows, c, j < rows and c < channels


@device
def _column_sum(v, buf, cl, j, rows, cb):
    """The sum of v over the `rows` threads j*cb + cl (j = 0..rows-1) of the block's column cl, in every thread of
    the column: a pairwise tree in shared memory (buf, a slot per thread), a fixed order."""
    buf[tx] = v
    syncthreads()
    r = rows
    while r > 1:
        h = (r + 1) // 2
        if j < r - h:
            buf[tx] += buf[tx + h * cb]
        syncthreads()
        r = h
    total = buf[cl]
    syncthreads()  # buf may be reused right after
    return total


@device
def _column_sums(a, b, buf_a, buf_b, cl, j, rows, cb):
    """(sum a, sum b) over the block's column cl, as _column_sum, both trees in the same steps."""
    buf_a[tx] = a
    buf_b[tx] = b
    syncthreads()
    r = rows
    while r > 1:
        h = (r + 1) // 2
        if j < r - h:
            buf_a[tx] += buf_a[tx + h * cb]
            buf_b[tx] += buf_b[tx + h * cb]
        syncthreads()
        r = h
    sum_a = buf_a[cl]
    sum_b = buf_b[cl]
    syncthreads()
    return sum_a, sum_b


@device
def _lanes_sum(v, lanes):
    """The sum of v over an aligned group of `lanes` lanes of a warp (a power of two <= 32), in each of them."""
    for k in static_range(5):
        if (16 >> k) < lanes:
            v += shfl_xor(v, 16 >> k)
    return v


@device
def _merged_stats_lanes(part_mean, part_m2, c, q, lanes, ok, n, splits, chunk, M: Const[int]):
    """(mean, biased variance) of channel c from its splits' (count, mean, M2), in each of the `lanes` lanes
    (q = 0..lanes-1) that merge it: lane q loads splits q, q + lanes, ... (at most M, all at once), then the exact
    merge of _merged_stats. ok false: a lane without a channel (it adds nothing but joins the shuffles)."""
    ms = local(f32, M)
    m2s = local(f32, M)
    acc = 0.0
    for k in static_range(M):
        s = q + k * lanes
        ms[k] = 0.0
        m2s[k] = 0.0
        if ok and s < splits:
            ms[k] = part_mean[c * splits + s]
            m2s[k] = part_m2[c * splits + s]
            acc += f32(min(chunk, n - s * chunk)) * ms[k]
    mu = _lanes_sum(acc, lanes) / f32(n)
    acc2 = 0.0
    for k in static_range(M):
        s = q + k * lanes
        if ok and s < splits:
            d = ms[k] - mu
            acc2 += m2s[k] + f32(min(chunk, n - s * chunk)) * d * d
    return mu, _lanes_sum(acc2, lanes) / f32(n)


@device
def _merged_sums_lanes(part_g, part_gx, c, q, lanes, ok, splits, M: Const[int]):
    """(sum dy, sum dy * (x - mean)) of channel c from its splits' partial sums, as _merged_stats_lanes."""
    acc_g = 0.0
    acc_gx = 0.0
    for k in static_range(M):
        s = q + k * lanes
        if ok and s < splits:
            acc_g += part_g[c * splits + s]
            acc_gx += part_gx[c * splits + s]
    return _lanes_sum(acc_g, lanes), _lanes_sum(acc_gx, lanes)


@device
def _split_stats(vals, part_mean, part_m2, active, row, n, channels, cb, splits, U: Const[int]):
    """Block (s, g)'s mean and sum of squared deviations (M2) of each of its channels, from the U values each thread
    holds (vals, zero where absent), stored as split s of part_mean / part_m2: an exact two-pass over one read."""
    cl, j, rows, c, _ = _nhwc_thread(cb, channels)
    chunk = rows * U
    acc = 0.0
    for u in static_range(U):
        acc += vals[u]
    buf = shared(f32, BN_NHWC_MAX_THREADS)
    mu = _column_sum(acc, buf, cl, j, rows, cb) / f32(min(chunk, n - bx * chunk))
    acc2 = 0.0
    for u in static_range(U):
        if active and row + u * rows < n:
            d = vals[u] - mu
            acc2 += d * d
    m2 = _column_sum(acc2, buf, cl, j, rows, cb)
    if j == 0 and c < channels:
        part_mean[c * splits + bx] = mu
        part_m2[c * splits + bx] = m2


@device
def _load_gradient(dy, dy2, x, y, gs, xs, active, row, rows, n, channels, c, relu, pair: Const[int], U: Const[int]):
    """A thread's U values of g (dy, plus dy2 when pair: two gradient contributions added here, masked by the ReLU:
    y > 0) and of x, as f32 (zero where absent)."""
    for u in static_range(U):
        gs[u] = 0.0
        xs[u] = 0.0
        if active and row + u * rows < n:
            idx = (row + u * rows) * channels + c
            gs[u] = f32(dy[idx])
            if pair:
                gs[u] += f32(dy2[idx])
            if relu:
                gs[u] = gs[u] if y[idx] > 0 else 0.0
            xs[u] = f32(x[idx])


@device
def _split_sums(gs, xs, part_g, part_gx, mean, active, row, n, channels, cb, splits, U: Const[int]):
    """Block (s, g)'s sum(g) and sum(g * (x - mean)) of each of its channels, from the U values of g (dy masked by
    the ReLU) and x each thread holds, stored as split s of part_g / part_gx."""
    cl, j, rows, c, _ = _nhwc_thread(cb, channels)
    m = mean[c] if active else 0.0
    sum_g = 0.0
    sum_gx = 0.0
    for u in static_range(U):
        if active and row + u * rows < n:
            sum_g += gs[u]
            sum_gx += gs[u] * (xs[u] - m)
    buf_g = shared(f32, BN_NHWC_MAX_THREADS)
    buf_gx = shared(f32, BN_NHWC_MAX_THREADS)
    sum_g, sum_gx = _column_sums(sum_g, sum_gx, buf_g, buf_gx, cl, j, rows, cb)
    if j == 0 and c < channels:
        part_g[c * splits + bx] = sum_g
        part_gx[c * splits + bx] = sum_gx


# Each channels-last kernel is made by a factory from the element type T of its activations (x, y, residual, dy, dx,
# dresidual: f32 or bf16, the latter what autocast's convolutions read and write). Loads convert to f32 (f32(...)),
# arithmetic and statistics are f32, stores into a bf16 array round to nearest even; mean, 1/std, running stats,
# weight, bias, their gradients and the partials are f32 for every T. One source per kernel, one kernel per T.

def _nhwc_stats_partial_kernel(T):
    @kernel
    def batch_norm_stats_partial_nhwc(x: Array[T], part_mean: Array[f32], part_m2: Array[f32], n: i32,
                                      channels: i32, cb: i32, splits: i32, U: Const[int]):
        """Block (s, g) of grid (splits, G) on a channels-last x (n rows of C): mean and sum of squared deviations
        (M2) of each of channels g*cb ... over rows s*R*U ... (s+1)*R*U - 1, a thread's U values held in registers:
        an exact two-pass over one read."""
        cl, j, rows, c, active = _nhwc_thread(cb, channels)
        row = bx * rows * U + j
        vals = local(f32, U)
        for u in static_range(U):
            vals[u] = f32(x[(row + u * rows) * channels + c]) if active and row + u * rows < n else 0.0
        _split_stats(vals, part_mean, part_m2, active, row, n, channels, cb, splits, U)
    return batch_norm_stats_partial_nhwc


def _nhwc_apply_kernel(T):
    @kernel
    def batch_norm_apply_nhwc(x: Array[T], y: Array[T], part_mean: Array[f32], part_m2: Array[f32],
                              mean: Array[f32], invstd: Array[f32], running_mean: Array[f32],
                              running_var: Array[f32], batches: Array[i64], weight: Array[f32], bias: Array[f32],
                              residual: Array[T], counter: Array[u32], n: i32, channels: i32, cb: i32, lanes: i32,
                              splits: i32, chunk: i32, momentum: f32, eps: f32, update_running: i32, count_batch: i32,
                              relu: Const[int], add_residual: Const[int], fused: Const[int], U: Const[int],
                              stats: Const[int] = 0, M: Const[int] = BN_NHWC_MERGE):
        """y = relu((x - mean) * invstd * weight + bias + residual) on channels-last arrays: block (s, g) takes the
        values of batch_norm_stats_partial_nhwc's block (s, g), U per thread.

        fused=1: the block first merges the partial statistics of its cb channels (`splits` of them, of `chunk`
        rows each, the last one possibly shorter) into shared memory, `lanes` threads per channel (needs splits <=
        lanes * M: bn_split_nhwc); the blocks of split 0 also store their channels' mean, 1/std and running
        statistics. The partials are this kernel's own (stats=1, or batch_norm_stats_partial_nhwc's: chunk = rows *
        U) or a convolution's (its epilogue's, conv_fprop_mma.ChannelStats). fused=0: mean and invstd come from
        batch_norm_stats_finalize.
        stats=1 (with fused=1: the whole forward in one launch): the block first computes its partial statistics
        itself (batch_norm_stats_partial_nhwc's work, on the values it holds) and waits at grid_sync(counter) for
        every block's; every block must be resident (bn_split_nhwc's one_launch).
        count_batch != 0: block (0, 0) adds one to batches[0] (the layer's num_batches_tracked)."""
        cl, j, rows, c, active = _nhwc_thread(cb, channels)
        row = bx * rows * U + j
        xs = local(f32, U)
        rs = local(f32, U)
        for u in static_range(U):  # loads issued before the merge: their latency overlaps it
            xs[u] = f32(x[(row + u * rows) * channels + c]) if active and row + u * rows < n else 0.0
            if add_residual:
                rs[u] = f32(residual[(row + u * rows) * channels + c]) if active and row + u * rows < n else 0.0
        if stats:
            _split_stats(xs, part_mean, part_m2, active, row, n, channels, cb, splits, U)
            grid_sync(counter)
        s_mean = shared(f32, BN_NHWC_MAX_THREADS)
        s_invstd = shared(f32, BN_NHWC_MAX_THREADS)
        if fused:
            mc = tx // lanes
            cm = by * cb + mc
            has = mc < cb and cm < channels
            mu, var = _merged_stats_lanes(part_mean, part_m2, cm, tx % lanes, lanes, has, n, splits, chunk, M)
            inv = rsqrt(var + eps)
            if has and tx % lanes == 0:
                s_mean[mc] = mu
                s_invstd[mc] = inv
                if bx == 0:
                    _store_stats(cm, mu, inv, var, mean, invstd, running_mean, running_var, n, momentum,
                                 update_running)
            syncthreads()
        if count_batch != 0 and bx == 0 and by == 0 and tx == 0:
            batches[0] += 1
        if active:
            m, inv_c = _channel_pair(fused, s_mean, s_invstd, cl, mean, invstd, c)
            w = weight[c]
            b = bias[c]
            for u in static_range(U):
                if row + u * rows < n:
                    v = (xs[u] - m) * inv_c * w + b
                    if add_residual:
                        v += rs[u]
                    if relu:
                        v = max(v, 0.0)
                    y[(row + u * rows) * channels + c] = v
    return batch_norm_apply_nhwc


def _nhwc_backward_partial_kernel(T):
    @kernel
    def batch_norm_backward_partial_nhwc(dy: Array[T], dy2: Array[T], x: Array[T], y: Array[T], mean: Array[f32],
                                         part_g: Array[f32], part_gx: Array[f32], n: i32, channels: i32, cb: i32,
                                         splits: i32, relu: Const[int], U: Const[int], pair: Const[int] = 0):
        """Block (s, g) of grid (splits, G) on channels-last arrays: sum(dy) and sum(dy * (x - mean)) of each of
        its channels over its rows (those of batch_norm_stats_partial_nhwc's block (s, g)), dy masked by the ReLU
        (y > 0). pair=1: dy is dy + dy2 (two gradient contributions, added as they are loaded)."""
        cl, j, rows, c, active = _nhwc_thread(cb, channels)
        row = bx * rows * U + j
        gs = local(f32, U)
        xs = local(f32, U)
        _load_gradient(dy, dy2, x, y, gs, xs, active, row, rows, n, channels, c, relu, pair, U)
        _split_sums(gs, xs, part_g, part_gx, mean, active, row, n, channels, cb, splits, U)
    return batch_norm_backward_partial_nhwc


def _nhwc_backward_input_kernel(T):
    @kernel
    def batch_norm_backward_input_nhwc(dy: Array[T], dy2: Array[T], x: Array[T], y: Array[T], mean: Array[f32],
                                       invstd: Array[f32], weight: Array[f32], part_g: Array[f32],
                                       part_gx: Array[f32], dweight: Array[f32], dbias: Array[f32], dx: Array[T],
                                       dresidual: Array[T], counter: Array[u32], n: i32, channels: i32, cb: i32,
                                       lanes: i32, splits: i32, relu: Const[int], add_residual: Const[int],
                                       fused: Const[int], U: Const[int], sums: Const[int] = 0,
                                       pair: Const[int] = 0, M: Const[int] = BN_NHWC_MERGE):
        """dx = weight * invstd * (g - mean(g) - xhat * mean(g * xhat)), g = dy masked by the ReLU (also the
        residual's gradient), on channels-last arrays: block (s, g) takes the values of
        batch_norm_backward_partial_nhwc's.

        fused=1: the block first merges the partial sums of its cb channels into shared memory, `lanes` threads per
        channel; the blocks of split 0 store their channels' dbias and dweight. fused=0: dbias and dweight come from
        batch_norm_backward_finalize. sums=1 (with fused=1: the whole backward in one launch): the block first
        computes its partial sums itself (batch_norm_backward_partial_nhwc's work, on the values it holds) and waits
        at grid_sync(counter) for every block's; every block must be resident (bn_split_nhwc's one_launch).
        pair=1: dy is dy + dy2 (two gradient contributions, added as they are loaded)."""
        cl, j, rows, c, active = _nhwc_thread(cb, channels)
        row = bx * rows * U + j
        gs = local(f32, U)
        xs = local(f32, U)
        _load_gradient(dy, dy2, x, y, gs, xs, active, row, rows, n, channels, c, relu, pair, U)  # before the merge
        if sums:
            _split_sums(gs, xs, part_g, part_gx, mean, active, row, n, channels, cb, splits, U)
            grid_sync(counter)
        s_db = shared(f32, BN_NHWC_MAX_THREADS)
        s_dw = shared(f32, BN_NHWC_MAX_THREADS)
        if fused:
            mc = tx // lanes
            cm = by * cb + mc
            has = mc < cb and cm < channels
            acc_g, acc_gx = _merged_sums_lanes(part_g, part_gx, cm, tx % lanes, lanes, has, splits, M)
            if has and tx % lanes == 0:
                dw = acc_gx * invstd[cm]
                s_db[mc] = acc_g
                s_dw[mc] = dw
                if bx == 0:
                    dbias[cm] = acc_g
                    dweight[cm] = dw
            syncthreads()
        if active:
            db, dw_c = _channel_pair(fused, s_db, s_dw, cl, dbias, dweight, c)
            m = mean[c]
            inv_c = invstd[c]
            w = weight[c]
            for u in static_range(U):
                if row + u * rows < n:
                    idx = (row + u * rows) * channels + c
                    if add_residual:
                        dresidual[idx] = gs[u]
                    xhat = (xs[u] - m) * inv_c
                    dx[idx] = w * inv_c * (gs[u] - db / f32(n) - xhat * dw_c / f32(n))
    return batch_norm_backward_input_nhwc


# the channels-last kernels by activation dtype name (x.dtype.name), made by the factories above
NHWC_KERNELS = {name: dict(stats_partial=_nhwc_stats_partial_kernel(T), apply=_nhwc_apply_kernel(T),
                           backward_partial=_nhwc_backward_partial_kernel(T),
                           backward_input=_nhwc_backward_input_kernel(T))
                for name, T in (("float32", f32), ("bfloat16", bf16))}
batch_norm_stats_partial_nhwc = NHWC_KERNELS["float32"]["stats_partial"]
batch_norm_apply_nhwc = NHWC_KERNELS["float32"]["apply"]
batch_norm_backward_partial_nhwc = NHWC_KERNELS["float32"]["backward_partial"]
batch_norm_backward_input_nhwc = NHWC_KERNELS["float32"]["backward_input"]


def _sms(x: Tensor) -> int:
    return multiprocessor_count(x.xp.cuda.runtime.getDevice())


def bn_split(n: int, channels: int, sm_count: int, threads: int = BN_THREADS,
             blocks_per_sm: int = BN_BLOCKS_PER_SM) -> tuple[int, int]:
    """(values per thread U, blocks per channel S) of a split reduction over n values per channel: U a power of
    two in 2..BN_MAX_PER_THREAD, as small as lets the C*S blocks come near blocks_per_sm * sm_count."""
    wanted = max(1, blocks_per_sm * sm_count // channels)
    per_thread = -(-n // (wanted * threads))
    U = 2
    while U < per_thread and U < BN_MAX_PER_THREAD:
        U *= 2
    return U, -(-n // (threads * U))


def bn_fusable(hw: int, threads: int = BN_APPLY_THREADS, per_thread: int = BN_APPLY_PER_THREAD) -> bool:
    """Whether the elementwise kernels can merge the statistics themselves: a block's threads * per_thread
    contiguous values span at most ceil(threads * per_thread / hw) + 1 channel rows, one warp each."""
    return -(-threads * per_thread // hw) + 1 <= min(threads // 32, BN_MAX_CHANNELS_PER_BLOCK)


def bn_split_nhwc(n: int, channels: int, sm_count: int, threads: int = BN_NHWC_THREADS,
                  blocks_per_sm: int = BN_NHWC_BLOCKS_PER_SM,
                  merge: int = BN_NHWC_MERGE) -> tuple[int, int, int, int, int, bool]:
    """The channels-last kernels' launch over n rows of `channels` values: (cb channels per block, G channel groups,
    merging lanes per channel, U rows per thread, S row splits, fused).

    U is a power of two up to BN_MAX_PER_THREAD, the smallest that lets the S * G blocks come near
    blocks_per_sm * sm_count. fused (four launches: the elementwise kernels merge the S partials themselves) needs
    S <= lanes * merge; U grows for it when that is enough, else the finalize kernels merge (six launches)."""
    if not 32 <= threads <= BN_NHWC_MAX_THREADS or threads % 32:
        raise ValueError(f"bn_split_nhwc: threads must be a multiple of 32 in 32..{BN_NHWC_MAX_THREADS}, "
                         f"got {threads}")
    cb = min(channels, threads)
    groups, rows = -(-channels // cb), threads // cb
    lanes = min(32, 1 << (rows.bit_length() - 1))
    wanted = max(1, blocks_per_sm * sm_count // groups)
    U = 1
    while U < BN_MAX_PER_THREAD and -(-n // (rows * U)) > wanted:
        U *= 2
    fused_U = U
    while fused_U < BN_MAX_PER_THREAD and -(-n // (rows * fused_U)) > lanes * merge:
        fused_U *= 2
    fused = -(-n // (rows * fused_U)) <= lanes * merge
    U = fused_U if fused else U
    return cb, groups, lanes, U, -(-n // (rows * U)), fused

def bn_plan_nhwc(n: int, channels: int, sm_count: int, threads: int = BN_NHWC_THREADS) -> tuple[tuple, bool]:
    """(bn_split_nhwc's plan, one_launch): one launch per direction (statistics, grid_sync, normalize in the same
    kernel) where the merging plan needs at most one block per SM, so that every block is resident at once and the
    grid barrier cannot wait for a block that never starts; else the four- or six-launch plan."""
    if BN_ONE_LAUNCH:
        plan = bn_split_nhwc(n, channels, sm_count, threads, blocks_per_sm=BN_ONE_LAUNCH_BLOCKS_PER_SM)
        cb, groups, lanes, U, S, fused = plan
        if fused and S * groups <= BN_ONE_LAUNCH_BLOCKS_PER_SM * sm_count:
            return plan, True
    return bn_split_nhwc(n, channels, sm_count, threads), False


def conv_stats_of(x: Tensor):
    """The partial statistics of x that the convolution which made x wrote in its epilogue
    (conv_fprop_mma.ChannelStats), or None: x not made so, or changed since (in-place ops drop them)."""
    made = x.__dict__.get("_channel_stats")
    if made is None or made.y is not x.data or made.splits * made.chunk * x.shape[1] != x.numel():
        return None
    return made


def _kernel_dtype(x: Tensor) -> bool:
    """Whether the GPU kernels take x's dtype without a cast: float32, and bf16 when x is channels-last."""
    return x.dtype.name == "float32" or (x.dtype.name in NHWC_KERNELS and is_channels_last(x.data))


def _counter_in_kernel(num_batches_tracked: Tensor | None, x: Tensor) -> bool:
    t = num_batches_tracked
    return (t is not None and t.dtype == "int64" and t.numel() == 1 and t.device == x.device
            and t.data.flags.c_contiguous)


def _kernel_buffers(x: Tensor, splits: int, running_mean: Tensor | None, running_var: Tensor | None,
                    weight: Tensor | None, bias: Tensor | None, num_batches_tracked: Tensor | None) -> tuple:
    """What the GPU kernels of a training batch_norm_act take besides the activations: (mean, invstd, the two
    partial arrays, weight, bias, update running stats?, running mean, running var, counter, count in kernel?).
    Missing weight/bias/running stats become ones/zeros/scratch; a counter the kernel cannot bump is bumped here."""
    xp, C = x.xp, x.shape[1]
    mean, invstd = xp.empty(C, xp.float32), xp.empty(C, xp.float32)
    part_a, part_b = xp.empty(C * splits, xp.float32), xp.empty(C * splits, xp.float32)
    w = xp.ones(C, xp.float32) if weight is None else weight.data
    b = xp.zeros(C, xp.float32) if bias is None else bias.data
    track = running_mean is not None and running_var is not None
    rm = running_mean.data if track else mean
    rv = running_var.data if track else invstd
    if _counter_in_kernel(num_batches_tracked, x):
        batches, count = num_batches_tracked.data, 1
    else:
        if num_batches_tracked is not None:
            num_batches_tracked.data += 1
        batches, count = xp.empty(1, xp.int64), 0
    return mean, invstd, part_a, part_b, w, b, track, rm, rv, batches, count


def _backward_buffers(xp, C: int, S: int, weight: Tensor | None, bias: Tensor | None) -> tuple:
    """(dweight, dbias, part_g, part_gx) for the backward kernels: the parameters' zeroed .grad buffers where they
    have them (the kernels write straight into those), else scratch; the partial sums of S splits per channel."""
    dweight = grad_destination(weight) if weight is not None else None
    dbias = grad_destination(bias) if bias is not None else None
    dweight = xp.empty(C, xp.float32) if dweight is None else dweight
    dbias = xp.empty(C, xp.float32) if dbias is None else dbias
    return dweight, dbias, xp.empty(C * S, xp.float32), xp.empty(C * S, xp.float32)


def _parent_grads(dx, weight, dweight, bias, dbias, residual, dres) -> list:
    """The gradients of batch_norm_act's parents (x, weight, bias, residual: those that are there), in order."""
    return [dx] + [d for t, d in ((weight, dweight), (bias, dbias), (residual, dres)) if t is not None]


def _rows(a):
    """A channels-last (N, C, H, W) array as the C-contiguous (N, H, W, C) array it is (what the kernels index)."""
    return a.transpose(0, 2, 3, 1)


_plans_queued: set = set()  # (kernel, plan) pairs _prefetch_layer_kinds has queued: once each, not every call


def _prefetch_layer_kinds(apply, plan: dict) -> None:
    """Queue the compiles of the normalize kernel for every kind of layer (with or without ReLU, with or without a
    residual) on one plan: a network's first layer of a shape asks for them all, so that a cold start-up compiles
    them side by side instead of one by one as each kind first comes (the launch after this waits for its own)."""
    key = (id(apply), tuple(sorted(plan.items())))
    if key not in _plans_queued:
        _plans_queued.add(key)
        for relu in (0, 1):
            for add_residual in (0, 1):
                apply.prefetch(relu=relu, add_residual=add_residual, **plan)


def _batch_norm_act_channels_last(x: Tensor, running_mean: Tensor | None, running_var: Tensor | None,
                                  weight: Tensor | None, bias: Tensor | None, momentum: float, eps: float,
                                  residual: Tensor | None, relu: bool, num_batches_tracked: Tensor | None) -> Tensor:
    """batch_norm_act's GPU path for a channels-last x: the *_nhwc kernels of x's dtype (float32 or bf16), no layout
    or dtype conversion of x; y, dx and dresidual come out channels-last in x's dtype, a residual or incoming
    gradient in another layout or dtype is converted. Statistics, parameters and their gradients stay float32."""
    xp, xa, C = x.xp, x.data, x.shape[1]
    kernels = NHWC_KERNELS[x.dtype.name]
    n = xa.size // C
    (cb, groups, lanes, U, S, fused), one = bn_plan_nhwc(n, C, _sms(x), BN_NHWC_THREADS)
    grid, threads = (S, groups), BN_NHWC_THREADS
    mean, invstd, part_a, part_b, w, b, track, rm, rv, batches, count = _kernel_buffers(
        x, S, running_mean, running_var, weight, bias, num_batches_tracked)
    counter = grid_sync_counter(xp)
    conv = conv_stats_of(x)
    if conv is not None:   # the convolution that made x wrote its partial statistics: merge those
        parts, splits, chunk, own = (conv.part_mean, conv.part_m2), conv.splits, conv.chunk, False
        merge = -(-splits // lanes)
        merged = merge <= BN_CONV_STATS_MERGE   # else the finalize kernel merges them, once
        merge = merge if merged else BN_NHWC_MERGE
    else:
        parts, splits, chunk, merge, own, merged = (part_a, part_b), S, threads // cb * U, BN_NHWC_MERGE, one, fused
        if not one:
            kernels["stats_partial"][grid, threads](_rows(xa), part_a, part_b, n, C, cb, S, U=U)
    if not merged:
        batch_norm_stats_finalize[C, 32](*parts, mean, invstd, rm, rv, n, splits, chunk, momentum, eps, int(track))
    y = empty_like_format(x.shape, xa)
    res = dense_like(residual.data, xa) if residual is not None else y
    flags = dict(relu=int(relu), add_residual=int(residual is not None), fused=int(fused), U=U)
    apply_plan = dict(stats=int(own), fused=int(merged), U=U, M=merge)
    if xp is not np:
        _prefetch_layer_kinds(kernels["apply"], apply_plan)
    kernels["apply"][grid, threads](_rows(xa), _rows(y), *parts, mean, invstd, rm, rv, batches, w, b, _rows(res),
                                    counter, n, C, cb, lanes, splits, chunk, momentum, eps, int(track), count,
                                    **(flags | apply_plan))
    parents = [t for t in (x, weight, bias, residual) if t is not None]
    if xp is not np and is_grad_enabled() and any(t.requires_grad for t in parents):  # compile the backward's
        for pair in range(1 + int(relu)):  # an activation used twice (a residual block's input) gets two gradients
            if not one:
                kernels["backward_partial"].prefetch(relu=int(relu), U=U, pair=pair)
            kernels["backward_input"].prefetch(sums=int(one), pair=pair, **flags)

    def backward(g):
        g, g2 = g if isinstance(g, GradientPair) else (g, None)  # g2: a second contribution, added in the kernels
        g = dense_like(g.astype(xa.dtype, copy=False), xa)  # astype keeps the layout
        g2 = g if g2 is None else dense_like(g2.astype(xa.dtype, copy=False), xa)
        pair = int(g2 is not g)
        dweight, dbias, part_g, part_gx = _backward_buffers(xp, C, S, weight, bias)
        if not one:
            kernels["backward_partial"][grid, threads](_rows(g), _rows(g2), _rows(xa), _rows(y), mean, part_g,
                                                       part_gx, n, C, cb, S, relu=int(relu), U=U, pair=pair)
        if not fused:
            batch_norm_backward_finalize[C, 32](part_g, part_gx, invstd, dweight, dbias, S)
        dx = empty_like_format(x.shape, xa)
        dres = empty_like_format(x.shape, xa) if residual is not None else dx
        kernels["backward_input"][grid, threads](_rows(g), _rows(g2), _rows(xa), _rows(y), mean, invstd, w, part_g,
                                                 part_gx, dweight, dbias, _rows(dx), _rows(dres), grid_sync_counter(xp),
                                                 n, C, cb, lanes, S, sums=int(one), pair=pair, **flags)
        return _parent_grads(dx, weight, dweight, bias, dbias, residual, dres)

    backward.takes_gradient_pairs = True
    return from_op(y, parents, backward, "batch_norm_act" if relu or residual is not None else "batch_norm")


def _batch_norm_act_rows(x: Tensor, running_mean: Tensor | None, running_var: Tensor | None,
                         weight: Tensor | None, bias: Tensor | None, momentum: float, eps: float,
                         residual: Tensor | None, relu: bool, num_batches_tracked: Tensor | None) -> Tensor:
    """batch_norm_act's GPU path for a float32 x in any layout but channels-last: the NCHW kernels on a contiguous
    copy (four launches; six when H*W is so small that a block would span more channels than it has warps, see
    bn_fusable)."""
    xp = x.xp
    C = x.shape[1]
    xa = xp.ascontiguousarray(x.data)
    total, hw = xa.size, xa.size // (x.shape[0] * C)
    n = total // C
    U, S = bn_split(n, C, _sms(x))
    fused = int(bn_fusable(hw))
    mean, invstd, part_a, part_b, w, b, track, rm, rv, batches, count = _kernel_buffers(
        x, S, running_mean, running_var, weight, bias, num_batches_tracked)
    chunk = BN_THREADS * U
    batch_norm_stats_partial[(S, C), BN_THREADS](xa, part_a, part_b, n, hw, C, S, U=U)
    if not fused:
        batch_norm_stats_finalize[C, 32](part_a, part_b, mean, invstd, rm, rv, n, S, chunk, momentum, eps,
                                         int(track))
    y = xp.empty_like(xa)
    res = xp.ascontiguousarray(residual.data) if residual is not None else y
    flags = dict(relu=int(relu), add_residual=int(residual is not None), fused=fused)
    elementwise_blocks = -(-total // (BN_APPLY_THREADS * BN_APPLY_PER_THREAD))
    batch_norm_apply[elementwise_blocks, BN_APPLY_THREADS](xa, y, part_a, part_b, mean, invstd, rm, rv, batches, w,
                                                           b, res, total, hw, C, n, S, chunk, momentum, eps,
                                                           int(track), count, **flags)
    parents = [t for t in (x, weight, bias, residual) if t is not None]

    def backward(g):
        g = xp.ascontiguousarray(g)
        dweight, dbias, part_g, part_gx = _backward_buffers(xp, C, S, weight, bias)
        batch_norm_backward_partial[(S, C), BN_THREADS](g, xa, y, mean, part_g, part_gx, n, hw, C, S,
                                                        relu=int(relu), U=U)
        if not fused:
            batch_norm_backward_finalize[C, 32](part_g, part_gx, invstd, dweight, dbias, S)
        dx = xp.empty_like(xa)
        dres = xp.empty_like(xa) if residual is not None else dx
        batch_norm_backward_input[elementwise_blocks, BN_APPLY_THREADS](g, xa, y, mean, invstd, w, part_g, part_gx,
                                                                        dweight, dbias, dx, dres, total, hw, C, n,
                                                                        S, **flags)
        return _parent_grads(dx, weight, dweight, bias, dbias, residual, dres)

    return from_op(y, parents, backward, "batch_norm_act" if relu or residual is not None else "batch_norm")


# ------------------------------------------------------------------ batch_norm_act's fast paths (frost.dispatch)
# frost.ops.norm.batch_norm_act has checked the arguments when it asks; dispatch has matched device, dtype and layout.

def _fits_kernels(x: Tensor, running_mean: Tensor | None, running_var: Tensor | None, weight: Tensor | None,
                  bias: Tensor | None, *, training: bool, residual: Tensor | None) -> bool:
    # i32 indices (with room for a block's overrun past the end), channels on the grid's y axis; an empty x has
    # nothing for the kernels to do, a residual of another shape is broadcast by the reference path
    params = (running_mean, running_var, weight, bias)
    return (training and x.ndim >= 2 and 0 < x.numel() < 2**30 and x.shape[1] < 65536
            and (residual is None or residual.shape == x.shape)
            and all(p is None or (p.dtype == "float32" and p.data.flags.c_contiguous) for p in params))


@dispatch.register("batch_norm_act", device="cuda", dtypes=("bfloat16",), layouts=("channels_last",),
                   applies=_fits_kernels)
@dispatch.register("batch_norm_act", device="cuda", dtypes=("float32",), applies=_fits_kernels)
def batch_norm_act_kernels(x: Tensor, running_mean: Tensor | None, running_var: Tensor | None,
                           weight: Tensor | None, bias: Tensor | None, training: bool, momentum: float, eps: float,
                           residual: Tensor | None, relu: bool, num_batches_tracked: Tensor | None) -> Tensor:
    """batch_norm_act in training by the kernels above: a channels-last x (float32 or bf16) by the *_nhwc kernels
    without a layout conversion (output and gradients channels-last too), any other float32 x by the NCHW ones.
    num_batches_tracked is incremented inside the normalize kernel (no launch of its own)."""
    if residual is not None and residual.dtype != x.dtype:
        residual = cast(residual, x.dtype)  # the kernels read the residual in x's dtype
    if is_channels_last(x.data):
        return _batch_norm_act_channels_last(x, running_mean, running_var, weight, bias, momentum, eps, residual,
                                             relu, num_batches_tracked)
    return _batch_norm_act_rows(x, running_mean, running_var, weight, bias, momentum, eps, residual, relu,
                                num_batches_tracked)


def _half_without_kernels(x: Tensor, *operands, training: bool, residual: Tensor | None) -> bool:
    return training and not _kernel_dtype(x)


@dispatch.register("batch_norm_act", device="cuda", dtypes=("bfloat16", "float16"), applies=_half_without_kernels)
def batch_norm_act_in_float32(x: Tensor, running_mean: Tensor | None, running_var: Tensor | None,
                              weight: Tensor | None, bias: Tensor | None, training: bool, momentum: float,
                              eps: float, residual: Tensor | None, relu: bool,
                              num_batches_tracked: Tensor | None) -> Tensor:
    """Half-precision activations the kernels do not read (NCHW bf16, float16) are normalized in float32, output
    included: the op again on float32 x and residual, which then takes the float32 kernels where they apply."""
    x = cast(x, float32)
    residual = None if residual is None else cast(residual, float32)
    return norm.batch_norm_act(x, running_mean, running_var, weight, bias, training, momentum, eps, residual, relu,
                               num_batches_tracked)
