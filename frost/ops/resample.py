"""Resampling and patch ops: interpolate, pixel_shuffle / pixel_unshuffle, unfold / fold and max_unpool, forward
and backward side by side.

interpolate is separable: along each spatial axis every output position reads a few input positions ("taps") with
weights. Per axis the forward is one matmul with the dense (out, in) weight matrix and the backward one with its
transpose; an axis too long for a dense matrix gathers and weights the taps instead, and scatter-adds them back.
"""
from __future__ import annotations

import math

import numpy as np

from frost.ops.shape import scatter_at
from frost.ops.matmul import matmul_arrays
from frost.tensor import Tensor, from_op

# the spatial dims (input.ndim - 2) each mode applies to
_MODE_DIMS = {"nearest": (1, 2, 3), "nearest-exact": (1, 2, 3), "area": (1, 2, 3), "linear": (1,),
              "bilinear": (2,), "bicubic": (2,), "trilinear": (3,)}
_CUBIC_A = -0.75  # PyTorch's (and OpenCV's) bicubic kernel parameter
_DENSE_LIMIT = 1 << 22  # entries of one axis's dense weight matrix (32 MiB in float64); longer axes use the taps
# (taps' arguments, device) -> that axis map on the GPU, made once: a step captured by frost.jit may not copy host
# arrays to the device, so it finds the maps its eager warm-up calls made; the oldest goes past the limit
_DEVICE_MAPS: dict = {}
_DEVICE_MAPS_LIMIT = 64


def _check_tensor(x, name: str, what: str = "input") -> None:
    if not isinstance(x, Tensor):
        raise TypeError(f"{name}: expected {what} to be a Tensor, got {type(x).__name__}")


def _tuple(value, n: int, name: str, what: str) -> tuple:
    """`value` as n ints: an int repeats; a sequence must have n entries."""
    if isinstance(value, (int, np.integer)):
        return (int(value),) * n
    values = tuple(int(v) for v in value)
    if len(values) == 1:
        return values * n
    if len(values) != n:
        raise ValueError(f"{name}: {what} must be an int or {n} ints, got {value!r}")
    return values


# ------------------------------------------------------------------ interpolate


def interpolate(input: Tensor, size=None, scale_factor=None, mode: str = "nearest", align_corners: bool | None = None,
                recompute_scale_factor: bool | None = None, antialias: bool = False) -> Tensor:
    """Resample the spatial dims of an (N, C, *spatial) tensor, as torch.nn.functional.interpolate.

    Modes: 'nearest' and 'nearest-exact' (any of 1-3 spatial dims), 'area', 'linear' (1-D), 'bilinear' and
    'bicubic' (2-D), 'trilinear' (3-D). Give `size` or `scale_factor`; with a scale factor the source positions
    use 1 / scale_factor unless recompute_scale_factor=True (then input_size / output_size).
    """
    _check_tensor(input, "interpolate")
    _check_mode(input, mode, align_corners, antialias)
    out_sizes, scales = _output_sizes(input, size, scale_factor, recompute_scale_factor, mode)
    if mode not in ("nearest", "nearest-exact") and not input.dtype.is_floating_point:
        raise RuntimeError(f"interpolate: mode {mode!r} needs a floating-point input, got {input.dtype.name}")
    xp, a = input.xp, input.data
    acc = np.float64 if a.dtype == np.float64 else np.float32  # PyTorch's index math runs in the op's math type
    maps = [_cached_axis_map(xp, input.device, (mode, n, out, bool(align_corners), scale, acc, input.ndim == 4))
            for n, out, scale in zip(input.shape[2:], out_sizes, scales)]
    out = a
    for axis, axis_map in enumerate(maps, start=2):
        out = _resample_axis(xp, out, axis, *axis_map)
    out = out.astype(a.dtype, copy=False)
    in_shape = input.shape

    def backward(g):
        for axis, axis_map in reversed(list(enumerate(maps, start=2))):
            g = _resample_axis_backward(xp, g, axis, *axis_map, in_shape[axis])
        return (g.astype(a.dtype, copy=False),)
    return from_op(out, (input,), backward, "interpolate")


