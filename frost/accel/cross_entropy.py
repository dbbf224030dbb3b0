"""Cross-entropy of (N, C) float32, bf16 or fp16 logits on the GPU: one launch each way, registered with
frost.dispatch as cross_entropy's fast path; with FROST_XENT_GRADIENT_IN_FORWARD=1, rows of
GRADIENT_IN_FORWARD_MIN_CLASSES classes and more get their gradient from the forward (the backward then reads no
logits). The reference math, and the op that asks for this,
is frost/ops/loss.py."""
import os

from frost import dispatch
from frost.autograd import is_grad_enabled
from frost.layout import data_ptr
from frost.kernel import (Array, bdx, bf16, block_max, block_sum, bx, cdiv, device, exp, f16, f32, gdx, i32, i64, inf,
                          kernel, lane, load8_into, local, log, shared, static_range, store8_from, tx, warp, warp_max,
                          warp_sum)
from frost.tensor import Tensor, from_op

# The common classifier loss (float32 or 16-bit logits, int64 class indices, no weight or smoothing, mean or sum) in one
# launch each way instead of a dozen array ops. Forward: one warp per row (lanes loop over the classes) finds the
# row's max and sum of exp, keeps its log-sum-exp for backward and adds lse - x[target] to its lane 0's running
# sum; the block then block_sums the losses and the count of counted rows in a fixed order (deterministic). Up
# to XENT_ROWS_PER_BLOCK rows (the seed's N=32) that block writes the result; beyond, each block writes partial
# sums and a one-block kernel adds them, again in a fixed order. Backward: one thread per logit,
# d = coef * (softmax - onehot), coef = g / count (mean) or g (sum), g and count read on the device: no host
# read, so the step can be captured in a CUDA graph. The NumPy twin is frost.ops.loss's _class_index_loss; the
# tests compare them.

XENT_THREADS = 256           # threads per block of the finalize
XENT_FORWARD_THREADS = 1024  # threads per block of the forward, a warp per row: a batch of 32 rows in one pass
XENT_ROWS_PER_BLOCK = 1024   # rows one forward block takes before the forward splits into partial sums
XENT_LOGITS_PER_BLOCK = 1 << 16   # ... and logits: long rows (a 50k vocabulary) spread over every SM, a row a warp
XENT_MAX_BLOCKS = 1024       # forward blocks at most (the finalize loops over their partials)
XENT_BACKWARD_THREADS = 256  # threads per block of the backward (one per logit)
# Logits of at least this many classes may get their gradient written by the forward (cross_entropy_forward_grad),
# each row rewritten right after its log-sum-exp while it is in L2: the backward then reads nothing (GPT-2's 16k x
# 50k bf16 logits are 1.6 GB a pass). Narrower rows (the seed's 10 classes) keep one launch each way. Off: timed on
# an H100 (b38b235, GPT-2 124M, one call) it changed nothing measurable, 35.11 -> 35.09 ms/step and 34.74 -> 34.62
# with the GELU epilogue (gpt2_124m_bf16_jit_epilogue_xent_ab_h100_b38b235.json); FROST_XENT_GRADIENT_IN_FORWARD=1.
GRADIENT_IN_FORWARD = os.environ.get("FROST_XENT_GRADIENT_IN_FORWARD", "0") == "1"
GRADIENT_IN_FORWARD_MIN_CLASSES = 1024
UNLESS_ONE_BLOCKS = 1024     # the grid of cross_entropy_backward_unless_one (a grid-stride loop)


@device
def _lanes_lse(m, s):
    """log(sum(exp)) of a warp's row from each lane's running max m and its sum s of exp(value - m)."""
    top = warp_max(m)
    return top + log(warp_sum(s * exp(m - top)))


@device
def _block_lse(m, s, scratch):
    """_lanes_lse over a whole block (every thread gets it); scratch as for block_sum."""
    top = block_max(m, scratch)
    return top + log(block_sum(s * exp(m - top), scratch))


@device
def _running_max_sum(x, base, C, first, stride, ms):
    """ms[0], ms[1] = the running max of x[base + first], x[base + first + stride], ... (below C) and the sum of
    exp(value - max), rescaled when the max grows, so that no exp overflows and the values are read once."""
    m = -inf
    s = 0.0
    for c in range(first, C, stride):
        v = f32(x[base + c])
        if v > m:
            s = s * exp(m - v)
            m = v
        s += exp(v - m)
    ms[0] = m
    ms[1] = s


