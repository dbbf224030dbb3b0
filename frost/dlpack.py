"""DLPack both ways, zero-copy: Tensor.__dlpack__ / __dlpack_device__ (so torch.from_dlpack(t), np.from_dlpack(t)
and cupy.from_dlpack(t) share a frost tensor's memory) and frost.from_dlpack(x) (a torch tensor, a NumPy or CuPy
array, anything with __dlpack__).

NumPy's DLPack knows no bfloat16 (ml_dtypes' dtype is not one of its own), so bfloat16 host tensors go through this
module's own reading and writing of the DLPack structures (the unversioned "dltensor" capsule, which every
consumer takes); the other dtypes go through NumPy's and CuPy's.
"""
from __future__ import annotations

import ctypes
import threading
from typing import Any

import ml_dtypes
import numpy as np

from frost.backend import cuda as cuda_backend
from frost.dtype import ALL
from frost.tensor import Tensor

_CPU, _CUDA = 1, 2                    # DLDeviceType codes
_BFLOAT, _BF16_BITS = 4, 16            # DLDataTypeCode kDLBfloat, and its width
_LEGACY = b"dltensor"                  # the capsule names of the unversioned protocol
_USED = b"used_dltensor"
_FROST_DTYPES = frozenset(d.np for d in ALL)


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32), ("dtype", _DLDataType),
                ("shape", ctypes.POINTER(ctypes.c_int64)), ("strides", ctypes.POINTER(ctypes.c_int64)),
                ("byte_offset", ctypes.c_uint64)]


class _DLManagedTensor(ctypes.Structure):
    pass


_Deleter = ctypes.CFUNCTYPE(None, ctypes.POINTER(_DLManagedTensor))
_DLManagedTensor._fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", _Deleter)]

_CapsuleDestructor = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
_api = ctypes.pythonapi
_api.PyCapsule_New.restype, _api.PyCapsule_New.argtypes = ctypes.py_object, [ctypes.c_void_p, ctypes.c_char_p,
                                                                               _CapsuleDestructor]
_api.PyCapsule_IsValid.restype, _api.PyCapsule_IsValid.argtypes = ctypes.c_int, [ctypes.py_object, ctypes.c_char_p]
_api.PyCapsule_GetPointer.restype = ctypes.c_void_p
_api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_api.PyCapsule_SetName.restype, _api.PyCapsule_SetName.argtypes = ctypes.c_int, [ctypes.py_object, ctypes.c_char_p]
# the same two functions on a capsule being destroyed, by address: a py_object would revive it (its count is 0)
_is_valid_at = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p)(("PyCapsule_IsValid", _api))
_pointer_at = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_char_p)(("PyCapsule_GetPointer", _api))

# what an exported bfloat16 capsule keeps alive until its consumer calls the deleter: address -> (struct, array, ...)
_exported: dict[int, tuple] = {}
_exported_lock = threading.Lock()


def to_dlpack(t: Tensor, stream: Any = None, max_version: tuple[int, int] | None = None,
              dl_device: tuple | None = None, copy: bool | None = None):
    """The DLPack capsule of t's memory (Tensor.__dlpack__). A tensor that requires grad is refused, as in PyTorch:
    the consumer's writes would bypass autograd; export t.detach()."""
    if t.requires_grad:
        raise RuntimeError(f"__dlpack__: cannot export a tensor (shape {t.shape}) that requires grad; export "
                           f"t.detach()")
    if t.dtype.name == "bfloat16" and isinstance(t.data, np.ndarray):
        if copy:
            return _export_bfloat16(t.data.copy())
        return _export_bfloat16(t.data)
    options = {k: v for k, v in dict(stream=stream, max_version=max_version, dl_device=dl_device, copy=copy).items()
               if v is not None}
    return t.data.__dlpack__(**options)


def dlpack_device(t: Tensor) -> tuple[int, int]:
    """(device type, index) as DLPack names them: (1, 0) for the CPU, (2, N) for cuda:N."""
    return t.data.__dlpack_device__()


def from_dlpack(x: Any) -> Tensor:
    """A frost tensor over the memory of `x` (anything with __dlpack__: a torch tensor, a NumPy or CuPy array, a
    frost tensor), not a copy: writes through either side are seen by the other."""
    if isinstance(x, Tensor):
        return x
    if not hasattr(x, "__dlpack__") or not hasattr(x, "__dlpack_device__"):
        raise TypeError(f"frost.from_dlpack: expected an object with __dlpack__ and __dlpack_device__ (a torch tensor, "
                        f"a NumPy or CuPy array), got {type(x).__name__}")
    kind, _ = x.__dlpack_device__()
    if int(kind) == _CUDA:
        return _tensor(cuda_backend.gpu_cupy().from_dlpack(x))
    if int(kind) != _CPU:
        raise ValueError(f"frost.from_dlpack: device type {int(kind)} is neither the CPU (1) nor CUDA (2)")
    try:
        array = np.from_dlpack(x)
    except (RuntimeError, BufferError, TypeError) as numpy_refused:  # bfloat16 (NumPy: "Unsupported dtype")
        array = _import_legacy(x.__dlpack__(), numpy_refused)
    return _tensor(array)