def _check_mode(x: Tensor, mode: str, align_corners, antialias: bool) -> None:
    if mode not in _MODE_DIMS:
        raise ValueError(f"interpolate: unknown mode {mode!r}; expected one of {', '.join(_MODE_DIMS)}")
    dims = x.ndim - 2
    if dims not in (1, 2, 3):
        raise NotImplementedError(f"interpolate: only 3-D, 4-D and 5-D inputs (N, C, *spatial) are supported, got "
                                  f"shape {x.shape} for mode {mode!r}")
    if dims not in _MODE_DIMS[mode]:
        raise NotImplementedError(f"interpolate: mode {mode!r} needs a {_MODE_DIMS[mode][0] + 2}-D input, got "
                                  f"shape {x.shape}")
    if align_corners is not None and mode in ("nearest", "nearest-exact", "area"):
        raise ValueError(f"interpolate: align_corners can only be set with the interpolating modes linear, "
                         f"bilinear, bicubic and trilinear, got mode {mode!r}")
    if antialias:
        raise NotImplementedError("interpolate: antialias=True is not supported in frost")
    if any(n == 0 for n in x.shape[1:]):
        raise RuntimeError(f"interpolate: expected an input with non-empty channel and spatial dims, got shape "
                           f"{x.shape}")


def _output_sizes(x: Tensor, size, scale_factor, recompute_scale_factor, mode: str) -> tuple:
    """(output sizes, scale factors handed to the index math: None where input / output size applies)."""
    spatial = x.shape[2:]
    dims = len(spatial)
    if (size is None) == (scale_factor is None):
        raise ValueError(f"interpolate: give exactly one of size and scale_factor, got size={size!r} and "
                         f"scale_factor={scale_factor!r}")
    if size is not None:
        if recompute_scale_factor:
            raise ValueError("interpolate: recompute_scale_factor is not meaningful with an explicit size")
        sizes = _spatial_values(size, dims, spatial, "size")
        if not all(isinstance(s, (int, np.integer)) for s in sizes):
            raise TypeError(f"interpolate: size must be an int or a tuple of ints, got {size!r}")
        sizes, scales = tuple(int(s) for s in sizes), (None,) * dims
    else:
        scales = tuple(float(s) for s in _spatial_values(scale_factor, dims, spatial, "scale_factor"))
        sizes = tuple(math.floor(n * s) for n, s in zip(spatial, scales))
        if recompute_scale_factor or mode == "area":  # area always derives its windows from the sizes
            scales = (None,) * dims
    if min(sizes) <= 0:
        raise RuntimeError(f"interpolate: input and output sizes should be greater than 0, got input {spatial} and "
                           f"output {sizes}")
    return sizes, scales


def _spatial_values(value, dims: int, spatial: tuple, what: str) -> tuple:
    if not isinstance(value, (tuple, list)):
        return (value,) * dims
    if len(value) != dims:
        raise ValueError(f"interpolate: {what} {tuple(value)} must have one entry per spatial dim of the input "
                         f"({dims}: {spatial})")
    return tuple(value)


def _taps(mode: str, n: int, out: int, align_corners: bool, scale, acc, planar: bool) -> tuple:
    """(indices, weights) of shape (out, taps): output j = sum_k weights[j, k] * input[indices[j, k]]; weights
    None means one tap of weight 1. `planar`: the input is 4-D, where PyTorch's nearest takes integer shortcuts."""
    if mode == "nearest":
        return _nearest_taps(n, out, scale, exact=False, shortcuts=planar), None
    if mode == "nearest-exact":
        return _nearest_taps(n, out, scale, exact=True, shortcuts=False), None
    if mode == "area":
        return _area_taps(n, out, acc)
    if mode == "bicubic":
        return _cubic_taps(n, out, align_corners, scale, acc)
    return _linear_taps(n, out, align_corners, scale, acc)


def _inverse_scale(n: int, out: int, scale, dtype):
    """PyTorch's compute_scales_value: 1 / scale_factor when one was given, else input / output size."""
    if scale is not None and scale > 0:
        return dtype(1.0 / scale)
    return dtype(n) / dtype(out)


