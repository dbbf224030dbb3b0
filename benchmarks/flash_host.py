"""Host time of Frost's flash attention calls at a short sequence, where the host can fall behind the GPU: per call,
the wall time of `--calls` back-to-back calls before and after one device synchronization, and the GPU's time by
CUDA events around the same number of calls, forward (the default kernel for bf16) and backward (from that
forward's O and log-sum-exp), then the same through `F.scaled_dot_product_attention` on tensors with the flash path
asked for ("sdpa forward" without autograd, "sdpa fwd+bwd" through it, as benchmarks/flash_attention.py times them).
Where host time a call exceeds the events' time, the GPU waits for Python; where an sdpa row's GPU time exceeds its
kernels', the layers above them launch work of their own.

Run on a CUDA machine:  python benchmarks/flash_host.py [--shape 32 16 512 128] [--calls 200] [--profile]
[--out FILE]  (--profile: cProfile's top entries by own time after the timing)"""
import argparse
import cProfile
import io
import os
import pstats
import time
from pathlib import Path

import ml_dtypes
import numpy as np

import frost
from frost.accel import flash_attention as fa
from frost.bench import common
from frost.ops.attention import scaled_dot_product_attention as sdpa


def time_calls(cp, fn, calls: int) -> dict:
    """Microseconds a call: host (the loop alone), wall (the loop and the synchronization), GPU (CUDA events)."""
    for _ in range(5):
        fn()
    cp.cuda.Device().synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    host = time.perf_counter() - t0
    cp.cuda.Device().synchronize()
    wall = time.perf_counter() - t0
    start, end = cp.cuda.Event(), cp.cuda.Event()
    start.record()
    for _ in range(calls):
        fn()
    end.record()
    end.synchronize()
    gpu = cp.cuda.get_elapsed_time(start, end) / 1e3
    return {name: seconds / calls * 1e6 for name, seconds in (("host_us", host), ("wall_us", wall), ("gpu_us", gpu))}


def tensor_calls(q, k, v, do, causal: bool) -> dict:
    """The forward (no autograd) and forward + backward through scaled_dot_product_attention on tensors over the
    same arrays, the flash kernels asked for (cuDNN's graphs off, as flash_attention.py's "frost flash bulk" rows)."""
    qt, kt, vt = (frost.Tensor(a, requires_grad=True) for a in (q, k, v))
    dot = frost.Tensor(do)

    def forward():
        with frost.no_grad():
            return sdpa(qt, kt, vt, is_causal=causal)

    def forward_backward():
        for t in (qt, kt, vt):
            t.grad = None
        sdpa(qt, kt, vt, is_causal=causal).backward(dot)
    return {"sdpa forward": forward, "sdpa fwd+bwd": forward_backward}


def profile(fn, calls: int) -> str:
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(calls):
        fn()
    pr.disable()
    out = io.StringIO()
    pstats.Stats(pr, stream=out).sort_stats("tottime").print_stats(20)
    return out.getvalue()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", type=int, nargs=4, default=[32, 16, 512, 128], metavar=("B", "H", "L", "D"))
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--out", type=Path, default=None, help="write the JSON here (default: not written)")
    args = ap.parse_args()
    common.require_cuda("benchmarks/flash_host.py")
    common.check_output_path("--out", args.out)
    if args.calls < 1:
        ap.error(f"--calls must be at least 1, got {args.calls}")
    import cupy as cp
    os.environ.update(FROST_CUDNN_ATTENTION="0", FROST_FLASH_ATTENTION="1")
    b, h, length, d = args.shape
    rng = np.random.default_rng(0)
    q, k, v, do = (cp.asarray(rng.standard_normal(args.shape).astype(ml_dtypes.bfloat16)) for _ in range(4))
    p = fa.Problem(b, h, 1, length, length, d, args.causal, 1 / np.sqrt(d), False)
    o, lse = fa.forward_arrays(cp, q, k, v, p)
    calls = {"forward": lambda: fa.forward_arrays(cp, q, k, v, p),
             "backward": lambda: fa.backward_arrays(cp, q, k, v, o, lse, do, p),
             **tensor_calls(q, k, v, do, args.causal)}
    device = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)["name"].decode()
    print(f"Flash attention host time, bf16, {'x'.join(map(str, args.shape))}, causal {args.causal}, on {device} "
          f"({args.calls} calls)")
    print(f"{'pass':<13} {'host us':>9} {'wall us':>9} {'GPU us':>9}")
    rows = []
    for name, fn in calls.items():
        row = dict(pass_=name, **time_calls(cp, fn, args.calls))
        rows.append(row)
        print(f"{name:<13} {row['host_us']:9.1f} {row['wall_us']:9.1f} {row['gpu_us']:9.1f}")
        if args.profile:
            print(profile(fn, args.calls))
    common.keep_result(args.out, dict(device=device, commit=common.git_commit(), versions=common.versions(),
                                      shape=args.shape, causal=args.causal, calls=args.calls,
                                      results=[{("pass" if k == "pass_" else k): v for k, v in r.items()}
                                               for r in rows]))


if __name__ == "__main__":
    main()
