"""Data-parallel training over processes: torch.distributed's calls on NCCL (CUDA) or MPI (CPU).

    import frost.distributed as dist
    dist.init_process_group()                     # reads RANK, WORLD_SIZE, ... set by `frost run`
    model = frost.nn.parallel.DistributedDataParallel(model)
    ...
    dist.destroy_process_group()

Start the processes with `frost run --nproc-per-node N script.py args` (or `python -m frost.distributed.run`)."""
from frost.distributed.process_group import (DistributedError, ReduceOp, all_gather, all_gather_into_tensor,
                                             all_reduce, barrier, broadcast, destroy_process_group, get_backend,
                                             get_local_rank, get_rank, get_world_size, init_process_group,
                                             is_available, is_initialized, is_mpi_available, is_nccl_available,
                                             reduce_scatter, reduce_scatter_tensor)
from frost.distributed.store import StoreError, TCPStore

__all__ = [
    "DistributedError", "ReduceOp", "StoreError", "TCPStore", "all_gather", "all_gather_into_tensor", "all_reduce",
    "barrier", "broadcast", "destroy_process_group", "get_backend", "get_local_rank", "get_rank", "get_world_size",
    "init_process_group", "is_available", "is_initialized", "is_mpi_available", "is_nccl_available",
    "reduce_scatter", "reduce_scatter_tensor",
]