def _nearest_taps(n: int, out: int, scale, exact: bool, shortcuts: bool) -> np.ndarray:
    """floor(j / scale) ('nearest') or floor((j + 0.5) / scale) ('nearest-exact') in float32, as PyTorch; its 2-D
    kernel copies when out == n and halves when out == 2 n, whatever the scale factor says."""
    j = np.arange(out)
    if shortcuts and out == n:
        return j[:, None]
    if shortcuts and out == 2 * n:
        return (j // 2)[:, None]
    inv = _inverse_scale(n, out, scale, np.float32)
    position = j.astype(np.float32) + np.float32(0.5 if exact else 0)
    position = position * inv
    return np.minimum(np.floor(position).astype(np.int64), n - 1)[:, None]


def _source_position(n: int, out: int, align_corners: bool, scale, acc, cubic: bool) -> np.ndarray:
    """PyTorch's area_pixel_compute_source_index for every output index: align_corners maps the corner pixels'
    centers onto each other; otherwise half-pixel centers, clamped at 0 except for cubic."""
    j = np.arange(out).astype(acc)
    if align_corners:
        ratio = acc(n - 1) / acc(out - 1) if out > 1 else acc(0)
        return ratio * j
    position = _inverse_scale(n, out, scale, acc) * (j + acc(0.5)) - acc(0.5)
    return position if cubic else np.maximum(position, acc(0))


def _floor_and_fraction(position: np.ndarray, n: int) -> tuple:
    """PyTorch's guard_index_and_lambda: the index below (at most n - 1; floored in float32, as its floorf) and the
    fraction past it, clamped to [0, 1]."""
    index = np.minimum(np.floor(position.astype(np.float32)).astype(np.int64), n - 1)
    fraction = np.clip(position - index.astype(position.dtype), 0, 1).astype(position.dtype)
    return index, fraction


def _linear_taps(n: int, out: int, align_corners: bool, scale, acc) -> tuple:
    if out == n:  # PyTorch copies when the size does not change, whatever the scale factor
        return np.arange(n)[:, None], np.ones((n, 1), dtype=acc)
    index, fraction = _floor_and_fraction(_source_position(n, out, align_corners, scale, acc, cubic=False), n)
    upper = index + (index < n - 1)
    return np.stack([index, upper], 1), np.stack([1 - fraction, fraction], 1)


def _cubic_taps(n: int, out: int, align_corners: bool, scale, acc) -> tuple:
    """Four taps around each position, the indices clamped to the border (PyTorch's bounded access)."""
    index, t = _floor_and_fraction(_source_position(n, out, align_corners, scale, acc, cubic=True), n)
    indices = np.clip(index[:, None] + np.arange(-1, 3), 0, n - 1)
    a = acc(_CUBIC_A)
    weights = np.stack([_cubic_far(t + 1, a), _cubic_near(t, a), _cubic_near(1 - t, a), _cubic_far(2 - t, a)], 1)
    return indices, weights.astype(acc)


def _cubic_near(x, a):
    """The cubic convolution kernel for distances |x| <= 1."""
    return ((a + 2) * x - (a + 3)) * x * x + 1


def _cubic_far(x, a):
    """The cubic convolution kernel for distances 1 < |x| < 2."""
    return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a


def _area_taps(n: int, out: int, acc) -> tuple:
    """Adaptive average pooling windows [floor(j n / out), ceil((j + 1) n / out)); short windows padded with
    zero-weight taps."""
    j = np.arange(out)
    start, end = (j * n) // out, -((-(j + 1) * n) // out)
    width = int((end - start).max())
    offsets = np.arange(width)
    indices = np.minimum(start[:, None] + offsets, n - 1)
    weights = np.where(offsets < (end - start)[:, None], 1 / (end - start)[:, None], 0).astype(acc)
    return indices, weights


def _axis_map(xp, idx: np.ndarray, w, n: int, acc) -> tuple:
    """(indices, weights, dense (out, n) weight matrix or None) on the device; the matrix while it is small
    enough: one matmul (BLAS, cuBLAS) is far faster than a gather per tap and much faster than a scatter-add."""
    matrix = None
    if idx.shape[0] * n <= _DENSE_LIMIT:
        matrix = np.zeros((idx.shape[0], n), dtype=acc)
        np.add.at(matrix, (np.arange(idx.shape[0])[:, None], idx), 1 if w is None else w)
        matrix = xp.asarray(matrix)
    return xp.asarray(idx), None if w is None else xp.asarray(w), matrix


def _cached_axis_map(xp, device, key: tuple) -> tuple:
    """_axis_map of the taps that key = (mode, n, out, align_corners, scale, acc, planar) names; on a GPU kept."""
    mode, n, _, _, _, acc, _ = key
    if xp is np:
        return _axis_map(xp, *_taps(*key), n, acc)
    place = (key, str(device))
    if place not in _DEVICE_MAPS:
        if len(_DEVICE_MAPS) >= _DEVICE_MAPS_LIMIT:
            _DEVICE_MAPS.pop(next(iter(_DEVICE_MAPS)))
        _DEVICE_MAPS[place] = _axis_map(xp, *_taps(*key), n, acc)
    return _DEVICE_MAPS[place]


def _matmul_axis(xp, a, axis: int, matrix):
    """a with `axis` (of length matrix.shape[1]) mapped through matrix: sum_i matrix[j, i] a[..., i, ...], in the
    matrix's dtype, as one 2-D matmul (matmul_arrays: capturable on the GPU, where CuPy's cuBLAS is not)."""
    moved = xp.moveaxis(a, axis, -1)
    rows = moved.reshape(-1, moved.shape[-1]).astype(matrix.dtype, copy=False)
    product = matmul_arrays(xp, rows, matrix.T).reshape(moved.shape[:-1] + (matrix.shape[0],))
    return xp.moveaxis(product, -1, axis)


def _resample_axis(xp, a, axis: int, idx, w, matrix):
    if w is None:  # nearest: a plain gather, exact and for any dtype
        return xp.take(a, idx[:, 0], axis=axis)
    if matrix is not None:
        return _matmul_axis(xp, a, axis, matrix)
    return _gather_axis(xp, a, axis, idx, w)


def _resample_axis_backward(xp, g, axis: int, idx, w, matrix, size: int):
    if matrix is not None:
        return _matmul_axis(xp, g, axis, matrix.T)  # half-precision gradients add up in float32
    return _scatter_axis(xp, g, axis, idx, w, size)


def _along(w, axis: int, ndim: int):
    """Per-position weights w (length along `axis`) shaped to broadcast against an ndim array."""
    return w.reshape((-1,) + (1,) * (ndim - 1 - axis))


def _gather_axis(xp, a, axis: int, idx, w):
    out = None
    for k in range(idx.shape[1]):
        term = xp.take(a, idx[:, k], axis=axis) * _along(w[:, k], axis, a.ndim)
        out = term if out is None else out + term
    return out


def _scatter_axis(xp, g, axis: int, idx, w, size: int):
    """The transpose of _gather_axis: each output position's gradient goes back, weighted, to its taps."""
    shape = list(g.shape)
    shape[axis] = size
    gx = xp.zeros(shape, dtype=g.dtype)
    front = xp.moveaxis(gx, axis, 0)  # a view: the scatter below writes into gx
    g_front = xp.moveaxis(g, axis, 0)
    for k in range(idx.shape[1]):
        part = g_front if w is None else g_front * _along(w[:, k], 0, g.ndim).astype(g.dtype, copy=False)
        scatter_at(xp, "add", front, idx[:, k], part)
    return gx


# ------------------------------------------------------------------ pixel shuffle


def pixel_shuffle(input: Tensor, upscale_factor: int) -> Tensor:
    """(*, C r^2, H, W) -> (*, C, H r, W r): each group of r^2 channels becomes an r x r block of pixels."""
    x, r = input, _factor(input, upscale_factor, "pixel_shuffle", "upscale_factor")
    *lead, c, h, w = x.shape
    if c % (r * r):
        raise RuntimeError(f"pixel_shuffle: the channel dim (-3) of input {x.shape} must be divisible by "
                           f"upscale_factor^2 = {r * r}, got {c}")
    split = (*lead, c // (r * r), r, r, h, w)
    k = len(lead)
    order = tuple(range(k)) + (k, k + 3, k + 1, k + 4, k + 2)  # (*, C, H, r, W, r)
    return _rearranged(x, split, order, (*lead, c // (r * r), h * r, w * r), "pixel_shuffle")


def pixel_unshuffle(input: Tensor, downscale_factor: int) -> Tensor:
    """(*, C, H r, W r) -> (*, C r^2, H, W): the inverse of pixel_shuffle."""
    x, r = input, _factor(input, downscale_factor, "pixel_unshuffle", "downscale_factor")
    *lead, c, h, w = x.shape
    if h % r or w % r:
        raise RuntimeError(f"pixel_unshuffle: height and width of input {x.shape} must be divisible by "
                           f"downscale_factor {r}")
    split = (*lead, c, h // r, r, w // r, r)
    k = len(lead)
    order = tuple(range(k)) + (k, k + 2, k + 4, k + 1, k + 3)  # (*, C, r, r, H, W)
    return _rearranged(x, split, order, (*lead, c * r * r, h // r, w // r), "pixel_unshuffle")


def _factor(x, factor, name: str, what: str) -> int:
    _check_tensor(x, name)
    if x.ndim < 3:
        raise RuntimeError(f"{name}: expected an input of at least 3 dims (*, C, H, W), got shape {x.shape}")
    if not isinstance(factor, (int, np.integer)) or factor <= 0:
        raise RuntimeError(f"{name}: {what} must be a positive int, got {factor!r}")
    return int(factor)


def _rearranged(x: Tensor, split: tuple, order: tuple, shape: tuple, name: str) -> Tensor:
    out = x.data.reshape(split).transpose(order).reshape(shape)
    inverse = tuple(np.argsort(order))
    return from_op(out, (x,), lambda g: (g.reshape(tuple(split[i] for i in order)).transpose(inverse)
                                         .reshape(x.shape),), name)


# ------------------------------------------------------------------ unfold / fold


def _patch_geometry(name: str, kernel_size, dilation, padding, stride) -> tuple:
    geometry = tuple(_tuple(v, 2, name, what) for v, what in ((kernel_size, "kernel_size"), (dilation, "dilation"),
                                                              (padding, "padding"), (stride, "stride")))
    kernel, dil, pad, strd = geometry
    if min(kernel + dil + strd) <= 0 or min(pad) < 0:
        raise RuntimeError(f"{name}: kernel_size, dilation and stride must be positive and padding non-negative, "
                           f"got kernel_size={kernel}, dilation={dil}, padding={pad}, stride={strd}")
    return geometry


def _blocks(name: str, spatial: tuple, kernel, dil, pad, strd) -> tuple:
    """The number of sliding blocks along each spatial dim, as PyTorch's im2col."""
    blocks = tuple((n + 2 * p - d * (k - 1) - 1) // s + 1 for n, k, d, p, s in zip(spatial, kernel, dil, pad, strd))
    if min(blocks) < 1:
        raise RuntimeError(f"{name}: spatial size {spatial} with kernel_size={kernel}, dilation={dil}, padding={pad} "
                           f"and stride={strd} gives {blocks} sliding blocks; each must be at least 1")
    return blocks


def _offset_slices(i: int, j: int, dil, strd, blocks) -> tuple:
    """Where kernel offset (i, j) of every block lands in the padded plane."""
    top, left = i * dil[0], j * dil[1]
    return (Ellipsis, slice(top, top + strd[0] * (blocks[0] - 1) + 1, strd[0]),
            slice(left, left + strd[1] * (blocks[1] - 1) + 1, strd[1]))


def _im2col(xp, a, kernel, dil, pad, strd, blocks):
    """(N, C, H, W) -> (N, C, kh, kw, bh, bw): every block's pixels, zero outside the input."""
    n, c, h, w = a.shape
    padded = xp.zeros((n, c, h + 2 * pad[0], w + 2 * pad[1]), dtype=a.dtype)
    padded[..., pad[0]:pad[0] + h, pad[1]:pad[1] + w] = a
    cols = xp.empty((n, c) + kernel + blocks, dtype=a.dtype)
    for i in range(kernel[0]):
        for j in range(kernel[1]):
            cols[:, :, i, j] = padded[_offset_slices(i, j, dil, strd, blocks)]
    return cols


def _col2im(xp, cols, size: tuple, kernel, dil, pad, strd, blocks):
    """(N, C, kh, kw, bh, bw) -> (N, C, H, W): the transpose of _im2col, overlapping blocks adding up."""
    n, c = cols.shape[:2]
    padded = xp.zeros((n, c, size[0] + 2 * pad[0], size[1] + 2 * pad[1]), dtype=cols.dtype)
    for i in range(kernel[0]):
        for j in range(kernel[1]):
            padded[_offset_slices(i, j, dil, strd, blocks)] += cols[:, :, i, j]
    return padded[..., pad[0]:pad[0] + size[0], pad[1]:pad[1] + size[1]]


def unfold(input: Tensor, kernel_size, dilation=1, padding=0, stride=1) -> Tensor:
    """Sliding blocks of a (N, C, H, W) or (C, H, W) input as columns: (N, C kh kw, L), as torch's F.unfold."""
    _check_tensor(input, "unfold")
    if input.ndim not in (3, 4):
        raise RuntimeError(f"unfold: expected a 3-D (C, H, W) or 4-D (N, C, H, W) input, got shape {input.shape}")
    kernel, dil, pad, strd = _patch_geometry("unfold", kernel_size, dilation, padding, stride)
    xp, a = input.xp, input.data.reshape((-1,) + input.shape[-3:])
    blocks = _blocks("unfold", a.shape[2:], kernel, dil, pad, strd)
    cols = _im2col(xp, a, kernel, dil, pad, strd, blocks)
    out = cols.reshape(input.shape[:-3] + (a.shape[1] * kernel[0] * kernel[1], blocks[0] * blocks[1]))
    col_shape = cols.shape

    def backward(g):
        grad = _col2im(xp, g.reshape(col_shape), a.shape[2:], kernel, dil, pad, strd, blocks)
        return (grad.reshape(input.shape),)
    return from_op(out, (input,), backward, "unfold")


def fold(input: Tensor, output_size, kernel_size, dilation=1, padding=0, stride=1) -> Tensor:
    """Sum columns (N, C kh kw, L) or (C kh kw, L) back into (N, C, H, W) images: the transpose of unfold."""
    _check_tensor(input, "fold")
    if input.ndim not in (2, 3):
        raise RuntimeError(f"fold: expected a 2-D (C kh kw, L) or 3-D (N, C kh kw, L) input, got shape "
                           f"{input.shape}")
    size = _tuple(output_size, 2, "fold", "output_size")
    kernel, dil, pad, strd = _patch_geometry("fold", kernel_size, dilation, padding, stride)
    rows, length = input.shape[-2:]
    if rows % (kernel[0] * kernel[1]):
        raise RuntimeError(f"fold: dim -2 of input {input.shape} must be divisible by the kernel's "
                           f"{kernel[0]} * {kernel[1]} = {kernel[0] * kernel[1]} elements, got {rows}")
    blocks = _blocks("fold", size, kernel, dil, pad, strd)
    if length != blocks[0] * blocks[1]:
        raise RuntimeError(f"fold: output_size={size}, kernel_size={kernel}, dilation={dil}, padding={pad} and "
                           f"stride={strd} give {blocks[0]} * {blocks[1]} = {blocks[0] * blocks[1]} sliding blocks, "
                           f"but dim -1 of input {input.shape} is {length}")
    xp = input.xp
    col_shape = (-1, rows // (kernel[0] * kernel[1])) + kernel + blocks
    out = _col2im(xp, input.data.reshape(col_shape), size, kernel, dil, pad, strd, blocks)
    out = out.reshape(input.shape[:-2] + (rows // (kernel[0] * kernel[1]),) + size)
    image_shape = (-1, rows // (kernel[0] * kernel[1])) + size

    def backward(g):
        return (_im2col(xp, g.reshape(image_shape), kernel, dil, pad, strd, blocks).reshape(input.shape),)
    return from_op(out, (input,), backward, "fold")


# ------------------------------------------------------------------ max unpooling


def max_unpool1d(input: Tensor, indices: Tensor, kernel_size, stride=None, padding=0, output_size=None) -> Tensor:
    """The inverse of max_pool1d(return_indices=True): each value goes back to its index, zeros elsewhere."""
    return _max_unpool(input, indices, 1, kernel_size, stride, padding, output_size, "max_unpool1d")


def max_unpool2d(input: Tensor, indices: Tensor, kernel_size, stride=None, padding=0, output_size=None) -> Tensor:
    """The inverse of max_pool2d(return_indices=True): each value goes back to its flat index h * W + w in its
    plane, zeros elsewhere."""
    return _max_unpool(input, indices, 2, kernel_size, stride, padding, output_size, "max_unpool2d")


def _max_unpool(x: Tensor, indices: Tensor, dims: int, kernel_size, stride, padding, output_size,
                name: str) -> Tensor:
    _check_tensor(x, name)
    _check_tensor(indices, name, "indices")
    if x.ndim not in (dims + 1, dims + 2):
        raise RuntimeError(f"{name}: expected a {dims + 1}-D or {dims + 2}-D input, got shape {x.shape}")
    if indices.shape != x.shape or indices.dtype.name != "int64":
        raise RuntimeError(f"{name}: indices must be an int64 tensor of the input's shape {x.shape}, got "
                           f"{indices.dtype.name} of shape {indices.shape}")
    kernel = _tuple(kernel_size, dims, name, "kernel_size")
    strd = _tuple(kernel if stride is None or stride == () or stride == [] else stride, dims, name, "stride")
    pad = _tuple(padding, dims, name, "padding")
    size = _unpool_size(x, kernel, strd, pad, output_size, name)
    xp = x.xp
    planes = x.shape[:-dims]
    count = math.prod(planes)
    length = math.prod(x.shape[-dims:])
    idx = indices.data.reshape(count, length)
    plane_size = math.prod(size)
    if isinstance(idx, np.ndarray) and idx.size and (idx.min() < 0 or idx.max() >= plane_size):
        bad = int(idx.min()) if idx.min() < 0 else int(idx.max())
        raise RuntimeError(f"{name}: found an invalid max index {bad} (output planes are of size "
                           f"{' x '.join(map(str, size))})")
    rows = xp.arange(count)[:, None]
    out = xp.zeros((count, plane_size), dtype=x.data.dtype)
    out[rows, idx] = x.data.reshape(count, length)

    def backward(g):
        return (g.reshape(count, plane_size)[rows, idx].reshape(x.shape),)
    return from_op(out.reshape(planes + size), (x,), backward, name)


def _unpool_size(x: Tensor, kernel, stride, padding, output_size, name: str) -> tuple:
    """PyTorch's default (in - 1) * stride - 2 * padding + kernel, or output_size when it lies strictly within
    one stride of that."""
    dims = len(kernel)
    default = tuple((n - 1) * s - 2 * p + k for n, k, s, p in zip(x.shape[-dims:], kernel, stride, padding))
    if output_size is None:
        return default
    size = tuple(int(s) for s in output_size)
    if len(size) == dims + 2:
        size = size[2:]
    if len(size) != dims:
        raise ValueError(f"{name}: output_size should have {dims} or {dims + 2} entries, got {tuple(output_size)}")
    for d, (want, base, s) in enumerate(zip(size, default, stride)):
        if not base - s < want < base + s:
            raise ValueError(f"{name}: invalid output_size {size} (dim {d} must be between {base - s} and "
                             f"{base + s}, exclusive) for input {x.shape}")
    return size
