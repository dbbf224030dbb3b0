"""A batch of windows of uint8 RGB images of any sizes, each resized to one size (and mirrored where asked) on the GPU,
bit for bit as Pillow's antialiased bilinear resize of the window (frost.data.transforms.resized_crop, what
RandomResizedCrop applies on the CPU): registered with frost.dispatch as `resized_crops`'s fast path, for images
decoded on the GPU (an ImageNet-style JPEG batch) whose augmentation should not go back to the host.

Pillow resamples in two passes, each a weighted sum of at most `ksize` input pixels per output pixel with
coefficients fixed before the pass: the horizontal pass makes the window's rows that the vertical pass needs
(ybox_first ... ybox_last) at the output's width, rounded to uint8; the vertical pass makes the output. The
coefficients are computed here on the host exactly as Pillow computes them (float64, the same order of operations,
then 22-bit fixed point), one row of `ksize` per output column or row and image; the kernels add in int32 as Pillow
does, so results are identical. A pass Pillow skips (the window already the output's width or height) is an
identity here: the coefficients (1, 0) reproduce every pixel exactly."""
from __future__ import annotations

import math

import numpy as np

from frost import dispatch
from frost.backend import cuda
from frost.kernel import Array, bdx, bx, i32, kernel, tx, u8

PRECISION_BITS = 32 - 8 - 2   # Pillow's fixed point for 8-bit images
THREADS = 256


def coefficients(in_size: int, in0: float, in1: float, out_size: int) -> tuple[np.ndarray, np.ndarray]:
    """(bounds (out_size, 2) int32: first input pixel and count; k (out_size, ksize) int32 fixed-point weights) of
    Pillow's bilinear precompute_coeffs and normalize_coeffs_8bpc for one axis of one window."""
    scale = float(np.float32(in1) - np.float32(in0)) / out_size
    filterscale = max(scale, 1.0)
    support = 1.0 * filterscale
    ksize = int(math.ceil(support)) * 2 + 1
    center = in0 + (np.arange(out_size) + 0.5) * scale
    xmin = np.maximum(np.trunc(center - support + 0.5), 0).astype(np.int64)
    xmax = np.minimum(np.trunc(center + support + 0.5).astype(np.int64), in_size) - xmin
    x = np.arange(ksize)
    distance = np.abs((((x[None, :] + xmin[:, None]) - center[:, None]) + 0.5) * (1.0 / filterscale))
    w = np.where((x[None, :] < xmax[:, None]) & (distance < 1.0), 1.0 - distance, 0.0)
    total = np.zeros(out_size)
    for column in range(ksize):   # Pillow adds the weights one after another
        total = total + w[:, column]
    w = np.where(total[:, None] != 0.0, w / np.where(total == 0.0, 1.0, total)[:, None], w)
    k = np.trunc(0.5 + w * (1 << PRECISION_BITS)).astype(np.int32)
    return np.stack([xmin, xmax], axis=1).astype(np.int32), k


def _scales(in0, in1, out_size: int) -> np.ndarray:
    """Each window's input pixels per output pixel, as `coefficients` computes it (float32 ends, float64 ratio)."""
    return (np.asarray(in1, np.float64).astype(np.float32)
            - np.asarray(in0, np.float64).astype(np.float32)).astype(np.float64) / out_size


def _ksizes(scale: np.ndarray) -> np.ndarray:
    """Each window's filter taps: Pillow's bilinear support (the scale, at least 1) on both sides, plus one."""
    return np.ceil(np.maximum(scale, 1.0)).astype(np.int64) * 2 + 1


