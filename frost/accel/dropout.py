"""Dropout on the GPU: one launch each way, the mask drawn inside the kernel and drawn again in the backward, never
stored. Registered with frost.dispatch as dropout's fast path; the reference, and the op that asks for this, is
frost/ops/random.py.

The draws are exactly the reference's: the reference keeps element i when word i of the CUDA generator's next draw
(`generator.random(shape) >= p`: Philox4x32-10 at counter offset + i // 4, word i % 4, as a float32 from its top 24
bits) is at least p, and scales kept values by 1 / (1 - p) rounded to x's dtype. Here thread j draws counter
offset + j from a 4-word snapshot of the generator's state taken at the call (a device-to-device copy; the generator
then advances by the same ceil(n / 4) counters as the reference's draw), and writes y = x * scale or x * 0 for its
four elements (one 4-element vector access each way where x and y are aligned for it). So with the same seed the
fast path and the reference give the same values bit for bit, and a step
captured by frost.jit draws a new mask on each replay. The reference writes a float32 uniform array, a boolean mask,
the scaled mask and the product; here one read of x and one write of y.
"""
import numpy as np

from frost import dispatch
from frost.backend import cuda
from frost.layout import data_ptr
from frost.kernel import Array, Const, bdx, bf16, bx, cdiv, device, f16, f32, i32, kernel, load4, store4, tx, u32
from frost.accel.philox import counters_for, draw_block, to_unit
from frost.tensor import Tensor, from_op

DROPOUT_THREADS = 256
DTYPES = ("float32", "bfloat16", "float16")


@device
def _scaled(w: u32, drop_p: f32, scale: f32) -> f32:
    """The mask value of one element: scale where its word's uniform is kept (>= p), else 0."""
    m = 0.0
    if to_unit(w) >= drop_p:
        m = scale
    return m


def _kernels(T):
    @kernel
    def dropout_apply(x: Array[T], y: Array[T], rng: Array[u32], n: i32, blocks: i32, drop_p: f32, scale: f32,
                      VECTOR: Const[bool]):
        """y = x times the mask of Philox block j (four elements a thread) from the state snapshot rng; the
        backward's launch passes the output's gradient as x. VECTOR: x and y are aligned for load4/store4 (16
        bytes of float32, 8 of bf16/fp16), which move a whole block's four elements at once."""
        j = bx * bdx + tx
        if j < blocks:
            w0, w1, w2, w3 = draw_block(rng, j)
            i = j * 4
            if VECTOR and i + 4 <= n:
                x0, x1, x2, x3 = load4(x, i)
                store4(y, i, f32(x0) * _scaled(w0, drop_p, scale), f32(x1) * _scaled(w1, drop_p, scale),
                       f32(x2) * _scaled(w2, drop_p, scale), f32(x3) * _scaled(w3, drop_p, scale))
            else:
                y[i] = f32(x[i]) * _scaled(w0, drop_p, scale)
                if i + 1 < n:
                    y[i + 1] = f32(x[i + 1]) * _scaled(w1, drop_p, scale)
                if i + 2 < n:
                    y[i + 2] = f32(x[i + 2]) * _scaled(w2, drop_p, scale)
                if i + 3 < n:
                    y[i + 3] = f32(x[i + 3]) * _scaled(w3, drop_p, scale)
    return dropout_apply


DROPOUT_KERNELS = {name: _kernels(T) for name, T in (("float32", f32), ("bfloat16", bf16), ("float16", f16))}


def scale_for(p: float, dtype) -> np.float32:
    """1 / (1 - p) rounded to x's dtype (as the reference's scaled mask holds it), as the kernels' float32."""
    return np.float32(np.dtype(dtype).type(1.0 / (1.0 - p)))


def apply_mask(xp, x, rng, p: float):
    """x (contiguous, 1-D) times the dropout mask drawn from the 4-word state snapshot rng: the kernel on the GPU
    for CuPy arrays, its simulator for NumPy ones."""
    n = x.size
    blocks = counters_for(n)
    y = xp.empty_like(x)
    kern = DROPOUT_KERNELS[str(x.dtype)]
    launch = kern.simulate if xp is np else kern
    vector = data_ptr(x) % (4 * x.itemsize) == 0 and data_ptr(y) % (4 * x.itemsize) == 0
    launch[cdiv(blocks, DROPOUT_THREADS), DROPOUT_THREADS](x, y, rng, n, blocks, np.float32(p), scale_for(p, x.dtype),
                                                           VECTOR=vector)
    return y


def _state_snapshot(n: int):
    """The CUDA generator's state before a draw of n values, the generator then moved past them."""
    return cuda.generator().reserve(counters_for(n))


def _fits_kernels(x: Tensor, *, mask_shape: tuple, p: float) -> bool:
    # element-wise dropout (dropout2d's channel masks stay with the reference); i32 indices with room for the last
    # block; p = 1 is the reference's zeros
    return tuple(mask_shape) == tuple(x.shape) and 0 < x.numel() < 2**31 - 4 * DROPOUT_THREADS and 0.0 < p < 1.0


@dispatch.register("dropout", device="cuda", dtypes=DTYPES, layouts=("contiguous",), applies=_fits_kernels)
def dropout_kernels(x: Tensor, mask_shape: tuple, p: float) -> Tensor:
    """Element-wise dropout of a contiguous float32/bf16/fp16 x by the kernel above."""
    xp = x.xp
    xa = x.data.reshape(-1)
    rng = _state_snapshot(xa.size)
    y = apply_mask(xp, xa, rng, p)

    def backward(g):
        g = xp.ascontiguousarray(g, dtype=xa.dtype).reshape(-1)
        return (apply_mask(xp, g, rng, p).reshape(x.shape),)

    return from_op(y.reshape(x.shape), (x,), backward, "dropout")
