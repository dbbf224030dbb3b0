"""Frost's default flash attention, forward and backward alone, under a label: run it once per tree in one device call
(each tree's frost first on PYTHONPATH) to compare two trees on the same GPU and lease, where one run's table alone
would mix a change with the machine's drift between calls.

Run on a CUDA machine:  PYTHONPATH=TREE:... python benchmarks/flash_ab.py --label NAME [--head-dims 128 64]
[--lengths 2048 4096] [--passes forward backward] [--out-dir DIR]
(writes DIR/flash_ab_forward_NAME.json and DIR/flash_ab_backward_NAME.json)
The forward is forward_arrays' default variant for bf16 (the bulk kernel on a Hopper GPU), the backward
backward_arrays' default from that forward's O and log-sum-exp (the fused kernel from FUSED_FROM_LENGTH queries).
Shapes, timing and TFLOP/s as benchmarks/flash_forward_tiles.py and flash_backward.py count them (time_pass): batch x
length = 16k tokens, heads x dim = 2048, causal and not, --iters calls after --warmup."""
import argparse
from pathlib import Path

import ml_dtypes
import numpy as np

from flash_attention import time_pass
from frost.accel import flash_attention as fa
from frost.bench import common


def default_rows(cp, label: str, kind: str, iters: int, warmup: int):
    """rows(shape, causal) for time_pass: one row, Frost's default `kind` pass ("forward" or "backward")."""
    sync = cp.cuda.Device().synchronize

    def rows(shape: tuple, causal: bool) -> list:
        b, h, length, d = shape
        rng = np.random.default_rng(0)
        q, k, v, do = (cp.asarray(rng.standard_normal(shape).astype(ml_dtypes.bfloat16)) for _ in range(4))
        p = fa.Problem(b, h, 1, length, length, d, causal, 1 / np.sqrt(d), False)
        o, lse = fa.forward_arrays(cp, q, k, v, p)
        if kind == "forward":
            def call():
                return fa.forward_arrays(cp, q, k, v, p)
        else:
            def call():
                return fa.backward_arrays(cp, q, k, v, o, lse, do, p)
        return [(f"{label} {kind}", common.steady_seconds_per_call(call, sync, iters, warmup), None)]
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--label", required=True, help="names this tree's rows and files")
    ap.add_argument("--lengths", type=int, nargs="+", default=[2048, 4096])
    ap.add_argument("--head-dims", type=int, nargs="+", default=[128, 64], choices=fa.HEAD_DIMS)
    ap.add_argument("--passes", nargs="+", default=["forward", "backward"], choices=["forward", "backward"])
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--out-dir", type=Path, default=None, help="write the two JSON files here (default: not written)")
    args = ap.parse_args()
    common.require_cuda("benchmarks/flash_ab.py")
    import cupy as cp
    for kind in args.passes:
        out = None if args.out_dir is None else args.out_dir / f"flash_ab_{kind}_{args.label}.json"
        common.check_output_path("--out-dir", out)
        time_pass(argparse.Namespace(**vars(args), out=out), kind,
                  default_rows(cp, args.label, kind, args.iters, args.warmup), "none")


if __name__ == "__main__":
    main()
