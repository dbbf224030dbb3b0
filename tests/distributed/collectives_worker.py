"""Run under `frost run --launcher mpi`: every collective against the value it must give; exits non-zero (with
the assertion's message) on the first wrong one."""
import sys

import numpy as np

import frost
import frost.distributed as dist


def main() -> None:
    dist.init_process_group("mpi")
    rank, world = dist.get_rank(), dist.get_world_size()
    assert dist.get_backend() == "mpi" and dist.is_initialized()
    for dtype in ("float32", "float64", "int64", "bfloat16"):
        t = frost.tensor(np.arange(6) + rank, dtype=dtype)
        dist.all_reduce(t)
        expected = world * np.arange(6) + world * (world - 1) / 2
        assert np.array_equal(t.float().numpy(), expected), (dtype, t.float().numpy(), expected)
    for op, fold in ((dist.ReduceOp.MAX, np.max), (dist.ReduceOp.MIN, np.min), (dist.ReduceOp.PRODUCT, np.prod),
                     (dist.ReduceOp.AVG, np.mean)):
        t = frost.tensor([rank + 1.0, 2.0 * rank])
        dist.all_reduce(t, op)
        expected = fold([[r + 1.0, 2.0 * r] for r in range(world)], axis=0)
        assert np.allclose(t.numpy(), expected), (op, t.numpy(), expected)
    t = frost.full((4,), float(rank))
    work = dist.all_reduce(t, async_op=True)
    work.wait()
    assert np.array_equal(t.numpy(), np.full(4, world * (world - 1) / 2))
    t = frost.full((3,), float(rank))
    dist.broadcast(t, src=world - 1)
    assert np.array_equal(t.numpy(), np.full(3, world - 1.0))
    parts = [frost.zeros(2) for _ in range(world)]
    dist.all_gather(parts, frost.full((2,), float(rank)))
    assert [p.tolist() for p in parts] == [[float(r)] * 2 for r in range(world)]
    whole = frost.zeros(2 * world)
    dist.all_gather_into_tensor(whole, frost.full((2,), float(rank)))
    assert whole.tolist() == [float(r) for r in range(world) for _ in range(2)]
    mine = frost.zeros(2)
    dist.reduce_scatter_tensor(mine, frost.arange(2 * world, dtype=frost.float32) * (rank + 1))
    total = world * (world + 1) / 2
    assert mine.tolist() == [total * (2 * rank), total * (2 * rank + 1)], mine.tolist()
    dist.reduce_scatter(mine, [frost.full((2,), float(r + rank)) for r in range(world)])
    assert mine.tolist() == [float(world * rank + total - world)] * 2, mine.tolist()
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.write(f"rank {rank} of {world}: collectives ok\n")  # one write: print's two interleave across ranks


if __name__ == "__main__":
    main()
