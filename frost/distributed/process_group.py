"""The default process group: which backend, this process's rank, the world's size; collectives on tensors in
place, PyTorch's torch.distributed calls and semantics.

Ranks come from torchrun's variables (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT), which
`frost run` sets, or from MPI's launcher (OMPI_COMM_WORLD_*, PMI_*)."""
from __future__ import annotations

import os
from datetime import timedelta

from frost.backend import cuda as cuda_backend
from frost.distributed import mpi
from frost.distributed.nccl import NCCLBackend
from frost.distributed.store import TCPStore
from frost.tensor import Tensor


class ReduceOp:
    SUM = "sum"
    AVG = "avg"
    PRODUCT = "product"
    MAX = "max"
    MIN = "min"


class DistributedError(RuntimeError):
    pass


class Completed:
    """What a collective returns with async_op=True when it has already completed (torch.distributed returns a
    Work object whose wait() the caller may call)."""

    def wait(self, timeout=None) -> bool:
        return True

    def is_completed(self) -> bool:
        return True


class _Group:
    def __init__(self, backend, rank: int, world_size: int, local_rank: int, store: TCPStore | None) -> None:
        self.backend, self.rank, self.world_size, self.local_rank, self.store = (
            backend, rank, world_size, local_rank, store)


_group: _Group | None = None

_RANK_VARS = ("RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK")
_SIZE_VARS = ("WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE")
_LOCAL_VARS = ("LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID")


def _env_int(names: tuple, default: int | None) -> int | None:
    for name in names:
        value = os.environ.get(name)
        if value is not None:
            try:
                return int(value)
            except ValueError:
                raise DistributedError(f"init_process_group: ${name} = {value!r} is not an integer") from None
    return default


