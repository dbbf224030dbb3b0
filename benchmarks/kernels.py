"""Frost kernels written in Python against bandwidth ceilings and vendor equivalents (prints a table, writes JSON).

Run on a GPU machine:  python benchmarks/kernels.py [--quick]
  - AdamW over 64M floats vs the bandwidth of a device-to-device copy (goal: 85% of the copy's bandwidth)
  - the tensor-core bf16 GEMM (mma.sync, cp.async, ldmatrix) at 4096^3 vs cuBLAS through cupy.matmul (goal: 60%)
  - row softmax and a warp-shuffle sum reduction vs CuPy's equivalents
Times are medians of repeated runs measured with CUDA events.
"""
import argparse
import importlib.util
import json
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples" / "kernels"


def load(name):
    spec = importlib.util.spec_from_file_location(f"frost_example_{name}", EXAMPLES / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def median_ms(fn, repeats: int = 20, warmup: int = 3) -> float:
    import cupy as cp
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start, end = cp.cuda.Event(), cp.cuda.Event()
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(cp.cuda.get_elapsed_time(start, end))
    return float(np.median(times))


def bench_adamw(n: int, repeats: int):
    import cupy as cp
    adamw = load("adamw")
    p, g = cp.random.standard_normal(n, dtype=cp.float32), cp.random.standard_normal(n, dtype=cp.float32)
    m, v = cp.zeros(n, cp.float32), cp.zeros(n, cp.float32)
    src, dst = cp.empty(n * 4, cp.float32), cp.empty(n * 4, cp.float32)  # a copy moving more bytes than AdamW
    t_copy = median_ms(lambda: dst.__setitem__(Ellipsis, src), repeats)
    copy_gbs = 2 * src.nbytes / t_copy / 1e6
    t_adamw = median_ms(lambda: adamw.adamw_step(p, g, m, v, step=10), repeats)
    adamw_gbs = 7 * 4 * n / t_adamw / 1e6   # reads p, g, m, v; writes p, m, v
    return [dict(name=f"adamw ({n // 2**20}M floats)", ms=t_adamw, metric=f"{adamw_gbs:.0f} GB/s",
                 baseline="device-to-device copy", baseline_ms=t_copy * (7 * 4 * n) / (2 * src.nbytes),
                 baseline_metric=f"{copy_gbs:.0f} GB/s", ratio=adamw_gbs / copy_gbs, goal=0.85)]


CONFIGS = [dict(BM=128, BN=128, BK=32, WM=64, WN=64, STAGES=3), dict(BM=128, BN=128, BK=32, WM=64, WN=32, STAGES=3),
           dict(BM=128, BN=256, BK=32, WM=64, WN=64, STAGES=3), dict(BM=256, BN=128, BK=32, WM=64, WN=64, STAGES=3),
           dict(BM=128, BN=128, BK=32, WM=64, WN=64, STAGES=4), dict(BM=128, BN=128, BK=32, WM=64, WN=32, STAGES=2)]


def bench_gemm(size: int, repeats: int):
    import cupy as cp
    gemm = load("gemm")
    a32 = cp.random.standard_normal((size, size), dtype=cp.float32)
    b32 = cp.random.standard_normal((size, size), dtype=cp.float32)
    # bf16 bits by truncation of the float32s (good enough as benchmark data)
    a = (a32.view(cp.uint32) >> 16).astype(cp.uint16)
    b = (b32.view(cp.uint32) >> 16).astype(cp.uint16)
    c = cp.zeros((size, size), cp.float32)
    tried, by_name = {}, {}
    for cfg in CONFIGS:  # tile shapes: the best one is reported, all are recorded
        name = "BM{BM} BN{BN} BK{BK} WM{WM} WN{WN} S{STAGES}".format(**cfg)
        by_name[name] = cfg
        try:
            tried[name] = median_ms(lambda: gemm.gemm(a, b, c, **cfg), repeats)
        except Exception as exc:  # a configuration the GPU cannot run (e.g. too much shared memory)
            tried[name] = f"{type(exc).__name__}: {exc}"
    timed = {k: v for k, v in tried.items() if isinstance(v, float)}
    best = min(timed, key=timed.get)
    t_frost = timed[best]
    gemm.gemm(a, b, c, **by_name[best])
    ah, bh = a32.astype(cp.float16), b32.astype(cp.float16)
    t_cublas = median_ms(lambda: cp.matmul(ah, bh), repeats)  # cuBLAS, fp16 tensor cores (same rate as bf16)
    flops = 2 * size ** 3
    # correctness on a corner of the result
    ref = (a[:256].astype(cp.uint32) << 16).view(cp.float32) @ (b[:, :256].astype(cp.uint32) << 16).view(cp.float32)
    err = float(cp.abs(ref - c[:256, :256]).max() / cp.abs(ref).max())
    return [dict(name=f"gemm bf16 {size}^3 (mma.sync)", config=best, configs=tried, ms=t_frost,
                 metric=f"{flops / t_frost / 1e9:.0f} TFLOP/s",
                 baseline="cupy.matmul fp16 (cuBLAS)", baseline_ms=t_cublas,
                 baseline_metric=f"{flops / t_cublas / 1e9:.0f} TFLOP/s", ratio=t_cublas / t_frost, goal=0.60,
                 max_rel_error=err)]


def bench_softmax(rows: int, cols: int, repeats: int):
    import cupy as cp
    sm = load("softmax")
    x = cp.random.standard_normal((rows, cols), dtype=cp.float32)
    y = cp.empty_like(x)
    t_frost = median_ms(lambda: sm.softmax_rows[rows, 256](x, y), repeats)

    def cupy_softmax():
        e = cp.exp(x - x.max(axis=1, keepdims=True))
        return e / e.sum(axis=1, keepdims=True)
    t_cupy = median_ms(cupy_softmax, repeats)
    err = float(cp.abs(cupy_softmax() - y).max())
    gbs = 2 * x.nbytes / t_frost / 1e6
    return [dict(name=f"row softmax {rows}x{cols}", ms=t_frost, metric=f"{gbs:.0f} GB/s", baseline="CuPy ops",
                 baseline_ms=t_cupy, baseline_metric=f"{2 * x.nbytes / t_cupy / 1e6:.0f} GB/s",
                 ratio=t_cupy / t_frost, goal=None, max_abs_error=err)]


def bench_reduce(n: int, repeats: int):
    import cupy as cp
    red = load("block_reduce")
    x = cp.random.standard_normal(n, dtype=cp.float32)
    out = cp.zeros(1, cp.float32)
    sms = cp.cuda.Device().attributes["MultiProcessorCount"]

    def frost_sum():
        out.fill(0)
        red.reduce_sum[sms * 8, 256](x, out, n)
    t_frost = median_ms(frost_sum, repeats)
    t_cupy = median_ms(lambda: cp.sum(x), repeats)
    rel = float(abs(out[0] - cp.sum(x.astype(cp.float64))) / cp.abs(x).sum())
    return [dict(name=f"warp-shuffle sum ({n // 2**20}M floats)", ms=t_frost,
                 metric=f"{x.nbytes / t_frost / 1e6:.0f} GB/s",
                 baseline="cupy.sum", baseline_ms=t_cupy, baseline_metric=f"{x.nbytes / t_cupy / 1e6:.0f} GB/s",
                 ratio=t_cupy / t_frost, goal=None, rel_error=rel)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smaller sizes and fewer repeats")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "kernels.json"))
    args = ap.parse_args()
    import cupy as cp
    repeats = 5 if args.quick else 20
    t0 = time.perf_counter()
    rows = []
    rows += bench_adamw((8 if args.quick else 64) * 2 ** 20, repeats)
    rows += bench_gemm(2048 if args.quick else 4096, repeats)
    rows += bench_softmax(4096 if args.quick else 16384, 4096, repeats)
    rows += bench_reduce((8 if args.quick else 64) * 2 ** 20, repeats)
    device = cp.cuda.runtime.getDeviceProperties(0)["name"].decode()
    print(f"Frost kernels on {device} (median of {repeats} runs, CUDA events; ratio = Frost's throughput over "
          "the baseline's, higher is better)")
    print(f"{'kernel':34} {'frost ms':>9} {'frost':>14} {'baseline':>28} {'base ms':>9} {'base':>14} {'ratio':>6} goal")
    for r in rows:
        goal = "" if r["goal"] is None else (f">= {r['goal']:.0%} " + ("met" if r["ratio"] >= r["goal"] else "NOT met"))
        print(f"{r['name']:34} {r['ms']:9.3f} {r['metric']:>14} {r['baseline']:>28} {r['baseline_ms']:9.3f} "
              f"{r['baseline_metric']:>14} {r['ratio']:6.2f} {goal}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(dict(device=device, repeats=repeats, results=rows,
                                              seconds=time.perf_counter() - t0), indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
