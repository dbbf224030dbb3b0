"""The CPU backend: MPI through mpi4py (with Open MPI's wheel), on NumPy arrays, in place.

Processes must be started by MPI's launcher (`frost run` does so on machines without CUDA, or with
`--launcher mpi`): MPI forms the world itself, so no rendezvous over MASTER_ADDR is needed."""
from __future__ import annotations

import importlib.util

import numpy as np

# NumPy dtypes MPI has no type for (bfloat16): reduced in float32 and rounded back once
_WIDENED = {"bfloat16": np.float32}


class MPIWork:
    """A collective in flight (async_op=True): wait() completes it and writes the result back."""

    def __init__(self, request, finish=None) -> None:
        self.request, self.finish, self.done = request, finish, False

    def _complete(self) -> None:
        if self.finish is not None:
            self.finish()
        self.done = True

    def wait(self) -> bool:
        if not self.done:
            self.request.Wait()
            self._complete()
        return True

    def is_completed(self) -> bool:
        """Whether the collective is done (its result then written back), without blocking: a loop polling it
        must see the end without calling wait()."""
        if not self.done and self.request.Test():
            self._complete()
        return self.done


def available() -> bool:
    return importlib.util.find_spec("mpi4py") is not None


def _mpi():
    """mpi4py's MPI module, imported on first use: importing it initializes MPI, which `import frost` must not."""
    from mpi4py import MPI
    return MPI


def world() -> tuple[int, int]:
    """(rank, size) of MPI's COMM_WORLD."""
    comm = _mpi().COMM_WORLD
    return comm.Get_rank(), comm.Get_size()


class MPIBackend:
    name = "mpi"

    def __init__(self) -> None:
        MPI = _mpi()
        self.comm = MPI.COMM_WORLD.Dup()  # our own communicator: a user's mpi4py traffic cannot mix with ours
        self.in_place = MPI.IN_PLACE
        self.ops = {"sum": MPI.SUM, "avg": MPI.SUM, "product": MPI.PROD, "max": MPI.MAX, "min": MPI.MIN}

    def all_reduce(self, a: np.ndarray, op: str, async_op: bool):
        buf = _widened(a)
        size = self.comm.Get_size()

        def finish():
            if op == "avg":
                buf[...] /= size
            if buf is not a:
                a[...] = buf
        if async_op:
            return MPIWork(self.comm.Iallreduce(self.in_place, buf, self.ops[op]), finish)
        self.comm.Allreduce(self.in_place, buf, self.ops[op])
        finish()
        return None

    def broadcast(self, a: np.ndarray, src: int) -> None:
        buf = _widened(a)
        self.comm.Bcast(buf, root=src)
        if buf is not a:
            a[...] = buf

    def all_gather(self, out: np.ndarray, a: np.ndarray) -> None:
        """out (world, *a.shape) receives every rank's a."""
        buf, whole = _widened(a), _widened(out)
        self.comm.Allgather(buf, whole)
        if whole is not out:
            out[...] = whole

    def reduce_scatter(self, out: np.ndarray, a: np.ndarray, op: str) -> None:
        """out (a's first dim / world, ...) receives this rank's block of the reduction of a."""
        buf, part = _widened(a), _widened(out)
        self.comm.Reduce_scatter_block(buf, part, self.ops[op])
        if op == "avg":
            part /= self.comm.Get_size()
        if part is not out:
            out[...] = part

    def barrier(self) -> None:
        self.comm.Barrier()

    def close(self) -> None:
        self.comm.Free()


def _widened(a: np.ndarray) -> np.ndarray:
    wide = _WIDENED.get(a.dtype.name)
    return a.astype(wide) if wide is not None else a
