"""Matrix products through cuBLAS's strided-batched GEMM, called directly with CuPy memory and CuPy's stream.

CuPy's own matmul has no bfloat16 and pays its general broadcasting logic on every call; the cuDNN frontend's
matmul is capturable but spends hundreds of microseconds of Python per call (measured on the H200, 2026-12-05:
cudnn.matmul 0.4 ms a call under cProfile, 112 calls a step of the shakespeare-char GPT). One cublasGemmStridedBatchedEx
call reads each operand in place when it is row- or column-major inside its matrix, with any batch stride (0 for a
broadcast operand).

Not for captured steps: CuPy's binding sets the stream on the handle at each call, which returns cuBLAS to its own
workspace pool, and that pool may allocate. frost/accel/matmul.py takes cuDNN's capturable matmul while a step is
captured, where the per-call cost is paid once.
"""
from __future__ import annotations

import numpy as np

from frost import backends
from frost.backend import cuda
from frost.backend.batched import batched_product

# cudaDataType and cublasComputeType_t values (library_types.h, cublas_api.h)
_DATA_TYPES = {"float32": 0, "float64": 1, "float16": 2, "bfloat16": 14}
_COMPUTE_32F, _COMPUTE_32F_FAST_TF32, _COMPUTE_64F = 68, 77, 70
_OP_N, _OP_T = 0, 1
_GEMM_DEFAULT = -1
_scalars: dict = {}  # (dtype kind, value) -> a host array whose address cuBLAS reads alpha or beta from


def available() -> bool:
    """True when CuPy exposes cuBLAS's strided-batched GEMM."""
    try:
        return hasattr(_library(), "gemmStridedBatchedEx")
    except Exception:
        return False


def supports(a, b) -> bool:
    """A product this path takes: equal float dtypes cuBLAS has, 2-D or 3-D operands, nothing empty."""
    return (str(a.dtype) in _DATA_TYPES and a.dtype == b.dtype and 2 <= a.ndim <= 3 and 2 <= b.ndim <= 3
            and a.size > 0 and b.size > 0)


def _library():
    return cuda.cupy().cuda.cublas


def _scalar(dtype_name: str, value: float) -> int:
    host = _scalars.get((dtype_name, value))
    if host is None:
        host = _scalars[(dtype_name, value)] = np.array(value, dtype=np.float64 if dtype_name == "float64"
                                                        else np.float32)
    return host.ctypes.data


def _handle() -> int:
    # CuPy's handle for this device; the GEMM binding sets CuPy's current stream on it at each call
    return cuda.cupy().cuda.device.get_cublas_handle()


def _operand(cp, m):
    """(array, transposed?, leading dimension, batch stride) for a (batch, rows, cols) array in cuBLAS's
    column-major terms: a row-major matrix reads as its transpose (no transpose asked); a column-major one is
    transposed by cuBLAS. Any other layout is copied to row-major first."""
    item = m.itemsize
    batch, rows, cols = m.shape
    sb, sr, sc = (s // item for s in m.strides)
    if batch == 1:
        sb = 0
    in_place = sb >= 0  # a reversed batch is copied
    if in_place and (sc == 1 or cols == 1) and sr >= max(1, cols):
        return m, False, sr if rows > 1 else max(1, cols), sb
    if in_place and (sr == 1 or rows == 1) and sc >= max(1, rows):
        return m, True, sc if cols > 1 else max(1, rows), sb
    dense = cp.ascontiguousarray(m)
    return dense, False, max(1, cols), (rows * cols if batch > 1 else 0)


def matmul(a, b, out=None, accumulate: bool = False):
    """a @ b for 2-D or 3-D CuPy arrays of one float dtype, batch dims broadcast (1 against B).

    `out`, when given, is a C-contiguous array of the result's shape that receives the product: a's dtype, or
    float32 for 16-bit operands. accumulate: out = out + a @ b, added to the float32 product before its one rounding
    (cuBLAS's beta = 1)."""
    if accumulate and out is None:
        raise ValueError("cublas.matmul: accumulate=True needs an `out` to add the product to")
    cp = cuda.cupy()
    a3, b3, out, result = batched_product(cp, a, b, out)
    batch, m, k, n = out.shape[0], a3.shape[1], a3.shape[2], b3.shape[2]
    # C (row-major, m x n) is C^T (column-major, n x m) = B^T A^T: cuBLAS multiplies B's view by A's
    b3, b_t, ldb, stride_b = _operand(cp, b3)
    a3, a_t, lda, stride_a = _operand(cp, a3)
    name = str(a.dtype)
    dtype_code = _DATA_TYPES[name]
    if name == "float64":
        compute = _COMPUTE_64F
    elif name == "float32" and backends.allow_tf32:
        compute = _COMPUTE_32F_FAST_TF32
    else:
        compute = _COMPUTE_32F
    beta = _scalar(name, float(accumulate))
    _library().gemmStridedBatchedEx(
        _handle(), _OP_T if b_t else _OP_N, _OP_T if a_t else _OP_N, n, m, k, _scalar(name, 1.0),
        b3.data.ptr, dtype_code, ldb, stride_b, a3.data.ptr, dtype_code, lda, stride_a, beta,
        out.data.ptr, _DATA_TYPES[str(out.dtype)], n, m * n, batch, compute, _GEMM_DEFAULT)
    return result
