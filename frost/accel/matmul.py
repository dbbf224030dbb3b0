"""Matrix products on the GPU: cuBLAS's strided-batched GEMM in eager code (microseconds of Python a call), cuDNN's
matmul while a step is captured (capturable, where CuPy's cuBLAS calls are refused; its Python cost is paid once, at
capture), or Frost's plain float32 kernel when frost.backends.allow_tf32 is off. Registered with
frost.dispatch for frost/ops/matmul.py's `matmul_arrays`, whose xp.matmul runs wherever this declines (NumPy arrays,
1-D operands, integer types)."""
from __future__ import annotations

import os

import numpy as np

from frost import backends, dispatch
from frost.backend import cublas, cudnn
from frost.accel import epilogue
from frost.accel.conv_common import capturing
from frost.jit import warming_up
from frost.kernel import Array, bx, by, bz, f32, i32, kernel, shared, static_range, syncthreads, tx
from frost.ops.matmul import add_bias, fold_batch_dims

FLOAT_TYPES = ("float16", "bfloat16", "float32")  # float64 stays with CuPy's cuBLAS: cuDNN's matmul has none
FUSED_BIAS = os.environ.get("FROST_CUDNN_MATMUL_BIAS", "1") != "0"


def folds_or_fits(a, b) -> bool:
    """Products this path takes: 2-D or 3-D matrices (cuDNN's), and batches of matrices over more dims, folded
    to 3-D so that attention's (B, H, T, D) products run on cuDNN too."""
    if max(a.ndim, b.ndim) > 3:
        return min(a.ndim, b.ndim) >= 2
    return 2 <= a.ndim <= 3 and 2 <= b.ndim <= 3


@dispatch.register("matmul_arrays", device="cuda", dtypes=FLOAT_TYPES, applies=folds_or_fits)
def matmul_arrays_cuda(xp, a, b, out=None):
    """matmul_arrays for CuPy matrices of a float type (the first operand's): cuBLAS; while a step is captured or
    warms up for its capture, cuDNN, or matmul_float32_exact for float32 operands with TF32 switched off; xp.matmul
    where neither library is there or an operand is empty."""
    if max(a.ndim, b.ndim) > 3:
        a3, b3, batch = fold_batch_dims(xp, a, b)
        product = matmul_arrays_cuda(xp, a3, b3).reshape(batch + (a.shape[-2], b.shape[-1]))
        if out is None:
            return product
        out[...] = product
        return out
    if cublas.supports(a, b) and cublas.available() and not (capturing() or warming_up()):
        return cublas.matmul(a, b, out=out)  # exact float32 too when TF32 is off
    if str(a.dtype) == "float32" and str(b.dtype) == "float32" and not backends.allow_tf32:
        # cuDNN's float32 matmul rounds like TF32 even with its tensor-core engines deselected (measured)
        return matmul_float32_exact(xp, a, b, out)
    if cudnn.available() and min(a.size, b.size) > 0:
        return cudnn.matmul(a, b, out=out)
    return xp.matmul(a, b, out=out)


def fuses_bias(a, b, *, bias) -> bool:
    """Two matrices and a dense bias of the product's width, of one dtype (cuDNN's epilogue reads it as such)."""
    return (a.ndim == 2 and b.ndim == 2 and bias.shape == (b.shape[1],) and bias.flags.c_contiguous
            and bias.dtype == a.dtype == b.dtype)


@dispatch.register("matmul_bias", device="cuda", dtypes=FLOAT_TYPES, applies=fuses_bias)
def matmul_bias_cuda(xp, a, b, bias):
    """a @ b + bias over every row: while a step is captured (or warms up for its capture), one cuDNN graph with the
    bias in the GEMM's epilogue, added to the float32 product and rounded once (GPT-2 124M's 48 separate bias adds
    took 1.7 ms of a 38.8 ms step on an H100: gpt2_kernels_h100_1c31d4a-pre.json); else, or where cuDNN builds no
    such graph, the product, then add_bias. Eager code: cuBLAS with the bias in its C (one rounding too).
    FROST_CUDNN_MATMUL_BIAS=0 switches the fused graph off. A product that a warm-up saw GELU read gets the GELU in
    its epilogue as well (frost/accel/epilogue.py)."""
    captured = capturing()
    if FUSED_BIAS and (captured or warming_up()) and cudnn.available() and min(a.size, b.size) > 0 \
            and not (str(a.dtype) == "float32" and not backends.allow_tf32):
        signature = (a.shape, b.shape, b.strides, str(a.dtype))
        form = epilogue.activation_after(signature, captured)
        fused = cudnn.matmul(a, b, bias=bias, activation=form) if form is not None else None
        if fused is not None:   # GELU in the epilogue too (frost/accel/epilogue.py), kept for gelu_kernels
            epilogue.keep(signature, fused[0], form, fused[1])
            return fused[0]
        product = cudnn.matmul(a, b, bias=bias)
        if product is not None:
            epilogue.made(signature, product)
            return product
    if cublas.supports(a, b) and cublas.available() and not (captured or warming_up()):
        # the bias in the GEMM's C (beta = 1): added to the float32 product and rounded once, as cuDNN's epilogue
        # rounds it, so an eager step computes what its captured replay computes (a product rounded to bf16 before
        # its bias is added parted GPT weights by 2.4 % of their norm over 20 steps, H100)
        return cublas.matmul(a, b, out=rows_of(xp, bias, a.shape[0]), accumulate=True)
    product = matmul_arrays_cuda(xp, a, b)
    add_bias(product, bias)
    return product


