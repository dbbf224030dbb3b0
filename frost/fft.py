"""Discrete Fourier transforms, as torch.fft: fft, ifft, rfft, irfft and their 2-D and n-D forms (fft2, fftn, ...),
with n= / s= (each transformed dimension cropped or zero-padded to that length), dim=, norm= ("backward", the
default: no scaling forward and 1/n inverse; "ortho": 1/sqrt(n) both ways; "forward": 1/n forward), and gradients.

Complex numbers. Frost has no complex dtype (frost.dtype: its ops, promotion rules and kernels are real), so a
complex tensor is a real one whose last dimension has size 2 and holds (real, imaginary) pairs: the layout of
torch.view_as_real, with the real dtype of the parts (float32 for complex64, float64 for complex128). So

    frost.fft.rfft(x)            equals  torch.view_as_real(torch.fft.rfft(x))
    frost.fft.irfft(z)           equals  torch.fft.irfft(torch.view_as_complex(z))

Transforms of complex input (fft, ifft, irfft, ...) read that layout, and `dim` counts the complex tensor's
dimensions (the trailing pair dimension excluded): dim=-1 is the one just before it. A real signal goes to fft
through complex(x) (imaginary parts zero) or, cheaper, through rfft. Gradients are those of a real loss with respect
to the real and imaginary parts (PyTorch's convention for complex gradients, seen through view_as_real).

The transforms run in NumPy's or CuPy's FFT (pocketfft / cuFFT), in float64 for float64 input and float32 otherwise
(integers in the default float dtype).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from frost.dtype import default_float_dtype
from frost.ops.reduce import normalize_dim
from frost.ops.shape import stack
from frost.tensor import Tensor, _resolve, from_op, zeros_like

__all__ = ["fft", "ifft", "rfft", "irfft", "fft2", "ifft2", "rfft2", "irfft2", "fftn", "ifftn", "rfftn", "irfftn",
           "fftfreq", "rfftfreq", "complex", "real", "imag"]

_NORMS = ("backward", "ortho", "forward")
_DUAL_NORM = {"backward": "forward", "ortho": "ortho", "forward": "backward"}  # the adjoint's scaling
_FORWARD = {"c2c": "fftn", "ic2c": "ifftn", "r2c": "rfftn", "c2r": "irfftn"}


# ---------------------------------------------------------------- the complex-as-pairs layout
def complex(real: Tensor, imag: Tensor | None = None) -> Tensor:  # noqa: A001 - torch.complex's name
    """The complex tensor real + i imag in Frost's layout (a trailing dimension of (real, imaginary) pairs); imag
    None means zeros. Differentiable."""
    return stack([real, zeros_like(real) if imag is None else imag], -1)


def real(z: Tensor) -> Tensor:
    """The real parts of a complex tensor in Frost's layout."""
    return _pairs(z, "fft.real")[..., 0]


def imag(z: Tensor) -> Tensor:
    """The imaginary parts of a complex tensor in Frost's layout."""
    return _pairs(z, "fft.imag")[..., 1]


def _pairs(z: Tensor, name: str) -> Tensor:
    if not isinstance(z, Tensor):
        raise TypeError(f"{name}: expected a Tensor, got {type(z).__name__}")
    if z.ndim < 1 or z.shape[-1] != 2 or not z.dtype.is_floating_point:
        raise ValueError(f"{name}: a complex tensor is a floating one whose last dimension holds (real, imaginary) "
                         f"pairs (torch.view_as_real's layout), got {z.dtype} of shape {z.shape}")
    return z


def _work_dtype(x: Tensor):
    if x.data.dtype == np.float64:
        return np.float64
    return np.float32 if x.dtype.is_floating_point else default_float_dtype().np


def _to_complex(xp, a):
    return a[..., 0] + 1j * a[..., 1]


def _to_pairs(xp, z, dtype):
    return xp.stack([z.real, z.imag], axis=-1).astype(dtype, copy=False)


# ---------------------------------------------------------------- the one transform behind them all
def _fit(xp, a, axes: Sequence[int], sizes: Sequence[int]):
    """a cropped or zero-padded along each axis to its size."""
    for axis, size in zip(axes, sizes):
        have = a.shape[axis]
        if have > size:
            a = xp.take(a, xp.arange(size), axis=axis)
        elif have < size:
            widths = [(0, 0)] * a.ndim
            widths[axis] = (0, size - have)
            a = xp.pad(a, widths)
    return a


