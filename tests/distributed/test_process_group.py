"""The default process group's calls in one process: the backends stand in (conftest's AlikeBackend), or NCCL's
set-up fails for want of a GPU. The collectives themselves run on several processes in test_data_parallel.py."""
import socket

import numpy as np
import pytest

import frost
import frost.distributed as dist
from frost.backend import cuda
from frost.distributed import TCPStore, mpi, nccl


@pytest.mark.parametrize("alike_world", [2], indirect=True)
def test_every_collective_with_async_op_returns_a_work_to_wait_on(alike_world):
    t = frost.ones(4)
    works = [dist.all_reduce(t, async_op=True), dist.broadcast(t, async_op=True),
             dist.all_gather_into_tensor(frost.zeros(8), t, async_op=True),
             dist.all_gather([frost.zeros(4), frost.zeros(4)], t, async_op=True),
             dist.reduce_scatter_tensor(frost.zeros(2), t, async_op=True),
             dist.reduce_scatter(frost.zeros(4), [t, t], async_op=True)]
    assert [w.wait() and w.is_completed() for w in works] == [True] * 6
    assert dist.broadcast(t) is None  # as torch.distributed: no work without async_op


@pytest.mark.parametrize("alike_world", [2], indirect=True)
def test_errors_name_the_rank_the_op_and_the_shape(alike_world):
    with pytest.raises(dist.DistributedError, match=r"all_reduce on rank 0: the tensor of shape \(3, 2\) is not"):
        dist.all_reduce(frost.zeros(2, 3).t())
    with pytest.raises(ValueError, match=r"all_gather on rank 0: tensor_list\[1\] is \(4,\) float64"):
        dist.all_gather([frost.zeros(4), frost.zeros(4, dtype=frost.float64)], frost.ones(4))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.skipif(cuda.is_available(), reason="needs NCCL's set-up to fail: a machine without CUDA")
def test_a_failed_nccl_set_up_frees_rank_0s_port():
    port = free_port()
    with pytest.raises(cuda.CudaUnavailableError):
        dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=2, timeout=5)
    assert not dist.is_initialized()
    TCPStore("127.0.0.1", port, is_master=True).close()  # a retry can serve on the same port


def test_the_nccl_unique_id_travels_between_machines_of_either_char_sign():
    """CuPy gives the id as C chars: signed on x86-64, unsigned on Arm; the bytes are what must arrive."""
    raw = bytes(range(128))[::-1]
    signed = tuple(np.frombuffer(raw, dtype=np.int8).tolist())
    unsigned = tuple(raw)
    assert nccl._pack_id(signed) == nccl._pack_id(unsigned) == raw
    local = nccl._unpack_id(raw)
    assert local == (unsigned if nccl._UNSIGNED_CHAR else signed)
    with pytest.raises(ValueError, match="127 bytes, expected 128"):
        nccl._unpack_id(raw[:127])


class BytesCommunicator:
    """CuPy 14's NcclCommunicator (Cython-typed `bytes commId`): the unique id as bytes only."""

    def __init__(self, world_size, comm_id, rank):
        if not isinstance(comm_id, bytes):
            raise TypeError(f"Argument 'commId' has incorrect type (expected bytes, got {type(comm_id).__name__})")
        self.comm_id = comm_id


class CharsCommunicator:
    """Older CuPy's (`tuple commId`): the id as a tuple of this machine's C chars."""

    def __init__(self, world_size, comm_id, rank):
        if not isinstance(comm_id, tuple):
            raise TypeError(f"Argument 'commId' has incorrect type (expected tuple, got {type(comm_id).__name__})")
        self.comm_id = comm_id


@pytest.mark.parametrize("kind", [BytesCommunicator, CharsCommunicator])
def test_the_communicator_takes_the_id_in_the_form_this_cupy_wants(kind):
    raw = bytes(range(128))[::-1]
    fake = type("FakeNccl", (), {"NcclCommunicator": kind})
    expected = raw if kind is BytesCommunicator else nccl._unpack_id(raw)
    assert nccl.communicator(fake, 1, raw, 0).comm_id == expected
    assert nccl._pack_id(raw) == raw  # CuPy 14's get_unique_id() gives bytes: they travel as they are
    with pytest.raises(ValueError, match="127 bytes, expected 128"):
        nccl.communicator(fake, 1, raw[:127], 0)


class SlowRequest:
    """An MPI request that completes at the third Test()."""

    def __init__(self) -> None:
        self.tests = 0

    def Test(self) -> bool:  # noqa: N802 (mpi4py's name)
        self.tests += 1
        return self.tests >= 3

    def Wait(self) -> None:  # noqa: N802
        self.tests = 3


def test_an_mpi_work_polled_with_is_completed_finishes_without_wait():
    written = []
    work = mpi.MPIWork(SlowRequest(), lambda: written.append("result"))
    assert [work.is_completed() for _ in range(4)] == [False, False, True, True]
    assert written == ["result"]  # written back once, when it completed
    work.wait()
    assert written == ["result"]


@pytest.mark.parametrize("alike_world", [2], indirect=True)
def test_an_average_of_integers_is_refused_by_name(alike_world):
    with pytest.raises(TypeError, match=r"all_reduce: ReduceOp.AVG of a int64 tensor of shape \(3,\)"):
        dist.all_reduce(frost.arange(3), dist.ReduceOp.AVG)
    assert alike_world.log == []  # refused before the collective, as every process would
