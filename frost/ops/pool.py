"""2-D pooling (max, average, adaptive average and adaptive max), forward and backward side by side."""
from __future__ import annotations

import math

import numpy as np

from frost.backend import device_of, xp_for
from frost.dtype import widened
from frost.ops.conv import int_pair
from frost.tensor import Tensor, from_op


def _check_input(x: Tensor, name: str) -> None:
    if not isinstance(x, Tensor):
        raise TypeError(f"{name}: expected a Tensor, got {type(x).__name__}")
    if x.ndim not in (3, 4):
        raise RuntimeError(f"{name}: expected a 3-D (C, H, W) or 4-D (N, C, H, W) input, got shape {x.shape}")
    if not x.dtype.is_floating_point:
        raise RuntimeError(f"{name}: expected a floating-point input, got {x.dtype.name}")


def _out_size(size: int, k: int, s: int, p: int, d: int, ceil_mode: bool) -> int:
    """PyTorch's pooling output size; in ceil mode the last window must start inside the input or left padding."""
    span = size + 2 * p - d * (k - 1) - 1
    out = (-(-span // s) if ceil_mode else span // s) + 1
    if ceil_mode and (out - 1) * s >= size + p:
        out -= 1
    return out


def _geometry(x: Tensor, name: str, kernel_size, stride, padding, dilation, ceil_mode: bool):
    kh, kw = int_pair(kernel_size, "kernel_size", name)
    sh, sw = int_pair(stride if stride is not None and stride not in ((), []) else (kh, kw), "stride", name)
    ph, pw = int_pair(padding, "padding", name)
    dh, dw = int_pair(dilation, "dilation", name)
    if min(kh, kw, sh, sw, dh, dw) < 1 or min(ph, pw) < 0:
        raise ValueError(f"{name}: kernel_size, stride and dilation must be positive and padding non-negative, got "
                         f"kernel_size={kernel_size!r} stride={stride!r} padding={padding!r} dilation={dilation!r}")
    if ph > kh // 2 or pw > kw // 2:
        raise RuntimeError(f"{name}: padding {(ph, pw)} should be at most half of the kernel size {(kh, kw)}")
    h, w = x.shape[-2:]
    ho = _out_size(h, kh, sh, ph, dh, ceil_mode)
    wo = _out_size(w, kw, sw, pw, dw, ceil_mode)
    if ho <= 0 or wo <= 0:
        raise RuntimeError(f"{name}: output size ({ho} x {wo}) is too small for input {x.shape} with kernel "
                           f"{(kh, kw)}, stride {(sh, sw)}, padding {(ph, pw)}, dilation {(dh, dw)}")
    return (kh, kw), (sh, sw), (ph, pw), (dh, dw), (ho, wo)


def _padded(a, pads: tuple, out_hw: tuple, kernel: tuple, stride: tuple, dilation: tuple, value: float):
    """a (..., H, W) padded by `pads` on the top/left and as much on the bottom/right as the last window needs."""
    xp = _xp(a)
    h, w = a.shape[-2:]
    hp = max(h + pads[0], (out_hw[0] - 1) * stride[0] + dilation[0] * (kernel[0] - 1) + 1)
    wp = max(w + pads[1], (out_hw[1] - 1) * stride[1] + dilation[1] * (kernel[1] - 1) + 1)
    if (hp, wp) == (h, w):
        return a
    out = xp.full(a.shape[:-2] + (hp, wp), value, dtype=a.dtype)
    out[..., pads[0]:pads[0] + h, pads[1]:pads[1] + w] = a
    return out


def _windows(a, kernel: tuple, stride: tuple, dilation: tuple, out_hw: tuple):
    """A strided view (..., Ho, Wo, kh, kw) of every pooling window (no copy)."""
    xp = _xp(a)
    *lead, s_h, s_w = a.strides
    return xp.lib.stride_tricks.as_strided(
        a, shape=a.shape[:-2] + out_hw + kernel,
        strides=tuple(lead) + (stride[0] * s_h, stride[1] * s_w, dilation[0] * s_h, dilation[1] * s_w))


def _window_slices(i: int, j: int, kernel, stride, dilation, out_hw):
    """Where kernel offset (i, j) of every window lands in the padded input."""
    top, left = i * dilation[0], j * dilation[1]
    return (Ellipsis, slice(top, top + stride[0] * (out_hw[0] - 1) + 1, stride[0]),
            slice(left, left + stride[1] * (out_hw[1] - 1) + 1, stride[1]))


def _xp(array):
    """The array module (NumPy or CuPy) of a raw array: the helpers above take arrays, not Tensors."""
    return xp_for(device_of(array))


def _unbatched(fn, x: Tensor, *args, **kwargs):
    """Run a 4-D pooling op on a 3-D (C, H, W) input."""
    out = fn(x.unsqueeze(0), *args, **kwargs)
    if isinstance(out, tuple):
        return tuple(o.squeeze(0) if isinstance(o, Tensor) else o for o in out)
    return out.squeeze(0)


# ------------------------------------------------------------------ max pooling


def max_pool2d(x: Tensor, kernel_size, stride=None, padding=0, dilation=1, ceil_mode: bool = False,
               return_indices: bool = False):
    """Max over each window, as torch.nn.functional.max_pool2d; the gradient goes to the (first) maximum."""
    _check_input(x, "max_pool2d")
    if x.ndim == 3:
        return _unbatched(max_pool2d, x, kernel_size, stride, padding, dilation, ceil_mode, return_indices)
    kernel, strd, pads, dil, out_hw = _geometry(x, "max_pool2d", kernel_size, stride, padding, dilation, ceil_mode)
    xp, a = x.xp, x.data
    xpad = _padded(a, pads, out_hw, kernel, strd, dil, -math.inf)
    windows = _windows(xpad, kernel, strd, dil, out_hw)
    flat = windows.reshape(a.shape[:2] + out_hw + (kernel[0] * kernel[1],))
    arg = xp.argmax(flat, axis=-1)  # the first maximum (and NaN wins), as PyTorch picks
    if xpad is not a:  # a window whose real values are all -inf ties with its padding: the first real one wins
        real = _windows(_padded(xp.ones(a.shape[-2:], dtype=bool), pads, out_hw, kernel, strd, dil, False), kernel,
                        strd, dil, out_hw).reshape(out_hw + (kernel[0] * kernel[1],))
        picked_real = xp.take_along_axis(xp.broadcast_to(real, flat.shape), arg[..., None], axis=-1)[..., 0]
        arg = xp.where(picked_real, arg, xp.argmax(real, axis=-1))
    out = xp.take_along_axis(flat, arg[..., None], axis=-1)[..., 0]
    padded_shape = xpad.shape

    def backward(g):
        gpad = xp.zeros(padded_shape, dtype=g.dtype)
        for i in range(kernel[0]):
            for j in range(kernel[1]):
                where = _window_slices(i, j, kernel, strd, dil, out_hw)
                gpad[where] += xp.where(arg == i * kernel[1] + j, g, 0)
        return (gpad[..., pads[0]:pads[0] + a.shape[2], pads[1]:pads[1] + a.shape[3]],)

    result = from_op(out, (x,), backward, "max_pool2d")
    if not return_indices:
        return result
    return result, Tensor(_flat_input_index(arg, kernel, strd, pads, dil, out_hw, a.shape[3], xp))


def _flat_input_index(arg, kernel, stride, pads, dilation, out_hw, width: int, xp):
    """PyTorch's indices: the position h * W + w of each window's maximum in its (unpadded) input plane."""
    oh = xp.arange(out_hw[0]).reshape(-1, 1)
    ow = xp.arange(out_hw[1]).reshape(1, -1)
    h = oh * stride[0] - pads[0] + (arg // kernel[1]) * dilation[0]
    w = ow * stride[1] - pads[1] + (arg % kernel[1]) * dilation[1]
    return (h * width + w).astype(xp.int64)


# ------------------------------------------------------------------ average pooling


def _avg_divisor(size: int, out: int, k: int, s: int, p: int, count_include_pad: bool, xp):
    """Per-output-row window sizes: PyTorch divides by the window clipped to the padded input (or, without
    count_include_pad, to the real input)."""
    start = np.arange(out) * s - p
    end = np.minimum(start + k, size + p)
    if not count_include_pad:
        start, end = np.maximum(start, 0), np.minimum(end, size)
    return xp.asarray((end - start).astype(np.float64))


def avg_pool2d(x: Tensor, kernel_size, stride=None, padding=0, ceil_mode: bool = False,
               count_include_pad: bool = True, divisor_override: int | None = None) -> Tensor:
    """Mean over each window, as torch.nn.functional.avg_pool2d."""
    _check_input(x, "avg_pool2d")
    if divisor_override == 0:  # 0 used to be taken for "no override" (a falsy test); PyTorch refuses it
        raise RuntimeError(f"avg_pool2d: divisor must be not zero, got divisor_override=0 for input {x.shape}; pass "
                           f"None to divide by the window size")
    if x.ndim == 3:
        return _unbatched(avg_pool2d, x, kernel_size, stride, padding, ceil_mode, count_include_pad,
                          divisor_override)
    kernel, strd, pads, dil, out_hw = _geometry(x, "avg_pool2d", kernel_size, stride, padding, 1, ceil_mode)
    xp, a = x.xp, x.data
    wide = widened(a)  # half-precision windows add up in float32, as PyTorch's do
    h, w = a.shape[2:]
    if divisor_override is not None:
        divisor = float(divisor_override)
    else:
        dh = _avg_divisor(h, out_hw[0], kernel[0], strd[0], pads[0], count_include_pad, xp)
        dw = _avg_divisor(w, out_hw[1], kernel[1], strd[1], pads[1], count_include_pad, xp)
        divisor = (dh[:, None] * dw[None, :]).astype(wide.dtype)
    xpad = _padded(wide, pads, out_hw, kernel, strd, dil, 0.0)
    out = _windows(xpad, kernel, strd, dil, out_hw).sum(axis=(-2, -1), dtype=wide.dtype) / divisor
    padded_shape = xpad.shape

    def backward(g):
        share = (g / divisor).astype(g.dtype, copy=False)
        gpad = xp.zeros(padded_shape, dtype=g.dtype)
        for i in range(kernel[0]):
            for j in range(kernel[1]):
                gpad[_window_slices(i, j, kernel, strd, dil, out_hw)] += share
        return (gpad[..., pads[0]:pads[0] + h, pads[1]:pads[1] + w],)

    return from_op(out.astype(a.dtype, copy=False), (x,), backward, "avg_pool2d")


# ------------------------------------------------------------------ adaptive pooling


def _adaptive_bounds(size: int, out: int) -> tuple:
    """PyTorch's adaptive windows: [floor(i * size / out), ceil((i + 1) * size / out))."""
    i = np.arange(out)
    return (i * size) // out, -((-(i + 1) * size) // out)


def _output_size(x: Tensor, output_size, name: str) -> tuple:
    if isinstance(output_size, (int, np.integer)):
        output_size = (output_size, output_size)
    oh, ow = (x.shape[-2 + k] if s is None else int(s) for k, s in enumerate(output_size))
    if oh <= 0 or ow <= 0:
        raise RuntimeError(f"{name}: output size must be positive, got {tuple(output_size)} for input {x.shape}")
    return oh, ow


def _check_non_empty(x: Tensor, name: str, dims: tuple) -> None:
    """PyTorch refuses adaptive pooling over an empty plane: there is no window to average or take the max of."""
    for dim in dims:
        if x.shape[dim] == 0:
            raise RuntimeError(f"{name}(): Expected input to have non-zero size for non-batch dimensions, but input "
                               f"has sizes {list(x.shape)} with dimension {dim % x.ndim} being empty; give dimension "
                               f"{dim % x.ndim} at least one element")


def _averaging_matrix(size: int, out: int, dtype, xp):
    """(out, size) matrix whose row i averages input window i; pooling is A_h @ x @ A_w.T."""
    start, end = _adaptive_bounds(size, out)
    pos = np.arange(size)
    inside = (pos[None, :] >= start[:, None]) & (pos[None, :] < end[:, None])
    return xp.asarray((inside / (end - start)[:, None]).astype(dtype))


def adaptive_avg_pool2d(x: Tensor, output_size) -> Tensor:
    """Average over PyTorch's adaptive windows; any output size, a reshape-mean when it divides the input."""
    _check_input(x, "adaptive_avg_pool2d")
    _check_non_empty(x, "adaptive_avg_pool2d", (-2, -1))  # as PyTorch, an empty channel dim is allowed here
    if x.ndim == 3:
        return _unbatched(adaptive_avg_pool2d, x, output_size)
    xp, a = x.xp, x.data
    wide = widened(a)  # half-precision windows add up in float32, as PyTorch's do
    n, c, h, w = a.shape
    oh, ow = _output_size(x, output_size, "adaptive_avg_pool2d")
    if h % oh == 0 and w % ow == 0:
        kh, kw = h // oh, w // ow
        out = wide.reshape(n, c, oh, kh, ow, kw).mean(axis=(3, 5)).astype(a.dtype, copy=False)

        def backward(g):
            share = (g / (kh * kw))[:, :, :, None, :, None]
            return (xp.broadcast_to(share, (n, c, oh, kh, ow, kw)).reshape(n, c, h, w).astype(g.dtype, copy=False),)
        return from_op(out, (x,), backward, "adaptive_avg_pool2d")

    ah = _averaging_matrix(h, oh, wide.dtype, xp)
    aw = _averaging_matrix(w, ow, wide.dtype, xp)
    out = xp.matmul(xp.matmul(ah, wide), aw.T).astype(a.dtype, copy=False)

    def backward(g):
        return (xp.matmul(xp.matmul(ah.T, g), aw).astype(g.dtype, copy=False),)
    return from_op(out, (x,), backward, "adaptive_avg_pool2d")


def adaptive_max_pool2d(x: Tensor, output_size, return_indices: bool = False):
    """Max over PyTorch's adaptive windows (windows of unequal size are padded by repeating their last element)."""
    _check_input(x, "adaptive_max_pool2d")
    # as PyTorch: every dim but the first, so a 3-D (0, H, W) input passes but a 4-D (N, 0, H, W) one does not
    _check_non_empty(x, "adaptive_max_pool2d", tuple(range(1, x.ndim)))
    if x.ndim == 3:
        return _unbatched(_adaptive_max_pool2d_4d, x, output_size, return_indices)
    return _adaptive_max_pool2d_4d(x, output_size, return_indices)


def _adaptive_max_pool2d_4d(x: Tensor, output_size, return_indices: bool):
    xp, a = x.xp, x.data
    n, c, h, w = a.shape
    oh, ow = _output_size(x, output_size, "adaptive_max_pool2d")
    rows = _window_positions(h, oh)  # (oh, kh)
    cols = _window_positions(w, ow)  # (ow, kw)
    kh, kw = rows.shape[1], cols.shape[1]
    # plane index of every window element, (oh, ow, kh * kw); duplicates only repeat an element of the window
    plane = (rows[:, None, :, None] * w + cols[None, :, None, :]).reshape(oh, ow, kh * kw)
    plane = xp.asarray(plane)
    windows = a.reshape(n, c, h * w)[:, :, plane]  # (n, c, oh, ow, kh * kw)
    arg = xp.argmax(windows, axis=-1)
    out = xp.take_along_axis(windows, arg[..., None], axis=-1)[..., 0]
    index = xp.take_along_axis(xp.broadcast_to(plane, windows.shape), arg[..., None], axis=-1)[..., 0]

    def backward(g):
        flat = (index + (xp.arange(n * c) * (h * w)).reshape(n, c, 1, 1)).reshape(-1)
        gx = xp.bincount(flat, weights=g.reshape(-1), minlength=n * c * h * w)
        return (gx.astype(g.dtype, copy=False).reshape(n, c, h, w),)

    result = from_op(out, (x,), backward, "adaptive_max_pool2d")
    return (result, Tensor(index.astype(xp.int64))) if return_indices else result


def _window_positions(size: int, out: int):
    """(out, kmax) input positions of each adaptive window, the last one repeated to fill short windows."""
    start, end = _adaptive_bounds(size, out)
    kmax = int((end - start).max())
    return np.minimum(start[:, None] + np.arange(kmax)[None, :], end[:, None] - 1)
