"""Convolution weight gradients at the seed ResNet's shapes: our kernels (frost/accel/conv_wgrad.py) against cuDNN.

Run on a GPU machine (needs the cuDNN frontend):
    python benchmarks/conv_wgrad.py [--quick] [--channels-last] [--bf16] [--out FILE.json]
--channels-last: x and dy with channels-last (NHWC) memory and dW channels-last (KRSC memory), for both.
--bf16 (implies --channels-last): bf16 x and dy (autocast's), float32 dW; our candidates include the tensor-core
kernel (conv_wgrad_mma); cuDNN's bf16 dW is timed with its widening into the float32 dW, as conv2d runs it.
Each call is captured `--calls` times into a CUDA graph (as frost.jit runs a training step) and the graph is
replayed; the time per call is the median over replays, measured with CUDA events. For every shape: each of our
candidate tile choices (the ones `choose` times), cuDNN's tuned plan with TF32 off and with TF32 on (frost's
default, frost.backends.allow_tf32), and the max error of each of our candidates against cuDNN with TF32 off
(relative to the largest |dW|). The step estimate weights each shape by its weight-gradient calls per step.
"""
import argparse
import time
from pathlib import Path

import ml_dtypes
import numpy as np

from frost import backends
from frost.backend.cuda import graph_time_us
from frost.bench import common
from frost.layout import as_channels_last, empty_like_format
from frost.accel import conv_wgrad as cw

ROOT = Path(__file__).resolve().parents[1]
# (N, Cin, Cout, H, stride, k) and weight-gradient calls per training step of the seed ResNet (batch 32)
SEED_SHAPES = [((32, 3, 16, 32, 1, 3), 1), ((32, 16, 16, 32, 1, 3), 6), ((32, 16, 32, 32, 2, 3), 1),
               ((32, 32, 32, 16, 1, 3), 5), ((32, 16, 32, 32, 2, 1), 1), ((32, 32, 64, 16, 2, 3), 1),
               ((32, 64, 64, 8, 1, 3), 5), ((32, 32, 64, 16, 2, 1), 1)]


def cudnn_wgrad(g, x, w_shape, s, p, out):
    from frost.backend import cudnn
    return cudnn.conv2d_backward_weight(g, x, w_shape, (s, s), (p, p), (1, 1), out=out)