@device
def _running_max_sum8(x, base, C, first, stride, ms):
    """_running_max_sum of a 16-bit row whose start, length, first and stride are multiples of 8, eight values (16
    bytes) a load, the running max moved once per eight."""
    v = local(f32, 8)
    m = -inf
    s = 0.0
    for c in range(first, C, stride):
        load8_into(v, x, base + c)
        top = v[0]
        for e in static_range(1, 8):
            top = max(top, v[e])
        if top > m:
            s = s * exp(m - top)
            m = top
        for e in static_range(8):
            s += exp(v[e] - m)
    ms[0] = m
    ms[1] = s


@device
def _row_lse(x, base, C):
    """log(sum(exp(x[base:base + C]))) in every lane of one warp, in float32, in one pass."""
    ms = local(f32, 2)
    _running_max_sum(x, base, C, lane, 32, ms)
    return _lanes_lse(ms[0], ms[1])


@device
def _row_lse8(x, base, C):
    """_row_lse of a 16-bit row whose start and length are multiples of 8, eight values a load."""
    ms = local(f32, 2)
    _running_max_sum8(x, base, C, lane * 8, 256, ms)
    return _lanes_lse(ms[0], ms[1])


@device
def _block_row_lse(x, base, C, scratch):
    """_row_lse with the whole block reading the row."""
    ms = local(f32, 2)
    _running_max_sum(x, base, C, tx, bdx, ms)
    return _block_lse(ms[0], ms[1], scratch)


@device
def _block_row_lse8(x, base, C, scratch):
    """_row_lse8 with the whole block reading the row."""
    ms = local(f32, 2)
    _running_max_sum8(x, base, C, tx * 8, bdx * 8, ms)
    return _block_lse(ms[0], ms[1], scratch)


@device
def _target_column(t, C):
    """The column of class index t: out-of-range values wrap around as CuPy's fancy indexing does on the generic
    path (the op checks targets wherever values can be read; inside a capture neither path can)."""
    col = t % C
    if col < 0:
        col += C
    return i32(col)


@device
def _store_total(total, rows, loss, count, mean):
    loss[0] = total / rows if mean != 0 else total  # 0/0 (every target ignored) is NaN, as the generic path
    count[0] = rows


@device
def _store_block_totals(acc, rows, loss, count, part_loss, part_count, mean):
    """The block's loss and count of rows (each thread's sums of the rows it stored, 0 in the others), in a fixed
    order: stored as the result by a lone block, else as block bx's partial sums for cross_entropy_finalize."""
    scratch = shared(f32, 32)
    total = block_sum(acc, scratch)
    rows = block_sum(rows, scratch)
    if tx == 0:
        if gdx == 1:
            _store_total(total, rows, loss, count, mean)
        else:
            part_loss[bx] = total
            part_count[bx] = rows


@kernel
def count_targets(target: Array[i64], total_rows: Array[f32], n: i32, ignore_index: i64):
    """One block: total_rows[0] = how many of the n targets are not ignore_index (the mean's divisor, which
    cross_entropy_forward_grad needs before it writes a gradient)."""
    rows = 0.0
    for r in range(tx, n, bdx):
        if target[r] != ignore_index:
            rows += 1.0
    scratch = shared(f32, 32)
    rows = block_sum(rows, scratch)
    if tx == 0:
        total_rows[0] = rows


@kernel
def cross_entropy_finalize(part_loss: Array[f32], part_count: Array[f32], loss: Array[f32], count: Array[f32],
                           parts: i32, mean: i32):
    """One block: the loss and the count from the forward blocks' partial sums, in a fixed order."""
    acc = 0.0
    rows = 0.0
    for b in range(tx, parts, bdx):
        acc += part_loss[b]
        rows += part_count[b]
    scratch = shared(f32, 32)
    total = block_sum(acc, scratch)
    rows = block_sum(rows, scratch)
    if tx == 0:
        _store_total(total, rows, loss, count, mean)


