"""One launch each of the Hopper flash forward (flash_fwd_bulk) and fused backward (flash_bwd_wgmma) at one of the
issue's shapes, bf16: the target for Nsight Compute, which benchmarks/gpu_flash.sh runs over them
(ncu -k regex:'flash_fwd_bulk|flash_bwd_wgmma' ... python benchmarks/flash_profile.py).

Run on a Hopper GPU:  python benchmarks/flash_profile.py [--shape 4 16 4096 128] [--causal]"""
import argparse

import cupy as cp
import ml_dtypes
import numpy as np

from frost.accel import flash_attention as fa


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", type=int, nargs=4, default=[4, 16, 4096, 128], metavar=("B", "H", "L", "D"))
    ap.add_argument("--causal", action="store_true")
    args = ap.parse_args()
    b, h, length, d = args.shape
    rng = np.random.default_rng(0)
    q, k, v, do = (cp.asarray(rng.standard_normal(args.shape).astype(ml_dtypes.bfloat16)) for _ in range(4))
    p = fa.Problem(b, h, 1, length, length, d, args.causal, 1 / np.sqrt(d), False)
    o, lse = fa.forward_arrays(cp, q, k, v, p, variant="bulk")
    fa.backward_arrays(cp, q, k, v, o, lse, do, p, variant="fused")
    cp.cuda.Device().synchronize()


if __name__ == "__main__":
    main()
