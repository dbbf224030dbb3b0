"""LayerNorm and RMSNorm over the last dims on the GPU: one launch forward, two backward, registered with
frost.dispatch as layer_norm's and rms_norm's fast paths. The reference math, and the ops that ask for these, is
frost/ops/norm.py."""
import math
import os

from frost import dispatch
from frost.autocast import current as autocast_dtype, keep_copy
from frost.autograd import sum_of_gradients
from frost.dtype import bfloat16
from frost.layout import data_ptr
from frost.kernel import (Array, Const, bdx, bf16, block_sum, bx, cdiv, device, f16, f32, gdx, i32, kernel, lane,
                          load4, load8_f32_into, load8_into, local, shared, sqrt, static_range, store4,
                          store8_f32_from, store8_from, syncthreads, tx, warp, warp_sum)
from frost.accel.bias import linear_bias_of
from frost.ops.elementwise import keep_branch_gradient
from frost.ops.matmul import keep_column_sums
from frost.tensor import Tensor, from_op

# A transformer normalizes rows of C = 384 ... 1600 values some B*T = 16k times per layer; the reference path
# spends a dozen array ops (and as many full-size temporaries) on it. Forward (after llm.c's layernorm_forward
# kernel3): one warp per row, lanes striding over the row; an exact two-pass mean and variance in float32 (the row
# is read three times, the second and third from L1/L2), one rounding into the output's dtype, and the row's mean
# and 1/std kept for the backward. Aligned rows move 16 bytes per access: float32 rows of a multiple of 4 values
# (load4/store4), bf16/fp16 rows of a multiple of 8 (load8/store8); other rows one value per lane. Backward: a block
# per group of rows, each thread owning columns tx, tx + bdx, ... (K of them, in registers) of every row it visits:
# the two row sums of dx's formula are block sums, and the thread's dweight/dbias partials stay in registers over its
# rows, written once per block; a second kernel adds the blocks' partials per column in a fixed order. The backward
# of aligned rows of a multiple of 8 (layer_norm_backward_vec8, any of the dtypes) takes a warp per row instead: lane
# l owns the 8-column chunks l, l + 32, ... (K of them), the row sums are warp sums (no block barrier per row), x
# and dout are read twice (the second time from L1) rather than held, and the warps' dweight/dbias partials are
# added in shared memory in warp order at the end. No float atomics and a grid that depends only on the shape:
# repeated runs are bit-identical. Nothing reads back to the host, so a step can be captured in a CUDA graph.
# RMSNorm is the same kernels without the mean (RMS: Const[bool]). In a pre-LayerNorm transformer under autocast
# the input is the float32 residual stream and the output goes to a linear layer in bf16: the forward also writes
# that bf16 copy (COPY), and the backward adds the stream's gradient so far and writes the sum's copy for the
# branch joined to the stream (ADD, COPY): the casts and sums around a LayerNorm take no passes of their own.

LN_FORWARD_THREADS = 256   # threads per block of the forward: a warp per row, 8 rows per block
LN_BACKWARD_BLOCKS = 512   # blocks of the backward at most (each loops over rows bx, bx + gdx, ...); all resident
LN_MAX_PER_THREAD = 8      # columns one backward thread holds in registers (K): rows up to 8 * 1024 wide
LN_FINALIZE_THREADS = 256  # threads of the partials' sum: 32 columns per block, 8 warps splitting the partials
LN_MAX_WIDTH = LN_MAX_PER_THREAD * 1024
LN_WARP_ROWS_THREADS = 256   # the vec8 backward: 8 warps a block, a warp per row
LN_WARP_ROWS_MAX_CHUNKS = 8  # 8-column chunks a lane owns (K) in the vec8 backward: rows up to 2048 wide
# float32 rows under autocast: the forward writes the 16-bit copy the next linear layer casts; =0 leaves it to a cast
AUTOCAST_COPY = os.environ.get("FROST_LN_AUTOCAST_COPY", "1") != "0"
# the backward adds x's gradient so far (a residual stream's) in its own pass; =0 leaves the sum to the autograd
ADDS_TO_GRADIENTS = os.environ.get("FROST_LN_ADDS_GRADIENTS", "1") != "0"


@device
def _affine(y, w, b, c, WEIGHT: Const[bool], BIAS: Const[bool]):
    """y * w[c] + b[c] in float32, each factor only when given (the reference path's order of operations)."""
    if WEIGHT:
        y = y * f32(w[c])
    if BIAS:
        y = y + f32(b[c])
    return y


