"""The resident dataset's batch kernels: gather by index and scale to [0, 1] (`gather_scaled`), and gather, pad-crop,
flip, scale and normalize into NCHW (`gather_augmented`), each one launch, registered with frost.dispatch for uint8
images on the GPU. They do no host work, so a step captured by frost.jit gathers its own batch from the indices
(the seed ResNet's step does). The float math is the CPU reference's (frost.data.transforms: float32(x) / 255, then
(y - mean) / std), so results agree bit for bit; the core validates the arguments before it asks the table."""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from frost import dispatch
from frost.accel.conv_common import capturing
from frost.backend import cuda
from frost.dtype import to_dtype
from frost.kernel import Array, bdx, bf16, bx, f32, i32, i64, kernel, tx, u8

THREADS = 256


# ---------------------------------------------------------------- gather, pad-crop, flip, normalize: one launch
# One thread per output value (NCHW); images NHWC.

@kernel
def augment_kernel(images: Array[u8], index: Array[i32], offsets_y: Array[i32], offsets_x: Array[i32],
                   flips: Array[i32], mean: Array[f32], std: Array[f32], out: Array[f32], total: i32, h: i32,
                   w: i32, channels: i32, size: i32, padding: i32):
    i = bx * bdx + tx
    if i < total:
        col = i % size
        row = (i // size) % size
        ch = (i // (size * size)) % channels
        b = i // (size * size * channels)
        if flips[b] != 0:
            col = size - 1 - col
        y = row + offsets_y[b] - padding
        x = col + offsets_x[b] - padding
        v = 0.0
        if y >= 0 and y < h and x >= 0 and x < w:
            v = f32(images[((index[b] * h + y) * w + x) * channels + ch]) / 255.0
        out[i] = (v - mean[ch]) / std[ch]


_constants: dict = {}


def _device_constants(mean: tuple, std: tuple, device: int):
    """mean and std as arrays on `device`, made once, by the first eager call: a host-to-device copy cannot happen
    inside a captured step."""
    key = (mean, std, device)
    if key not in _constants:
        if capturing():
            raise RuntimeError(f"gather_augmented: mean {mean} and std {std} are first used inside a captured step; "
                               f"call the step once eagerly first (frost.jit's warm-up does)")
        cp = cuda.cupy()
        with cp.cuda.Device(device):
            _constants[key] = (cp.asarray(mean, dtype=cp.float32), cp.asarray(std, dtype=cp.float32))
    return _constants[key]


def indexes_in_32_bits(images, *args, **kwargs) -> bool:
    """The augment kernel computes its addresses in int32: datasets of 2^31 values and more take the reference."""
    return images.size < 2 ** 31


@dispatch.register("gather_augmented", device="cuda", dtypes=("uint8",), applies=indexes_in_32_bits)
def augment_gpu(images, index, offsets_y, offsets_x, flips, size: int, padding: int, mean: Sequence[float],
                std: Sequence[float]) -> Any:
    """frost.data.transforms.gather_augmented for a uint8 NHWC dataset on the GPU: NCHW float32, one launch. All
    arrays (CuPy: the core unwraps tensors and lists; any strides, integer or bool) are on the device already."""
    cp = cuda.cupy()
    n, h, w, c = images.shape
    idx, oy, ox, fl = (cp.ascontiguousarray(a, dtype=cp.int32) for a in (index, offsets_y, offsets_x, flips))
    out = cp.empty((len(idx), c, size, size), dtype=cp.float32)
    mean32, std32 = _device_constants(tuple(mean), tuple(std), images.device.id)
    if out.size:
        augment_kernel[(out.size + THREADS - 1) // THREADS, THREADS](images.reshape(-1), idx, oy, ox, fl, mean32, std32,
                                                                     out, out.size, h, w, c, size, padding)
    return out


# ---------------------------------------------------------------- gather and scale: one launch
# images[index] of a uint8 dataset as float32(x) / 255 (to_float's math), stored as float32 or rounded to bf16:
# the gather, the conversion and the division (and, for a bf16 first layer, autocast's cast) in one kernel.

@kernel.warm
@kernel
def gather_scaled(images: Array[u8], index: Array[i64], out: Array[f32], total: i32, row: i32):
    i = bx * bdx + tx
    if i < total:
        out[i] = f32(images[index[i // row] * row + i % row]) / 255.0


@kernel
def gather_scaled_bf16(images: Array[u8], index: Array[i64], out: Array[bf16], total: i32, row: i32):
    i = bx * bdx + tx
    if i < total:
        out[i] = f32(images[index[i // row] * row + i % row]) / 255.0   # rounded to nearest, as a cast


GATHER_SCALED = {"float32": gather_scaled, "bfloat16": gather_scaled_bf16}


def gather_scaled_gpu(images, index, dtype: str = "float32", simulate: bool = False) -> Any:
    """images[index] / 255 for a uint8 dataset (any layout: rows are gathered whole) as float32 or bfloat16 in one
    launch; index 1-D integers (checked by the core's frost.data.transforms.gather_scaled; any strides). simulate:
    NumPy arrays, run by the kernel language's simulator (the tests)."""
    xp = np if simulate else cuda.cupy()
    index = xp.ascontiguousarray(index, dtype=xp.int64)
    out = xp.empty((len(index), *images.shape[1:]), dtype=to_dtype(dtype).np)
    row = int(np.prod(images.shape[1:]))
    kern = GATHER_SCALED[dtype].simulate if simulate else GATHER_SCALED[dtype]
    if out.size:
        kern[(out.size + THREADS - 1) // THREADS, THREADS](xp.ascontiguousarray(images).reshape(-1), index,
                                                           out.reshape(-1), out.size, row)
    return out


dispatch.register("gather_scaled", device="cuda", dtypes=("uint8",))(gather_scaled_gpu)
