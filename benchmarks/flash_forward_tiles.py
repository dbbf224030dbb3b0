"""Attention forward alone, Frost's kernels by variant and tiles beside cuDNN (Frost's path through its graphs) and
PyTorch's SDPA backends: the table to tune the Hopper forwards by (bf16, FlashAttention's shapes: batch x length =
16k tokens, heads x dim = 2048).

Run on a CUDA machine:  python benchmarks/flash_forward_tiles.py [--lengths 1024 4096] [--out FILE.json]
Rows: "frost cuDNN", "torch flash", "torch cuDNN" (with a CUDA build of torch), then Frost's forward_arrays with
variant mma (its default tiles), wgmma (its default tiles) and bulk at each tile setting of BULK_SETTINGS. Each row:
the time one more call adds to --iters calls queued back to back after --warmup (common.steady_seconds_per_call);
TFLOP/s count 4 x B x H x L^2 x D, halved when causal. Each Frost kernel row is checked against the mma forward first
(max |difference|, bf16 outputs)."""
import argparse
from pathlib import Path

import ml_dtypes
import numpy as np

from flash_attention import frost_calls, time_pass, torch_backends, torch_calls
from frost.accel import flash_attention as fa
from frost.bench import common

BULK_SETTINGS = (dict(WGS=2, BC=64, STAGES=2, RS=1, PINGPONG=1), dict(WGS=2, BC=128, STAGES=2, RS=1),
                 dict(WGS=2, BC=128, STAGES=2, RS=1, PINGPONG=1),
                 dict(WGS=2, BC=128, STAGES=2, RS=1, PINGPONG=1, PERSIST=1),
                 dict(WGS=2, BC=176, STAGES=2, RS=1, PINGPONG=1),
                 dict(WGS=2, BC=176, STAGES=2, RS=1, PINGPONG=1, PERSIST=1),
                 dict(WGS=3, BC=64, STAGES=2, RS=1), dict(WGS=3, BC=64, STAGES=2, RS=1, PERSIST=1),
                 dict(WGS=3, BC=128, STAGES=2, RS=1), dict(WGS=3, BC=128, STAGES=2, RS=1, PERSIST=1))


def kernel_rows(cp, shape: tuple, causal: bool, iters: int, warmup: int) -> list[tuple[str, float, float | None]]:
    """(name, seconds a call, max |O - O_mma|) of each Frost kernel setting at one shape."""
    b, h, length, d = shape
    rng = np.random.default_rng(0)
    q, k, v = (cp.asarray(rng.standard_normal(shape).astype(ml_dtypes.bfloat16)) for _ in range(3))
    p = fa.Problem(b, h, 1, length, length, d, causal, 1 / np.sqrt(d), False)
    sync = cp.cuda.Device().synchronize
    base = cp.asnumpy(fa.forward_arrays(cp, q, k, v, p, variant="mma")[0]).astype(np.float32)
    settings = [("mma", None), ("wgmma", None)] + [("bulk", t) for t in BULK_SETTINGS if t["BC"] <= length]
    rows = []
    for variant, tiles in settings:
        def call(variant=variant, tiles=tiles):
            return fa.forward_arrays(cp, q, k, v, p, tiles=tiles, variant=variant)
        diff = float(np.abs(cp.asnumpy(call()[0]).astype(np.float32) - base).max())
        name = f"frost {variant}" + ("" if tiles is None else " " + " ".join(f"{a}={x}" for a, x in tiles.items()))
        rows.append((name, common.steady_seconds_per_call(call, sync, iters, warmup), diff))
    return rows


def library_rows(shape: tuple, causal: bool, iters: int, warmup: int, torch_rows: dict) -> list:
    import frost
    rows = [("frost cuDNN", common.steady_seconds_per_call(frost_calls(shape, causal, "cudnn")[0],
                                                           frost.cuda.synchronize, iters, warmup), None)]
    for name, backend in torch_rows.items():
        import torch
        rows.append((name, common.steady_seconds_per_call(torch_calls(shape, causal, backend)[0],
                                                          torch.cuda.synchronize, iters, warmup), None))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lengths", type=int, nargs="+", default=[1024, 4096])
    ap.add_argument("--head-dims", type=int, nargs="+", default=[64, 128], choices=fa.HEAD_DIMS)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--out", type=Path, default=None, help="write the result as JSON here (default: not written)")
    args = ap.parse_args()
    common.check_output_path("--out", args.out)
    common.require_cuda("benchmarks/flash_forward_tiles.py")
    import cupy as cp
    torch_rows = torch_backends()
    def rows(shape, causal):
        return (library_rows(shape, causal, args.iters, args.warmup, torch_rows)
                + kernel_rows(cp, shape, causal, args.iters, args.warmup))
    time_pass(args, "forward", rows, "O - O_mma")


if __name__ == "__main__":
    main()
