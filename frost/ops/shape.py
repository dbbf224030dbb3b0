"""Shape ops: reshape, permute, expand, indexing, cat/stack/split, pad; forward and backward together."""
from __future__ import annotations

import math
import warnings

import numpy as np

from frost import layout
from frost.autograd import PlacedGradient, unbroadcast
from frost.dtype import promote
from frost.ops.elementwise import cast, sum_to
from frost.ops.reduce import normalize_dim, normalize_dims
from frost.tensor import Tensor, from_op

builtins_max = max


# the dtypes CuPy's add.at and maximum.at / minimum.at take (its atomics); others go through a wider or reordered type.
# Floats' extremes never use CuPy's: its float64 atomicMax/atomicMin compare through fmaxf/fminf, which rounds every
# value to float32, and both drop NaN (NumPy's maximum.at keeps it)
_CUPY_ADD_AT = frozenset(("int32", "uint32", "uint64", "float16", "float32", "float64"))
_CUPY_EXTREME_AT = frozenset(("int32", "uint32", "uint64"))
_SIGN_BIT = np.uint64(1 << 63)


def scatter_at(xp, ufunc: str, target, pos, values) -> None:
    """xp.<ufunc>.at(target, pos, values) for ufunc "add", "maximum" or "minimum", in place, on any dtype. CuPy's
    atomics take only some types: int64 adds as uint64 (the same bits modulo 2^64), bfloat16 and the small integers
    in float32 / int32 (rounded once at the end), int64 extremes as uint64 with the sign bit flipped (which keeps
    the order), and floats' extremes as unsigned keys in the floats' order (float_extreme_at)."""
    op = getattr(xp, ufunc)
    dtype = str(target.dtype)
    if xp is np or dtype in (_CUPY_ADD_AT if ufunc == "add" else _CUPY_EXTREME_AT):
        op.at(target, pos, values)
        return
    values = xp.asarray(values)
    if dtype == "int64" and ufunc == "add":
        op.at(target.view(xp.uint64), pos, values.astype(xp.int64, copy=False).view(xp.uint64))
    elif dtype == "int64":
        flipped = target.view(xp.uint64) ^ _SIGN_BIT
        op.at(flipped, pos, values.astype(xp.int64, copy=False).view(xp.uint64) ^ _SIGN_BIT)
        target[...] = (flipped ^ _SIGN_BIT).view(xp.int64)
    elif ufunc != "add" and (target.dtype.kind == "f" or dtype == "bfloat16"):
        float_extreme_at(xp, ufunc, target, pos, values)
    else:
        wide = xp.float32 if target.dtype.kind == "f" or dtype == "bfloat16" else xp.int32
        widened = target.astype(wide)
        op.at(widened, pos, values.astype(wide, copy=False))
        target[...] = widened.astype(target.dtype, copy=False)


def float_extreme_at(xp, ufunc: str, target, pos, values) -> None:
    """maximum.at / minimum.at of floats with unsigned-integer atomics, exactly as NumPy's: each float as the
    unsigned key that sorts as the float does (sign bit set for positives, every bit flipped for negatives), float64
    in uint64 and the narrower floats in float32's uint32; a NaN in the target or among a place's values makes that
    place NaN."""
    wide, bits, sign = (np.float64, np.uint64, 1 << 63) if target.dtype == np.float64 else (np.float32, np.uint32,
                                                                                           1 << 31)
    start = target.astype(wide, copy=False)
    values = xp.asarray(values).astype(wide, copy=False)
    keys = _order_keys(xp, start, bits, sign)
    getattr(xp, ufunc).at(keys, pos, _order_keys(xp, values, bits, sign))
    nans = xp.isnan(start).astype(np.int32)
    xp.add.at(nans, pos, xp.isnan(values).astype(np.int32))
    unsigned = xp.where((keys & bits(sign)) != 0, keys ^ bits(sign), ~keys)
    target[...] = xp.where(nans > 0, wide(np.nan), unsigned.view(wide)).astype(target.dtype, copy=False)


def _order_keys(xp, a, bits, sign: int):
    """The unsigned integers (of type `bits`) whose order is the order of the floats `a` (NaN aside)."""
    b = xp.ascontiguousarray(a).view(bits)
    return xp.where((b & bits(sign)) != 0, ~b, b | bits(sign))


