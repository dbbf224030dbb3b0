"""cuDNN convolutions at the seed ResNet's shapes in NCHW and channels-last memory, float32 (TF32) and bf16.

Run on a GPU machine (needs the cuDNN frontend):  python benchmarks/conv_layouts.py [--out FILE.json]
For every shape, kind (fprop, dgrad, wgrad), dtype and layout, cuDNN's tuned plan (frost.backend.cudnn, every
plan timed once) is captured `--calls` times into a CUDA graph and replayed; us per call is the median over
replays (CUDA events). Layouts: "nchw" (activations and weights C-contiguous), "nhwc" (activations and weights
channels-last: the cuDNN tensor-core kernels' own layout), "nhwc-act" (channels-last activations, NCHW weights,
as when only the data is converted). The step estimate weights each shape by its calls per training step. Also
our float32 weight-gradient kernel (frost/accel/conv_wgrad.py, NCHW only) for comparison.
"""
import argparse
import json
import time
from pathlib import Path

from frost import backends
from frost.backend.cuda import graph_time_us
from frost.bench import common
from frost.layout import as_channels_last

ROOT = Path(__file__).resolve().parents[1]
# (N, Cin, Cout, H, stride, k) and calls per training step (fprop = wgrad calls; the first conv has no dgrad)
SEED_SHAPES = [((32, 3, 16, 32, 1, 3), 1), ((32, 16, 16, 32, 1, 3), 6), ((32, 16, 32, 32, 2, 3), 1),
               ((32, 32, 32, 16, 1, 3), 5), ((32, 16, 32, 32, 2, 1), 1), ((32, 32, 64, 16, 2, 3), 1),
               ((32, 64, 64, 8, 1, 3), 5), ((32, 32, 64, 16, 2, 1), 1)]
LAYOUTS = ("nchw", "nhwc", "nhwc-act")


def operands(shape, dtype: str, layout: str):
    import cupy as cp
    n, cin, cout, h, s, k = shape
    ho = (h + 2 * (k // 2) - k) // s + 1
    rng = cp.random.default_rng(0)
    x = rng.standard_normal((n, cin, h, h), dtype=cp.float32)
    w = rng.standard_normal((cout, cin, k, k), dtype=cp.float32)
    g = rng.standard_normal((n, cout, ho, ho), dtype=cp.float32)
    if dtype == "bf16":
        from frost.dtype import bfloat16
        x, w, g = (a.astype(bfloat16.np) for a in (x, w, g))
    if layout != "nchw":
        x, g = as_channels_last(x), as_channels_last(g)
    if layout == "nhwc":
        w = as_channels_last(w)
    return x, w, g


def time_kinds(shape, dtype: str, layout: str, calls: int, repeats: int) -> dict:
    from frost.backend import cudnn
    n, cin, cout, h, s, k = shape
    x, w, g = operands(shape, dtype, layout)
    args = ((s, s), (k // 2, k // 2), (1, 1))
    return {
        "fprop": graph_time_us(lambda: cudnn.conv2d_forward(x, w, g.shape, *args), calls, repeats),
        "dgrad": graph_time_us(lambda: cudnn.conv2d_backward_input(g, w, x.shape, *args), calls, repeats),
        "wgrad": graph_time_us(lambda: cudnn.conv2d_backward_weight(g, x, w.shape, *args), calls, repeats),
    }


def ours_wgrad_us(shape, calls: int, repeats: int) -> float:
    from frost.accel import conv_wgrad as cw
    import cupy as cp
    n, cin, cout, h, s, k = shape
    x, w, g = operands(shape, "fp32", "nchw")
    out = cp.empty(w.shape, cp.float32)
    best = float("inf")
    for tiles in cw.candidates(g, x, w.shape, s, k // 2):
        best = min(best, graph_time_us(lambda: cw.conv2d_backward_weight_gpu(g, x, w.shape, s, k // 2, out=out,
                                                                              tiles=tiles), calls, repeats))
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--out", type=Path, default=None, help="write the result as JSON here (default: not written)")
    args = ap.parse_args()
    backends.allow_tf32 = True
    rows, totals = [], {}
    started = time.perf_counter()
    for shape, per_step in SEED_SHAPES:
        row = {"shape": list(shape), "calls_per_step": per_step}
        for dtype in ("fp32", "bf16"):
            for layout in LAYOUTS:
                us = time_kinds(shape, dtype, layout, args.calls, args.repeats)
                row[f"{dtype}_{layout}"] = {kind: round(v, 2) for kind, v in us.items()}
                dgrad_calls = 0 if shape[1] == 3 else per_step
                step = per_step * (us["fprop"] + us["wgrad"]) + dgrad_calls * us["dgrad"]
                totals[f"{dtype}_{layout}"] = totals.get(f"{dtype}_{layout}", 0.0) + step
        row["ours_wgrad_fp32_nchw"] = round(ours_wgrad_us(shape, args.calls, args.repeats), 2)
        rows.append(row)
        print(json.dumps(row), flush=True)
    print(f"\nus per training step (sum over the seed model's convolutions), {time.perf_counter() - started:.0f} s:")
    print("| dtype_layout | fprop+dgrad+wgrad us/step |\n|---|---|")
    for name, us in totals.items():
        print(f"| {name} | {us:.1f} |")
    common.keep_result(args.out, {"rows": rows, "us_per_step": {k: round(v, 1) for k, v in totals.items()}})


if __name__ == "__main__":
    main()