def axis_coefficients(in_sizes, in0, in1, out_size: int) -> tuple[np.ndarray, np.ndarray]:
    """`coefficients` for one axis of a batch of windows at once (in_sizes, in0, in1: (B,) arrays): bounds (B,
    out_size, 2) and k (B, out_size, K), K the batch's widest ksize. The same float64 operations element by element,
    so the same bits; the columns past an image's own ksize hold zero weights (adding them to Pillow's total changes
    nothing)."""
    in_sizes, in0 = np.asarray(in_sizes, np.int64), np.asarray(in0, np.float64)
    scale = _scales(in0, in1, out_size)
    filterscale = np.maximum(scale, 1.0)
    support = 1.0 * filterscale
    ksize = int(_ksizes(scale).max())
    center = in0[:, None] + (np.arange(out_size) + 0.5)[None, :] * scale[:, None]
    xmin = np.maximum(np.trunc(center - support[:, None] + 0.5), 0).astype(np.int64)
    xmax = np.minimum(np.trunc(center + support[:, None] + 0.5).astype(np.int64), in_sizes[:, None]) - xmin
    x = np.arange(ksize)
    distance = np.abs((((x + xmin[..., None]) - center[..., None]) + 0.5) * (1.0 / filterscale)[:, None, None])
    w = np.where((x < xmax[..., None]) & (distance < 1.0), 1.0 - distance, 0.0)
    total = np.zeros(center.shape)
    for column in range(ksize):   # Pillow adds the weights one after another
        total = total + w[..., column]
    w = np.where(total[..., None] != 0.0, w / np.where(total == 0.0, 1.0, total)[..., None], w)
    k = np.trunc(0.5 + w * (1 << PRECISION_BITS)).astype(np.int32)
    return np.stack([xmin, xmax], axis=-1).astype(np.int32), k


def _grouped(in_sizes, in0, in1, out_size: int) -> tuple[np.ndarray, np.ndarray]:
    """axis_coefficients computed per group of windows that share a ksize, then padded to the widest: one huge
    window (a wide ksize) would otherwise widen every window's float64 temporaries (2 s and 1 GiB for a batch holding
    a 65,535-pixel window)."""
    in_sizes, in0, in1 = np.asarray(in_sizes), np.asarray(in0, np.float64), np.asarray(in1, np.float64)
    ksizes = _ksizes(_scales(in0, in1, out_size))
    widest = int(ksizes.max())
    bounds = np.empty((len(in0), out_size, 2), np.int32)
    k = np.zeros((len(in0), out_size, widest), np.int32)
    for ksize in np.unique(ksizes).tolist():
        group = np.flatnonzero(ksizes == ksize)
        bounds[group], k[group, :, :ksize] = axis_coefficients(in_sizes[group], in0[group], in1[group], out_size)
    return bounds, k


def batch_coefficients(heights, widths, boxes, size: tuple[int, int]) -> dict:
    """Every image's coefficients for both axes, padded to the batch's widest ksize, and the rows each horizontal pass
    makes: the arrays the kernels read (NumPy, int32). A few NumPy calls for the whole batch: per image they took 63 ms
    for 256 windows on one core, more than the batch's decode."""
    out_h, out_w = size
    top, left, height, width = np.asarray(boxes, np.float64).reshape(-1, 4).T   # Pillow takes fractional boxes
    row_bounds, row_k = _grouped(heights, top, top + height, out_h)
    col_bounds, col_k = _grouped(widths, left, left + width, out_w)
    first = row_bounds[:, 0, 0].copy()
    last = row_bounds[:, -1, 0] + row_bounds[:, -1, 1]
    row_bounds[:, :, 0] -= first[:, None]   # the vertical pass reads the horizontal pass's rows
    return {"row_bounds": row_bounds, "row_k": row_k, "col_bounds": col_bounds, "col_k": col_k,
            "first_row": first.astype(np.int32), "rows": (last - first).astype(np.int32), "kv": row_k.shape[2],
            "kh": col_k.shape[2]}


