"""2-D convolution on the GPU: cuDNN's tuned plans, or Frost's own kernels where they time faster (the tensor-core
forward, conv_fprop_mma, also turned into the input gradient; the split-K weight gradient, conv_wgrad and
conv_wgrad_mma), decided once per shape by measurement and remembered on disk. Registered with frost.dispatch for the
array functions of frost/ops/conv.py, whose im2col reference runs wherever these decline (NumPy arrays, groups > 1,
uneven padding, no cuDNN)."""
from __future__ import annotations

from frost import dispatch
from frost.accel import conv_fprop_mma, conv_wgrad
from frost.backend import cudnn
from frost.layout import array_module, dense_like, empty_like_format, is_channels_last
from frost.ops.conv import Geometry


def cudnn_args(geo: Geometry) -> tuple:
    """(stride, padding, dilation) as cuDNN and our kernels take them: one padding per side pair."""
    return (geo.sh, geo.sw), (geo.ph[0], geo.pw[0]), (geo.dh, geo.dw)


CUDNN_TYPES = ("float16", "bfloat16", "float32")  # float64: no cuDNN engine plans one here (H200, cuDNN 9.19)


def cudnn_runs(*operands, geo: Geometry) -> bool:
    """Whether cuDNN can run this convolution (one group, the same padding on both sides of each axis) and is here.
    Our kernels are chosen only against cuDNN's plan, so they take no call that cuDNN does not."""
    return geo.groups == 1 and geo.ph[0] == geo.ph[1] and geo.pw[0] == geo.pw[1] and cudnn.available()


def _dense(array, xp):
    """cuDNN needs real strides: no broadcast (zero) strides, no negative ones; NCHW or channels-last memory."""
    return array if array.flags.c_contiguous or is_channels_last(array) else xp.ascontiguousarray(array)


@dispatch.register("conv2d_forward", device="cuda", dtypes=CUDNN_TYPES, applies=cudnn_runs)
def conv2d_forward_cuda(x, w, geo: Geometry, bias=None, stats: bool = True) -> tuple:
    """conv2d_forward_stats on the GPU: (y, conv_fprop_mma.ChannelStats of y or None); stats asks our forward kernel,
    where it runs (bias None), to make batch norm's partial statistics of y in its epilogue."""
    args = cudnn_args(geo)
    xp = array_module(x)
    x, w, y_shape = _dense(x, xp), _dense(w, xp), (geo.n, geo.cout, geo.ho, geo.wo)
    stats = stats and bias is None
    made = None
    # our tensor-core kernel where it times faster than cuDNN's best plan (decided once per shape, remembered)
    if conv_fprop_mma.supported(x, w, *args, geo.groups) and conv_fprop_mma.choose(
            x, w, args[1], lambda: cudnn.conv2d_forward(x, w, y_shape, *args), stride=args[0], with_stats=stats):
        out, made = conv_fprop_mma.conv2d_forward_gpu_stats(x, w, args[1], empty_like_format(y_shape, x),
                                                            stride=args[0], stats=stats)
    else:
        out = cudnn.conv2d_forward(x, w, y_shape, *args)
    if bias is not None:
        out += bias.reshape(1, -1, 1, 1)
    return out, made


@dispatch.register("conv2d_backward_input", device="cuda", dtypes=CUDNN_TYPES, applies=cudnn_runs)
def conv2d_backward_input_cuda(g, w, x_shape: tuple, geo: Geometry):
    """conv2d_backward_input on the GPU: cuDNN's, or a forward convolution of ours turned (flipped weight) where it
    times faster (FROST_CONV_DGRAD_MMA=0: never)."""
    args = cudnn_args(geo)
    xp = array_module(g)
    g, w, x_shape = _dense(g, xp), _dense(w, xp), tuple(x_shape)
    if conv_fprop_mma.supported(g, w, *args, geo.groups, flip=True) and conv_fprop_mma.choose(
            g, w, args[1], lambda: cudnn.conv2d_backward_input(g, w, x_shape, *args), flip=True,
            stride=args[0], out_hw=x_shape[2:]):
        return conv_fprop_mma.conv2d_forward_gpu(g, w, args[1], empty_like_format(x_shape, g), flip=True,
                                                 stride=args[0])
    return cudnn.conv2d_backward_input(g, w, x_shape, *args)


@dispatch.register("conv2d_backward_weight", device="cuda", dtypes=CUDNN_TYPES, applies=cudnn_runs)
def conv2d_backward_weight_cuda(g, x, w_shape: tuple, geo: Geometry, out=None, defer: bool = False):
    """conv2d_backward_weight on the GPU: our split-K kernel where it times faster than cuDNN's best plan (decided
    once per shape, remembered), else cuDNN's. `out` and `defer` as conv2d_backward_weight takes them: a float32 `out`
    for bf16 operands gets cuDNN's dW converted; with defer our kernel may complete `out` with a later launch."""
    xp = array_module(x)
    g, x, w_shape = _dense(g, xp), _dense(x, xp), tuple(w_shape)
    if g.ndim == 4 and conv_wgrad.input_layout(g, x) is None:
        g = dense_like(g, x)  # dy in x's memory format: our kernel reads both alike (one copy)
    args = cudnn_args(geo)
    stride_hw, padding_hw, dilation_hw = args
    ours = (out is None or str(out.dtype) == "float32") and conv_wgrad.supported(  # ours writes float32 dW
        g, x, w_shape, stride_hw, padding_hw, dilation_hw, geo.groups)

    def with_cudnn():
        if out is not None and out.dtype != x.dtype:  # a float32 out for bf16 operands: cuDNN's dW, converted
            out[...] = cudnn.conv2d_backward_weight(g, x, w_shape, *args)
            return out
        return cudnn.conv2d_backward_weight(g, x, w_shape, *args, out=out)

    if ours and conv_wgrad.choose(g, x, w_shape, stride_hw, padding_hw, with_cudnn):  # timed as it would run
        return conv_wgrad.conv2d_backward_weight_gpu(g, x, w_shape, stride_hw, padding_hw, out=out, defer=defer)
    return with_cudnn()


@dispatch.register("conv2d_prepare_backward", device="cuda", dtypes=CUDNN_TYPES, applies=cudnn_runs)
def conv2d_prepare_backward_cuda(y, x, w, geo: Geometry, weight_gradient: bool, input_gradient: bool) -> None:
    """Start compiling our gradient kernels' candidates for this shape in the background (dy will be shaped like y),
    so that the backward pass finds them built."""
    args = cudnn_args(geo)
    if weight_gradient:
        conv_wgrad.prefetch(y, x, w.shape, *args, out=w)
    if input_gradient:
        conv_fprop_mma.prefetch_input_gradient(y, _dense(w, array_module(w)), *args, x.shape)