def reshape(x: Tensor, shape: tuple) -> Tensor:
    shape = tuple(shape)
    try:
        out = x.data.reshape(shape)
    except ValueError:
        raise RuntimeError(f"reshape: shape {shape} is invalid for a tensor of shape {x.shape} "
                           f"({x.numel()} elements)") from None
    src = x.shape
    return from_op(out, (x,), lambda g: (g.reshape(src),), "reshape", lambda g, o: (reshape(g, src),))


def view(x: Tensor, shape: tuple) -> Tensor:
    """reshape that never copies: PyTorch's view, which refuses a shape that x's strides cannot give (NumPy's and
    CuPy's reshape then copy: writes through the result would not reach x)."""
    shape = tuple(shape)
    known = math.prod(d for d in shape if d != -1)
    if shape.count(-1) == 1 and known and x.numel() % known == 0:
        shape = tuple(x.numel() // known if d == -1 else d for d in shape)
    strides = tuple(s // x.data.itemsize for s in x.data.strides)
    if math.prod(shape) == x.numel() and not _viewable(x.shape, strides, shape):
        raise RuntimeError(f"view: a tensor of shape {x.shape} with strides {strides} cannot be viewed as shape "
                           f"{shape} (a dimension of the view would span two separate blocks of its memory); use "
                           f".reshape(...), which copies here, or .contiguous() first")
    return reshape(x, shape)


def _viewable(shape: tuple, strides: tuple, new_shape: tuple) -> bool:
    """Whether memory laid out as (shape, strides) reads as new_shape (same size) without a copy: each chunk of dims
    that lie contiguously one inside the next must split into whole dims of new_shape (PyTorch's computeStride)."""
    if not shape or math.prod(shape) == 0:
        return True
    view_dim, view_numel, chunk_numel, chunk_stride = len(new_shape) - 1, 1, 1, strides[-1]
    for dim in range(len(shape) - 1, -1, -1):
        chunk_numel *= shape[dim]
        if dim > 0 and (shape[dim - 1] == 1 or strides[dim - 1] == chunk_numel * chunk_stride):
            continue  # dim - 1 extends the chunk
        while view_dim >= 0 and (view_numel < chunk_numel or new_shape[view_dim] == 1):
            view_numel *= new_shape[view_dim]
            view_dim -= 1
        if view_numel != chunk_numel:
            return False
        if dim > 0:
            view_numel, chunk_numel, chunk_stride = 1, 1, strides[dim - 1]
    return view_dim == -1


def permute(x: Tensor, dims: tuple) -> Tensor:
    if any(not -x.ndim <= d < builtins_max(x.ndim, 1) for d in dims):
        raise IndexError(f"permute: dims {tuple(dims)} are out of range for a tensor of shape {x.shape}")
    dims = tuple(d % x.ndim for d in dims) if x.ndim else tuple(dims)
    if sorted(dims) != list(range(x.ndim)):
        raise RuntimeError(f"permute: dims {dims} are not a permutation of the {x.ndim} dimensions of shape {x.shape}")
    inverse = tuple(np.argsort(dims))
    return from_op(x.data.transpose(dims), (x,), lambda g: (g.transpose(inverse),), "permute",
                   lambda g, o: (permute(g, inverse),))


def transpose(x: Tensor, dim0: int, dim1: int) -> Tensor:
    if x.ndim < 2 and x.ndim == 0:
        return x
    dims = list(range(x.ndim))
    d0, d1 = normalize_dims(dim0, x.ndim, "transpose")[0], normalize_dims(dim1, x.ndim, "transpose")[0]
    dims[d0], dims[d1] = dims[d1], dims[d0]
    return permute(x, tuple(dims))


def flatten(x: Tensor, start_dim: int = 0, end_dim: int = -1) -> Tensor:
    if x.ndim == 0:
        return reshape(x, (1,))
    s, e = normalize_dim(start_dim, x.ndim, "flatten"), normalize_dim(end_dim, x.ndim, "flatten")
    if s > e:
        raise RuntimeError(f"flatten: start_dim {start_dim} comes after end_dim {end_dim} (shape {x.shape})")
    shape = x.shape[:s] + (int(np.prod(x.shape[s:e + 1])),) + x.shape[e + 1:]
    return reshape(x, shape)


def squeeze(x: Tensor, dim=None) -> Tensor:
    if dim is None:
        shape = tuple(n for n in x.shape if n != 1)
    else:
        axes = normalize_dims(dim, x.ndim, "squeeze")
        shape = tuple(n for i, n in enumerate(x.shape) if not (i in axes and n == 1))
    return reshape(x, shape)


def unsqueeze(x: Tensor, dim: int) -> Tensor:
    if not -x.ndim - 1 <= dim <= x.ndim:
        raise IndexError(f"unsqueeze: dim {dim} is out of range for a tensor with {x.ndim} dimensions")
    d = dim % (x.ndim + 1)
    return reshape(x, x.shape[:d] + (1,) + x.shape[d:])


def expand(x: Tensor, sizes: tuple) -> Tensor:
    sizes = tuple(sizes)
    lead = len(sizes) - x.ndim
    if lead < 0:
        raise RuntimeError(f"expand: cannot expand shape {x.shape} to fewer dimensions {sizes}")
    target = tuple(x.shape[i - lead] if (s == -1 and i >= lead) else s for i, s in enumerate(sizes))
    try:
        out = x.xp.broadcast_to(x.data, target)
    except ValueError:
        raise RuntimeError(f"expand: shape {x.shape} cannot be expanded to {sizes}") from None
    src = x.shape
    return from_op(out, (x,), lambda g: (unbroadcast(g, src),), "expand", lambda g, o: (sum_to(g, src),))


def contiguous(x: Tensor, memory_format=None) -> Tensor:
    """x dense in C order, or in `memory_format` (frost.channels_last: 4-D, NHWC memory); x itself when it is."""
    if memory_format is None or memory_format is layout.contiguous_format:
        out = x.xp.asarray(x.data, order="C")  # not ascontiguousarray, which turns 0-d into 1-d
    elif x.ndim != 4:
        raise ValueError(f"contiguous: memory_format={memory_format!r} needs a 4-D (N, C, H, W) tensor, got shape "
                         f"{x.shape}")
    else:
        out = layout.in_format(x.data, memory_format)
    if out is x.data:
        return x
    return from_op(out, (x,), lambda g: (g,), "contiguous", lambda g, o: (g,))


def repeat(x: Tensor, sizes: tuple) -> Tensor:
    sizes = tuple(sizes)
    if len(sizes) < x.ndim:
        raise RuntimeError(f"repeat: {len(sizes)} repeat counts for a tensor of {x.ndim} dimensions")
    xa = x.data.reshape((1,) * (len(sizes) - x.ndim) + x.shape)
    out = x.xp.tile(xa, sizes)

    def backward(g):
        # fold every repeated copy back: shape (r0, n0, r1, n1, ...) summed over the r axes
        split = []
        for r, n in zip(sizes, xa.shape):
            split += [r, n]
        return (g.reshape(split).sum(axis=tuple(range(0, len(split), 2))).reshape(x.shape),)
    return from_op(out, (x,), backward, "repeat")


def flip(x: Tensor, dims) -> Tensor:
    if dims is not None and not isinstance(dims, int) and len(dims) == 0:  # flip(()): a copy, as PyTorch's
        return from_op(x.data.copy(), (x,), lambda g: (g,), "flip", lambda g, o: (g,))
    axes = normalize_dims(dims, x.ndim, "flip")
    # a copy, as PyTorch's flip (NumPy's is a view: writes through it would reach x)
    return from_op(x.xp.flip(x.data, axes).copy(), (x,), lambda g: (x.xp.flip(g, axes),), "flip",
                   lambda g, o: (flip(g, axes),))


# ------------------------------------------------------------------ indexing

def raw_index(index):
    """Replace tensors inside an index with their arrays (a uint8 tensor with a bool mask, as PyTorch reads it)."""
    if isinstance(index, tuple):
        return tuple(raw_index(i) for i in index)
    if isinstance(index, Tensor):
        if index.data.dtype == np.uint8:
            warnings.warn("indexing with a uint8 tensor reads it as a mask, as PyTorch does (which deprecates it); "
                          "index with a bool tensor instead", DeprecationWarning, stacklevel=4)
            return index.data != 0
        return index.data
    if isinstance(index, list):
        array = np.asarray(index)
        return array.astype(np.int64) if array.size == 0 else array  # [] selects nothing (NumPy reads it as float)
    return index


def _is_advanced(index) -> bool:
    items = index if isinstance(index, tuple) else (index,)
    return any(hasattr(i, "shape") and getattr(i, "ndim", 0) >= 0 and not isinstance(i, (int, np.integer))
               for i in items)


def _is_integer(i) -> bool:
    """An index that selects one position: a Python or NumPy int, or a 0-d integer array (PyTorch's 0-d tensor)."""
    if isinstance(i, (bool, np.bool_)):
        return False
    return isinstance(i, (int, np.integer)) or (getattr(i, "ndim", None) == 0 and i.dtype.kind in "iu")


def _selects_first(idx):
    """PyTorch applies an index's integers (selects) before its tensors; NumPy counts an integer as one more
    advanced index when tensors are present, which moves the tensors' dims to the front when an integer and a
    tensor are apart (x[:, 0, :, i]). Two passes, (selects with ':' for the tensors, the rest), where they
    differ; None where one pass gives PyTorch's result."""
    items = idx if isinstance(idx, tuple) else (idx,)
    is_tensor = [not _is_integer(i) and (hasattr(i, "shape") or isinstance(i, bool)) for i in items]  # bool: a mask
    if not any(is_tensor) or not any(_is_integer(i) for i in items):
        return None
    selects, rest = [], []
    for i, tensor in zip(items, is_tensor):
        if tensor:  # the second pass's (a mask spans its ndim dims)
            selects += [slice(None)] * (np.ndim(i) if isinstance(i, bool) or i.dtype == bool else 1)
            rest.append(i)
        else:  # the first pass's; its dims (a slice's, None's) stay whole in the second, an integer's are gone
            selects.append(i)
            if not _is_integer(i):
                rest.append(Ellipsis if i is Ellipsis else slice(None))
    return tuple(selects), tuple(rest)


def assign(target, idx, value) -> None:
    """target[idx] = value for a raw index (raw_index), its dims placed as getitem places them."""
    passes = _selects_first(idx)
    if passes is None:
        target[idx] = value
        return
    selects = tuple(int(i) if _is_integer(i) else i for i in passes[0])  # NumPy copies for a 0-d array: no view
    target[selects][passes[1]] = value


def getitem(x: Tensor, index) -> Tensor:
    idx = raw_index(index)
    if isinstance(index, Tensor) and index.device != x.device:
        raise RuntimeError(f"index: index tensor is on {index.device} but the indexed tensor is on {x.device}")
    passes = _selects_first(idx)
    if passes is not None:
        return getitem(getitem(x, passes[0]), passes[1])
    try:
        out = x.data[idx]
    except IndexError as e:
        raise IndexError(f"index: {e} (tensor of shape {x.shape})") from None
    xp = x.xp
    advanced = _is_advanced(idx)
    if not advanced:
        out = out if hasattr(out, "shape") and not np.isscalar(out) else xp.asarray(out)

    def backward(g):
        if not advanced:  # summed with the other slices' gradients when read (split's pieces join)
            return (PlacedGradient(xp, x.shape, g.dtype, [(idx, g)]),)
        gx = xp.zeros(x.shape, dtype=g.dtype)
        scatter_at(xp, "add", gx, idx, g)  # repeated indices accumulate
        return (gx,)
    return from_op(out, (x,), backward, "index", lambda g, o: (_placed(g, x.shape, idx, advanced),))


def _placed(g: Tensor, shape: tuple, idx, advanced: bool) -> Tensor:
    """getitem's gradient as an op of its own (so that it can be differentiated again): g put (added, where an
    advanced index repeats a place) into zeros of `shape` at the raw index idx; its gradient reads idx back."""
    xp = g.xp
    out = xp.zeros(shape, dtype=g.data.dtype)
    if advanced:
        scatter_at(xp, "add", out, idx, g.data)
    else:
        out[idx] = g.data
    return from_op(out, (g,), lambda gg: (xp.asarray(gg[idx]),), "index_backward",
                   lambda gg, o: (getitem(gg, idx),))


def gather(x: Tensor, dim: int, index: Tensor) -> Tensor:
    xp = x.xp
    axis = normalize_dim(dim, x.ndim, "gather")
    if not isinstance(index, Tensor) or index.dtype.is_floating_point or index.dtype.name == "bool":
        raise RuntimeError(f"gather: index must be an integer tensor, got {_describe_index(index)}")
    idx = index.data
    if idx.ndim != x.ndim or any(i > n for d, (i, n) in enumerate(zip(idx.shape, x.shape)) if d != axis):
        raise RuntimeError(f"gather: index of shape {index.shape} does not fit input of shape {x.shape} "
                           f"(same number of dims, and no larger outside dim {dim})")
    _refuse_negative(idx, "gather", x.shape[axis], dim)
    # PyTorch lets the index be smaller than the input outside `dim`: gather from the leading corner
    corner = tuple(slice(None) if d == axis else slice(0, i) for d, i in enumerate(idx.shape))
    try:
        out = xp.take_along_axis(x.data[corner], idx, axis=axis)
    except IndexError as e:
        raise IndexError(f"gather: {e} (input of shape {x.shape}, dim {dim})") from None

    def backward(g):
        gx = xp.zeros(x.shape, dtype=g.dtype)
        _scatter_add_along_axis(xp, gx, idx, g, axis)
        return (gx,)
    return from_op(out, (x,), backward, "gather")


def _describe_index(index) -> str:
    if isinstance(index, Tensor):
        return f"a {index.dtype.name} tensor of shape {index.shape}"
    return type(index).__name__


def _scatter_add_along_axis(xp, target, idx, values, axis: int) -> None:
    grids = list(xp.indices(idx.shape, sparse=True))
    grids[axis] = idx
    scatter_at(xp, "add", target, tuple(grids), values)


# ------------------------------------------------------------------ joining and splitting

def _check_same_device(tensors, name: str) -> None:
    devs = {str(t.device) for t in tensors}
    if len(devs) > 1:
        raise RuntimeError(f"{name}: tensors are on different devices: {sorted(devs)}")


def cat(tensors, dim: int = 0) -> Tensor:
    tensors = list(tensors)
    if not tensors:
        raise RuntimeError("cat: expected a non-empty list of tensors")
    _check_same_device(tensors, "cat")
    nd = tensors[0].ndim
    axis = normalize_dim(dim, nd, "cat")
    for t in tensors:
        if t.ndim != nd or t.shape[:axis] + t.shape[axis + 1:] != tensors[0].shape[:axis] + tensors[0].shape[axis + 1:]:
            raise RuntimeError(f"cat: shapes {[t.shape for t in tensors]} do not match except in dim {dim}")
    dt = tensors[0].dtype
    for t in tensors[1:]:
        dt = promote(dt, t.dtype)
    xp = tensors[0].xp
    out = xp.concatenate([t.data.astype(dt.np, copy=False) for t in tensors], axis=axis)
    bounds = np.cumsum([t.shape[axis] for t in tensors])[:-1]

    def backward(g):
        return [p.astype(t.data.dtype, copy=False) for p, t in zip(xp.split(g, bounds, axis=axis), tensors)]

    def tensor_backward(g, o):
        starts = (0, *bounds)
        return [cast(getitem(g, (slice(None),) * axis + (slice(lo, lo + t.shape[axis]),)), t.dtype)
                for lo, t in zip(starts, tensors)]
    return from_op(out, tensors, backward, "cat", tensor_backward)


def stack(tensors, dim: int = 0) -> Tensor:
    tensors = list(tensors)
    if not tensors:
        raise RuntimeError("stack: expected a non-empty list of tensors")
    shapes = {t.shape for t in tensors}
    if len(shapes) > 1:
        raise RuntimeError(f"stack: all tensors must have the same shape, got {[t.shape for t in tensors]}")
    return cat([unsqueeze(t, dim) for t in tensors], dim)


def split(x: Tensor, split_size, dim: int = 0) -> tuple:
    axis = normalize_dim(dim, x.ndim, "split")
    n = x.shape[axis]
    if isinstance(split_size, int):
        if split_size <= 0:
            raise RuntimeError(f"split: split_size must be positive, got {split_size}")
        sizes = [split_size] * (n // split_size) + ([n % split_size] if n % split_size else [])
        sizes = sizes or [0]  # a dim of size 0 splits into one empty piece, as PyTorch
    else:
        sizes = list(split_size)
        if sum(sizes) != n:
            raise RuntimeError(f"split: sizes {sizes} do not add up to {n} (dim {dim} of shape {x.shape})")
    out, start = [], 0
    for s in sizes:
        index = (slice(None),) * axis + (slice(start, start + s),)
        out.append(getitem(x, index))
        start += s
    return tuple(out)


def chunk(x: Tensor, chunks: int, dim: int = 0) -> tuple:
    if chunks <= 0:
        raise RuntimeError(f"chunk: chunks must be positive, got {chunks}")
    n = x.shape[normalize_dim(dim, x.ndim, "chunk")]
    if n == 0:  # `chunks` empty pieces, as PyTorch
        return split(x, [0] * chunks, dim)
    return split(x, -(-n // chunks), dim)


def pad(x: Tensor, padding, mode: str = "constant", value: float | None = None) -> Tensor:
    """Padding in PyTorch's order: (left, right) of the last dim, then of the one before, ...

    mode is 'constant' (with `value`, None meaning 0), 'reflect', 'replicate' or 'circular'; the arguments come in
    torch.nn.functional.pad's order.
    """
    value = 0.0 if value is None else value
    padding = tuple(int(p) for p in padding)
    if len(padding) % 2 or len(padding) // 2 > x.ndim:
        raise ValueError(f"pad: padding {padding} must have an even length at most 2*{x.ndim} "
                         f"for a tensor of shape {x.shape}")
    widths = [(0, 0)] * x.ndim
    for i in range(len(padding) // 2):
        widths[x.ndim - 1 - i] = (padding[2 * i], padding[2 * i + 1])
    xp = x.xp
    if mode not in ("constant", "reflect", "replicate", "circular"):
        raise ValueError(f"pad: unknown mode {mode!r}; expected 'constant', 'reflect', 'replicate' or 'circular'")
    _check_pad_widths(x, widths, mode)
    if mode == "constant":
        return _pad_constant(x, widths, value)
    # every other mode reads each output position from one input position: gather forward, scatter-add back
    takes = []
    for axis, (lo, hi) in enumerate(widths):
        if lo or hi:
            n = x.shape[axis]
            if mode == "reflect" and (lo >= n or hi >= n):
                raise ValueError(f"pad: reflect padding {(lo, hi)} must be smaller than the size {n} of dim {axis}")
            takes.append((axis, xp.asarray(_pad_source(n, lo, hi, mode))))
    out = x.data
    for axis, idx in takes:
        out = xp.take(out, idx, axis=axis)

    def backward(g):
        for axis, idx in reversed(takes):
            shape = list(g.shape)
            shape[axis] = x.shape[axis]
            folded = xp.zeros(shape, dtype=g.dtype)
            scatter_at(xp, "add", folded, (slice(None),) * axis + (idx,), g)
            g = folded
        return (g,)
    return from_op(out, (x,), backward, "pad")


def _check_pad_widths(x: Tensor, widths: list, mode: str) -> None:
    """Negative padding crops, as PyTorch's: constant and circular padding crop first and may not remove more than
    the dim holds; reflect and replicate index the whole input and must leave at least one element; circular
    padding wraps the cropped input at most once (PyTorch's self-overlapping copies beyond that are refused)."""
    for axis, (lo, hi) in enumerate(widths):
        n = x.shape[axis]
        kept = n - max(-lo, 0) - max(-hi, 0)
        if kept < 0 if mode in ("constant", "circular") else (lo or hi) and n + lo + hi < 1:
            raise RuntimeError(f"pad: padding {(lo, hi)} of dim {axis} leaves {n + lo + hi} of its {n} elements "
                               f"(input shape {x.shape}, mode {mode!r})")
        if mode == "circular" and max(lo, hi) > kept:
            raise RuntimeError(f"pad: circular padding {(lo, hi)} of dim {axis} wraps around more than once: it may "
                               f"add at most the {kept} elements the input keeps there (input shape {x.shape})")


def _pad_constant(x: Tensor, widths: list, value: float) -> Tensor:
    """Crop by the negative widths, then pad by the positive ones with `value`."""
    xp = x.xp
    kept = tuple(slice(max(-lo, 0), n - max(-hi, 0)) for n, (lo, hi) in zip(x.shape, widths))
    added = [(max(lo, 0), max(hi, 0)) for lo, hi in widths]
    out = xp.pad(x.data[kept], added, constant_values=value)
    inner = tuple(slice(lo, out.shape[i] - hi) for i, (lo, hi) in enumerate(added))
    if all(lo >= 0 and hi >= 0 for lo, hi in widths):
        return from_op(out, (x,), lambda g: (g[inner],), "pad", lambda g, o: (getitem(g, inner),))

    def backward(g):
        gx = xp.zeros(x.shape, dtype=g.dtype)
        gx[kept] = g[inner]
        return (gx,)
    return from_op(out, (x,), backward, "pad")


def _pad_source(n: int, lo: int, hi: int, mode: str) -> np.ndarray:
    """For each output position along a padded axis, the input position it copies (negative widths crop)."""
    j = np.arange(-lo, n + hi)
    if mode == "replicate":
        return np.clip(j, 0, n - 1)
    if mode == "circular":  # PyTorch crops first, then wraps around what is left
        start, kept = max(-lo, 0), n - max(-lo, 0) - max(-hi, 0)
        return start + np.arange(-max(lo, 0), kept + max(hi, 0)) % max(kept, 1)
    period = 2 * (n - 1)  # reflect without repeating the edge
    j = np.abs(j) % period if period else np.zeros_like(j)
    return np.where(j >= n, period - j, j)


def _triangle(x: Tensor, diagonal: int, lower: bool, name: str) -> Tensor:
    if x.ndim < 2:
        raise RuntimeError(f"{name}: needs a tensor with at least 2 dimensions, got shape {x.shape}")
    xp = x.xp
    rows, cols = x.shape[-2:]
    mask = (xp.tri(rows, cols, diagonal, dtype=bool) if lower else ~xp.tri(rows, cols, diagonal - 1, dtype=bool))
    zero = xp.zeros((), dtype=x.data.dtype)
    return from_op(xp.where(mask, x.data, zero), (x,), lambda g: (xp.where(mask, g, 0).astype(g.dtype, copy=False),),
                   name)


def tril(x: Tensor, diagonal: int = 0) -> Tensor:
    """The lower triangle of the last two dims (on and below `diagonal`), zeros elsewhere."""
    return _triangle(x, diagonal, True, "tril")


def triu(x: Tensor, diagonal: int = 0) -> Tensor:
    """The upper triangle of the last two dims (on and above `diagonal`), zeros elsewhere."""
    return _triangle(x, diagonal, False, "triu")


def index_select(x: Tensor, dim: int, index: Tensor) -> Tensor:
    """Entries of x at the 1-D integer `index` along `dim`; repeated indices accumulate their gradient."""
    axis = normalize_dim(dim, x.ndim, "index_select")
    idx = index.data if isinstance(index, Tensor) else np.asarray(index)
    if idx.ndim > 1 or idx.dtype.kind not in "iu":
        raise RuntimeError(f"index_select: index must be a 1-D integer tensor, got {_describe_index(index)}")
    _refuse_negative(idx, "index_select", x.shape[axis], dim)
    return getitem(x, (slice(None),) * axis + (idx.reshape(-1),))


def _refuse_negative(idx, name: str, size: int, dim) -> None:
    """PyTorch's gather and index_select take no negative indices (NumPy's would count from the end). Checked
    where the indices are readable without a device sync (the CPU)."""
    if isinstance(idx, np.ndarray) and idx.size and idx.min() < 0:
        raise IndexError(f"{name}: index {int(idx.min())} is out of bounds for dim {dim} of size {size} (negative "
                         f"indices are not allowed)")


def narrow(x: Tensor, dim: int, start: int, length: int) -> Tensor:
    axis = normalize_dim(dim, x.ndim, "narrow")
    n = x.shape[axis]
    start = start + n if start < 0 else start
    if not (0 <= start and length >= 0 and start + length <= n):
        raise RuntimeError(f"narrow: start {start} and length {length} exceed dim {dim} of size {n}")
    return getitem(x, (slice(None),) * axis + (slice(start, start + length),))


def unbind(x: Tensor, dim: int = 0) -> tuple:
    axis = normalize_dim(dim, x.ndim, "unbind")
    return tuple(getitem(x, (slice(None),) * axis + (i,)) for i in range(x.shape[axis]))


def clone(x: Tensor) -> Tensor:
    """A copy with its own memory that stays on the tape (its gradient passes straight through)."""
    return from_op(x.data.copy(), (x,), lambda g: (g,), "clone", lambda g, o: (g,))
