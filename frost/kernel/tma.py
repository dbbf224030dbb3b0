"""TMA tensor maps: the copy engine's description of a global array and of the box it copies (cp_async_bulk_tensor).

`tensor_map(array, box, swizzle=128)` describes `array` (NumPy for the simulator, CuPy on the GPU; any strides whose
last dimension is contiguous) and a box of `box` elements per dimension, both outermost first as NumPy orders them.
A kernel takes it as a `TensorMap[T, rank]` parameter and passes it to cp_async_bulk_tensor(dst, i, tmap, coords,
bars, j), which copies array[coords[0]:coords[0] + box[0], ...] into shared memory: elements past the array's edges
land as zeros, and with a swizzle the 16-byte chunks of each 128-byte line are permuted as wgmma's descriptors of
that swizzle expect (128: chunk XOR row % 8, frost.kernel.lib.swizzle). Where cp_async_bulk moves one contiguous
run (so a tile had to be laid out as its shared image first), a tensor map reads the tile where it lies.

On the GPU the map is the driver's 128-byte CUtensorMap (cuTensorMapEncodeTiled), passed by value as a
__grid_constant__ parameter; it holds the array's address, so the array must outlive the launches that use it
(a captured graph keeps the address, as it keeps pointers). The rules checked here are the driver's (CUDA driver
API, "Tensor Map Object Managment"): 1 to 5 dimensions, the last contiguous, the others' strides multiples of 16
bytes, the address 16-byte aligned, box sides of 1 to 256 elements, the innermost side a multiple of 16 bytes and
at most the swizzle's span."""
from __future__ import annotations

import ctypes
import functools

import numpy as np

from frost.backend.cuda import driver, driver_error_name
from frost.kernel.types import BY_NP, Scalar

SWIZZLES = {0: 0, 32: 1, 64: 2, 128: 3}   # bytes -> CUtensorMapSwizzle
# CUtensorMapDataType by element type name (cuda.h)
DATA_TYPES = {"u8": 0, "u32": 2, "i32": 3, "i64": 5, "f16": 6, "f32": 7, "f64": 8, "bf16": 9}
L2_PROMOTION_128B = 2   # CU_TENSOR_MAP_L2_PROMOTION_L2_128B: what CUTLASS's TMA loads ask for
MAX_BOX = 256
MAP_BYTES = 128
_ENCODED_KEPT = 256   # encoded maps remembered (oldest forgotten first)
_encoded: dict = {}   # (address, shape, strides, box, swizzle, element) -> the 128 bytes


class TensorMap:
    """A tensor map (see the module): the array, its box and swizzle, and on the GPU the encoded CUtensorMap."""

    def __init__(self, array, box: tuple, swizzle: int, elem: Scalar, encoded: bytes | None) -> None:
        self.array, self.box, self.swizzle, self.elem, self.encoded = array, box, swizzle, elem, encoded

    @property
    def rank(self) -> int:
        return len(self.box)

    @property
    def box_bytes(self) -> int:
        """The bytes one copy lands (and counts on its mbarrier), inside the array or not."""
        return int(np.prod(self.box)) * self.elem.np.itemsize

    def __repr__(self) -> str:
        where = "GPU" if self.encoded is not None else "simulator"
        return (f"TensorMap({self.elem}, shape {tuple(self.array.shape)}, box {self.box}, swizzle {self.swizzle}, "
                f"{where})")

    def box_image(self, coords: tuple) -> np.ndarray:
        """The simulator's copy: the box at coords as the bytes land in shared memory (flat, swizzled)."""
        a = self.array
        values = np.zeros(self.box, a.dtype)
        src, dst = [], []
        for c, n, size in zip(coords, self.box, a.shape):
            lo, hi = max(c, 0), min(c + n, size)
            if lo >= hi:
                return swizzled(values.reshape(-1), self.swizzle)
            src.append(slice(lo, hi))
            dst.append(slice(lo - c, hi - c))
        values[tuple(dst)] = a[tuple(src)]
        return swizzled(values.reshape(-1), self.swizzle)


