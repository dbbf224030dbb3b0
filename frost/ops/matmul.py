"""Matrix multiplication (batched, broadcasting) and the linear layer's op, forward and backward together."""
from __future__ import annotations

from frost.autograd import unbroadcast
from frost.tensor import Tensor, from_op


def _check(a: Tensor, b: Tensor, name: str) -> None:
    if not isinstance(a, Tensor) or not isinstance(b, Tensor):
        raise TypeError(f"{name}: both operands must be tensors, got {type(a).__name__} and {type(b).__name__}")
    if a.device != b.device:
        raise RuntimeError(f"{name}: operands are on different devices: {a.shape} on {a.device} and {b.shape} on {b.device}")
    if a.dtype != b.dtype:
        raise RuntimeError(f"{name}: operands have different dtypes: {a.shape} {a.dtype!r} and {b.shape} {b.dtype!r}")
    if a.ndim == 0 or b.ndim == 0:
        raise RuntimeError(f"{name}: both operands need at least one dimension, got shapes {a.shape} and {b.shape}")
    ka = a.shape[-1]
    kb = b.shape[0] if b.ndim == 1 else b.shape[-2]
    if ka != kb:
        raise RuntimeError(f"{name}: shapes {a.shape} and {b.shape} cannot be multiplied ({ka} != {kb})")


def matmul(a: Tensor, b: Tensor) -> Tensor:
    """a @ b with NumPy's rules: 1-D operands are promoted and squeezed, batch dims broadcast."""
    _check(a, b, "matmul")
    xp = a.xp
    xa, xb = a.data, b.data
    out = xp.matmul(xa, xb)

    def backward(g):
        # promote 1-D operands to matrices so that one formula serves every case
        A = xa[None, :] if xa.ndim == 1 else xa
        B = xb[:, None] if xb.ndim == 1 else xb
        G = g
        if xa.ndim == 1:
            G = xp.expand_dims(G, -2)
        if xb.ndim == 1:
            G = xp.expand_dims(G, -1)
        ga = xp.matmul(G, xp.swapaxes(B, -1, -2))
        gb = xp.matmul(xp.swapaxes(A, -1, -2), G)
        ga = unbroadcast(ga, A.shape).reshape(xa.shape)
        gb = unbroadcast(gb, B.shape).reshape(xb.shape)
        return ga, gb
    return from_op(out, (a, b), backward, "matmul")


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """x @ weight.T + bias in one op (one BLAS call each way, no transposed copy)."""
    _check(x, weight.mT if weight.ndim == 2 else weight, "linear")
    xp = x.xp
    xa, w = x.data, weight.data
    out = xp.matmul(xa, w.T)
    if bias is not None:
        if bias.shape != (w.shape[0],):
            raise RuntimeError(f"linear: bias of shape {bias.shape} does not fit weight of shape {weight.shape}")
        out += bias.data
    parents = (x, weight) if bias is None else (x, weight, bias)

    def backward(g):
        gx = xp.matmul(g, w)
        g2 = g.reshape(-1, g.shape[-1])
        gw = xp.matmul(g2.T, xa.reshape(-1, xa.shape[-1]))
        grads = [gx, gw]
        if bias is not None:
            grads.append(g2.sum(axis=0))
        return grads
    return from_op(out, parents, backward, "linear")
