"""Frost: a readable deep-learning framework with autograd, layers, optimizers and GPU kernels in Python."""
from frost.autograd import no_grad, enable_grad, set_grad_enabled, is_grad_enabled, detect_anomaly
from frost.backend import Device
from frost.dtype import (DType, bfloat16, bool_ as bool, float16, float32, float64, int8, int16, int32, int64,
                         uint8)
from frost.tensor import (Tensor, arange, empty, empty_like, eye, from_numpy, full, full_like, linspace,
                          manual_seed, ones, ones_like, tensor, zeros, zeros_like)
from frost import tensor_methods  # noqa: F401 - adds the op methods (x + y, x.sum(), ...) to Tensor
from frost.ops.draws import rand, rand_like, randint, randn, randn_like, randperm
from frost.ops.elementwise import (abs, allclose, clamp, cos, exp, gelu, isfinite, isnan, log, maximum, minimum,
                                   relu, rsqrt, sigmoid, silu, sin, sqrt, tanh, where)
from frost.ops.reduce import (amax, amin, argmax, argmin, logsumexp, log_softmax, mean, prod, softmax, std,
                               std_mean, sum, var, var_mean)
from frost.ops.reduce import all, any, norm  # noqa: A004 - torch.all and torch.any shadow them too
from frost.ops.scan import cummax, cummin, cumprod, logcumsumexp
from frost.ops.elementwise import logical_and, logical_not, logical_or, pow, remainder  # noqa: A004 - torch.pow
from frost.ops.math import (acos, acosh, addmm, asin, asinh, atan, atan2, atanh, baddbmm, bmm, clamp_max, clamp_min,
                            cosh, count_nonzero, diag, diff, fmod, hypot, lerp, log10, log2, logical_xor, median,
                            nan_to_num, outer, quantile, roll, sinh, square, tan, tensordot, trace)
from frost.ops.reduce import max, min
from frost.ops.shape import cat, chunk, flatten, gather, split, stack, pad
from frost.ops.matmul import matmul
from frost.ops.elementwise import copysign, div, isclose, sgn, sign
from frost.ops.elementwise import ceil, erf, expm1, floor, log1p, reciprocal, round
from frost.ops.reduce import argsort, cumsum, sort, topk
from frost.ops.shape import clone, flip, index_select, narrow, tril, triu, unbind
from frost.ops.einsum import einsum
from frost.ops.index import (index_add, index_copy, index_fill, index_put, masked_scatter, masked_select, scatter,
                             scatter_add, scatter_reduce)
from frost.ops.elementwise import masked_fill
from frost.ops.resample import pixel_shuffle, pixel_unshuffle
from frost.io import load, save
from frost.random import get_rng_state, set_rng_state
from frost.generator import Generator
from frost.ops.sampling import bernoulli, multinomial, normal
from frost.ops.spectral import (bartlett_window, blackman_window, hamming_window, hann_window, istft, kaiser_window,
                                stft)
from frost import distributions, fft
from frost.autocast import autocast
from frost.layout import channels_last, contiguous_format
from frost import backends, cuda, data, nn, optim, parallel
from frost import random  # noqa: F401 - frost.random.fork_rng; left out of __all__ (see there)
from frost.jit import jit
from frost import amp
from frost.compat import (compile, device, get_default_dtype, inference_mode, numel,  # noqa: A004 - torch.compile
                          set_default_dtype)
from frost.backends import get_float32_matmul_precision, set_float32_matmul_precision
from frost.dlpack import from_dlpack
from frost.typeinfo import finfo, iinfo, is_tensor
from frost import autograd, utils
from frost import kernel  # the kernel language; also the @frost.kernel decorator
from frost.kernel import cuda_source
from frost import accel  # noqa: F401 - registers the fast paths (GPU kernels) with frost.dispatch

float = float32
double = float64
half = float16
long = int64
int = int32  # noqa: A001 - PyTorch's alias, shadowing the builtin as torch.int does
short = int16

__version__ = "0.1.0"  # the one version: pyproject.toml reads it (tool.setuptools.dynamic)

# the public names: what `from frost import *` binds and what help(frost) documents (as torch's, some shadow
# Python's builtins: abs, all, any, max, min, round, sum, bool, float, int)
__all__ = [
    # autograd
    "no_grad", "enable_grad", "set_grad_enabled", "is_grad_enabled", "detect_anomaly", "inference_mode",
    # tensors and their constructors
    "Tensor", "Device", "device", "numel", "tensor", "from_numpy", "from_dlpack",
    "arange", "linspace", "eye", "empty", "empty_like", "full",
    "full_like", "ones", "ones_like", "zeros", "zeros_like", "rand", "rand_like", "randn", "randn_like", "randint",
    "randperm", "manual_seed", "get_rng_state", "set_rng_state", "Generator", "bernoulli", "multinomial", "normal",
    # dtypes and memory formats
    "DType", "bool", "uint8", "int8", "int16", "int32", "int64", "float16", "bfloat16", "float32", "float64",
    "float", "double", "half", "long", "int", "short", "channels_last", "contiguous_format",
    # element-wise ops
    "abs", "allclose", "ceil", "clamp", "copysign", "cos", "div", "erf", "exp", "expm1", "floor", "gelu", "isclose",
    "isfinite", "isnan", "log", "log1p", "maximum", "minimum", "reciprocal", "relu", "round", "rsqrt", "sgn",
    "sigmoid", "sign", "silu", "sin", "sqrt", "tanh", "where",
    "acos", "acosh", "asin", "asinh", "atan", "atan2", "atanh", "clamp_max", "clamp_min", "cosh", "fmod", "hypot",
    "lerp", "log10", "log2", "logical_and", "logical_not", "logical_or", "logical_xor", "nan_to_num", "pow",
    "remainder", "sinh", "square", "tan",
    # reductions, sorting and softmax
    "all", "amax", "amin", "any", "argmax", "argmin", "argsort", "cummax", "cummin", "cumprod", "cumsum",
    "logcumsumexp", "logsumexp", "log_softmax", "max", "mean", "min", "norm", "prod", "softmax", "sort", "std",
    "std_mean", "sum", "topk", "var", "var_mean", "count_nonzero", "median", "quantile", "trace",
    # shapes and indexing
    "cat", "chunk", "clone", "flatten", "flip", "gather", "index_select", "narrow", "pad", "split", "stack", "tril",
    "triu", "unbind", "matmul", "addmm", "baddbmm", "bmm", "diag", "diff", "outer", "roll", "tensordot",
    "pixel_shuffle", "pixel_unshuffle",
    "einsum", "index_add", "index_copy", "index_fill", "index_put", "masked_fill", "masked_scatter", "masked_select",
    "scatter", "scatter_add", "scatter_reduce",
    # spectral analysis (transforms themselves: frost.fft)
    "stft", "istft", "bartlett_window", "blackman_window", "hamming_window", "hann_window", "kaiser_window",
    # checkpoints, mixed precision, CUDA graphs, kernels
    "save", "load", "autocast", "jit", "compile", "kernel", "cuda_source",
    # dtype limits and type tests
    "finfo", "iinfo", "is_tensor",
    # defaults and PyTorch's switches
    "get_default_dtype", "set_default_dtype", "get_float32_matmul_precision", "set_float32_matmul_precision",
    # subpackages
    "amp", "autograd", "backends", "cuda", "data", "distributions", "fft", "nn", "optim", "parallel", "utils",
]  # not frost.random: a star import would shadow Python's random module
