import numpy as np
import pytest

from frost.distributed import process_group


@pytest.fixture
def needs_mpi():
    pytest.importorskip("mpi4py")


class AlikeBackend:
    """Stands in for a world of `world` processes that all hold this process's values (so a sum multiplies by
    the world's size; an average, max and min leave them), in one process; every collective is logged."""

    name = "mpi"

    def __init__(self, world: int) -> None:
        self.world, self.log = world, []

    def all_reduce(self, a, op: str, async_op: bool):
        self.log.append(("all_reduce", op, a.size))
        if op == "sum":
            a *= self.world
        return process_group.Completed() if async_op else None

    def broadcast(self, a, src: int) -> None:
        self.log.append(("broadcast", a.size))

    def all_gather(self, out, a) -> None:
        self.log.append(("all_gather", a.size))
        out[...] = a

    def reduce_scatter(self, out, a, op: str) -> None:
        self.log.append(("reduce_scatter", op, a.size))
        out[...] = np.asarray(a).reshape(self.world, -1)[0].reshape(out.shape) * (self.world if op == "sum" else 1)

    def barrier(self) -> None:
        self.log.append(("barrier",))

    def close(self) -> None:
        pass


@pytest.fixture
def alike_world(monkeypatch, request):
    """The default group as rank 0 of a world of alike processes (size: the test's `world` parameter, else 1)."""
    world = getattr(request, "param", 1)
    backend = AlikeBackend(world)
    monkeypatch.setattr(process_group, "_group", process_group._Group(backend, 0, world, 0, None))
    return backend