@device
def _row_stats(x, base, C, eps, RMS: Const[bool]):
    """Mean (0 for RMS) and 1/sqrt(var + eps) of x[base:base + C] in every lane of one warp, two passes in f32."""
    m = 0.0
    if not RMS:
        for c in range(lane, C, 32):
            m += f32(x[base + c])
        m = warp_sum(m) / f32(C)
    v = 0.0
    for c in range(lane, C, 32):
        d = f32(x[base + c]) - m
        v += d * d
    v = warp_sum(v) / f32(C)
    return m, 1.0 / sqrt(v + eps)


@device
def _row_stats4(x, base, C, eps, RMS: Const[bool]):
    """_row_stats of a float32 row whose length and start are multiples of 4, 16 bytes per load."""
    m = 0.0
    if not RMS:
        for c in range(lane * 4, C, 128):
            x0, x1, x2, x3 = load4(x, base + c)
            m += (x0 + x1) + (x2 + x3)
        m = warp_sum(m) / f32(C)
    v = 0.0
    for c in range(lane * 4, C, 128):
        x0, x1, x2, x3 = load4(x, base + c)
        d0, d1, d2, d3 = x0 - m, x1 - m, x2 - m, x3 - m
        v += (d0 * d0 + d1 * d1) + (d2 * d2 + d3 * d3)
    v = warp_sum(v) / f32(C)
    return m, 1.0 / sqrt(v + eps)


@device
def _row_stats8(x, base, C, eps, RMS: Const[bool]):
    """_row_stats of a bf16/fp16 row whose length and start are multiples of 8, 16 bytes per load."""
    v = local(f32, 8)
    m = 0.0
    if not RMS:
        for c in range(lane * 8, C, 256):
            load8_into(v, x, base + c)
            m += ((v[0] + v[1]) + (v[2] + v[3])) + ((v[4] + v[5]) + (v[6] + v[7]))
        m = warp_sum(m) / f32(C)
    q = 0.0
    for c in range(lane * 8, C, 256):
        load8_into(v, x, base + c)
        for k in static_range(8):
            v[k] = (v[k] - m) * (v[k] - m)
        q += ((v[0] + v[1]) + (v[2] + v[3])) + ((v[4] + v[5]) + (v[6] + v[7]))
    q = warp_sum(q) / f32(C)
    return m, 1.0 / sqrt(q + eps)


