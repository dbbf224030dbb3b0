"""Programmatic dependent launch: Frost kernels launched through cuLaunchKernelEx so the next one is launched early.

Every `@kernel` begins with `griddepcontrol.wait` (cgen's `frost_wait_for_previous_grid`): it waits until the kernel
before it in the stream has completed and its writes are visible, and nothing is read or written before it, so
the order of memory effects is the plain stream's. Launched with CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
on a GPU of compute capability 9.0 or newer, a kernel is launched when the blocks of the one before have finished
(each block's exit counts as its trigger) rather than after that grid's completion has gone through the stream,
inside CUDA graphs too (stream capture records the programmatic edge): on the seed ResNet's captured step (about
100 of its 120 launches are ours) 0.655 -> 0.636 ms in float32 and 0.578 -> 0.571 in bf16 on an H200. An earlier
trigger (`griddepcontrol.launch_dependents` as each block starts) was slower, 0.739 against 0.693 ms without PDL
(both with empty caches): the next kernel's blocks, placed while this one runs, crowd onto the SMs that happen to
be free. Elsewhere (older GPUs, `FROST_PDL=0`, CUDA C++ joined with `cuda_source`) launches go through CuPy as
before; the wait is a no-op there.
"""
from __future__ import annotations

import ctypes
import functools
import os
import struct
import threading

import numpy as np

from frost.backend.cuda import driver, driver_error_name

# CUlaunchAttributeID: CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION (cuda.h)
PROGRAMMATIC_STREAM_SERIALIZATION = 6

enabled = os.environ.get("FROST_PDL", "1") != "0"  # checked at each launch: set it False to compare


class _LaunchAttribute(ctypes.Structure):
    # CUlaunchAttribute: the id, padding to 8 bytes, then the 64-byte CUlaunchAttributeValue union
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", ctypes.c_int * 16)]


class _LaunchConfig(ctypes.Structure):
    # CUlaunchConfig, its grid and block dimensions as six fields (the layout of two arrays of three: a config is
    # built from plain numbers at every launch)
    _fields_ = [("grid_x", ctypes.c_uint), ("grid_y", ctypes.c_uint), ("grid_z", ctypes.c_uint),
                ("block_x", ctypes.c_uint), ("block_y", ctypes.c_uint), ("block_z", ctypes.c_uint),
                ("shared_mem_bytes", ctypes.c_uint), ("stream", ctypes.c_void_p),
                ("attrs", ctypes.POINTER(_LaunchAttribute)), ("num_attrs", ctypes.c_uint)]


_SERIALIZATION = _LaunchAttribute(id=PROGRAMMATIC_STREAM_SERIALIZATION)
_SERIALIZATION.value[0] = 1
_SERIALIZATION_POINTER = ctypes.pointer(_SERIALIZATION)   # read by every launch, written by none
# struct's codes of the NumPy scalar types a kernel's arguments come as (bfloat16 has none: such a signature is
# packed by NumPy instead)
_STRUCT_CODES = {("u", 1): "B", ("u", 2): "H", ("u", 4): "I", ("u", 8): "Q", ("i", 1): "b", ("i", 2): "h",
                 ("i", 4): "i", ("i", 8): "q", ("f", 2): "e", ("f", 4): "f", ("f", 8): "d", ("b", 1): "?"}
# per thread and signature: a reused argument buffer and its member pointers (the driver copies the arguments
# during the launch call, so the next launch may overwrite them)
_scratch = threading.local()


@functools.lru_cache(maxsize=None)
def _layout(dtypes: tuple) -> tuple:
    """(a struct.Struct that packs these dtypes each at its natural alignment, or None if one has no struct code;
    the same record as a NumPy dtype; each member's offset), once per signature."""
    record = np.dtype([(f"a{i}", d) for i, d in enumerate(dtypes)], align=True)
    offsets = [record.fields[f"a{i}"][1] for i in range(len(dtypes))]
    codes = [_STRUCT_CODES.get((d.kind, d.itemsize)) for d in dtypes]
    if None in codes:
        return None, record, offsets
    fmt, end = "=", 0
    for code, d, offset in zip(codes, dtypes, offsets):
        fmt += "x" * (offset - end) + code
        end = offset + d.itemsize
    return struct.Struct(fmt + "x" * (record.itemsize - end)), record, offsets


def _pointers(base: int, offsets) -> ctypes.Array:
    return (ctypes.c_void_p * len(offsets))(*[base + o for o in offsets])


def kernel_params(args) -> tuple:
    """(values, params) for cuLaunchKernelEx: `values` holds the kernel's arguments (NumPy scalars, in signature
    order) in one record at their natural alignments and `params` points at each; keep `values` alive until the
    launch call has returned (the driver copies them then). The same thread's next launch of the same signature
    reuses the record: packing into it costs a fraction of building a NumPy record."""
    dtypes = tuple(a.dtype for a in args)
    packer, record, offsets = _layout(dtypes)
    if packer is None:
        values = np.array(tuple(args), dtype=record)
        return values, _pointers(values.ctypes.data, offsets)
    kept = _scratch.__dict__.get(dtypes)
    if kept is None:
        values = (ctypes.c_uint64 * max(1, -(-record.itemsize // 8)))()   # 8-byte aligned, as the record needs
        kept = _scratch.__dict__[dtypes] = (values, _pointers(ctypes.addressof(values), offsets))
    packer.pack_into(kept[0], 0, *args)
    return kept


@functools.lru_cache(maxsize=None)
def _launch_kernel_ex():
    """libcuda's cuLaunchKernelEx, or None where the driver has none."""
    fn = getattr(driver(), "cuLaunchKernelEx", None)
    if fn is not None:
        fn.argtypes = [ctypes.POINTER(_LaunchConfig), ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
        fn.restype = ctypes.c_int
    return fn


_capable: dict = {}


def usable(device_id: int) -> bool:
    """Whether launches on this GPU go through programmatic dependent launch (compute capability 9.0+)."""
    if not enabled:
        return False
    if device_id not in _capable:
        import cupy
        major = cupy.cuda.runtime.getDeviceProperties(device_id)["major"]
        _capable[device_id] = major >= 9 and _launch_kernel_ex() is not None
    return _capable[device_id]


def launch(name: str, fn_ptr: int, grid, block, smem: int, stream_ptr: int, args, serialize: bool = True) -> None:
    """Launch a loaded kernel through cuLaunchKernelEx, with the programmatic-serialization attribute unless
    serialize is False (a plain launch, for arguments CuPy cannot pass); a driver error names the kernel."""
    values, params = kernel_params(args)
    attrs = (_SERIALIZATION_POINTER, 1) if serialize else (None, 0)
    config = _LaunchConfig(*grid, *block, smem, stream_ptr, *attrs)
    err = _launch_kernel_ex()(ctypes.byref(config), fn_ptr, params, None)
    if err:
        raise RuntimeError(f"{name}: cuLaunchKernelEx failed with CUresult {err} ({driver_error_name(err)}); "
                           f"grid {grid}, block {block}, {smem} bytes of dynamic shared memory")
