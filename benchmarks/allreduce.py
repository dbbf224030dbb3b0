"""all_reduce bandwidth: Frost's frost.distributed against torch.distributed, in the same processes.

    frost run --nproc-per-node 2 benchmarks/allreduce.py --out benchmarks/results/allreduce_<machine>_<commit>.json

On GPUs Frost uses NCCL and PyTorch uses NCCL; on CPUs Frost uses MPI and PyTorch gloo (a different engine: the
CPU numbers test the script, they are not a comparison of NCCL). For each message size from --min-bytes to
--max-bytes (x4 steps) and each dtype, the median over --iters timed calls of one all_reduce (sum), the device
synchronized after each, gives the algorithm bandwidth (bytes / time) and the bus bandwidth (algbw * 2(n-1)/n, the
traffic of a ring: nccl-tests' definition). Rank 0 prints the table and writes JSON with --out.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import numpy as np

import frost
import frost.distributed as dist
from frost.backend import cuda as cuda_backend
from frost.dtype import to_dtype

try:  # the opponent, in the same processes (frost itself never imports it)
    import torch
except ImportError:
    torch = None


def parse(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--min-bytes", type=int, default=1024)
    p.add_argument("--max-bytes", type=int, default=None, help="default: 1 GiB on GPUs, 64 MiB on CPUs")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--dtypes", default="bfloat16,float32")
    p.add_argument("--no-torch", action="store_true", help="time Frost only")
    p.add_argument("--out", help="JSON results (rank 0)")
    return p.parse_args(argv)


def sizes(lo: int, hi: int) -> list[int]:
    out, n = [], lo
    while n <= hi:
        out.append(n)
        n *= 4
    return out


def median_seconds(call, sync, iters: int, warmup: int) -> float:
    for _ in range(warmup):
        call()
    sync()
    times = []
    for _ in range(iters):
        start = time.perf_counter()
        call()
        sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def frost_timing(nbytes: int, dtype: str, device: str, args) -> float:
    t = frost.ones(nbytes // np.dtype(to_dtype(dtype).np).itemsize, dtype=dtype, device=device)
    sync = cuda_backend.synchronize if device == "cuda" else (lambda: None)
    return median_seconds(lambda: dist.all_reduce(t), sync, args.iters, args.warmup)


def torch_timing(nbytes: int, dtype: str, device: str, args) -> float:
    kind = getattr(torch, dtype)
    t = torch.ones(nbytes // torch.tensor([], dtype=kind).element_size(), dtype=kind, device=device)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    return median_seconds(lambda: torch.distributed.all_reduce(t), sync, args.iters, args.warmup)


def main(argv=None) -> None:
    args = parse(argv)
    on_gpu = cuda_backend.is_available()
    device = "cuda" if on_gpu else "cpu"
    dist.init_process_group("nccl" if on_gpu else "mpi")
    rank, world = dist.get_rank(), dist.get_world_size()
    with_torch = torch is not None and not args.no_torch
    if with_torch:
        if on_gpu:
            torch.cuda.set_device(dist.get_local_rank())
        os.environ["MASTER_PORT"] = str(int(os.environ.get("MASTER_PORT", "29500")) + 2)  # beside frost's store
        torch.distributed.init_process_group("nccl" if on_gpu else "gloo", rank=rank, world_size=world)
    rows = []
    for dtype in args.dtypes.split(","):
        for nbytes in sizes(args.min_bytes, args.max_bytes or (2 ** 30 if on_gpu else 2 ** 26)):
            row = {"dtype": dtype, "bytes": nbytes, "frost_s": frost_timing(nbytes, dtype, device, args)}
            if with_torch:
                row["torch_s"] = torch_timing(nbytes, dtype, device, args)
            for who in ("frost", "torch"):
                if f"{who}_s" in row:
                    algbw = nbytes / row[f"{who}_s"] / 1e9
                    row[f"{who}_algbw_gbs"], row[f"{who}_busbw_gbs"] = algbw, algbw * 2 * (world - 1) / world
            rows.append(row)
    if rank == 0:
        report(rows, world, device, with_torch, args)
    if with_torch:
        torch.distributed.destroy_process_group()
    dist.destroy_process_group()


def report(rows: list[dict], world: int, device: str, with_torch: bool, args) -> None:
    print(f"all_reduce (sum), {world} processes on {device}: bus bandwidth GB/s (median of {args.iters})")
    print(f"{'dtype':>9} {'bytes':>12} {'frost':>9} {'torch':>9} {'frost/torch':>11}")
    for r in rows:
        torch_bw = r.get("torch_busbw_gbs")
        ratio = f"{r['frost_busbw_gbs'] / torch_bw:11.2f}" if torch_bw else f"{'-':>11}"
        print(f"{r['dtype']:>9} {r['bytes']:>12} {r['frost_busbw_gbs']:9.3f} "
              f"{torch_bw if torch_bw is not None else float('nan'):9.3f} {ratio}")
    if args.out:
        result = {"benchmark": "allreduce", "world_size": world, "device": device, "iters": args.iters,
                  "frost_backend": "nccl" if device == "cuda" else "mpi",
                  "torch_backend": None if not with_torch else ("nccl" if device == "cuda" else "gloo"),
                  "date": time.strftime("%Y-%m-%d"), "rows": rows}
        tmp = args.out + ".tmp"
        with open(tmp, "w") as f:
            json.dump(result, f, indent=1)
        os.replace(tmp, args.out)


if __name__ == "__main__":
    main()