def _forward_kernel(T):
    @kernel
    def layer_norm_forward(x: Array[T], w: Array[T], b: Array[T], out: Array[T], mean: Array[f32],
                           rstd: Array[f32], n: i32, C: i32, eps: f32, WEIGHT: Const[bool], BIAS: Const[bool],
                           RMS: Const[bool]):
        """Row r = bx * warps + warp: out = (x - mean) * rstd * w + b over its C values; mean[r], rstd[r] kept."""
        r = bx * (bdx // 32) + warp
        if r < n:  # the whole warp takes the same branch
            base = r * C
            m, s = _row_stats(x, base, C, eps, RMS)
            for c in range(lane, C, 32):
                out[base + c] = _affine((f32(x[base + c]) - m) * s, w, b, c, WEIGHT, BIAS)
            if lane == 0:
                mean[r] = m
                rstd[r] = s
    return layer_norm_forward


def _forward_kernel_vec4(H):
    @kernel
    def layer_norm_forward_vec4(x: Array[f32], w: Array[f32], b: Array[f32], out: Array[f32], copy: Array[H],
                                mean: Array[f32], rstd: Array[f32], n: i32, C: i32, eps: f32, WEIGHT: Const[bool],
                                BIAS: Const[bool], RMS: Const[bool], COPY: Const[bool] = False):
        """layer_norm_forward of float32 rows of a multiple of 4 values (16-byte aligned arrays), 16 bytes per
        access; with COPY, each output also rounded once into `copy` (autocast's 16-bit copy, 8 bytes per access)."""
        r = bx * (bdx // 32) + warp
        if r < n:
            base = r * C
            m, s = _row_stats4(x, base, C, eps, RMS)
            for c in range(lane * 4, C, 128):
                x0, x1, x2, x3 = load4(x, base + c)
                y0, y1, y2, y3 = (x0 - m) * s, (x1 - m) * s, (x2 - m) * s, (x3 - m) * s
                if WEIGHT:
                    w0, w1, w2, w3 = load4(w, c)
                    y0, y1, y2, y3 = y0 * w0, y1 * w1, y2 * w2, y3 * w3
                if BIAS:
                    b0, b1, b2, b3 = load4(b, c)
                    y0, y1, y2, y3 = y0 + b0, y1 + b1, y2 + b2, y3 + b3
                store4(out, base + c, y0, y1, y2, y3)
                if COPY:
                    store4(copy, base + c, y0, y1, y2, y3)
            if lane == 0:
                mean[r] = m
                rstd[r] = s
    return layer_norm_forward_vec4


# float32 rows' forward by the dtype of the 16-bit copy it may write (bfloat16's also when it writes none)
LN_FORWARD_VEC4 = {"bfloat16": _forward_kernel_vec4(bf16), "float16": _forward_kernel_vec4(f16)}
layer_norm_forward_vec4 = LN_FORWARD_VEC4["bfloat16"]


def _forward_kernel_vec8(T):
    @kernel
    def layer_norm_forward_vec8(x: Array[T], w: Array[T], b: Array[T], out: Array[T], mean: Array[f32],
                                rstd: Array[f32], n: i32, C: i32, eps: f32, WEIGHT: Const[bool], BIAS: Const[bool],
                                RMS: Const[bool]):
        """layer_norm_forward of bf16/fp16 rows of a multiple of 8 values (16-byte aligned arrays), 16 bytes per
        access."""
        v = local(f32, 8)
        p = local(f32, 8)
        r = bx * (bdx // 32) + warp
        if r < n:
            base = r * C
            m, s = _row_stats8(x, base, C, eps, RMS)
            for c in range(lane * 8, C, 256):
                load8_into(v, x, base + c)
                for k in static_range(8):
                    v[k] = (v[k] - m) * s
                if WEIGHT:
                    load8_into(p, w, c)
                    for k in static_range(8):
                        v[k] = v[k] * p[k]
                if BIAS:
                    load8_into(p, b, c)
                    for k in static_range(8):
                        v[k] = v[k] + p[k]
                store8_from(out, base + c, v)
            if lane == 0:
                mean[r] = m
                rstd[r] = s
    return layer_norm_forward_vec8


def _dxhat_chunk_for(load8):
    @device
    def _dxhat_chunk(xv, gv, wv, w, x, g, base: i32, c: i32, m: f32, s: f32, WEIGHT: Const[bool]):
        """For the 8 columns c ... c + 7 of a row: xv = xhat, gv = dout, wv = dout * weight (all float32)."""
        load8(xv, x, base + c)
        load8(gv, g, base + c)
        if WEIGHT:
            load8(wv, w, c)
        for e in static_range(8):
            xv[e] = (xv[e] - m) * s
            wv[e] = gv[e] * wv[e] if WEIGHT else gv[e]
    return _dxhat_chunk


def _backward_kernel_vec8(T, H=bf16):
    # the 8 values of a chunk move in one 16-byte access of 16-bit rows, in two of float32 ones
    load8, store8_of = (load8_f32_into, store8_f32_from) if T is f32 else (load8_into, store8_from)
    _dxhat_chunk = _dxhat_chunk_for(load8)

    @kernel
    def layer_norm_backward_vec8(g: Array[T], x: Array[T], w: Array[T], mean: Array[f32], rstd: Array[f32],
                                 dx: Array[T], so_far: Array[T], copy: Array[H], part_dw: Array[f32],
                                 part_db: Array[f32], part_dc: Array[f32], n: i32, C: i32, K: Const[int],
                                 WEIGHT: Const[bool], RMS: Const[bool], ADD: Const[bool] = False,
                                 COPY: Const[bool] = False, SUMS: Const[bool] = False):
        """layer_norm_backward of rows of a multiple of 8 values (16-byte aligned arrays): warp `warp`
        takes rows bx * 8 + warp, then gdx * 8 further; lane l owns columns 8 (l + 32 k) ... + 7, k < K. part_dw[bx,
        c] and part_db[bx, c] are the block's sums over its rows, its 8 warps added in order. With ADD, dx is x's
        gradient so far (so_far) plus this one, added in float32; with COPY, also rounded once into `copy`; with
        SUMS, part_dc[bx, c] the block's sums of the copy's columns (the bias gradient of the layer it flows to)."""
        sums = shared(f32, (8, 256))
        xv = local(f32, 8)
        gv = local(f32, 8)
        wv = local(f32, 8)
        dw = local(f32, (K, 8))
        db = local(f32, (K, 8))
        dc = local(f32, (K, 8))
        for k in static_range(K):
            for e in static_range(8):
                dw[k, e] = 0.0
                db[k, e] = 0.0
                dc[k, e] = 0.0
        for r in range(bx * 8 + warp, n, gdx * 8):
            base = r * C
            m = 0.0 if RMS else mean[r]
            s = rstd[r]
            sum_d = 0.0
            sum_dx = 0.0
            for k in static_range(K):
                c = (lane + 32 * k) * 8
                if c < C:
                    _dxhat_chunk(xv, gv, wv, w, x, g, base, c, m, s, WEIGHT)
                    for e in static_range(8):
                        dw[k, e] += gv[e] * xv[e]
                        db[k, e] += gv[e]
                        sum_d += wv[e]
                        sum_dx += wv[e] * xv[e]
            mean_d = 0.0 if RMS else warp_sum(sum_d) / f32(C)
            mean_dx = warp_sum(sum_dx) / f32(C)
            for k in static_range(K):
                c = (lane + 32 * k) * 8
                if c < C:
                    _dxhat_chunk(xv, gv, wv, w, x, g, base, c, m, s, WEIGHT)
                    for e in static_range(8):
                        xv[e] = (wv[e] - mean_d - xv[e] * mean_dx) * s
                    if ADD:
                        load8(gv, so_far, base + c)
                        for e in static_range(8):
                            xv[e] = xv[e] + gv[e]
                    store8_of(dx, base + c, xv)
                    if COPY:
                        store8_from(copy, base + c, xv)
                    if SUMS:
                        for e in static_range(8):
                            dc[k, e] += f32(H(xv[e]))
        for k in static_range(K):
            _block_partial(sums, dw, part_dw, k, C)
            _block_partial(sums, db, part_db, k, C)
            if SUMS:
                _block_partial(sums, dc, part_dc, k, C)
    return layer_norm_backward_vec8


@device
def _block_partial(sums, acc, part, k: i32, C: i32):
    """part[bx, chunk columns of round k] = the sum of the 8 warps' acc[k, :], added in warp order."""
    for e in static_range(8):
        sums[warp, lane * 8 + e] = acc[k, e]
    syncthreads()
    c = 256 * k + tx
    if c < C:
        total = 0.0
        for q in static_range(8):
            total += sums[q, tx]
        part[bx * C + c] = total
    syncthreads()


def _backward_kernel(T):
    @kernel
    def layer_norm_backward(g: Array[T], x: Array[T], w: Array[T], mean: Array[f32], rstd: Array[f32],
                            dx: Array[T], part_dw: Array[f32], part_db: Array[f32], n: i32, C: i32, K: Const[int],
                            WEIGHT: Const[bool], RMS: Const[bool]):
        """Rows bx, bx + gdx, ...: dx = rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)), dxhat = g * w
        (RMS: without the mean(dxhat) term); part_dw[bx, c] and part_db[bx, c] = sums of g * xhat and g over the
        block's rows. Thread tx owns columns tx + k * bdx, k < K (K * bdx >= C)."""
        scratch = shared(f32, 32)
        xhat = local(f32, K)
        dxhat = local(f32, K)
        wk = local(f32, K)
        dw = local(f32, K)
        db = local(f32, K)
        for k in static_range(K):
            c = tx + k * bdx
            wk[k] = f32(w[c]) if WEIGHT and c < C else 1.0
            dw[k] = 0.0
            db[k] = 0.0
        for r in range(bx, n, gdx):
            base = r * C
            m = 0.0 if RMS else mean[r]
            s = rstd[r]
            sum_d = 0.0
            sum_dx = 0.0
            for k in static_range(K):
                c = tx + k * bdx
                xhat[k] = 0.0
                dxhat[k] = 0.0
                if c < C:
                    xh = (f32(x[base + c]) - m) * s
                    gv = f32(g[base + c])
                    xhat[k] = xh
                    dxhat[k] = gv * wk[k]
                    dw[k] += gv * xh
                    db[k] += gv
                    sum_d += dxhat[k]
                    sum_dx += dxhat[k] * xh
            mean_d = 0.0 if RMS else block_sum(sum_d, scratch) / f32(C)
            mean_dx = block_sum(sum_dx, scratch) / f32(C)
            for k in static_range(K):
                c = tx + k * bdx
                if c < C:
                    dx[base + c] = (dxhat[k] - mean_d - xhat[k] * mean_dx) * s
        for k in static_range(K):
            c = tx + k * bdx
            if c < C:
                part_dw[bx * C + c] = dw[k]
                part_db[bx * C + c] = db[k]
    return layer_norm_backward


def _param_grads_kernel(T):
    @kernel
    def layer_norm_param_grads(part_dw: Array[f32], part_db: Array[f32], dw: Array[T], db: Array[T], parts: i32,
                               C: i32, WEIGHT: Const[bool], BIAS: Const[bool]):
        """dw[c] and db[c]: the sums of the backward blocks' partials of column c. Block bx takes columns
        bx * 32 + lane; warp w adds partials w, w + 8, ...; warp 0 adds the 8 warps' sums in order."""
        sums_w = shared(f32, (8, 32))
        sums_b = shared(f32, (8, 32))
        c = bx * 32 + lane
        acc_w = 0.0
        acc_b = 0.0
        if c < C:
            for p in range(warp, parts, 8):
                acc_w += part_dw[p * C + c]
                acc_b += part_db[p * C + c]
        sums_w[warp, lane] = acc_w
        sums_b[warp, lane] = acc_b
        syncthreads()
        if warp == 0 and c < C:
            total_w = 0.0
            total_b = 0.0
            for k in static_range(8):
                total_w += sums_w[k, lane]
                total_b += sums_b[k, lane]
            if WEIGHT:
                dw[c] = total_w
            if BIAS:
                db[c] = total_b
    return layer_norm_param_grads


def _vec8_kernels(T) -> dict:
    """The 16-byte kernels of rows of a multiple of 8 values (float32's forward is layer_norm_forward_vec4)."""
    if T is f32:
        return dict(backward_vec8=_backward_kernel_vec8(T))
    return dict(forward_vec8=_forward_kernel_vec8(T), backward_vec8=_backward_kernel_vec8(T))


LN_KERNELS = {name: dict(forward=_forward_kernel(T), backward=_backward_kernel(T), param_grads=_param_grads_kernel(T),
                         **_vec8_kernels(T))
              for name, T in (("float32", f32), ("bfloat16", bf16), ("float16", f16))}
# float32 rows' backward by the dtype of the 16-bit copy of its sum it may write (bfloat16's also when it writes none)
LN_BACKWARD_VEC8 = {"bfloat16": LN_KERNELS["float32"]["backward_vec8"], "float16": _backward_kernel_vec8(f32, f16)}
layer_norm_forward = LN_KERNELS["float32"]["forward"]
layer_norm_backward = LN_KERNELS["float32"]["backward"]
layer_norm_param_grads = LN_KERNELS["float32"]["param_grads"]


def ln_backward_plan(n: int, C: int) -> tuple[int, int, int]:
    """(blocks, threads, K) of the backward: about 4 columns per thread (K <= LN_MAX_PER_THREAD), a whole number
    of warps, and up to LN_BACKWARD_BLOCKS blocks; a function of the shape only, so results are reproducible."""
    threads = min(1024, max(32, 32 * cdiv(cdiv(C, 4), 32)))
    return min(n, LN_BACKWARD_BLOCKS), threads, cdiv(C, threads)


def moves_16_bytes(C: int, itemsize: int, *arrays) -> bool:
    """Whether rows of C values of `itemsize` bytes can move 16 bytes per access (4 float32 or 8 bf16/fp16 values):
    every array (None: not passed) of that element size and 16-byte aligned, C a multiple of the values moved."""
    return C % (16 // itemsize) == 0 and all(a is None or (a.dtype.itemsize == itemsize and data_ptr(a) % 16 == 0)
                                             for a in arrays)


def ln_backward_vec8_plan(n: int, C: int) -> tuple[int, int]:
    """(blocks, K) of layer_norm_backward_vec8: 8 rows a block at a time, up to LN_BACKWARD_BLOCKS blocks; K chunks
    of 8 columns a lane."""
    return min(cdiv(n, LN_WARP_ROWS_THREADS // 32), LN_BACKWARD_BLOCKS), cdiv(cdiv(C, 8), 32)


def _fits_kernels(x: Tensor, *params: Tensor | None, shape: tuple) -> bool:
    # i32 indices; parameters of x's dtype, contiguous (the kernels read them as flat arrays)
    C = math.prod(shape)
    return (0 < x.numel() < 2**31 - LN_MAX_WIDTH and 0 < C <= LN_MAX_WIDTH
            and all(p is None or (p.dtype == x.dtype and p.data.flags.c_contiguous) for p in params))


def _normalize(op: str, x: Tensor, shape: tuple, weight: Tensor | None, bias: Tensor | None, eps: float,
               rms: bool) -> Tensor:
    """layer_norm (rms=False) or rms_norm (bias None) of a contiguous x by the kernels above."""
    xp = x.xp
    C = math.prod(shape)
    n = x.numel() // C
    kernels = LN_KERNELS[x.dtype.name]
    xa = x.data.reshape(-1)
    w = weight.data.reshape(-1) if weight is not None else xa  # not read without WEIGHT / BIAS
    b = bias.data.reshape(-1) if bias is not None else xa
    flags = dict(WEIGHT=weight is not None, BIAS=bias is not None, RMS=rms)
    out = xp.empty_like(xa)
    mean, rstd = xp.empty(n, xp.float32), xp.empty(n, xp.float32)
    rows_per_block = LN_FORWARD_THREADS // 32
    params = (None if weight is None else w, None if bias is None else b)
    grid, copy = (cdiv(n, rows_per_block), LN_FORWARD_THREADS), None
    if moves_16_bytes(C, 4, xa, out, *params):
        # under autocast, the 16-bit copy that the next linear layer casts (cast_inputs finds it), in this pass
        half = autocast_dtype() if AUTOCAST_COPY else None
        copy = xp.empty(xa.shape, half.np) if half is not None else None
        LN_FORWARD_VEC4["bfloat16" if half is None else half.name][grid](
            xa, w, b, out, xp.empty(4, bfloat16.np) if copy is None else copy, mean, rstd, n, C, eps,
            COPY=copy is not None, **flags)
    else:
        forward = kernels["forward_vec8"] if moves_16_bytes(C, 2, xa, out, *params) else kernels["forward"]
        forward[grid](xa, w, b, out, mean, rstd, n, C, eps, **flags)
    parents = [t for t in (x, weight, bias) if t is not None]

    def backward(g, so_far=(None,)):
        g = xp.ascontiguousarray(g, dtype=xa.dtype).reshape(-1)
        dx = xp.empty_like(xa)
        warp_rows = (C % 8 == 0 and moves_16_bytes(C, xa.dtype.itemsize, g, xa, dx, params[0])
                     and cdiv(C, 8) <= 32 * LN_WARP_ROWS_MAX_CHUNKS)
        if warp_rows:
            dx, part_dw, part_db, blocks = _backward_warp_rows(xp, g, xa, w, mean, rstd, dx, so_far[0], x, n, C,
                                                               flags["WEIGHT"], rms)
        else:
            blocks, threads, K = ln_backward_plan(n, C)
            part_dw, part_db = xp.empty(blocks * C, xp.float32), xp.empty(blocks * C, xp.float32)
            kernels["backward"][blocks, threads](g, xa, w, mean, rstd, dx, part_dw, part_db, n, C, K=K,
                                                 WEIGHT=flags["WEIGHT"], RMS=rms)
            dx = dx.reshape(x.shape) if so_far[0] is None else sum_of_gradients(so_far[0], dx.reshape(x.shape))
        grads = [dx]
        if weight is None and bias is None:
            return grads
        unused = xp.empty(1, xa.dtype)  # stands in for a gradient not asked for (not written)
        dw = xp.empty_like(w) if weight is not None else unused
        db = xp.empty_like(b) if bias is not None else unused
        kernels["param_grads"][cdiv(C, 32), LN_FINALIZE_THREADS](part_dw, part_db, dw, db, blocks, C,
                                                                 WEIGHT=flags["WEIGHT"], BIAS=flags["BIAS"])
        grads += [dw.reshape(weight.shape)] if weight is not None else []
        grads += [db.reshape(bias.shape)] if bias is not None else []
        return grads

    backward.adds_to_gradients = ADDS_TO_GRADIENTS
    result = from_op(out.reshape(x.shape), parents, backward, op)
    if copy is not None:
        keep_copy(result, copy.reshape(x.shape))
    return result


def _backward_warp_rows(xp, g, xa, w, mean, rstd, dx, so_far, x: Tensor, n: int, C: int, weight: bool,
                        rms: bool) -> tuple:
    """(x's gradient, the parameters' partials, blocks) by layer_norm_backward_vec8, x's gradient so far (or None)
    added in the same pass when it is a float32 array like x; where x is a residual stream's sum with a 16-bit
    branch, that sum also rounded into the branch's dtype and kept for the add's backward (keep_branch_gradient)."""
    add = (so_far is not None and xa.dtype == xp.float32 and so_far.shape == x.shape and so_far.dtype == xa.dtype
           and so_far.flags.c_contiguous and data_ptr(so_far) % 16 == 0)
    branch_tensor = _branch_of(x) if add else None
    branch = None if branch_tensor is None else branch_tensor.data.dtype
    blocks, K = ln_backward_vec8_plan(n, C)
    part_dw, part_db = xp.empty(blocks * C, xp.float32), xp.empty(blocks * C, xp.float32)
    copy = xp.empty(xa.shape, branch) if branch is not None else None
    # the copy is the gradient of the branch: where that is a linear layer's output, its bias gradient's partial sums
    bias = linear_bias_of(branch_tensor) if branch is not None else None
    part_dc = xp.empty(blocks * C, xp.float32) if bias is not None else part_db
    kernel = LN_BACKWARD_VEC8["float16" if branch is not None and str(branch) == "float16" else "bfloat16"] \
        if xa.dtype == xp.float32 else LN_KERNELS[str(xa.dtype)]["backward_vec8"]
    kernel[blocks, LN_WARP_ROWS_THREADS](g, xa, w, mean, rstd, dx, so_far.reshape(-1) if add else dx,
                                         copy if copy is not None else xp.empty(8, bfloat16.np), part_dw, part_db,
                                         part_dc, n, C, K=K, WEIGHT=weight, RMS=rms, ADD=add, COPY=copy is not None,
                                         SUMS=bias is not None)
    dx = dx.reshape(x.shape)
    if so_far is not None and not add:
        dx = sum_of_gradients(so_far, dx)
    if copy is not None:
        copy = copy.reshape(x.shape)
        keep_branch_gradient(branch_tensor, dx, copy)
    if bias is not None:
        keep_column_sums(bias, copy, part_dc.reshape(blocks, C))
    return dx, part_dw, part_db, blocks


def _branch_of(x: Tensor) -> Tensor | None:
    """The 16-bit branch that the one-pass add making x joined to a float32 residual stream, else None."""
    node = x._ctx
    if node is None or node.name != "add" or not getattr(node.backward, "takes_gradient_pairs", False):
        return None
    narrow = [p for p in node.parents if p.shape == x.shape and str(p.data.dtype) in ("bfloat16", "float16")]
    return narrow[0] if len(narrow) == 1 else None


def _fits_layer_norm(x: Tensor, weight: Tensor | None, bias: Tensor | None, *, shape: tuple) -> bool:
    return _fits_kernels(x, weight, bias, shape=shape)


def _fits_rms_norm(x: Tensor, weight: Tensor | None, *, shape: tuple) -> bool:
    return _fits_kernels(x, weight, shape=shape)


@dispatch.register("layer_norm", device="cuda", dtypes=("float32", "bfloat16", "float16"), layouts=("contiguous",),
                   applies=_fits_layer_norm)
def layer_norm_kernels(x: Tensor, shape: tuple, weight: Tensor | None, bias: Tensor | None, eps: float) -> Tensor:
    """layer_norm of a contiguous float32/bf16/fp16 x over its trailing `shape` (checked by the op), weight and bias
    of x's dtype or None, by the kernels above."""
    return _normalize("layer_norm", x, shape, weight, bias, eps, rms=False)


@dispatch.register("rms_norm", device="cuda", dtypes=("float32", "bfloat16", "float16"), layouts=("contiguous",),
                   applies=_fits_rms_norm)
def rms_norm_kernels(x: Tensor, shape: tuple, weight: Tensor | None, eps: float) -> Tensor:
    """rms_norm of a contiguous float32/bf16/fp16 x over its trailing `shape` (eps resolved by the op)."""
    return _normalize("rms_norm", x, shape, weight, None, eps, rms=True)