def rows_of(xp, bias, rows: int):
    """A new (rows, n) array with `bias` (n,) in every row (16-bit types copied as their bits: CuPy's copies of
    them need no arithmetic)."""
    out = xp.empty((rows, bias.shape[0]), dtype=bias.dtype)
    as_copied = np.uint16 if bias.itemsize == 2 else bias.dtype
    out.view(as_copied)[...] = bias.view(as_copied)
    return out


@kernel
def matmul_float32_kernel(a: Array[f32], b: Array[f32], out: Array[f32], m: i32, k: i32, n: i32, a_batch: i32,
                          b_batch: i32):
    """out[z] = a[z] @ b[z] for row-major (m, k) and (k, n) matrices (batch strides a_batch, b_batch: 0 broadcasts)
    in float32 FFMA, no tensor cores: block (x, y, z) of 16x16 threads makes one 16x16 tile, k in steps of 16."""
    ta = shared(f32, (16, 17))
    tb = shared(f32, (16, 17))
    r = tx // 16
    c = tx % 16
    i = by * 16 + r
    j = bx * 16 + c
    acc = 0.0
    for k0 in range(0, k, 16):
        ta[r, c] = a[bz * a_batch + i * k + k0 + c] if i < m and k0 + c < k else 0.0
        tb[r, c] = b[bz * b_batch + (k0 + r) * n + j] if k0 + r < k and j < n else 0.0
        syncthreads()
        for kk in static_range(16):
            acc += ta[r, kk] * tb[kk, c]
        syncthreads()
    if i < m and j < n:
        out[(bz * m + i) * n + j] = acc


def matmul_float32_exact(xp, a, b, out=None):
    """a @ b for 2-D or 3-D float32 CuPy arrays in plain float32 arithmetic (frost.backends.allow_tf32 off);
    capturable. NumPy arrays run the kernel's simulator (tests). `out` as in matmul_arrays."""
    a3 = xp.ascontiguousarray(a if a.ndim == 3 else a[None])
    b3 = xp.ascontiguousarray(b if b.ndim == 3 else b[None])
    batch, m, k, n = max(a3.shape[0], b3.shape[0]), a3.shape[1], a3.shape[2], b3.shape[2]
    if a3.shape[0] not in (1, batch) or b3.shape[0] not in (1, batch) or b3.shape[1] != k:
        raise ValueError(f"matmul: shapes {tuple(a.shape)} and {tuple(b.shape)} do not fit")
    shape = (batch, m, n) if a.ndim == 3 or b.ndim == 3 else (m, n)
    if out is None:
        out = xp.empty(shape, dtype=xp.float32)
    elif tuple(out.shape) != shape or out.dtype != xp.float32 or not out.flags.c_contiguous:
        raise ValueError(f"matmul: out must be a C-contiguous float32 array of shape {shape}, "
                         f"got {out.dtype} {tuple(out.shape)}")
    if min(batch, m, n) > 0:
        launch = matmul_float32_kernel if xp is not np else matmul_float32_kernel.simulate
        a_batch = 0 if a3.shape[0] == 1 else m * k  # a single matrix serves every batch entry
        b_batch = 0 if b3.shape[0] == 1 else k * n
        launch[((n + 15) // 16, (m + 15) // 16, batch), 256](a3.reshape(-1), b3.reshape(-1), out.reshape(-1), m, k,
                                                               n, a_batch, b_batch)
    return out
