"""2-D convolution (PyTorch semantics) by im2col and one BLAS matmul; forward and both backward passes together."""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from frost import dispatch
from frost.ops.autocast_inputs import cast_inputs, cast_source
from frost.autograd import grad_destination, gradient_branch, is_grad_enabled
from frost.layout import array_module, empty_like_format
from frost.ops.conv_nd import check_operands, conv_compute_dtype, convolution_derivative
from frost.ops.matmul import matmul_arrays
from frost.tensor import Tensor, from_op

# Layout note. Columns are built as (C, kh, kw, N, Ho, Wo): for each input channel and kernel offset, a
# contiguous run over the whole batch. Then the forward is a single (Cout, K) @ (K, N*Ho*Wo) matmul per group
# whose result (Cout, N, Ho, Wo) is returned as a transposed view in NCHW order ("channel-major" memory).
# Elementwise ops downstream keep that memory order, so the next convolution's im2col and the gradient
# reshapes in the backward become plain contiguous copies or free views.
#
# The Tensor-level conv2d reaches the arrays only through conv2d_forward_stats, conv2d_backward_input and
# conv2d_backward_weight (plus, on the CPU, im2col columns kept from the forward for the weight gradient). Each asks
# frost.dispatch for a fast path first ("conv2d_forward", "conv2d_backward_input", "conv2d_backward_weight", with the
# Geometry as `geo`; on the GPU, frost/accel/conv.py: cuDNN or our kernels), and the forward offers the layer a
# head start on the backward ("conv2d_prepare_backward"). Without one, the im2col code below runs, NumPy or CuPy.


class Geometry(NamedTuple):
    """Everything about one convolution's shapes, normalised once."""
    n: int
    c: int
    h: int
    w: int
    cout: int
    kh: int
    kw: int
    sh: int
    sw: int
    ph: tuple  # (top, bottom)
    pw: tuple  # (left, right)
    dh: int
    dw: int
    groups: int
    ho: int
    wo: int


def int_pair(value, what: str, op: str = "conv2d") -> tuple:
    """(h, w) from an int or a one- or two-int sequence: an op's kernel size, stride, padding or dilation."""
    if isinstance(value, (int, np.integer)):
        return int(value), int(value)
    pair = tuple(int(v) for v in value)
    if len(pair) == 1:
        return pair[0], pair[0]
    if len(pair) != 2:
        raise ValueError(f"{op}: {what} must be an int or a pair of ints, got {value!r}")
    return pair