def _tensor(array) -> Tensor:
    if array.dtype not in _FROST_DTYPES:
        raise TypeError(f"frost.from_dlpack: unsupported DLPack dtype {array.dtype} (shape {tuple(array.shape)}); "
                        f"frost has {[d.name for d in ALL]}")
    return Tensor(array)


# ---------------------------------------------------------------- bfloat16 on the host, by hand

def _export_bfloat16(array: np.ndarray):
    """A "dltensor" capsule of a bfloat16 NumPy array: a DLManagedTensor whose deleter lets go of the array."""
    managed = _DLManagedTensor()
    shape = (ctypes.c_int64 * max(array.ndim, 1))(*array.shape)
    strides = (ctypes.c_int64 * max(array.ndim, 1))(*(s // array.itemsize for s in array.strides))
    managed.dl_tensor.data = array.__array_interface__["data"][0] if array.size else None
    managed.dl_tensor.device = _DLDevice(_CPU, 0)
    managed.dl_tensor.ndim = array.ndim
    managed.dl_tensor.dtype = _DLDataType(_BFLOAT, _BF16_BITS, 1)
    managed.dl_tensor.shape = ctypes.cast(shape, ctypes.POINTER(ctypes.c_int64))
    managed.dl_tensor.strides = ctypes.cast(strides, ctypes.POINTER(ctypes.c_int64))
    managed.dl_tensor.byte_offset = 0
    managed.deleter = _release_export
    address = ctypes.addressof(managed)
    with _exported_lock:
        _exported[address] = (managed, array, shape, strides)
    return _api.PyCapsule_New(address, _LEGACY, _destroy_unused_capsule)


@_Deleter
def _release_export(managed) -> None:
    with _exported_lock:
        _exported.pop(ctypes.addressof(managed.contents), None)


@_CapsuleDestructor
def _destroy_unused_capsule(capsule_address: int) -> None:
    """A capsule dropped before any consumer took it still owns its DLManagedTensor: release it."""
    if _is_valid_at(capsule_address, _LEGACY):
        address = _pointer_at(capsule_address, _LEGACY)
        with _exported_lock:
            _exported.pop(address, None)


class _Producer:
    """Holds an imported DLManagedTensor; the producer's deleter runs when the last array over it goes."""

    def __init__(self, managed: _DLManagedTensor) -> None:
        self.managed = managed

    def __del__(self) -> None:
        if self.managed.deleter:
            self.managed.deleter(ctypes.pointer(self.managed))


def _import_legacy(capsule, numpy_refused: Exception) -> np.ndarray:
    """A NumPy array over a "dltensor" capsule's bfloat16 host memory (NumPy itself refuses bfloat16)."""
    if not _api.PyCapsule_IsValid(capsule, _LEGACY):
        raise TypeError(f"frost.from_dlpack: NumPy refused the tensor ({numpy_refused}) and it is not an unused "
                        f"'dltensor' capsule frost could read itself") from numpy_refused
    managed = _DLManagedTensor.from_address(_api.PyCapsule_GetPointer(capsule, _LEGACY))
    dl = managed.dl_tensor
    if (dl.dtype.code, dl.dtype.bits, dl.dtype.lanes) != (_BFLOAT, _BF16_BITS, 1):
        raise TypeError(f"frost.from_dlpack: unsupported DLPack dtype (code {dl.dtype.code}, {dl.dtype.bits} bits, "
                        f"{dl.dtype.lanes} lanes): {numpy_refused}") from numpy_refused
    _api.PyCapsule_SetName(capsule, _USED)  # from here on the deleter is ours to call (the protocol's rule)
    owner = _Producer(managed)
    shape = tuple(dl.shape[i] for i in range(dl.ndim))
    item = np.dtype(ml_dtypes.bfloat16).itemsize
    strides = (tuple(dl.strides[i] * item for i in range(dl.ndim)) if dl.strides
               else tuple(int(np.prod(shape[i + 1:], dtype=np.int64)) * item for i in range(dl.ndim)))
    if 0 in shape:
        return np.empty(shape, ml_dtypes.bfloat16)
    if any(s < 0 for s in strides):
        raise ValueError("frost.from_dlpack: negative strides are not supported")
    nbytes = item + sum((n - 1) * s for n, s in zip(shape, strides))  # from the first element to the last one's end
    buffer = (ctypes.c_uint8 * nbytes).from_address(dl.data + dl.byte_offset)
    buffer._producer = owner  # the array's base chain keeps the producer's memory until the last view goes
    flat = np.frombuffer(buffer, np.uint8).view(ml_dtypes.bfloat16)
    return np.lib.stride_tricks.as_strided(flat, shape, strides, writeable=True)