def launched_by_mpi() -> bool:
    return any(name in os.environ for name in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"))


def is_available() -> bool:
    return True


def is_mpi_available() -> bool:
    return mpi.available()


def is_nccl_available() -> bool:
    return cuda_backend.is_available()


def _default_backend() -> str:
    if launched_by_mpi() or not cuda_backend.is_available():
        return "mpi"
    return "nccl"


def _seconds(timeout) -> float:
    return timeout.total_seconds() if isinstance(timeout, timedelta) else float(timeout)


def init_process_group(backend: str | None = None, init_method: str | None = None, world_size: int = -1,
                       rank: int = -1, timeout: "timedelta | float" = 1800.0) -> None:
    """Join the default process group. backend: "nccl" (CUDA tensors), "mpi" (CPU tensors) or None (MPI when
    started by MPI's launcher or without CUDA, else NCCL). init_method: "env://" (default: MASTER_ADDR and
    MASTER_PORT) or "tcp://host:port"; rank and world_size default to the environment's."""
    global _group
    if _group is not None:
        raise DistributedError("init_process_group: the default process group is already initialized "
                               "(call destroy_process_group() first)")
    backend = (backend or _default_backend()).lower()
    if backend not in ("mpi", "nccl"):
        raise ValueError(f"init_process_group: unknown backend {backend!r}; expected 'nccl' or 'mpi'")
    rank = rank if rank >= 0 else _env_int(_RANK_VARS, 0)
    world_size = world_size if world_size > 0 else _env_int(_SIZE_VARS, 1)
    local_rank = _env_int(_LOCAL_VARS, rank)
    if not 0 <= rank < world_size:
        raise DistributedError(f"init_process_group: rank {rank} is outside a world of size {world_size}")
    if backend == "mpi":
        _group = _Group(_mpi_backend(rank, world_size), rank, world_size, local_rank, None)
        return
    store = _store(init_method, rank, _seconds(timeout))
    try:
        nccl = NCCLBackend(rank, world_size, local_rank, store)
    except BaseException:
        store.close()  # rank 0's port free again, for a retry in this process
        raise
    _group = _Group(nccl, rank, world_size, local_rank, store)


def _mpi_backend(rank: int, world_size: int) -> mpi.MPIBackend:
    if not mpi.available():
        raise DistributedError("init_process_group: backend 'mpi' needs mpi4py and an MPI library "
                               "(pip install \"frost[mpi]\")")
    mpi_rank, mpi_size = mpi.world()
    if (mpi_rank, mpi_size) != (rank, world_size):
        hint = (" These processes were not started by MPI's launcher: start them with `frost run --launcher mpi` "
                "(or mpiexec)." if mpi_size == 1 else "")
        raise DistributedError(f"init_process_group: MPI says rank {mpi_rank} of {mpi_size}, the environment says "
                               f"rank {rank} of {world_size}.{hint}")
    return mpi.MPIBackend()


def _store(init_method: str | None, rank: int, timeout: float) -> TCPStore:
    if init_method in (None, "env://"):
        host, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
        if host is None or port is None:
            raise DistributedError("init_process_group: set MASTER_ADDR and MASTER_PORT (frost run does), or pass "
                                   "init_method='tcp://host:port'")
    elif init_method.startswith("tcp://"):
        host, _, port = init_method[len("tcp://"):].rpartition(":")
    else:
        raise ValueError(f"init_process_group: init_method {init_method!r} is not 'env://' or 'tcp://host:port'")
    return TCPStore(host, int(port), is_master=rank == 0, timeout=timeout)


def destroy_process_group() -> None:
    global _group
    if _group is None:
        return
    _group.backend.close()
    if _group.store is not None:
        _group.store.close()
    _group = None


def is_initialized() -> bool:
    return _group is not None


def _current(name: str) -> _Group:
    if _group is None:
        raise DistributedError(f"{name}: the default process group is not initialized; call "
                               f"frost.distributed.init_process_group() first")
    return _group


def get_rank(group=None) -> int:
    return _current("get_rank").rank


def get_world_size(group=None) -> int:
    return _current("get_world_size").world_size


def get_local_rank() -> int:
    return _current("get_local_rank").local_rank


def get_backend(group=None) -> str:
    return _current("get_backend").backend.name


def _array(name: str, t: Tensor):
    """t's array, checked for the backend: NumPy for MPI, CuPy for NCCL, and contiguous (collectives work on one
    block of memory)."""
    group = _current(name)
    if not isinstance(t, Tensor):
        raise TypeError(f"{name}: expected a frost Tensor, got {type(t).__name__}")
    on_gpu = t.device.type == "cuda"
    if on_gpu != (group.backend.name == "nccl"):
        raise DistributedError(f"{name} on rank {group.rank}: backend '{group.backend.name}' works on "
                               f"{'CUDA' if group.backend.name == 'nccl' else 'CPU'} tensors; got a {t.device} "
                               f"tensor of shape {tuple(t.shape)}")
    a = t.data
    if not a.flags.c_contiguous:
        raise DistributedError(f"{name} on rank {group.rank}: the tensor of shape {tuple(t.shape)} is not "
                               f"contiguous; pass t.contiguous() (a collective writes one block of memory in place)")
    return group, a


def _check_op(name: str, op: str, a) -> str:
    if op not in (ReduceOp.SUM, ReduceOp.AVG, ReduceOp.PRODUCT, ReduceOp.MAX, ReduceOp.MIN):
        raise ValueError(f"{name}: unknown op {op!r}; use frost.distributed.ReduceOp")
    if op == ReduceOp.AVG and a.dtype.kind in "iub":  # MPI's average divides in place: no integer result
        raise TypeError(f"{name}: ReduceOp.AVG of a {a.dtype} tensor of shape {tuple(a.shape)}; average a "
                        f"floating-point tensor, or SUM and divide")
    return op


def all_reduce(tensor: Tensor, op: str = ReduceOp.SUM, group=None, async_op: bool = False):
    """Reduce `tensor` over all ranks, in place; with async_op=True returns a handle whose wait() finishes it."""
    group_, a = _array("all_reduce", tensor)
    return group_.backend.all_reduce(a, _check_op("all_reduce", op, a), async_op)


def broadcast(tensor: Tensor, src: int = 0, group=None, async_op: bool = False):
    """Overwrite `tensor` on every rank with rank src's, in place."""
    group_, a = _array("broadcast", tensor)
    if not 0 <= src < group_.world_size:
        raise ValueError(f"broadcast: src {src} is outside a world of size {group_.world_size}")
    group_.backend.broadcast(a, src)
    return Completed() if async_op else None


def all_gather_into_tensor(output: Tensor, input: Tensor, group=None, async_op: bool = False):  # noqa: A002
    """output (world_size * input's first dim, ...) receives every rank's input, in rank order."""
    group_, a = _array("all_gather_into_tensor", input)
    _, out = _array("all_gather_into_tensor", output)
    if out.size != a.size * group_.world_size or out.dtype != a.dtype:
        raise ValueError(f"all_gather_into_tensor: output {tuple(out.shape)} {out.dtype} must hold world_size "
                         f"({group_.world_size}) x input {tuple(a.shape)} {a.dtype}")
    group_.backend.all_gather(out.reshape((group_.world_size,) + a.shape), a)
    return Completed() if async_op else None


def all_gather(tensor_list: list, tensor: Tensor, group=None, async_op: bool = False):
    """tensor_list[r] receives rank r's tensor."""
    group_, a = _array("all_gather", tensor)
    if len(tensor_list) != group_.world_size:
        raise ValueError(f"all_gather: tensor_list has {len(tensor_list)} tensors for a world of size "
                         f"{group_.world_size}")
    whole = tensor.xp.empty((group_.world_size,) + a.shape, dtype=a.dtype)
    group_.backend.all_gather(whole, a)
    for r, t in enumerate(tensor_list):  # checked after the collective: a rank that refused first would hang the rest
        if tuple(t.shape) != a.shape or t.data.dtype != a.dtype:
            raise ValueError(f"all_gather on rank {group_.rank}: tensor_list[{r}] is {tuple(t.shape)} {t.data.dtype}, "
                             f"expected the input's {a.shape} {a.dtype}")
        t.data[...] = whole[r]
    return Completed() if async_op else None


def reduce_scatter_tensor(output: Tensor, input: Tensor, op: str = ReduceOp.SUM, group=None,  # noqa: A002
                          async_op: bool = False):
    """output receives this rank's block (input split along its first dim into world_size blocks) of the
    reduction of input over all ranks."""
    group_, a = _array("reduce_scatter_tensor", input)
    _, out = _array("reduce_scatter_tensor", output)
    if out.size * group_.world_size != a.size or out.dtype != a.dtype:
        raise ValueError(f"reduce_scatter_tensor: input {tuple(a.shape)} {a.dtype} must be world_size "
                         f"({group_.world_size}) x output {tuple(out.shape)} {out.dtype}")
    group_.backend.reduce_scatter(out, a, _check_op("reduce_scatter_tensor", op, a))
    return Completed() if async_op else None


def reduce_scatter(output: Tensor, input_list: list, op: str = ReduceOp.SUM, group=None, async_op: bool = False):
    """output receives the reduction over all ranks of their input_list[rank]."""
    group_ = _current("reduce_scatter")
    if len(input_list) != group_.world_size:
        raise ValueError(f"reduce_scatter: input_list has {len(input_list)} tensors for a world of size "
                         f"{group_.world_size}")
    stacked = Tensor(output.xp.stack([t.data for t in input_list]))
    return reduce_scatter_tensor(output, stacked, op, async_op=async_op)


def barrier(group=None) -> None:
    _current("barrier").backend.barrier()