def _kernels(T, VEC: int):
    """The forward and backward for logits of type T (computed in float32; dx rounded once into T); VEC = 8: the
    16-byte variants for 16-bit rows of a multiple of 8 values (VEC is folded where the kernels are checked)."""
    @kernel
    def cross_entropy_forward(x: Array[T], target: Array[i64], lse: Array[f32], loss: Array[f32], count: Array[f32],
                              part_loss: Array[f32], part_count: Array[f32], n: i32, C: i32, ignore_index: i64,
                              mean: i32):
        """Warp w of block b takes rows b*W + w, then a grid stride on: lse[r] = log-sum-exp of row r, and the sum of
        lse[r] - x[r, target[r]] and the count of rows whose target is not ignore_index. One block (gdx == 1) stores
        the loss (sum, or sum / count when mean != 0) and the count; several store their sums in part_loss[b] and
        part_count[b] for cross_entropy_finalize. VEC = 8: 16-bit rows read 8 values a load (C % 8 == 0, x
        16-byte aligned)."""
        warps = bdx // 32
        acc = 0.0
        rows = 0.0
        for r in range(bx * warps + warp, n, gdx * warps):
            row_lse = lse_of_row(x, r * C, C)
            t = target[r]
            if lane == 0:
                lse[r] = row_lse
                if t != ignore_index:
                    acc += row_lse - f32(x[r * C + _target_column(t, C)])
                    rows += 1.0
        _store_block_totals(acc, rows, loss, count, part_loss, part_count, mean)

    @kernel
    def cross_entropy_forward_grad(x: Array[T], target: Array[i64], lse: Array[f32], loss: Array[f32],
                                   count: Array[f32], part_loss: Array[f32], part_count: Array[f32], dx: Array[T],
                                   total_rows: Array[f32], n: i32, C: i32, ignore_index: i64, mean: i32):
        """cross_entropy_forward for wide rows that also writes the gradient the backward would write for an upstream
        gradient of 1: block b takes rows b, b + gdx, ..., the whole block reading a row, so that few rows are in
        flight (two 1024-thread blocks an SM: 264 rows of GPT-2's 50k bf16 logits, 26 MB on an H100, inside its
        50 MB L2) and the row is still in L2 when the block reads it again to write dx[r, c] = coef * (softmax -
        onehot), coef = 1 / total_rows[0] (mean != 0; count_targets' count) or 1, 0 in ignored rows. VEC = 8 as
        the forward's, dx 16-byte aligned too."""
        scratch = shared(f32, 32)
        acc = 0.0
        rows = 0.0
        for r in range(bx, n, gdx):
            row_lse = block_lse_of_row(x, r * C, C, scratch)
            t = target[r]
            coef = 0.0
            col = -1
            if t != ignore_index:
                coef = 1.0 / total_rows[0] if mean != 0 else 1.0
                col = r * C + _target_column(t, C)
            for c in range(tx * VEC, C, bdx * VEC):
                write_grad(x, dx, r * C + c, col, coef, row_lse)
            if tx == 0:
                lse[r] = row_lse
                if t != ignore_index:
                    acc += row_lse - f32(x[col])
                    rows += 1.0
        _store_block_totals(acc, rows, loss, count, part_loss, part_count, mean)

    @kernel
    def cross_entropy_backward(x: Array[T], target: Array[i64], lse: Array[f32], count: Array[f32], g: Array[f32],
                               dx: Array[T], n: i32, C: i32, ignore_index: i64, mean: i32):
        """dx[r, c] = coef * (exp(x[r, c] - lse[r]) - [c == target[r]]), 0 in ignored rows; coef = g[0] / count[0]
        (mean != 0) or g[0]: one thread per logit, or per 8 logits of one row with VEC = 8 (16-bit rows, C % 8 ==
        0, x and dx 16-byte aligned: one load and one store of 16 bytes)."""
        i = (bx * bdx + tx) * VEC
        if i < n * C:
            _grad_at(x, target, lse, count, g, dx, i, C, ignore_index, mean)

    @kernel
    def cross_entropy_backward_unless_one(x: Array[T], target: Array[i64], lse: Array[f32], count: Array[f32],
                                          g: Array[f32], dx: Array[T], n: i32, C: i32, ignore_index: i64, mean: i32):
        """cross_entropy_backward over the dx that cross_entropy_forward_grad wrote for g[0] = 1, unless
        g[0] is 1 (a loss's own gradient almost always is: then nothing is read or written). A grid-stride loop
        (the grid is launched whatever g holds, which a captured step cannot know)."""
        if g[0] != 1.0:
            for i in range((bx * bdx + tx) * VEC, n * C, gdx * bdx * VEC):
                _grad_at(x, target, lse, count, g, dx, i, C, ignore_index, mean)

    @device
    def _grad_at(x, target, lse, count, g, dx, i, C, ignore_index, mean):
        """The gradient at logit i (VEC of them with VEC = 8, one row's) for an upstream gradient g[0]."""
        r = i // C
        t = target[r]
        coef = 0.0
        col = -1
        if t != ignore_index:
            coef = g[0] / count[0] if mean != 0 else g[0]
            col = r * C + _target_column(t, C)
        write_grad(x, dx, i, col, coef, lse[r])
    lse_of_row, block_lse_of_row, write_grad = ((_row_lse8, _block_row_lse8, _grad8) if VEC == 8
                                                else (_row_lse, _block_row_lse, _grad1))
    return cross_entropy_forward, cross_entropy_backward, cross_entropy_forward_grad, cross_entropy_backward_unless_one


