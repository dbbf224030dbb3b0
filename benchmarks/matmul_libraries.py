"""Matrix products at GPT shapes through the libraries frost/accel/matmul.py chooses between: cuBLAS's strided-batched
GEMM (frost/backend/cublas.py, eager code) and cuDNN's matmul (frost/backend/cudnn.py, captured steps), against
PyTorch's torch.matmul (cuBLAS/cuBLASLt) in the same process.

Per call: the wall time of an eager call (Python and launch included: what an eager training step pays), and the GPU
time of the same calls between two events (back to back: the kernel's own time where it exceeds the launch rate).

    python benchmarks/matmul_libraries.py --out benchmarks/results/matmul_libraries_<machine>_<commit>.json
"""
from __future__ import annotations

import argparse
import json
import time

import ml_dtypes
import numpy as np
import torch

from frost.backend import cublas, cuda, cudnn
from frost.bench import common

# (name, batch, m, k, n): nanoGPT shakespeare-char (batch 64 x 256 tokens, width 384, 6 heads) and GPT-2 small
# (batch 16 x 1024, width 768, 12 heads); attention's products are batched over batch x heads
SHAPES = [
    ("char qkv", 1, 16384, 384, 1152),
    ("char proj", 1, 16384, 384, 384),
    ("char mlp up", 1, 16384, 384, 1536),
    ("char mlp down", 1, 16384, 1536, 384),
    ("char q @ k^T", 384, 256, 64, 256),
    ("char att @ v", 384, 256, 256, 64),
    ("gpt2 qkv", 1, 16384, 768, 2304),
    ("gpt2 mlp up", 1, 16384, 768, 3072),
    ("gpt2 lm head", 1, 16384, 768, 50304),
    ("gpt2 q @ k^T", 192, 1024, 64, 1024),
]


def parse(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--iters", type=int, default=50)
    p.add_argument("--quick", action="store_true", help="the first four shapes, 10 calls each")
    p.add_argument("--out", help="JSON results")
    return p.parse_args(argv)


def timed(fn, iters: int, synchronize, event_pair) -> tuple[float, float]:
    """(wall us per call, GPU us per call) over `iters` calls after two untimed ones."""
    fn(), fn()
    synchronize()
    start, stop, elapsed_ms = event_pair()
    t0 = time.perf_counter()
    start()
    for _ in range(iters):
        fn()
    stop()
    synchronize()
    wall = (time.perf_counter() - t0) / iters * 1e6
    return wall, elapsed_ms() / iters * 1e3


def cupy_events(cp):
    def pair():
        a, b = cp.cuda.Event(), cp.cuda.Event()
        return a.record, b.record, lambda: cp.cuda.get_elapsed_time(a, b)
    return pair


def torch_events():
    def pair():
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        return a.record, b.record, lambda: a.elapsed_time(b)
    return pair


def main(argv=None) -> None:
    args = parse(argv)
    common.require_cuda("benchmarks/matmul_libraries.py")
    cp = cuda.cupy()
    shapes = SHAPES[:4] if args.quick else SHAPES
    iters = 10 if args.quick else args.iters
    rows = []
    rng = np.random.default_rng(0)
    for name, batch, m, k, n in shapes:
        a_host = rng.standard_normal((batch, m, k)).astype(np.float32).astype(ml_dtypes.bfloat16)
        b_host = rng.standard_normal((batch, k, n)).astype(np.float32).astype(ml_dtypes.bfloat16)
        a, b = cp.asarray(a_host), cp.asarray(b_host)
        if batch == 1:
            a, b = a[0], b[0]
        flops = 2.0 * batch * m * k * n
        reference = cublas.matmul(a, b).astype(cp.float32)
        row = {"shape": name, "batch": batch, "m": m, "k": k, "n": n}
        sync = cp.cuda.get_current_stream().synchronize
        for library, fn in (("cublas", lambda: cublas.matmul(a, b)), ("cudnn", lambda: cudnn.matmul(a, b))):
            diff = float(cp.abs(fn().astype(cp.float32) - reference).max())
            wall, gpu = timed(fn, iters, sync, cupy_events(cp))
            row[library] = {"wall_us": wall, "gpu_us": gpu, "tflops": flops / gpu / 1e6, "max_diff": diff}
        ta, tb = (torch.from_numpy(x.astype(np.float32)).cuda().to(torch.bfloat16) for x in (a_host, b_host))
        if batch == 1:
            ta, tb = ta[0], tb[0]
        wall, gpu = timed(lambda: torch.matmul(ta, tb), iters, torch.cuda.synchronize, torch_events())
        row["torch"] = {"wall_us": wall, "gpu_us": gpu, "tflops": flops / gpu / 1e6}
        rows.append(row)
    libraries = ["cublas", "cudnn", "torch"]
    header = f"{'shape':<14} {'b x m x k x n':>24}  " + "  ".join(f"{lib + ' wall/gpu us':>22} {'TFLOP/s':>7}"
                                                                   for lib in libraries)
    print(f"bf16 matrix products on {cp.cuda.runtime.getDeviceProperties(0)['name'].decode()} ({iters} calls a row)")
    print(header)
    print("-" * len(header))
    for row in rows:
        dims = f"{row['batch']} x {row['m']} x {row['k']} x {row['n']}"
        cells = "  ".join(f"{row[lib]['wall_us']:>10.1f} / {row[lib]['gpu_us']:>9.1f} {row[lib]['tflops']:>7.0f}"
                          for lib in libraries)
        print(f"{row['shape']:<14} {dims:>24}  {cells}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"rows": rows, "iters": iters}, f, indent=1)
        print(f"written to {args.out}")


if __name__ == "__main__":
    main()