def bench_shape(shape, calls: int, repeats: int, sms: int, channels_last: bool = False, bf16: bool = False) -> dict:
    import cupy as cp
    n, cin, cout, h, s, k = shape
    p = k // 2
    ho = (h + 2 * p - k) // s + 1
    rng = cp.random.default_rng(0)
    x = rng.standard_normal((n, cin, h, h), dtype=cp.float32)
    g = rng.standard_normal((n, cout, ho, ho), dtype=cp.float32)
    if channels_last:
        x, g = as_channels_last(x), as_channels_last(g)
    w_shape = (cout, cin, k, k)
    out = empty_like_format(w_shape, x, cp.float32)
    row = dict(shape=list(shape), flops=2 * n * ho * ho * cout * cin * k * k)
    if bf16:  # the reference below is cuDNN's float32 dW (TF32 off) of the bf16-rounded values
        xb, gb = x.astype(ml_dtypes.bfloat16), g.astype(ml_dtypes.bfloat16)
        x, g = xb.astype(cp.float32), gb.astype(cp.float32)
        out_b = empty_like_format(w_shape, xb)
        row["cudnn_bf16_us"] = graph_time_us(lambda: out.__setitem__(Ellipsis, cudnn_wgrad(gb, xb, w_shape, s, p,
                                                                                            out_b)), calls, repeats)
    saved = backends.allow_tf32, backends.deterministic
    try:
        for tf32 in (False, True):
            backends.allow_tf32, backends.deterministic = tf32, not tf32
            row[f"cudnn_tf32_{'on' if tf32 else 'off'}_us"] = graph_time_us(
                lambda: cudnn_wgrad(g, x, w_shape, s, p, out), calls, repeats)
        backends.allow_tf32, backends.deterministic = False, True
        ref = cp.asnumpy(cudnn_wgrad(g, x, w_shape, s, p, empty_like_format(w_shape, x, cp.float32))
                         ).astype(np.float64)
    finally:
        backends.allow_tf32, backends.deterministic = saved
    scale = max(float(np.abs(ref).max()), 1e-30)
    ours = []
    if bf16:
        x, g = xb, gb
    for tiles in cw.candidates(g, x, w_shape, s, p):
        plan = cw.plan_for(g, x, w_shape, s, p, tiles)
        us = graph_time_us(lambda: cw.conv2d_backward_weight_gpu(g, x, w_shape, s, p, out=out, tiles=tiles), calls,
                           repeats)
        got = cp.asnumpy(cw.conv2d_backward_weight_gpu(g, x, w_shape, s, p, tiles=tiles))
        ours.append(dict(tiles=tiles, us=us, threads=plan.threads, smem=plan.smem, blocks=int(np.prod(plan.grid)),
                         max_rel_error=float(np.abs(got - ref).max() / scale)))
    best = min(ours, key=lambda o: o["us"])
    row.update(ours=ours, best_ours_us=best["us"], best_tiles=best["tiles"],
               max_rel_error=max(o["max_rel_error"] for o in ours))
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer calls and repeats")
    ap.add_argument("--calls", type=int, default=None, help="calls per captured graph (default 100)")
    ap.add_argument("--channels-last", action="store_true", help="NHWC x and dy, KRSC dW (ours and cuDNN)")
    ap.add_argument("--bf16", action="store_true", help="bf16 x and dy (channels-last), float32 dW")
    ap.add_argument("--out", type=Path, default=None, help="write the result as JSON here (default: not written)")
    args = ap.parse_args()
    args.channels_last = args.channels_last or args.bf16
    layout = "channels-last" if args.channels_last else "NCHW"
    import cupy as cp
    calls = args.calls or (20 if args.quick else 100)
    repeats = 5 if args.quick else 20
    t0 = time.perf_counter()
    props = cp.cuda.runtime.getDeviceProperties(cp.cuda.runtime.getDevice())
    device, sms = props["name"].decode(), int(props["multiProcessorCount"])
    rows = []
    for shape, per_step in SEED_SHAPES:
        row = bench_shape(shape, calls, repeats, sms, args.channels_last, args.bf16)
        row["calls_per_step"] = per_step
        rows.append(row)
    step = {k: sum(r[k] * r["calls_per_step"] for r in rows)
            for k in ("cudnn_tf32_off_us", "cudnn_tf32_on_us", "best_ours_us")}
    cudnn_key = "cudnn_bf16_us" if args.bf16 else "cudnn_tf32_off_us"
    if args.bf16:
        step["cudnn_bf16_us"] = sum(r["cudnn_bf16_us"] * r["calls_per_step"] for r in rows)
    step["chosen_us"] = sum(min(r[cudnn_key], r["best_ours_us"]) * r["calls_per_step"] for r in rows)

    dtype = "bf16" if args.bf16 else "float32"
    print(f"Convolution weight gradients on {device} ({sms} SMs), {dtype} {layout}, us per call inside a CUDA graph "
          f"(median of {repeats} replays of {calls} calls); cuDNN column: {cudnn_key}")
    print(f"{'N, Cin, Cout, H, s, k':24} {'calls':>5} {'cuDNN':>8} {'cuDNN tf32':>10} {'ours':>8} {'speedup':>8} "
          f"{'max err':>9}  best tiles / every candidate (us)")
    for r in rows:
        t = r["best_tiles"]
        tiles = " ".join(f"{k}{v}" for k, v in t.items())
        every = " ".join(f"{o['us']:.1f}" for o in r["ours"])
        print(f"{str(tuple(r['shape'])):24} {r['calls_per_step']:5d} {r[cudnn_key]:8.2f} "
              f"{r['cudnn_tf32_on_us']:10.2f} {r['best_ours_us']:8.2f} "
              f"{r[cudnn_key] / r['best_ours_us']:8.2f} {r['max_rel_error']:9.1e}  {tiles} / {every}")
    print(f"per training step: cuDNN {step[cudnn_key]:.0f} us (float32 TF32 on: {step['cudnn_tf32_on_us']:.0f}), "
          f"ours {step['best_ours_us']:.0f} us, the faster of the two per shape {step['chosen_us']:.0f} us")
    common.keep_result(args.out, dict(device=device, sms=sms, layout=layout, calls_per_graph=calls, dtype=dtype,
                                      repeats=repeats, results=rows, step_us=step, seconds=time.perf_counter() - t0))


if __name__ == "__main__":
    main()