def _half_spectrum_weights(xp, n: int, dtype):
    """How often each of irfft's n // 2 + 1 inputs counts in the full Hermitian spectrum: 1 for the zero frequency
    (and the Nyquist one of an even n), 2 for the others, whose mirror image they also stand for."""
    w = xp.full(n // 2 + 1, 2.0, dtype=dtype)
    w[0] = 1.0
    if n % 2 == 0:
        w[-1] = 1.0
    return w


def _transform(x: Tensor, kind: str, s: Sequence[int] | None, dims: Sequence[int] | None, norm: str | None,
               name: str) -> Tensor:
    """kind: "c2c" (fftn), "ic2c" (ifftn), "r2c" (rfftn) or "c2r" (irfftn) over `dims` with lengths `s`."""
    norm = _check_norm(norm, name)
    xp = x.xp
    complex_in = kind != "r2c"
    work = _work_dtype(x)
    a = _to_complex(xp, _pairs(x, name).data.astype(work, copy=False)) if complex_in else \
        x.data.astype(work, copy=False)
    axes, sizes = _axes_and_sizes(a.shape, s, dims, kind, name)
    out = getattr(xp.fft, _FORWARD[kind])(a, s=sizes, axes=axes, norm=norm)
    out = out.astype(work, copy=False) if kind == "c2r" else _to_pairs(xp, out, work)
    in_sizes = [a.shape[axis] for axis in axes]

    def backward(g):
        dual = _DUAL_NORM[norm]
        if kind == "c2r":  # the adjoint of the Hermitian inverse: a half spectrum, its mirrored terms counted twice
            w = _half_spectrum_weights(xp, sizes[-1], work).reshape((-1,) + (1,) * (a.ndim - 1 - axes[-1]))
            grad = _to_pairs(xp, _fit(xp, xp.fft.rfftn(g, axes=axes, norm=dual) * w, axes, in_sizes), work)
        else:
            gz = _to_complex(xp, g)
            if kind == "r2c":  # the half spectrum back in the full one (the rest had no effect), real part only
                gz = xp.fft.ifftn(_fit(xp, gz, axes[-1:], sizes[-1:]), axes=axes, norm=dual).real
            else:
                gz = getattr(xp.fft, "ifftn" if kind == "c2c" else "fftn")(gz, axes=axes, norm=dual)
            grad = _fit(xp, gz, axes, in_sizes)
            grad = _to_pairs(xp, grad, work) if complex_in else grad
        return (grad.astype(x.data.dtype, copy=False),)
    return from_op(out, (x,), backward, name)


def _check_norm(norm: str | None, name: str) -> str:
    if norm is None:
        return "backward"
    if norm not in _NORMS:
        raise ValueError(f"{name}: invalid normalization mode {norm!r}; expected one of {_NORMS} (or None)")
    return norm


def _axes_and_sizes(shape: tuple, s: Sequence[int] | None, dims: Sequence[int] | None, kind: str,
                    name: str) -> tuple[list[int], list[int]]:
    """The transformed axes of the (complex) array and each one's transform length, as torch.fft settles them: no
    dims means the last len(s) dimensions, or all; a length of -1 (or none) keeps the input's, except that irfft's
    last one defaults to 2 * (m - 1)."""
    ndim = len(shape)
    if dims is None:
        dims = list(range(ndim - len(s), ndim)) if s is not None else list(range(ndim))
    axes = [normalize_dim(d, ndim, name) for d in dims]
    if len(set(axes)) != len(axes):
        raise RuntimeError(f"{name}: dims must be unique, got {tuple(dims)} for a tensor of {ndim} dimensions")
    if not axes:
        raise RuntimeError(f"{name}: no dimension to transform (input of shape {shape})")
    if s is not None and len(s) != len(axes):
        raise RuntimeError(f"{name}: s {tuple(s)} and dim {tuple(dims)} must have the same length")
    sizes = [shape[a] if s is None or s[i] == -1 else int(s[i]) for i, a in enumerate(axes)]
    if kind == "c2r" and (s is None or s[-1] == -1):
        sizes[-1] = 2 * (shape[axes[-1]] - 1)
    for size in sizes:
        if size < 1:
            raise RuntimeError(f"{name}: invalid number of data points ({size}) specified (input of shape {shape})")
    return axes, sizes


def _one(n: int | None, dim: int) -> tuple[list[int] | None, list[int]]:
    return (None if n is None else [n]), [dim]


# ---------------------------------------------------------------- the public transforms
def fft(input: Tensor, n: int | None = None, dim: int = -1, norm: str | None = None) -> Tensor:
    """The 1-D discrete Fourier transform of a complex tensor (Frost's layout) along `dim`."""
    return _transform(input, "c2c", *_one(n, dim), norm, "fft.fft")


def ifft(input: Tensor, n: int | None = None, dim: int = -1, norm: str | None = None) -> Tensor:
    """The 1-D inverse discrete Fourier transform of a complex tensor along `dim`."""
    return _transform(input, "ic2c", *_one(n, dim), norm, "fft.ifft")


def rfft(input: Tensor, n: int | None = None, dim: int = -1, norm: str | None = None) -> Tensor:
    """The 1-D transform of a real tensor: its n // 2 + 1 non-negative frequencies, as a complex tensor."""
    return _transform(input, "r2c", *_one(n, dim), norm, "fft.rfft")


def irfft(input: Tensor, n: int | None = None, dim: int = -1, norm: str | None = None) -> Tensor:
    """The real signal of length n (2 * (m - 1) by default) whose rfft is the half spectrum `input`; the imaginary
    parts of the zero frequency (and of the Nyquist one for an even n) are ignored, as in PyTorch."""
    return _transform(input, "c2r", *_one(n, dim), norm, "fft.irfft")


def fft2(input: Tensor, s: Sequence[int] | None = None, dim: Sequence[int] = (-2, -1),
         norm: str | None = None) -> Tensor:
    return _transform(input, "c2c", s, dim, norm, "fft.fft2")


def ifft2(input: Tensor, s: Sequence[int] | None = None, dim: Sequence[int] = (-2, -1),
          norm: str | None = None) -> Tensor:
    return _transform(input, "ic2c", s, dim, norm, "fft.ifft2")


def rfft2(input: Tensor, s: Sequence[int] | None = None, dim: Sequence[int] = (-2, -1),
          norm: str | None = None) -> Tensor:
    return _transform(input, "r2c", s, dim, norm, "fft.rfft2")


def irfft2(input: Tensor, s: Sequence[int] | None = None, dim: Sequence[int] = (-2, -1),
           norm: str | None = None) -> Tensor:
    return _transform(input, "c2r", s, dim, norm, "fft.irfft2")


def fftn(input: Tensor, s: Sequence[int] | None = None, dim: Sequence[int] | None = None,
         norm: str | None = None) -> Tensor:
    return _transform(input, "c2c", s, dim, norm, "fft.fftn")


def ifftn(input: Tensor, s: Sequence[int] | None = None, dim: Sequence[int] | None = None,
          norm: str | None = None) -> Tensor:
    return _transform(input, "ic2c", s, dim, norm, "fft.ifftn")


def rfftn(input: Tensor, s: Sequence[int] | None = None, dim: Sequence[int] | None = None,
          norm: str | None = None) -> Tensor:
    """The n-D transform of a real tensor: the last transformed dimension keeps its non-negative frequencies."""
    return _transform(input, "r2c", s, dim, norm, "fft.rfftn")


def irfftn(input: Tensor, s: Sequence[int] | None = None, dim: Sequence[int] | None = None,
           norm: str | None = None) -> Tensor:
    return _transform(input, "c2r", s, dim, norm, "fft.irfftn")


# ---------------------------------------------------------------- frequencies
def fftfreq(n: int, d: float = 1.0, *, dtype=None, device=None) -> Tensor:
    """The sample frequencies of an n-point fft with sample spacing d: [0, 1, ..., -1] / (d * n)."""
    dev, dt = _resolve(device, dtype, default_float_dtype())
    return Tensor(np.fft.fftfreq(n, d).astype(dt.np)).to(dev)


def rfftfreq(n: int, d: float = 1.0, *, dtype=None, device=None) -> Tensor:
    """The sample frequencies of an n-point rfft: [0, 1, ..., n // 2] / (d * n)."""
    dev, dt = _resolve(device, dtype, default_float_dtype())
    return Tensor(np.fft.rfftfreq(n, d).astype(dt.np)).to(dev)