def swizzled(flat: np.ndarray, swizzle: int) -> np.ndarray:
    """flat's elements where a copy with this swizzle puts them: byte b goes to b ^ ((b >> 7) % (swizzle / 16)) << 4
    (CUTLASS's Swizzle<log2(swizzle / 16), 4, 3>; the box starts on a 1024-byte boundary)."""
    if not swizzle:
        return flat
    item = flat.dtype.itemsize
    chunk = np.arange(flat.size) * item
    moved = (chunk ^ (((chunk >> 7) % (swizzle // 16)) << 4)) // item
    out = np.empty_like(flat)
    out[moved] = flat
    return out


def tensor_map(array, box, swizzle: int = 128) -> TensorMap:
    """A tensor map over `array` (NumPy: for the simulator; CuPy: encoded for the GPU) copying boxes of `box`
    elements (outermost first); swizzle 0, 32, 64 or 128 bytes. A ValueError names what the copy engine cannot take."""
    a = array if isinstance(array, np.ndarray) or hasattr(array, "__cuda_array_interface__") \
        else getattr(array, "data", array)
    box = tuple(int(n) for n in box)
    elem = BY_NP.get(np.dtype(a.dtype)) if hasattr(a, "dtype") else None
    what = f"tensor_map: an array of shape {tuple(getattr(a, 'shape', ()))}"
    if elem is None or elem.name not in DATA_TYPES:
        raise ValueError(f"{what}: the copy engine takes {', '.join(DATA_TYPES)} elements, got "
                         f"{getattr(a, 'dtype', type(a).__name__)}")
    _check_layout(what, a, box, swizzle, elem)
    on_gpu = not isinstance(a, np.ndarray)
    return TensorMap(a, box, swizzle, elem, _encode(what, a, box, swizzle, elem) if on_gpu else None)


def _check_layout(what: str, a, box: tuple, swizzle: int, elem: Scalar) -> None:
    item = elem.np.itemsize
    if not 1 <= a.ndim <= 5 or len(box) != a.ndim:
        raise ValueError(f"{what}: 1 to 5 dimensions and a box side for each, got box {box}")
    if swizzle not in SWIZZLES:
        raise ValueError(f"{what}: swizzle is 0, 32, 64 or 128 bytes, got {swizzle}")
    if a.strides[-1] != item or any(s <= 0 or s % 16 for s in a.strides[:-1]):
        raise ValueError(f"{what}, strides {a.strides}: the last dimension must be contiguous and the others' "
                         f"strides positive multiples of 16 bytes")
    if _address(a) % 16:
        raise ValueError(f"{what}: its first element must be 16-byte aligned, it is {_address(a) % 16} bytes past")
    inner = box[-1] * item
    if any(not 1 <= n <= MAX_BOX for n in box) or inner % 16 or (swizzle and inner > swizzle):
        raise ValueError(f"{what}: box sides are 1 to {MAX_BOX} elements, the innermost a multiple of 16 bytes"
                         + (f" and at most the swizzle's {swizzle}" if swizzle else "") + f", got box {box} "
                         f"({inner} bytes innermost)")


def _address(a) -> int:
    return a.ctypes.data if isinstance(a, np.ndarray) else a.__cuda_array_interface__["data"][0]


@functools.lru_cache(maxsize=None)
def _encode_tiled():
    fn = getattr(driver(), "cuTensorMapEncodeTiled", None)
    if fn is not None:
        u32p, u64p = ctypes.POINTER(ctypes.c_uint32), ctypes.POINTER(ctypes.c_uint64)
        fn.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32, ctypes.c_void_p, u64p, u64p, u32p, u32p,
                       ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int]
        fn.restype = ctypes.c_int
    return fn


def _encode(what: str, a, box: tuple, swizzle: int, elem: Scalar) -> bytes:
    """The CUtensorMap (128 bytes) from the driver; its dimensions innermost first, as the driver counts them. The
    same memory in the same layout and box gives the same bytes: they are remembered (a flash attention call maps K
    and V each time, and the driver's encode through ctypes cost more host time than a short kernel runs)."""
    key = (_address(a), a.shape, a.strides, box, swizzle, elem.name)
    encoded = _encoded.get(key)
    if encoded is None:
        encoded = _encoded[key] = _encode_new(what, a, box, swizzle, elem)
        while len(_encoded) > _ENCODED_KEPT:
            _encoded.pop(next(iter(_encoded)))
    return encoded


def _encode_new(what: str, a, box: tuple, swizzle: int, elem: Scalar) -> bytes:
    encode = _encode_tiled()
    if encode is None:
        raise RuntimeError(f"{what}: this CUDA driver has no cuTensorMapEncodeTiled (CUDA 12 and a Hopper GPU "
                           f"are needed)")
    rank = a.ndim
    out = (ctypes.c_uint64 * (MAP_BYTES // 8))()
    dims = (ctypes.c_uint64 * rank)(*reversed(a.shape))
    strides = (ctypes.c_uint64 * max(rank - 1, 1))(*reversed(a.strides[:-1]))
    sides = (ctypes.c_uint32 * rank)(*reversed(box))
    steps = (ctypes.c_uint32 * rank)(*([1] * rank))
    err = encode(out, DATA_TYPES[elem.name], rank, _address(a), dims, strides, sides, steps, 0, SWIZZLES[swizzle],
                 L2_PROMOTION_128B, 0)
    if err:
        raise ValueError(f"{what}, strides {a.strides}, box {box}, swizzle {swizzle}: cuTensorMapEncodeTiled "
                         f"failed with CUresult {err} ({driver_error_name(err)})")
    return bytes(out)
