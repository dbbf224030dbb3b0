"""The GPU backend: NCCL through CuPy's bindings (`cupy.cuda.nccl`, with the `nvidia-nccl-cu13` library), on CuPy
arrays, in place, on the current stream (so collectives order with the kernels around them and can be captured
into a CUDA graph by frost.jit).

Why CuPy's bindings and not nccl4py: Frost already depends on CuPy for every GPU array and stream, its NCCL
module takes raw pointers and a stream handle (nothing to convert), and it needs no second package. Rank 0 makes
the NCCL unique id and hands it to the others through the TCP store at MASTER_ADDR:MASTER_PORT (no PyTorch)."""
from __future__ import annotations

import platform
import struct

from frost.backend import cuda
from frost.distributed.store import TCPStore

# NCCL's enum values (nccl.h); CuPy's module names some of them only in newer releases
_DTYPES = {"int8": 0, "uint8": 1, "int32": 2, "int64": 4, "float16": 6, "float32": 7, "float64": 8,
           "bfloat16": 9}
_OPS = {"sum": 0, "product": 1, "max": 2, "min": 3, "avg": 4}
UNIQUE_ID_BYTES = 128  # NCCL_UNIQUE_ID_BYTES
# CuPy hands the id over as C chars: -128..127 where char is signed (x86-64), 0..255 where it is unsigned (Arm,
# POWER, s390x), and takes back only values of this machine's kind
_UNSIGNED_CHAR = platform.machine().lower().startswith(("aarch64", "arm", "ppc", "powerpc", "s390", "riscv"))


def _nccl():
    cuda.cupy()  # CuPy is imported on first GPU use only, with frost's error when it is missing
    from cupy.cuda import nccl
    return nccl


def _pack_id(uid) -> bytes:
    """The id's bytes, whichever sign the sending machine's chars have (CuPy 14 gives bytes already)."""
    return bytes(uid) if isinstance(uid, bytes) else bytes(v & 0xFF for v in uid)


def _unpack_id(raw: bytes) -> tuple:
    """The id as NcclCommunicator takes it on this machine."""
    if len(raw) != UNIQUE_ID_BYTES:
        raise ValueError(f"nccl: the unique id from rank 0's store has {len(raw)} bytes, expected {UNIQUE_ID_BYTES}")
    return tuple(raw) if _UNSIGNED_CHAR else struct.unpack(f"{len(raw)}b", raw)


def communicator(nccl, world_size: int, raw: bytes, rank: int):
    """NCCL's communicator from the id's bytes: CuPy 14 takes the bytes, older CuPy a tuple of this machine's C
    chars (it says which by refusing the other with a TypeError naming commId)."""
    if len(raw) != UNIQUE_ID_BYTES:
        raise ValueError(f"nccl: the unique id from rank 0's store has {len(raw)} bytes, expected {UNIQUE_ID_BYTES}")
    try:
        return nccl.NcclCommunicator(world_size, raw, rank)
    except TypeError as e:
        if "commId" not in str(e):
            raise
        return nccl.NcclCommunicator(world_size, _unpack_id(raw), rank)


class NCCLWork:
    """NCCL runs on the stream: the host has nothing to wait for (the next kernel on the stream waits)."""

    def wait(self) -> bool:
        return True

    def is_completed(self) -> bool:
        return True


class NCCLBackend:
    name = "nccl"

    def __init__(self, rank: int, world_size: int, local_rank: int, store: TCPStore) -> None:
        nccl = _nccl()
        cp = cuda.cupy()
        # one GPU per process, chosen by LOCAL_RANK as torchrun's users do; modulo the visible GPUs for schedulers
        # that give each process just its own (CUDA_VISIBLE_DEVICES of one GPU)
        cp.cuda.Device(local_rank % cp.cuda.runtime.getDeviceCount()).use()
        if rank == 0:
            store.set("nccl_unique_id", _pack_id(nccl.get_unique_id()))
        self.comm = communicator(nccl, world_size, store.get("nccl_unique_id"), rank)
        self.world_size = world_size

    @staticmethod
    def _stream() -> int:
        return cuda.cupy().cuda.get_current_stream().ptr

    @staticmethod
    def _dtype(a) -> int:
        try:
            return _DTYPES[a.dtype.name]
        except KeyError:
            raise TypeError(f"nccl: no NCCL type for {a.dtype.name}; use one of {sorted(_DTYPES)}") from None

    def all_reduce(self, a, op: str, async_op: bool):
        self.comm.allReduce(a.data.ptr, a.data.ptr, a.size, self._dtype(a), _OPS[op], self._stream())
        return NCCLWork() if async_op else None

    def broadcast(self, a, src: int) -> None:
        self.comm.bcast(a.data.ptr, a.size, self._dtype(a), src, self._stream())

    def all_gather(self, out, a) -> None:
        self.comm.allGather(a.data.ptr, out.data.ptr, a.size, self._dtype(a), self._stream())

    def reduce_scatter(self, out, a, op: str) -> None:
        self.comm.reduceScatter(a.data.ptr, out.data.ptr, out.size, self._dtype(a), _OPS[op], self._stream())

    def barrier(self) -> None:
        one = cuda.cupy().zeros(1, dtype="float32")
        self.all_reduce(one, "sum", False)
        cuda.cupy().cuda.get_current_stream().synchronize()

    def close(self) -> None:
        self.comm.destroy()