@device
def _grad1(x, dx, i, col, coef, row_lse):
    """dx[i] = coef * (softmax - onehot) at logit i, col the row's target logit; 0 in an ignored row (col < 0),
    whatever its logits hold."""
    d = 0.0
    if col >= 0:
        hit = 1.0 if i == col else 0.0
        d = coef * (exp(f32(x[i]) - row_lse) - hit)
    dx[i] = d


@device
def _grad8(x, dx, i, col, coef, row_lse):
    """_grad1 of logits i ... i + 7 (one row), one 16-byte load and store."""
    v = local(f32, 8)
    load8_into(v, x, i)
    for e in static_range(8):
        d = 0.0
        if col >= 0:
            d = coef * (exp(v[e] - row_lse) - (1.0 if i + e == col else 0.0))
        v[e] = d
    store8_from(dx, i, v)


# (dtype, values a thread) -> (forward, backward, forward_grad, backward_unless_one): float32 one at a time;
# bf16/fp16 also 8 at a time
XENT_KERNELS = {(name, vec): _kernels(T, vec) for name, T, vecs in (("float32", f32, (1,)), ("bfloat16", bf16, (1, 8)),
                                                                    ("float16", f16, (1, 8))) for vec in vecs}
cross_entropy_forward, cross_entropy_backward = (kernel.warm(k) for k in XENT_KERNELS["float32", 1][:2])


