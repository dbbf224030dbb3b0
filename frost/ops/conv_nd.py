"""1-, 2- and 3-D convolutions (conv1d, conv3d) and transposed convolutions (conv_transpose1d/2d/3d), PyTorch
semantics, forward and backward together; conv2d keeps its own tuned paths in conv.py.

Both directions rest on two array helpers over the same column layout, (groups, Cin/groups * prod(kernel),
N * prod(out)): `_columns` (im2col, a strided view copied once) and `_scatter_columns` (col2im, one strided add per
kernel offset). A convolution gathers columns and multiplies by the weight; its input gradient multiplies by the
weight's transpose and scatters. A transposed convolution is that input gradient, so its forward scatters and its
backward gathers, from one set of columns of the output gradient shared by the input and weight gradients.
"""
from __future__ import annotations

import itertools
import math
from typing import NamedTuple

import numpy as np

from frost.ops.autocast_inputs import cast_inputs
from frost.autograd import is_grad_enabled
from frost.ops.matmul import matmul_arrays
from frost.tensor import Tensor, from_op

_SPATIAL_NAMES = {1: "L", 2: "H, W", 3: "D, H, W"}


class Geometry(NamedTuple):
    """The shapes of one convolution from `size` to `out` (for a transposed one: from its output to its input)."""
    n: int
    c: int
    size: tuple  # the input's spatial sizes
    cout: int
    kernel: tuple
    stride: tuple
    pads: tuple  # ((low, high), ...) per spatial dim
    dilation: tuple
    groups: int
    out: tuple  # the output's spatial sizes

    @property
    def padded(self) -> tuple:
        return tuple(s + lo + hi for s, (lo, hi) in zip(self.size, self.pads))

    @property
    def spatial_axes(self) -> tuple:
        return tuple(range(2, 2 + len(self.size)))


# ------------------------------------------------------------------ arguments


def _tuple(value, dims: int, what: str, name: str) -> tuple:
    """An int, or a tuple of `dims` ints (or of one, which stands for all dims, as PyTorch expands it)."""
    if isinstance(value, (int, np.integer)):
        return (int(value),) * dims
    try:
        values = tuple(int(v) for v in value)
    except TypeError:
        raise TypeError(f"{name}: {what} must be an int or a tuple of {dims} ints, got {value!r}") from None
    if len(values) == 1:
        return values * dims
    if len(values) != dims:
        raise ValueError(f"{name}: {what} must be an int or a tuple of {dims} ints, got {value!r}")
    return values


