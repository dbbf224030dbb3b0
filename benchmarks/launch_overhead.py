"""Host microseconds per launch and per eager op on the GPU: Frost's kernel launch and ops against CuPy and PyTorch.

An eager step of small layers is bound by the host: the seed ResNet's eager step makes 113 kernel launches and took
26-27 ms on an H100 (seed_regression_eager4_h100_36e0953_vs_75c55de.json). Each row runs one call `--calls` times on
a 1,024-element float32 array (a few microseconds of GPU work, so the host's cost is what is timed), synchronizes,
and reports the median over `--repeats` of wall microseconds a call:

  frost_kernel_launch   a one-line @frost.kernel, k[4, 256](x, n): binding, specialization lookup, argument packing,
                        the driver call (programmatic dependent launch on Hopper)
  frost_add             y = x + 1.0 on a CUDA frost.Tensor (dispatch, allocation, the launch)
  frost_add_grad        the same with x requiring grad (the tape's record too)
  cupy_add              cupy.add(x, 1.0, out=y)
  torch_add             torch.add(x, 1.0, out=y)
  torch_add_new         y = x + 1.0 (PyTorch's allocating form, like frost_add)

`--frost TREE` imports Frost from another checkout (an exported tree of an earlier commit), so two trees can be
compared in one device call. Usage:
    python benchmarks/launch_overhead.py [--calls 20000] [--repeats 5] [--frost TREE] [--no-torch] [--out FILE]
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
N = 1024


def _median_us(call, calls: int, repeats: int, sync) -> float:
    for _ in range(min(calls, 200)):   # compiles, loads, fills caches and pools
        call()
    sync()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            call()
        sync()
        times.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(times)


def add_one_kernel():
    """x[i] += 1 for i < n, a kernel of the Frost that main() chose to import (hence imported here, not on top)."""
    from frost.kernel import Array, bdx, bx, f32, i32, kernel, tx

    @kernel
    def add_one(x: Array[f32], n: i32):
        i = bx * bdx + tx
        if i < n:
            x[i] = x[i] + 1.0
    return add_one


def frost_rows(calls: int, repeats: int) -> dict:
    import frost
    from frost.backend import cuda
    x = frost.zeros(N, device="cuda")
    xg = frost.zeros(N, device="cuda", requires_grad=True)
    launch = add_one_kernel()[N // 256, 256]
    rows = {"frost_kernel_launch": lambda: launch(x.data, N),
            "frost_add": lambda: x + 1.0,
            "frost_add_grad": lambda: xg + 1.0}
    return {name: _median_us(call, calls, repeats, cuda.synchronize) for name, call in rows.items()}


def cupy_rows(calls: int, repeats: int) -> dict:
    import cupy as cp
    x, y = cp.zeros(N, cp.float32), cp.empty(N, cp.float32)
    return {"cupy_add": _median_us(lambda: cp.add(x, 1.0, out=y), calls, repeats, cp.cuda.Device().synchronize)}


def torch_rows(calls: int, repeats: int) -> dict:
    import torch
    x, y = torch.zeros(N, device="cuda"), torch.empty(N, device="cuda")
    sync = torch.cuda.synchronize
    return {"torch_add": _median_us(lambda: torch.add(x, 1.0, out=y), calls, repeats, sync),
            "torch_add_new": _median_us(lambda: x + 1.0, calls, repeats, sync)}


def _commit(tree: Path) -> str:
    run = subprocess.run(["git", "-C", str(tree), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return run.stdout.strip() or "unknown (no git metadata)"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--calls", type=int, default=20000, help="calls a timed run (default 20000)")
    p.add_argument("--repeats", type=int, default=5, help="timed runs a row; the median is reported (default 5)")
    p.add_argument("--frost", default=None, help="import Frost from this tree instead of this checkout")
    p.add_argument("--no-torch", action="store_true", help="skip the PyTorch rows")
    p.add_argument("--out", default=None, help="write the results as JSON here")
    args = p.parse_args()
    tree = Path(args.frost).resolve() if args.frost else ROOT
    sys.path.insert(0, str(tree))
    from frost.backend import cuda
    if not cuda.is_available():
        print("launch_overhead: needs a CUDA GPU", file=sys.stderr)
        return 1
    rows = {**frost_rows(args.calls, args.repeats), **cupy_rows(args.calls, args.repeats)}
    if not args.no_torch:
        rows.update(torch_rows(args.calls, args.repeats))
    print(f"{'row':22s} {'us a call':>10s}")
    for name, us in rows.items():
        print(f"{name:22s} {us:10.2f}")
    result = {"benchmark": "launch_overhead", "us_per_call": rows, "calls": args.calls, "repeats": args.repeats,
              "elements": N, "frost_tree": str(tree) if args.frost else "this checkout", "frost_commit": _commit(tree),
              "device": cuda.device_name(), "date": time.strftime("%Y-%m-%d"), "python": platform.python_version()}
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