def xent_blocks(n: int, classes: int = 1, rows_per_block: int | None = None) -> int:
    """Blocks of the forward for n rows of `classes` logits: one up to rows_per_block rows and
    XENT_LOGITS_PER_BLOCK logits (one launch), else partial sums; at least a row a warp per block."""
    rows_per_block = XENT_ROWS_PER_BLOCK if rows_per_block is None else rows_per_block
    rows = max(XENT_FORWARD_THREADS // 32, min(rows_per_block, XENT_LOGITS_PER_BLOCK // max(classes, 1)))
    return min(cdiv(n, rows), XENT_MAX_BLOCKS)


def _fits_kernels(input: Tensor, target: Tensor, weight: Tensor | None, *, reduction: str,
                  label_smoothing: float) -> bool:
    # i32 indices into the logits; the count of rows is a float32 (exact below 2**24)
    return (input.ndim == 2 and target.dtype == "int64" and weight is None and label_smoothing == 0
            and reduction in ("mean", "sum") and 0 < input.shape[0] < 2**24 and input.shape[1] > 0
            and input.numel() < 2**31 - XENT_BACKWARD_THREADS)


@dispatch.register("cross_entropy", device="cuda", dtypes=("float32", "bfloat16", "float16"), applies=_fits_kernels)
def cross_entropy_kernels(input: Tensor, target: Tensor, weight: Tensor | None, ignore_index: int, reduction: str,
                          label_smoothing: float, loss_dtype: str | None = None) -> Tensor:
    """cross_entropy of (N, C) float32/bf16/fp16 logits and (N,) int64 class targets (checked by the op) by the
    kernels above (see _fits_kernels: no weight or smoothing, mean or sum), computed in float32; the loss in
    loss_dtype (the logits' by default; float32 under autocast), the gradient rounded once into the logits' dtype.
    Reading 16-bit logits as they are saves the float32 copy of them, and of their gradient, that a cast before
    the loss would make (two passes over N x C float32 values each way for a 50k vocabulary). Wide rows whose
    gradient will be asked for get it from the forward (_gradient_in_forward)."""
    xp = input.xp
    x = xp.ascontiguousarray(input.data)
    t = xp.ascontiguousarray(target.data)
    N, C = x.shape
    mean = int(reduction == "mean")
    in_forward = _gradient_in_forward(input)
    blocks = min(N, XENT_MAX_BLOCKS) if in_forward else xent_blocks(N, C)   # a block a row, or a warp a row
    lse = xp.empty(N, xp.float32)
    loss, count = xp.empty(1, xp.float32), xp.empty(1, xp.float32)
    part_loss, part_count = (xp.empty(blocks, xp.float32), xp.empty(blocks, xp.float32)) if blocks > 1 \
        else (loss, count)  # not written by a single block
    vec = 8 if x.dtype.itemsize == 2 and C % 8 == 0 and data_ptr(x) % 16 == 0 else 1
    kernels = XENT_KERNELS[input.dtype.name, vec]

    def backward(g):
        g = xp.ascontiguousarray(g, dtype=xp.float32).reshape(1)
        dx = xp.empty_like(x)
        per_thread = vec if data_ptr(dx) % 16 == 0 else 1
        XENT_KERNELS[input.dtype.name, per_thread][1][cdiv(N * C, XENT_BACKWARD_THREADS * per_thread),
                                                      XENT_BACKWARD_THREADS](x, t, lse, count, g, dx, N, C,
                                                                             ignore_index, mean)
        return (dx,)

    sums = (lse, loss, count, part_loss, part_count)
    if in_forward:
        dx, total_rows = xp.empty_like(x), xp.empty(1, xp.float32)
        if data_ptr(dx) % 16:
            kernels = XENT_KERNELS[input.dtype.name, 1]
        count_targets[1, XENT_THREADS](t, total_rows, N, ignore_index)
        kernels[2][blocks, XENT_FORWARD_THREADS](x, t, *sums, dx, total_rows, N, C, ignore_index, mean)
        backward = _handed_out_once(xp, dx, backward, lambda g, dx: kernels[3][
            UNLESS_ONE_BLOCKS, XENT_BACKWARD_THREADS](x, t, lse, count, g, dx, N, C, ignore_index, mean))
    else:
        kernels[0][blocks, XENT_FORWARD_THREADS](x, t, *sums, N, C, ignore_index, mean)
    if blocks > 1:
        cross_entropy_finalize[1, XENT_THREADS](part_loss, part_count, loss, count, blocks, mean)
    out = loss.reshape(()).astype(loss_dtype or x.dtype, copy=False)
    return from_op(out, (input,), backward, "cross_entropy")


def _gradient_in_forward(input: Tensor) -> bool:
    """Whether the forward writes the logits' gradient too: wide rows whose gradient will be asked for, and a
    grid-stride loop over them that cannot overflow i32."""
    return (GRADIENT_IN_FORWARD and input.shape[1] >= GRADIENT_IN_FORWARD_MIN_CLASSES and input.requires_grad
            and is_grad_enabled() and input.numel() < 2**31 - 8 * UNLESS_ONE_BLOCKS * XENT_BACKWARD_THREADS)


def _handed_out_once(xp, dx, recompute, unless_one):
    """The backward of a forward that wrote the gradient dx for an upstream gradient of 1: dx, rewritten by
    `unless_one(g, dx)` (the backward kernel, launched on the device value g) where g is not 1, handed out and no
    longer held; a second backward over a retained graph computes the gradient again from the logits
    (`recompute`)."""
    held = [dx]

    def backward(g):
        if not held:
            return recompute(g)
        dx = held.pop()
        unless_one(xp.ascontiguousarray(g, dtype=xp.float32).reshape(1), dx)
        return (dx,)
    return backward
