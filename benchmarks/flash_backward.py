"""Flash attention's backward alone: Frost's kernels (the mma.sync pair, the warpgroup-MMA pair at each dQ key step of
DQ_STEPS, and the fused one-kernel backward in each setting of FUSED_SETTINGS) against PyTorch's SDPA backward (cuDNN
and flash backends), bf16, at the issue's shapes (batch x length = 16k tokens, heads x head dim = 2048), causal and
not.

Run on a CUDA machine:  python benchmarks/flash_backward.py [--head-dims 128 64] [--lengths 4096] [--out FILE.json]
Each row is the time one more call adds to --iters calls queued back to back after --warmup
(common.steady_seconds_per_call) of the backward from a saved forward (Frost: backward_arrays from forward_arrays' O
and log-sum-exp; PyTorch: torch.autograd.grad of one forward's output, the graph retained). TFLOP/s count 2.5 x 4 x B
x H x L^2 x D (FlashAttention's convention), halved when causal. Frost's warpgroup-MMA rows are checked against the
mma.sync backward first (the largest |difference| of dQ, dK and dV, bf16)."""
import argparse
from pathlib import Path

import ml_dtypes
import numpy as np

from flash_attention import time_pass, torch_backends
from frost.accel import flash_attention as fa
from frost.bench import common

DQ_STEPS = (32, 64)   # the dQ kernel's keys a step at head dim 128 (WGMMA_BACKWARD_TILES)
FUSED_SETTINGS = (dict(WGS=2, RS=0), dict(WGS=2, RS=1), dict(WGS=2, RS=0, OVERLAP_EXP=1),
                  dict(WGS=2, RS=1, OVERLAP_EXP=1))


def frost_rows(cp, shape: tuple, causal: bool, iters: int, warmup: int) -> list[tuple[str, float, float | None]]:
    b, h, length, d = shape
    rng = np.random.default_rng(0)
    q, k, v, do = (cp.asarray(rng.standard_normal(shape).astype(ml_dtypes.bfloat16)) for _ in range(4))
    p = fa.Problem(b, h, 1, length, length, d, causal, 1 / np.sqrt(d), False)
    sync = cp.cuda.Device().synchronize
    o, lse = fa.forward_arrays(cp, q, k, v, p, variant="mma")

    def backward(variant):
        return fa.backward_arrays(cp, q, k, v, o, lse, do, p, variant=variant)
    base = [cp.asnumpy(g).astype(np.float32) for g in backward("mma")]
    rows = [("frost mma", common.steady_seconds_per_call(lambda: backward("mma"), sync, iters, warmup), None)]
    fused_default = fa.backward_variant(cp, q, p, "bulk") == "fused"
    keep = dict(fa.WGMMA_BACKWARD_TILES[d])
    for step in DQ_STEPS if d == 128 else (keep["BC"],):
        fa.WGMMA_BACKWARD_TILES[d] = dict(keep, BC=step)
        try:
            diff = max(float(np.abs(cp.asnumpy(g).astype(np.float32) - r).max())
                       for g, r in zip(backward("wgmma"), base))
            default = step == keep["BC"] and fused_default is False
            rows.append((f"frost wgmma dQ BC={step}" + (" (default)" if default else ""),
                         common.steady_seconds_per_call(lambda: backward("wgmma"), sync, iters, warmup), diff))
        finally:
            fa.WGMMA_BACKWARD_TILES[d] = keep
    keep = dict(fa.FUSED_BACKWARD_TILES[d])
    for setting in FUSED_SETTINGS:
        fa.FUSED_BACKWARD_TILES[d] = setting
        try:
            diff = max(float(np.abs(cp.asnumpy(g).astype(np.float32) - r).max())
                       for g, r in zip(backward("fused"), base))
            name = "frost fused " + " ".join(f"{k}={v}" for k, v in setting.items())
            default = setting == keep and fused_default
            rows.append((name + (" (default)" if default else ""),
                         common.steady_seconds_per_call(lambda: backward("fused"), sync, iters, warmup), diff))
        finally:
            fa.FUSED_BACKWARD_TILES[d] = keep
    return rows


def torch_rows(shape: tuple, causal: bool, iters: int, warmup: int, backends: dict) -> list:
    rows = []
    for name, backend in backends.items():
        import torch
        from torch.nn.attention import sdpa_kernel
        q, k, v, do = (torch.randn(shape, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(4))
        with sdpa_kernel(backend):
            out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
            seconds = common.steady_seconds_per_call(
                lambda: torch.autograd.grad(out, (q, k, v), do, retain_graph=True), torch.cuda.synchronize, iters,
                warmup)
        rows.append((name, seconds, None))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lengths", type=int, nargs="+", default=[4096])
    ap.add_argument("--head-dims", type=int, nargs="+", default=[128, 64], choices=fa.HEAD_DIMS)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--out", type=Path, default=None, help="write the result as JSON here (default: not written)")
    args = ap.parse_args()
    common.check_output_path("--out", args.out)
    common.require_cuda("benchmarks/flash_backward.py")
    import cupy as cp
    backends = torch_backends()
    def rows(shape, causal):
        return (torch_rows(shape, causal, args.iters, args.warmup, backends)
                + frost_rows(cp, shape, causal, args.iters, args.warmup))
    time_pass(args, "backward", rows, "dX - dX_mma")


if __name__ == "__main__":
    main()