def _padding(padding, kernel: tuple, dilation: tuple, stride: tuple, name: str) -> tuple:
    """((low, high), ...) from an int, a tuple, 'valid' or 'same' ('same' puts the odd extra at the end, as
    PyTorch)."""
    if isinstance(padding, str):
        if padding == "valid":
            return ((0, 0),) * len(kernel)
        if padding != "same":
            raise ValueError(f"{name}: padding must be an int, a tuple, 'valid' or 'same', got {padding!r}")
        if any(s != 1 for s in stride):
            raise ValueError(f"{name}: padding='same' is not supported for strided convolutions (stride={stride})")
        totals = [d * (k - 1) for k, d in zip(kernel, dilation)]
        return tuple((t // 2, t - t // 2) for t in totals)
    pads = _tuple(padding, len(kernel), "padding", name)
    if min(pads) < 0:
        raise ValueError(f"{name}: padding must be non-negative, got {padding!r}")
    return tuple((p, p) for p in pads)


def _positive(values: tuple, what: str, name: str) -> tuple:
    if min(values) < 1:
        raise ValueError(f"{name}: {what} must be positive, got {values}")
    return values


def _check_ranks(x_shape: tuple, w_shape: tuple, dims: int, name: str) -> None:
    spatial = _SPATIAL_NAMES[dims]
    if len(x_shape) != dims + 2:
        raise RuntimeError(f"{name}: expected a {dims + 2}-D input (N, C, {spatial}) or a {dims + 1}-D one "
                           f"(C, {spatial}), got shape {tuple(x_shape)}")
    if len(w_shape) != dims + 2:
        raise RuntimeError(f"{name}: expected a {dims + 2}-D weight, got shape {tuple(w_shape)}")


def _check_groups(groups: int, channels: int, weight_channels: int, x_shape: tuple, w_shape: tuple,
                  name: str) -> None:
    """`channels` (the input's) and `weight_channels` (the weight's output side) must both split into groups."""
    if not isinstance(groups, (int, np.integer)) or groups < 1:
        raise RuntimeError(f"{name}: groups must be a positive integer, got {groups!r}")
    if channels % groups or weight_channels % groups:
        raise RuntimeError(f"{name}: groups={groups} must divide both the input channels ({channels}) and the "
                           f"weight's {weight_channels}; input {tuple(x_shape)}, weight {tuple(w_shape)}")


def _check_out(out: tuple, size: tuple, pads: tuple, reach: tuple, name: str, x_shape: tuple) -> tuple:
    if min(out) <= 0:
        raise RuntimeError(f"{name}: output size {out} is too small: input {tuple(x_shape)} padded to "
                           f"{tuple(s + lo + hi for s, (lo, hi) in zip(size, pads))} is smaller than the dilated "
                           f"kernel {reach}")
    return out


def conv_geometry(x_shape: tuple, w_shape: tuple, stride=1, padding=0, dilation=1, groups: int = 1,
                  name: str = "conv") -> Geometry:
    """Check a convolution's shapes (x: (N, C, *size), w: (Cout, C/groups, *kernel)) and work out its output."""
    dims = len(w_shape) - 2
    _check_ranks(x_shape, w_shape, dims, name)
    n, c, *size = x_shape
    cout, cin_g, *kernel = w_shape
    _check_groups(groups, c, cout, x_shape, w_shape, name)
    if cin_g * groups != c:
        raise RuntimeError(f"{name}: input of shape {tuple(x_shape)} has {c} channels but weight {tuple(w_shape)} "
                           f"with groups={groups} expects {cin_g * groups}")
    stride = _positive(_tuple(stride, dims, "stride", name), "stride", name)
    dilation = _positive(_tuple(dilation, dims, "dilation", name), "dilation", name)
    pads = _padding(padding, tuple(kernel), dilation, stride, name)
    reach = tuple(d * (k - 1) + 1 for k, d in zip(kernel, dilation))
    out = tuple((s + lo + hi - r) // st + 1 for s, (lo, hi), r, st in zip(size, pads, reach, stride))
    _check_out(out, tuple(size), pads, reach, name, x_shape)
    return Geometry(n, c, tuple(size), cout, tuple(kernel), stride, pads, dilation, groups, out)


def transpose_geometry(x_shape: tuple, w_shape: tuple, stride=1, padding=0, output_padding=0, groups: int = 1,
                       dilation=1, name: str = "conv_transpose") -> Geometry:
    """The geometry of the convolution whose input gradient a transposed convolution is: from the transposed
    convolution's output (N, Cout, *size) to its input x (N, Cin, *out), with weight w (Cin, Cout/groups, *kernel)."""
    dims = len(w_shape) - 2
    _check_ranks(x_shape, w_shape, dims, name)
    n, c, *x_size = x_shape
    cin, cout_g, *kernel = w_shape
    _check_groups(groups, c, cin, x_shape, w_shape, name)
    if cin != c:
        raise RuntimeError(f"{name}: input of shape {tuple(x_shape)} has {c} channels but weight {tuple(w_shape)} "
                           f"expects {cin} (its first dim)")
    if isinstance(padding, str):
        raise ValueError(f"{name}: padding must be an int or a tuple of {dims} ints, got {padding!r} (transposed "
                         f"convolutions take no 'same' or 'valid')")
    stride = _positive(_tuple(stride, dims, "stride", name), "stride", name)
    dilation = _positive(_tuple(dilation, dims, "dilation", name), "dilation", name)
    pads = _padding(padding, tuple(kernel), dilation, stride, name)
    extra = _tuple(output_padding, dims, "output_padding", name)
    if any(e < 0 or (e >= s and e >= d) for e, s, d in zip(extra, stride, dilation)):
        raise ValueError(f"{name}: output_padding {extra} must be non-negative and smaller than either stride "
                         f"{stride} or dilation {dilation}")
    size = tuple((i - 1) * s - 2 * p + d * (k - 1) + e + 1
                 for i, s, (p, _), d, k, e in zip(x_size, stride, pads, dilation, kernel, extra))
    if min(size) <= 0:
        raise RuntimeError(f"{name}: output size {size} is too small: input {tuple(x_shape)}, weight "
                           f"{tuple(w_shape)}, stride {stride}, padding {tuple(p for p, _ in pads)}, dilation "
                           f"{dilation}, output_padding {extra}")
    return Geometry(n, cout_g * groups, size, cin, tuple(kernel), stride, pads, dilation, groups, tuple(x_size))


# ------------------------------------------------------------------ array helpers


def _padded(xp, x, geo: Geometry):
    if not any(lo or hi for lo, hi in geo.pads):
        return x
    out = xp.zeros((geo.n, geo.c) + geo.padded, dtype=x.dtype)
    out[(slice(None), slice(None)) + tuple(slice(lo, lo + s) for s, (lo, _) in zip(geo.size, geo.pads))] = x
    return out


def _columns(xp, x, geo: Geometry):
    """im2col: x (N, C, *size) as C-contiguous columns (groups, C/groups * prod(kernel), N * prod(out)): one
    matrix per group, so that every product below is one batched matmul of 3-D operands (matmul_arrays: cuDNN on
    the GPU, which a CUDA-graph capture takes and which multiplies bfloat16, unlike CuPy's batched cuBLAS path)."""
    xpad = _padded(xp, x, geo)
    s_n, s_c, *s_sp = xpad.strides
    view = xp.lib.stride_tricks.as_strided(
        xpad, shape=(geo.n, geo.c) + geo.kernel + geo.out,
        strides=(s_n, s_c) + tuple(d * s for d, s in zip(geo.dilation, s_sp))
        + tuple(st * s for st, s in zip(geo.stride, s_sp)))
    dims = len(geo.kernel)
    channels_kernel_batch_out = (1,) + tuple(range(2, 2 + dims)) + (0,) + tuple(range(2 + dims, 2 + 2 * dims))
    rows = geo.c // geo.groups * math.prod(geo.kernel)
    return xp.ascontiguousarray(view.transpose(channels_kernel_batch_out)).reshape(
        geo.groups, rows, geo.n * math.prod(geo.out))


def _scatter_columns(xp, cols, geo: Geometry):
    """col2im: columns (groups, C/groups * prod(kernel), N * prod(out)) summed back into an (N, C, *size) array."""
    dims = len(geo.kernel)
    cols = cols.reshape((geo.c,) + geo.kernel + (geo.n,) + geo.out)
    cols = cols.transpose((dims + 1, 0) + tuple(range(1, dims + 1)) + tuple(range(dims + 2, 2 * dims + 2)))
    gx = xp.zeros((geo.n, geo.c) + geo.padded, dtype=cols.dtype)
    both = (slice(None), slice(None))
    for offset in itertools.product(*(range(k) for k in geo.kernel)):
        window = tuple(slice(o * d, o * d + st * (m - 1) + 1, st)
                       for o, d, st, m in zip(offset, geo.dilation, geo.stride, geo.out))
        gx[both + window] += cols[both + offset]
    return gx[both + tuple(slice(lo, lo + s) for s, (lo, _) in zip(geo.size, geo.pads))]


def _grouped_weight(w, geo: Geometry):
    """w (Cout, C/groups, *kernel) as (groups, Cout/groups, C/groups * prod(kernel))."""
    return w.reshape(geo.groups, geo.cout // geo.groups, -1)


def _grouped_out(xp, g, geo: Geometry):
    """An output-side array (N, Cout, *out) as (groups, Cout/groups, N * prod(out)), C-contiguous."""
    per_group = g.reshape(geo.n, geo.groups, geo.cout // geo.groups, math.prod(geo.out)).transpose(1, 2, 0, 3)
    return xp.ascontiguousarray(per_group).reshape(geo.groups, geo.cout // geo.groups, -1)


def _multiply(xp, w, cols, geo: Geometry):
    """The convolution from its columns: (N, Cout, *out)."""
    product = matmul_arrays(xp, _grouped_weight(w, geo), cols)  # (groups, Cout/groups, N * prod(out))
    return xp.ascontiguousarray(product.reshape((geo.cout, geo.n) + geo.out).swapaxes(0, 1))


def _multiply_transposed(xp, w, g, geo: Geometry):
    """The input gradient from an output gradient g (N, Cout, *out): w's transpose times g, scattered back."""
    return _scatter_columns(xp, matmul_arrays(xp, _grouped_weight(w, geo).swapaxes(1, 2), _grouped_out(xp, g, geo)),
                            geo)


def _weight_gradient(xp, g, cols, geo: Geometry):
    """d(loss)/d(w) of a convolution, (Cout, C/groups, *kernel): g times the columns' transpose, summed over the
    batch in one matmul per group (batch and positions folded into its inner dim)."""
    product = matmul_arrays(xp, _grouped_out(xp, g, geo), cols.swapaxes(1, 2))
    return product.reshape((geo.cout, geo.c // geo.groups) + geo.kernel)


# ------------------------------------------------------------------ the differentiable ops


def check_operands(x: Tensor, weight: Tensor, bias: Tensor | None, dims: int, name: str) -> None:
    """Tensors on one device, of one floating-point dtype, and a weight of rank dims + 2 (PyTorch's messages)."""
    for what, t in (("input", x), ("weight", weight), ("bias", bias)):
        if t is not None and not isinstance(t, Tensor):
            raise TypeError(f"{name}: {what} must be a Tensor, got {type(t).__name__}")
    for what, t in (("weight", weight), ("bias", bias)):
        if t is None:
            continue
        if t.device != x.device:
            raise RuntimeError(f"{name}: input and {what} are on different devices: input {_describe(x)}, "
                               f"{what} {_describe(t)}")
        if t.dtype != x.dtype:
            raise RuntimeError(f"{name}: Input type ({x.dtype.name}) and {what} type ({t.dtype.name}) should be the "
                               f"same: input {x.shape}, {what} {t.shape}")
    if not x.dtype.is_floating_point:
        raise RuntimeError(f"{name}: expected floating-point tensors, got {x.dtype.name}")
    if weight.ndim != dims + 2:
        raise RuntimeError(f"{name}: expected a {dims + 2}-D weight (out, in / groups, {_SPATIAL_NAMES[dims]}), got "
                           f"shape {weight.shape}")
    if x.ndim not in (dims + 1, dims + 2):
        _check_ranks(x.shape, weight.shape, dims, name)


def _describe(t: Tensor) -> str:
    return f"{t.shape} {t.dtype.name} on {t.device}"


def conv_compute_dtype(a):
    """Half-precision CPU arrays are computed in float32 (NumPy has no fast half matmul)."""
    return np.float32 if isinstance(a, np.ndarray) and a.dtype.itemsize < 4 else a.dtype


def _prepare(x: Tensor, weight: Tensor, bias: Tensor | None, dims: int, name: str):
    """Autocast, checked operands, and whether x came unbatched (then it gets a batch dim of 1)."""
    x, weight, bias = cast_inputs(x, weight, bias)
    check_operands(x, weight, bias, dims, name)
    unbatched = x.ndim == dims + 1
    return (x.unsqueeze(0) if unbatched else x), weight, bias, unbatched


def _bias_gradient(g, geo: Geometry, bias: Tensor | None, out_dtype):
    if bias is None or not bias.requires_grad:
        return None
    return g.sum(axis=(0,) + geo.spatial_axes).astype(out_dtype, copy=False)


def _convolution(x: Tensor, weight: Tensor, bias: Tensor | None, stride, padding, dilation, groups: int,
                 dims: int, name: str) -> Tensor:
    x, weight, bias, unbatched = _prepare(x, weight, bias, dims, name)
    geo = conv_geometry(x.shape, weight.shape, stride, padding, dilation, groups, name)
    if bias is not None and bias.shape != (geo.cout,):
        raise RuntimeError(f"{name}: bias of shape {bias.shape} does not fit weight {weight.shape}; expected "
                           f"({geo.cout},)")
    xp, cdt, out_dtype = x.xp, conv_compute_dtype(x.data), x.data.dtype
    xa, wa = x.data.astype(cdt, copy=False), weight.data.astype(cdt, copy=False)
    cols = _columns(xp, xa, geo)
    out = _multiply(xp, wa, cols, geo)
    if bias is not None:
        out += bias.data.astype(cdt, copy=False).reshape((geo.cout,) + (1,) * dims)
    if not (weight.requires_grad and is_grad_enabled()):
        cols = None  # kept only for the weight gradient

    def backward(g):
        g = g.astype(cdt, copy=False)
        gx = _multiply_transposed(xp, wa, g, geo).astype(out_dtype, copy=False) if x.requires_grad else None
        gw = _weight_gradient(xp, g, cols, geo).astype(out_dtype, copy=False) if weight.requires_grad else None
        return (gx, gw) if bias is None else (gx, gw, _bias_gradient(g, geo, bias, out_dtype))
    parents = (x, weight) if bias is None else (x, weight, bias)
    derivative = convolution_derivative(x, weight, bias, (stride, padding, dilation, groups), dims, name)
    result = from_op(out.astype(out_dtype, copy=False), parents, backward, name, derivative)
    return result.squeeze(0) if unbatched else result


# ------------------------------------------------------------------ Tensor-level backwards (create_graph=True)
# A convolution's input gradient is a transposed convolution of g, and its weight gradient a convolution of x with
# g (batch and channels swapped, stride and dilation swapped); a transposed convolution's, the other way round. Both
# are these differentiable ops again, so gradients of gradients follow (groups=1 and symmetric padding only).


def _symmetric_pads(geo: Geometry, groups: int, name: str) -> tuple:
    if groups != 1 or any(lo != hi for lo, hi in geo.pads):
        raise RuntimeError(f"create_graph=True: the backward of '{name}' is not differentiable in Frost yet with "
                           f"groups={groups} or uneven padding {geo.pads}; only groups=1 and even padding are")
    return tuple(lo for lo, _ in geo.pads)


def weight_gradient(x: Tensor, g: Tensor, w_shape: tuple, stride: tuple, padding: tuple, dilation: tuple) -> Tensor:
    """d(loss)/d(w) of the convolution of x (N, C, *size) giving g (N, Cout, *out), groups 1, as a convolution: x's
    channels over g's, the batch summed as the channels are, cut to the kernel (a strided one reaches past it)."""
    dims = len(w_shape) - 2
    swap = (1, 0) + tuple(range(2, dims + 2))
    full = _convolution(x.permute(swap), g.permute(swap), None, dilation, padding, stride, 1, dims, f"conv{dims}d")
    corner = (slice(None), slice(None)) + tuple(slice(0, k) for k in w_shape[2:])
    return full[corner].permute(swap)


def convolution_derivative(x: Tensor, weight: Tensor, bias: Tensor | None, conv_args: tuple, dims: int, name: str):
    """The Tensor-level backward of a convolution (conv_args: stride, padding, dilation, groups; x batched)."""
    def tensor_backward(g: Tensor, out: Tensor) -> tuple:
        geo = conv_geometry(x.shape, weight.shape, *conv_args, name=name)
        pads = _symmetric_pads(geo, conv_args[3], name)
        # the rows and columns past the last window reached (a stride that does not divide) come back as zeros
        extra = tuple(s + 2 * p - (d * (k - 1) + 1) - st * (o - 1)
                      for s, p, d, k, st, o in zip(geo.size, pads, geo.dilation, geo.kernel, geo.stride, geo.out))
        gx = gw = None
        if x.requires_grad:
            gx = _transposed_convolution(g, weight, None, geo.stride, pads, extra, 1, geo.dilation, dims,
                                         f"conv_transpose{dims}d")
        if weight.requires_grad:
            gw = weight_gradient(x, g, weight.shape, geo.stride, pads, geo.dilation)
        return (gx, gw) if bias is None else (gx, gw, g.sum((0,) + geo.spatial_axes) if bias.requires_grad else None)
    return tensor_backward


def _transposed_derivative(x: Tensor, weight: Tensor, bias: Tensor | None, geo: Geometry, dims: int, name: str):
    """The Tensor-level backward of a transposed convolution (the input gradient of the convolution `geo` from its
    output back to x): g's convolution for x, and the convolution's weight gradient with g as its input."""
    def tensor_backward(g: Tensor, out: Tensor) -> tuple:
        pads = _symmetric_pads(geo, geo.groups, name)
        gx = gw = None
        if x.requires_grad:
            gx = _convolution(g, weight, None, geo.stride, pads, geo.dilation, 1, dims, f"conv{dims}d")
        if weight.requires_grad:
            gw = weight_gradient(g, x, weight.shape, geo.stride, pads, geo.dilation)
        return (gx, gw) if bias is None else (gx, gw, g.sum((0,) + geo.spatial_axes) if bias.requires_grad else None)
    return tensor_backward


def _transposed_convolution(x: Tensor, weight: Tensor, bias: Tensor | None, stride, padding, output_padding,
                            groups: int, dilation, dims: int, name: str) -> Tensor:
    x, weight, bias, unbatched = _prepare(x, weight, bias, dims, name)
    geo = transpose_geometry(x.shape, weight.shape, stride, padding, output_padding, groups, dilation, name)
    if bias is not None and bias.shape != (geo.c,):
        raise RuntimeError(f"{name}: bias of shape {bias.shape} does not fit weight {weight.shape} with "
                           f"groups={groups}; expected ({geo.c},)")
    xp, cdt, out_dtype = x.xp, conv_compute_dtype(x.data), x.data.dtype
    xa, wa = x.data.astype(cdt, copy=False), weight.data.astype(cdt, copy=False)
    out = _multiply_transposed(xp, wa, xa, geo)
    if bias is not None:
        out += bias.data.astype(cdt, copy=False).reshape((geo.c,) + (1,) * dims)

    def backward(g):
        # the transposed convolution's input gradient is the forward convolution of g: one set of columns of g
        # serves it and the weight gradient
        g = g.astype(cdt, copy=False)
        cols = _columns(xp, g, geo) if x.requires_grad or weight.requires_grad else None
        gx = _multiply(xp, wa, cols, geo).astype(out_dtype, copy=False) if x.requires_grad else None
        gw = _weight_gradient(xp, xa, cols, geo).astype(out_dtype, copy=False) if weight.requires_grad else None
        return (gx, gw) if bias is None else (gx, gw, _bias_gradient(g, geo, bias, out_dtype))
    parents = (x, weight) if bias is None else (x, weight, bias)
    derivative = _transposed_derivative(x, weight, bias, geo, dims, name)
    result = from_op(out.astype(out_dtype, copy=False), parents, backward, name, derivative)
    return result.squeeze(0) if unbatched else result


def conv1d(input: Tensor, weight: Tensor, bias: Tensor | None = None, stride=1, padding=0, dilation=1,
           groups: int = 1) -> Tensor:
    """1-D convolution over an (N, C, L) or (C, L) input, as torch.nn.functional.conv1d."""
    return _convolution(input, weight, bias, stride, padding, dilation, groups, 1, "conv1d")


def conv3d(input: Tensor, weight: Tensor, bias: Tensor | None = None, stride=1, padding=0, dilation=1,
           groups: int = 1) -> Tensor:
    """3-D convolution over an (N, C, D, H, W) or (C, D, H, W) input, as torch.nn.functional.conv3d."""
    return _convolution(input, weight, bias, stride, padding, dilation, groups, 3, "conv3d")


def conv_transpose1d(input: Tensor, weight: Tensor, bias: Tensor | None = None, stride=1, padding=0,
                     output_padding=0, groups: int = 1, dilation=1) -> Tensor:
    """1-D transposed convolution (weight (Cin, Cout/groups, k)), as torch.nn.functional.conv_transpose1d."""
    return _transposed_convolution(input, weight, bias, stride, padding, output_padding, groups, dilation, 1,
                                   "conv_transpose1d")


def conv_transpose2d(input: Tensor, weight: Tensor, bias: Tensor | None = None, stride=1, padding=0,
                     output_padding=0, groups: int = 1, dilation=1) -> Tensor:
    """2-D transposed convolution (weight (Cin, Cout/groups, kh, kw)), as torch.nn.functional.conv_transpose2d."""
    return _transposed_convolution(input, weight, bias, stride, padding, output_padding, groups, dilation, 2,
                                   "conv_transpose2d")


def conv_transpose3d(input: Tensor, weight: Tensor, bias: Tensor | None = None, stride=1, padding=0,
                     output_padding=0, groups: int = 1, dilation=1) -> Tensor:
    """3-D transposed convolution (weight (Cin, Cout/groups, kd, kh, kw)), as
    torch.nn.functional.conv_transpose3d."""
    return _transposed_convolution(input, weight, bias, stride, padding, output_padding, groups, dilation, 3,
                                   "conv_transpose3d")