def _padding(padding, kernel: tuple, dilation: tuple, stride: tuple) -> tuple:
    """((top, bottom), (left, right)) from an int, a pair, 'valid' or 'same'."""
    if isinstance(padding, str):
        if padding == "valid":
            return (0, 0), (0, 0)
        if padding != "same":
            raise ValueError(f"conv2d: padding must be an int, a pair, 'valid' or 'same', got {padding!r}")
        if stride != (1, 1):
            raise ValueError(f"conv2d: padding='same' is not supported for strided convolutions (stride={stride})")
        pads = []
        for k, d in zip(kernel, dilation):
            total = d * (k - 1)
            pads.append((total // 2, total - total // 2))  # the extra row goes at the end, as in PyTorch
        return tuple(pads)
    ph, pw = int_pair(padding, "padding")
    if ph < 0 or pw < 0:
        raise ValueError(f"conv2d: padding must be non-negative, got {padding!r}")
    return (ph, ph), (pw, pw)


def geometry(x_shape: tuple, w_shape: tuple, stride=1, padding=0, dilation=1, groups: int = 1) -> Geometry:
    """Check the shapes of a convolution and work out its output size."""
    if len(x_shape) != 4:
        raise RuntimeError(f"conv2d: expected a 4-D input (N, C, H, W) or a 3-D one (C, H, W), "
                           f"got shape {tuple(x_shape)}")
    if len(w_shape) != 4:
        raise RuntimeError(f"conv2d: expected a 4-D weight (Cout, Cin/groups, kh, kw), got shape {tuple(w_shape)}")
    n, c, h, w = x_shape
    cout, cin_g, kh, kw = w_shape
    if groups < 1:
        raise RuntimeError(f"conv2d: groups must be positive, got {groups}")
    if c % groups or cout % groups:
        raise RuntimeError(f"conv2d: groups={groups} must divide both the input channels ({c}) and the output "
                           f"channels ({cout}); input {tuple(x_shape)}, weight {tuple(w_shape)}")
    if cin_g * groups != c:
        raise RuntimeError(f"conv2d: input of shape {tuple(x_shape)} has {c} channels but weight {tuple(w_shape)} "
                           f"with groups={groups} expects {cin_g * groups}")
    sh, sw = int_pair(stride, "stride")
    dh, dw = int_pair(dilation, "dilation")
    if min(sh, sw, dh, dw) < 1:
        raise ValueError(f"conv2d: stride and dilation must be positive, got stride={stride!r} dilation={dilation!r}")
    ph, pw = _padding(padding, (kh, kw), (dh, dw), (sh, sw))
    ho = (h + ph[0] + ph[1] - dh * (kh - 1) - 1) // sh + 1
    wo = (w + pw[0] + pw[1] - dw * (kw - 1) - 1) // sw + 1
    if ho <= 0 or wo <= 0:
        raise RuntimeError(f"conv2d: output size ({ho} x {wo}) is too small: input {tuple(x_shape)} padded to "
                           f"({h + sum(ph)} x {w + sum(pw)}) is smaller than the dilated kernel "
                           f"({dh * (kh - 1) + 1} x {dw * (kw - 1) + 1})")
    return Geometry(n, c, h, w, cout, kh, kw, sh, sw, ph, pw, dh, dw, groups, ho, wo)


# ------------------------------------------------------------------ array-level kernels


def _padded_channel_major(x, geo: Geometry):
    """x as a (C, N, Hp, Wp) array (a view when there is no padding)."""
    xt = x.transpose(1, 0, 2, 3)
    (pt, pb), (pl, pr) = geo.ph, geo.pw
    if pt == pb == pl == pr == 0:
        return xt
    xp = array_module(x)
    out = xp.zeros((geo.c, geo.n, geo.h + pt + pb, geo.w + pl + pr), dtype=x.dtype)
    out[:, :, pt:pt + geo.h, pl:pl + geo.w] = xt
    return out


def im2col(x, geo: Geometry):
    """Columns (groups, Cin/groups * kh * kw, N * Ho * Wo), C-contiguous, from a strided view of x."""
    xp = array_module(x)
    xpad = _padded_channel_major(x, geo)
    s_c, s_n, s_h, s_w = xpad.strides
    view = xp.lib.stride_tricks.as_strided(
        xpad, shape=(geo.c, geo.kh, geo.kw, geo.n, geo.ho, geo.wo),
        strides=(s_c, geo.dh * s_h, geo.dw * s_w, s_n, geo.sh * s_h, geo.sw * s_w))
    k_g = geo.c // geo.groups * geo.kh * geo.kw
    return xp.ascontiguousarray(view).reshape(geo.groups, k_g, geo.n * geo.ho * geo.wo)


def _grad_channel_major(g, geo: Geometry):
    """The output gradient as (groups, Cout/groups, N * Ho * Wo); free when g is channel-major already."""
    xp = array_module(g)
    g2 = xp.ascontiguousarray(g.transpose(1, 0, 2, 3))
    return g2.reshape(geo.groups, geo.cout // geo.groups, geo.n * geo.ho * geo.wo)


def _grouped_weight(w, geo: Geometry):
    return w.reshape(geo.groups, geo.cout // geo.groups, -1)


def _product(xp, a, b, out=None):
    """a @ b in a's dtype, through matmul_arrays (CuPy has no bfloat16 product; the GPU's is capturable)."""
    product = matmul_arrays(xp, a, b, out)
    return product if product.dtype == a.dtype else product.astype(a.dtype)


def _forward_from_cols(cols, w, geo: Geometry, bias=None):
    xp = array_module(cols)
    out = _product(xp, _grouped_weight(w, geo), cols).reshape(geo.cout, geo.n, geo.ho, geo.wo)
    if bias is not None:
        out += bias.reshape(geo.cout, 1, 1, 1)
    return out.transpose(1, 0, 2, 3)


def _backward_weight_from_cols(g2, cols, geo: Geometry, out=None):
    xp = array_module(cols)
    if out is not None:  # a C-contiguous (Cout, C/groups, kh, kw) array, e.g. the weight's .grad buffer
        _product(xp, g2, cols.transpose(0, 2, 1), out=out.reshape(geo.groups, geo.cout // geo.groups, -1))
        return out
    gw = _product(xp, g2, cols.transpose(0, 2, 1))
    return gw.reshape(geo.cout, geo.c // geo.groups, geo.kh, geo.kw)


def _backward_input_as_conv(g, w, geo: Geometry):
    """For stride 1 the input gradient is itself a convolution: g, padded to 'full', with the flipped,
    transposed weight. One im2col of g and one matmul beat the scatter of col2im when Cout is not much
    larger than Cin."""
    groups, cout_g, cin_g = geo.groups, geo.cout // geo.groups, geo.c // geo.groups
    w_flipped = w.reshape(groups, cout_g, cin_g, geo.kh, geo.kw)[:, :, :, ::-1, ::-1]
    w_t = w_flipped.transpose(0, 2, 1, 3, 4).reshape(geo.c, cout_g, geo.kh, geo.kw)
    reach_h, reach_w = geo.dh * (geo.kh - 1), geo.dw * (geo.kw - 1)
    full = Geometry(geo.n, geo.cout, geo.ho, geo.wo, geo.c, geo.kh, geo.kw, 1, 1,
                    (reach_h - geo.ph[0], reach_h - geo.ph[1]), (reach_w - geo.pw[0], reach_w - geo.pw[1]),
                    geo.dh, geo.dw, groups, geo.h, geo.w)
    return _forward_from_cols(im2col(g, full), w_t, full)


def _input_grad_is_a_conv(geo: Geometry) -> bool:
    reach_h, reach_w = geo.dh * (geo.kh - 1), geo.dw * (geo.kw - 1)
    return (geo.sh == geo.sw == 1 and geo.cout <= 2 * geo.c
            and max(geo.ph) <= reach_h and max(geo.pw) <= reach_w)


def _backward_input_from_grad(g2, w, geo: Geometry):
    """col2im: scatter the column gradient back, one strided add per kernel offset."""
    xp = array_module(g2)
    gcols = _product(xp, _grouped_weight(w, geo).transpose(0, 2, 1), g2)
    gcols = gcols.reshape(geo.c, geo.kh, geo.kw, geo.n, geo.ho, geo.wo)
    (pt, pb), (pl, pr) = geo.ph, geo.pw
    gx = xp.zeros((geo.c, geo.n, geo.h + pt + pb, geo.w + pl + pr), dtype=g2.dtype)
    h_span, w_span = geo.sh * (geo.ho - 1) + 1, geo.sw * (geo.wo - 1) + 1
    for i in range(geo.kh):
        for j in range(geo.kw):
            top, left = i * geo.dh, j * geo.dw
            gx[:, :, top:top + h_span:geo.sh, left:left + w_span:geo.sw] += gcols[:, i, j]
    return gx[:, :, pt:pt + geo.h, pl:pl + geo.w].transpose(1, 0, 2, 3)


def conv2d_forward(x, w, stride=1, padding=0, dilation=1, groups: int = 1, bias=None):
    """The convolution of raw arrays x (N, C, H, W) and w (Cout, C/groups, kh, kw); returns (N, Cout, Ho, Wo)."""
    return conv2d_forward_stats(x, w, stride, padding, dilation, groups, bias, stats=False)[0]


def conv2d_forward_stats(x, w, stride=1, padding=0, dilation=1, groups: int = 1, bias=None, stats: bool = True):
    """conv2d_forward, returning (y, batch norm's channel statistics of y or None): stats asks a fast path that can
    (frost.accel.conv_fprop_mma's epilogue, bias None) to make them on the way; the reference makes none."""
    geo = geometry(x.shape, w.shape, stride, padding, dilation, groups)
    fast = dispatch.lookup("conv2d_forward", x, w, geo=geo)
    if fast is not None:
        return fast(x, w, geo, bias, stats)
    return _forward_from_cols(im2col(x, geo), w, geo, bias), None


def conv2d_backward_input(g, w, x_shape: tuple, stride=1, padding=0, dilation=1, groups: int = 1):
    """d(loss)/d(x) from the output gradient g (N, Cout, Ho, Wo) and the weight."""
    geo = geometry(tuple(x_shape), w.shape, stride, padding, dilation, groups)
    fast = dispatch.lookup("conv2d_backward_input", g, w, geo=geo)
    if fast is not None:
        return fast(g, w, tuple(x_shape), geo)
    if _input_grad_is_a_conv(geo):
        return _backward_input_as_conv(g, w, geo)
    return _backward_input_from_grad(_grad_channel_major(g, geo), w, geo)


def conv2d_backward_weight(g, x, w_shape: tuple, stride=1, padding=0, dilation=1, groups: int = 1, out=None,
                           defer: bool = False):
    """d(loss)/d(w) from the output gradient g (N, Cout, Ho, Wo) and the input x; written into `out` (a dense,
    NCHW or channels-last, array of w_shape and x's dtype, or float32 for bf16 operands on the GPU: autocast's
    master weight) and returned as `out` itself when given. defer: `out` is a .grad buffer claimed inside
    backward(), which a fast path may complete later (our kernel's last sum rides with the next weight gradient's
    launch); the reference completes it at once."""
    geo = geometry(x.shape, tuple(w_shape), stride, padding, dilation, groups)
    fast = dispatch.lookup("conv2d_backward_weight", g, x, geo=geo)
    if fast is not None:
        return fast(g, x, tuple(w_shape), geo, out, defer)
    return _backward_weight_from_cols(_grad_channel_major(g, geo), im2col(x, geo), geo, out=out)


# ------------------------------------------------------------------ the differentiable op


def _prepare_backward(y, x, w, geo: Geometry, weight_gradient: bool, input_gradient: bool) -> None:
    """Let a fast path start on the backward's kernels for this shape (compiles, in the background) while the
    forward goes on; dy will be shaped like y."""
    prepare = dispatch.lookup("conv2d_prepare_backward", x, w, geo=geo)
    if prepare is not None:
        prepare(y, x, w, geo, weight_gradient=weight_gradient, input_gradient=input_gradient)


def _check_operands(x: Tensor, weight: Tensor, bias: Tensor | None) -> None:
    check_operands(x, weight, bias, 2, "conv2d")
    if bias is not None and bias.shape != (weight.shape[0],):
        raise RuntimeError(f"conv2d: bias of shape {bias.shape} does not fit weight {weight.shape}; "
                           f"expected ({weight.shape[0]},)")


def conv2d(x: Tensor, weight: Tensor, bias: Tensor | None = None, stride=1, padding=0, dilation=1,
           groups: int = 1) -> Tensor:
    """2-D convolution over an (N, C, H, W) or (C, H, W) input, as torch.nn.functional.conv2d."""
    x, weight, bias = cast_inputs(x, weight, bias)
    _check_operands(x, weight, bias)
    if x.ndim == 3:
        return conv2d(x.unsqueeze(0), weight, bias, stride, padding, dilation, groups).squeeze(0)
    geo = geometry(x.shape, weight.shape, stride, padding, dilation, groups)
    cdt = conv_compute_dtype(x.data)
    xa, wa = x.data.astype(cdt, copy=False), weight.data.astype(cdt, copy=False)
    ba = None if bias is None else bias.data.astype(cdt, copy=False)
    conv_args = (stride, padding, dilation, groups)
    cols = stats = None
    if isinstance(xa, np.ndarray) and weight.requires_grad:
        # on the CPU the im2col columns are kept for the weight gradient instead of being rebuilt
        cols = im2col(xa, geo)
        out = _forward_from_cols(cols, wa, geo, ba)
    else:
        # in training (gradients wanted) batch norm usually follows: a fast path may make its statistics on the way
        out, stats = conv2d_forward_stats(xa, wa, *conv_args, bias=ba, stats=weight.requires_grad and is_grad_enabled())
        if is_grad_enabled() and (weight.requires_grad or x.requires_grad):
            _prepare_backward(out, xa, wa, geo, weight.requires_grad, x.requires_grad)
    out_dtype = x.data.dtype
    parents = (x, weight) if bias is None else (x, weight, bias)

    def backward(g):
        g = g.astype(cdt, copy=False)
        gx = gw = gb = None
        if weight.requires_grad:  # first: in a captured step it may branch off before the input gradient
            gw = weight_gradient(g)
        if x.requires_grad:
            gx = conv2d_backward_input(g, wa, xa.shape, *conv_args).astype(out_dtype, copy=False)
        if bias is None:
            return gx, gw
        if bias.requires_grad:
            dest = grad_destination(bias) if cdt == out_dtype else None
            gb = g.sum(axis=(0, 2, 3), out=dest).astype(out_dtype, copy=False)
        return gx, gw, gb

    def weight_gradient(g):
        # straight into the weight's zeroed .grad buffer when there is one (no fresh array, no add); such a
        # gradient is read only after backward()'s completions, so a captured step computes it on a side branch
        dest = grad_destination(weight) if cdt == out_dtype else None
        # autocast on the GPU: dW in float32 straight into the master weight's .grad
        master = cast_source(weight) if str(xa.dtype) == "bfloat16" and not isinstance(xa, np.ndarray) else None
        if cols is not None:
            return _backward_weight_from_cols(_grad_channel_major(g, geo), cols, geo, out=dest).astype(out_dtype,
                                                                                                      copy=False)
        claimed = dest
        if master is not None:
            claimed = grad_destination(master)
            dest = empty_like_format(wa.shape, master.data) if claimed is None else claimed
        with gradient_branch(g, xa, when=claimed is not None):
            gw = conv2d_backward_weight(g, xa, wa.shape, *conv_args, out=dest, defer=claimed is not None)
        return gw if master is not None else gw.astype(out_dtype, copy=False)

    derivative = convolution_derivative(x, weight, bias, conv_args, 2, "conv2d")
    result = from_op(out.astype(out_dtype, copy=False), parents, backward, "conv2d", derivative)
    if stats is not None and result.data is stats.y:
        result._channel_stats = stats   # batch_norm_act reads them (frost.accel.batch_norm.conv_stats_of)
    return result