@kernel
def resample_rows(images: Array[u8], starts: Array[i32], widths: Array[i32], first_row: Array[i32], rows: Array[i32],
                  bounds: Array[i32], k: Array[i32], tmp: Array[u8], n: i32, max_rows: i32, out_w: i32, ksize: i32):
    """The horizontal pass: tmp[i, r, x, c] for r < rows[i] from image i's row first_row[i] + r (HWC, 3 channels, at
    starts[i] in `images`), Pillow's int32 sum rounded and clipped to uint8."""
    t = bx * bdx + tx
    c = t % 3
    x = (t // 3) % out_w
    r = (t // (3 * out_w)) % max_rows
    i = t // (3 * out_w * max_rows)
    if i < n and r < rows[i]:
        base = starts[i] + (first_row[i] + r) * widths[i] * 3 + c
        xmin = bounds[(i * out_w + x) * 2]
        count = bounds[(i * out_w + x) * 2 + 1]
        acc = 1 << (PRECISION_BITS - 1)
        for j in range(count):
            acc += i32(images[base + (xmin + j) * 3]) * k[(i * out_w + x) * ksize + j]
        tmp[t] = min(max(acc >> PRECISION_BITS, 0), 255)


@kernel
def resample_columns(tmp: Array[u8], flips: Array[i32], bounds: Array[i32], k: Array[i32], out: Array[u8], n: i32,
                     max_rows: i32, out_h: i32, out_w: i32, ksize: i32):
    """The vertical pass: out[i, y, x', c] from the horizontal pass's rows, x' = out_w - 1 - x where flips[i]."""
    t = bx * bdx + tx
    c = t % 3
    x = (t // 3) % out_w
    y = (t // (3 * out_w)) % out_h
    i = t // (3 * out_w * out_h)
    if i < n:
        ymin = bounds[(i * out_h + y) * 2]
        count = bounds[(i * out_h + y) * 2 + 1]
        acc = 1 << (PRECISION_BITS - 1)
        for j in range(count):
            acc += i32(tmp[((i * max_rows + ymin + j) * out_w + x) * 3 + c]) * k[(i * out_h + y) * ksize + j]
        xo = out_w - 1 - x if flips[i] != 0 else x
        out[((i * out_h + y) * out_w + xo) * 3 + c] = min(max(acc >> PRECISION_BITS, 0), 255)


def fits(first, images, boxes, size, flips) -> bool:
    """C-order uint8 HWC images with 3 channels, of one array type, with int32 indices."""
    # the horizontal pass's rows at most: a window's height and its filter's reach on both sides
    rows = len(images) * max(int(math.ceil(h)) + 2 * int(math.ceil(h / size[0])) + 4 for _, _, h, _ in boxes)
    return (all(type(a) is type(first) and str(a.dtype) == "uint8" and a.ndim == 3 and a.shape[2] == 3
                and a.flags.c_contiguous for a in images)
            and sum(a.size for a in images) < 2**31 and rows * size[1] * 3 < 2**31)


@dispatch.register("resized_crops", device="cuda", dtypes=("uint8",), applies=fits)
def resized_crops_gpu(first, images: list, boxes, size: tuple[int, int], flips) -> object:
    """(N, h, w, 3) uint8 on the images' device: each image's (top, left, height, width) window resized to size by
    the two passes above, mirrored where flips is true; the coefficients made on the host, two launches."""
    xp = np if isinstance(first, np.ndarray) else cuda.cupy()
    heights, widths = [a.shape[0] for a in images], [a.shape[1] for a in images]
    plan = batch_coefficients(heights, widths, boxes, size)
    n, (out_h, out_w), max_rows = len(images), size, int(plan["rows"].max())
    starts = np.cumsum([0] + [a.size for a in images[:-1]]).astype(np.int32)
    flat = xp.concatenate([a.reshape(-1) for a in images])
    dev = {name: xp.asarray(plan[name].reshape(-1)) for name in ("row_bounds", "row_k", "col_bounds", "col_k",
                                                                  "first_row", "rows")}
    tmp = xp.empty(n * max_rows * out_w * 3, np.uint8)
    out = xp.empty((n, out_h, out_w, 3), np.uint8)
    total = tmp.size
    resample_rows[(total + THREADS - 1) // THREADS, THREADS](
        flat, xp.asarray(starts), xp.asarray(np.array(widths, np.int32)), dev["first_row"], dev["rows"],
        dev["col_bounds"], dev["col_k"], tmp, n, max_rows, out_w, plan["kh"])
    resample_columns[(out.size + THREADS - 1) // THREADS, THREADS](
        tmp, xp.asarray(np.asarray(flips, np.int32)), dev["row_bounds"], dev["row_k"], out.reshape(-1), n, max_rows,
        out_h, out_w, plan["kv"])
    return out
