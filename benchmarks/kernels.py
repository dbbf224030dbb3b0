"""Frost kernels written in Python against bandwidth ceilings and vendor equivalents (prints a table; --out FILE.json
also writes the result as JSON).

Run on a GPU machine:  python benchmarks/kernels.py [--quick] [--gemm-only] [--out FILE.json]
  - AdamW over 64M floats vs the bandwidth of a device-to-device copy (goal: 85% of the copy's bandwidth)
  - the tensor-core bf16 GEMMs at 4096^3 vs cuBLAS through cupy.matmul (goal: 60%): mma.sync (gemm.py) and, on
    Hopper, wgmma (gemm_wgmma.py, sm_90a; the one-tile wgmma check is printed first); the best of all is reported
  - row softmax and a warp-shuffle sum reduction vs CuPy's equivalents
  - start-up: time to the first launch in a fresh process with an empty kernel cache vs with a warm one
Every AdamW variant and GEMM configuration is timed and recorded; the best is reported. One that fails to compile,
launch or compute the right result is recorded as an error string. Times are medians of repeated runs measured
with CUDA events. `--startup-only` measures just the start-up numbers (time to the first cubin without a GPU).
"""
import argparse
import importlib.util
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples" / "kernels"
sys.path.insert(0, str(ROOT))

from frost.bench import common  # noqa: E402


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
    """Every AdamW variant of examples/kernels/adamw.py in one run; the best is reported, all are recorded."""
    import cupy as cp
    adamw = load("adamw")
    p, g = cp.random.standard_normal(n, dtype=cp.float32), cp.random.standard_normal(n, dtype=cp.float32)
    m, v = cp.zeros(n, cp.float32), cp.zeros(n, cp.float32)
    src, dst = cp.empty(n * 4, cp.float32), cp.empty(n * 4, cp.float32)  # a copy moving more bytes than AdamW
    t_copy = median_ms(lambda: dst.__setitem__(Ellipsis, src), repeats)
    copy_gbs = 2 * src.nbytes / t_copy / 1e6
    moved = 7 * 4 * n   # reads p, g, m, v; writes p, m, v
    tried = {}
    for variant in adamw.VARIANTS:
        for bps in ((8,) if variant in ("scalar", "vec4") else (4, 8, 16)):  # grid-stride: blocks per SM
            name = variant if variant in ("scalar", "vec4") else f"{variant} grid={bps}/SM"
            try:
                t = median_ms(lambda: adamw.adamw_step(p, g, m, v, step=10, variant=variant, blocks_per_sm=bps),
                              repeats)
                tried[name] = dict(ms=t, gbs=moved / t / 1e6, ratio=moved / t / 1e6 / copy_gbs)
            except Exception as exc:  # a variant that does not compile or launch is recorded, not fatal
                tried[name] = f"{type(exc).__name__}: {exc}"
    timed = {k: r for k, r in tried.items() if isinstance(r, dict)}
    if not timed:
        return [dict(name=f"adamw ({n // 2**20}M floats)", error="no variant ran", variants=tried)]
    best = min(timed, key=lambda k: timed[k]["ms"])
    t_adamw = timed[best]["ms"]
    adamw_gbs = moved / t_adamw / 1e6
    for variant in timed:
        print(f"  adamw {variant:24} {timed[variant]['ms']:8.3f} ms {timed[variant]['gbs']:7.0f} GB/s "
              f"{timed[variant]['ratio']:5.2f} of copy")
    return [dict(name=f"adamw ({n // 2**20}M floats)", config=best, variants=tried, ms=t_adamw,
                 metric=f"{adamw_gbs:.0f} GB/s", baseline="device-to-device copy",
                 baseline_ms=t_copy * moved / (2 * src.nbytes), baseline_metric=f"{copy_gbs:.0f} GB/s",
                 ratio=adamw_gbs / copy_gbs, goal=0.85)]


# GEMM configurations timed in one run (the best is reported, all are recorded): the padded kernel (gemm_bf16)
# with its earlier tiles, and the swizzled, fragment-double-buffered kernel (gemm_bf16_fast) with several tiles.
PADDED = [dict(BM=128, BN=128, BK=32, WM=64, WN=64, STAGES=3), dict(BM=128, BN=128, BK=32, WM=64, WN=32, STAGES=3),
          dict(BM=128, BN=256, BK=32, WM=64, WN=64, STAGES=3), dict(BM=256, BN=128, BK=32, WM=64, WN=64, STAGES=3),
          dict(BM=128, BN=128, BK=32, WM=64, WN=64, STAGES=4), dict(BM=128, BN=128, BK=32, WM=64, WN=32, STAGES=2)]
SWIZZLED = [dict(BM=128, BN=128, BK=32, WM=64, WN=64, STAGES=4, MIN_BLOCKS=2),
            dict(BM=128, BN=128, BK=64, WM=64, WN=64, STAGES=3, MIN_BLOCKS=2),
            dict(BM=128, BN=128, BK=32, WM=64, WN=32, STAGES=4, MIN_BLOCKS=2),
            dict(BM=128, BN=128, BK=32, WM=32, WN=64, STAGES=4, MIN_BLOCKS=2),
            dict(BM=128, BN=128, BK=64, WM=64, WN=32, STAGES=3, MIN_BLOCKS=2),
            dict(BM=128, BN=256, BK=32, WM=64, WN=64, STAGES=4, MIN_BLOCKS=1),
            dict(BM=256, BN=128, BK=32, WM=64, WN=64, STAGES=4, MIN_BLOCKS=1),
            dict(BM=128, BN=256, BK=64, WM=64, WN=64, STAGES=3, MIN_BLOCKS=1),
            dict(BM=256, BN=128, BK=64, WM=64, WN=64, STAGES=3, MIN_BLOCKS=1),
            dict(BM=128, BN=128, BK=64, WM=64, WN=64, STAGES=4, MIN_BLOCKS=1)]
CONFIGS = [dict(kernel="padded", **c) for c in PADDED] + [dict(kernel="swizzled", **c) for c in SWIZZLED]


def config_name(cfg) -> str:
    name = "BM{BM} BN{BN} BK{BK} WM{WM} WN{WN} S{STAGES}".format(**cfg)
    if cfg.get("kernel", "padded") != "padded":
        name = f"{cfg['kernel']} {name} MB{cfg.get('MIN_BLOCKS', 1)}"
    return name


# wgmma GEMM configurations (examples/kernels/gemm_wgmma.py, sm_90a): BM = 64 * WGS, BK = 64, 128B swizzle.
WGMMA = [dict(BN=256, WGS=2, STAGES=4), dict(BN=256, WGS=2, STAGES=3), dict(BN=256, WGS=2, STAGES=4, GROUP=16),
         dict(BN=128, WGS=2, STAGES=4), dict(BN=128, WGS=2, STAGES=5), dict(BN=128, WGS=2, STAGES=3, MIN_BLOCKS=2),
         dict(BN=256, WGS=1, STAGES=4), dict(BN=128, WGS=1, STAGES=4, MIN_BLOCKS=2)]


def wgmma_config_name(cfg) -> str:
    return "wgmma BM{} BN{BN} BK64 S{STAGES} G{GROUP} MB{MIN_BLOCKS}".format(64 * cfg["WGS"], **dict(
        dict(GROUP=8, MIN_BLOCKS=1), **cfg))


def _time_gemm_configs(configs, names, inspect, run, check, repeats):
    """Time each configuration after checking its result: {name: ms or error string}, {name: error}, ptxas info."""
    tried, errors, ptxas = {}, {}, {}
    for cfg, name in zip(configs, names):
        try:  # registers and spills as ptxas reports them, recorded next to the time
            info = inspect(cfg)
            ptxas[name] = {k: info[k] for k in ("registers", "spill_stores", "spill_loads", "stack")}
        except Exception as exc:
            ptxas[name] = f"{type(exc).__name__}: {exc}"
        try:
            err = check(cfg)
            if not err < 1e-3:
                raise RuntimeError(f"wrong result: max relative error {err:.3g}")
            tried[name] = median_ms(lambda: run(cfg), repeats)
            errors[name] = err
        except Exception as exc:  # a configuration the GPU cannot run (e.g. too much shared memory) or got wrong
            tried[name] = f"{type(exc).__name__}: {exc}"
    return tried, errors, ptxas


def _gemm_row(label, size, tried, errors, ptxas, t_cublas, baseline, **extra):
    flops = 2 * size ** 3
    timed = {k: v for k, v in tried.items() if isinstance(v, float)}
    if not timed:
        return dict(name=label, error="no configuration ran", configs=tried, ptxas=ptxas, **extra)
    best = min(timed, key=timed.get)
    return dict(name=label, config=best, configs=tried, ptxas=ptxas, ms=timed[best],
                metric=f"{flops / timed[best] / 1e9:.0f} TFLOP/s", baseline=baseline, baseline_ms=t_cublas,
                baseline_metric=f"{flops / t_cublas / 1e9:.0f} TFLOP/s", ratio=t_cublas / timed[best], goal=0.60,
                max_rel_error=errors[best], **extra)


def wgmma_tile_checks():
    """The single-tile wgmma test, first: its max error and a map of wrong 8x8 blocks make a layout mistake
    diagnosable from one run's output."""
    gw = load("gemm_wgmma")
    out = {}
    for n, zero_init in ((64, 1), (128, 0), (256, 1)):
        key = f"m64n{n}k64 zero_init={zero_init}"
        try:
            err, report = gw.check_tile(n, zero_init)
            ok = err < 1e-3
            out[key] = dict(max_abs_error=err, ok=ok) if ok else dict(max_abs_error=err, ok=ok, blocks=report)
            print(f"  wgmma single tile {key}: max abs error {err:.3g} " + ("ok" if ok else "WRONG\n" + report))
        except Exception as exc:
            out[key] = f"{type(exc).__name__}: {exc}"
            print(f"  wgmma single tile {key}: {out[key]}")
    return out


def bench_gemm(size: int, repeats: int):
    """mma.sync GEMMs (gemm.py: C = A @ B) and wgmma GEMMs (gemm_wgmma.py: C = A @ Bt^T, Bt = B transposed, the
    same product), every configuration checked then timed; rows for each family and for the best of all, each
    against cuBLAS computing the same product."""
    import cupy as cp
    gemm, gw = load("gemm"), load("gemm_wgmma")
    a32 = cp.random.standard_normal((size, size), dtype=cp.float32)
    b32 = cp.random.standard_normal((size, size), dtype=cp.float32)
    # bf16 bits by truncation of the float32s (good enough as benchmark data)
    a = (a32.view(cp.uint32) >> 16).astype(cp.uint16)
    b = (b32.view(cp.uint32) >> 16).astype(cp.uint16)
    bt = cp.ascontiguousarray(b.T)
    c = cp.zeros((size, size), cp.float32)
    # the reference for correctness: a corner of the product, in float32
    ref = (a[:256].astype(cp.uint32) << 16).view(cp.float32) @ (b[:, :256].astype(cp.uint32) << 16).view(cp.float32)

    def corner_error(run, cfg):
        c.fill(cp.nan)
        run(cfg)
        return float(cp.abs(ref - c[:256, :256]).max() / cp.abs(ref).max())

    def mma_run(cfg):
        gemm.gemm(a, b, c, **cfg)

    def mma_inspect(cfg):
        return gemm.KERNELS[cfg["kernel"]][0].inspect("sm_90", **{k: v for k, v in cfg.items() if k != "kernel"})

    names = [config_name(cfg) for cfg in CONFIGS]
    mma = _time_gemm_configs(CONFIGS, names, mma_inspect, mma_run, lambda cfg: corner_error(mma_run, cfg), repeats)

    tile_checks = wgmma_tile_checks()

    def wg_run(cfg):
        gw.gemm(a, bt, c, **cfg)

    wnames = [wgmma_config_name(cfg) for cfg in WGMMA]
    wg = _time_gemm_configs(WGMMA, wnames, lambda cfg: gw.gemm_wgmma.inspect("sm_90", **dict(gw.DEFAULT, **cfg)),
                            wg_run, lambda cfg: corner_error(wg_run, cfg), repeats)
    flops = 2 * size ** 3
    for tried in (mma[0], wg[0]):
        for name, t in tried.items():
            print(f"  gemm {name:50} " + (f"{t:8.3f} ms {flops / t / 1e9:6.0f} TFLOP/s" if isinstance(t, float)
                                          else t))
    ah, bh = a32.astype(cp.float16), b32.astype(cp.float16)
    bth = cp.ascontiguousarray(bh.T)
    t_nn = median_ms(lambda: cp.matmul(ah, bh), repeats)      # cuBLAS, fp16 tensor cores (same rate as bf16)
    t_nt = median_ms(lambda: cp.matmul(ah, bth.T), repeats)   # the same product from a transposed B, as wgmma's
    rows = [_gemm_row(f"gemm bf16 {size}^3 (mma.sync)", size, *mma, t_nn, "cupy.matmul fp16 (cuBLAS)"),
            _gemm_row(f"gemm bf16 {size}^3 (wgmma sm_90a)", size, *wg, t_nt, "cupy.matmul fp16 A @ Bt.T (cuBLAS)",
                      tile_checks=tile_checks)]
    ok = [r for r in rows if "error" not in r]
    if ok:
        best = max(ok, key=lambda r: r["ratio"])
        rows.append(dict(best, name=f"gemm bf16 {size}^3 (best of all)", configs=None, ptxas=None,
                         family=best["name"]))
    return rows


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


STARTUP_SCRIPT = r"""
import importlib.util, json, sys, time
t0 = time.perf_counter()
import numpy as np
from frost.kernel import compile_stats
spec = importlib.util.spec_from_file_location("ex", {path!r})
mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod)
t_import = time.perf_counter() - t0
mode = {mode!r}
if mode == "launch":
    import cupy as cp
{setup}
    cp.cuda.runtime.deviceSynchronize()
def first():
    if mode == "launch":
{launch}
        cp.cuda.runtime.deviceSynchronize()
    else:
{compile}
t1 = time.perf_counter(); first(); t_first = time.perf_counter() - t1
t2 = time.perf_counter(); first(); t_second = time.perf_counter() - t2
print(json.dumps(dict(import_s=t_import, first_s=t_first, second_s=t_second, **compile_stats)))
"""

STARTUP_CASES = {
    "adamw vec4": ("adamw", "    n = 1 << 20\n    p, g, m, v = (cp.ones(n, cp.float32) for _ in range(4))",
                   "        mod.adamw_step(p, g, m, v, step=1, variant='vec4')",
                   "        mod.adamw_update4.compile('sm_90')"),
    "gemm swizzled 128x128x32 S4": (
        "gemm", "    a = cp.zeros((512, 512), cp.uint16); b = cp.zeros((512, 512), cp.uint16)\n"
                "    c = cp.zeros((512, 512), cp.float32)",
        "        mod.gemm(a, b, c, kernel='swizzled', **dict(mod.FAST_DEFAULT, MIN_BLOCKS=2))",
        "        mod.gemm_bf16_fast.compile('sm_90', **dict(mod.FAST_DEFAULT, MIN_BLOCKS=2))"),
}


def bench_startup(mode: str = "launch"):
    """Time to the first launch (mode "launch") or the first cubin (mode "compile") in a fresh process: with an
    empty kernel cache directory (NVRTC compiles) and again with the cache it filled (the cubin is read from disk)."""
    import os
    import subprocess
    import sys
    import tempfile
    out = {}
    for name, (example, setup, launch, compile_) in STARTUP_CASES.items():
        code = STARTUP_SCRIPT.format(path=str(EXAMPLES / f"{example}.py"), mode=mode, setup=setup, launch=launch,
                                     compile=compile_)
        with tempfile.TemporaryDirectory() as cache:
            env = dict(os.environ, FROST_CACHE_DIR=cache)
            runs = {}
            for which in ("cold", "warm"):
                t0 = time.perf_counter()
                r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
                wall = time.perf_counter() - t0
                if r.returncode != 0:
                    runs[which] = "error: " + (r.stderr.strip().splitlines() or ["?"])[-1]
                    continue
                runs[which] = dict(json.loads(r.stdout.strip().splitlines()[-1]), process_s=wall)
        out[name] = runs
        cold, warm = runs.get("cold"), runs.get("warm")
        if isinstance(cold, dict) and isinstance(warm, dict):
            print(f"  start-up {name:30} first {mode}: {cold['first_s'] * 1e3:8.1f} ms cold cache "
                  f"({cold['nvrtc_compiles']} NVRTC compiles), {warm['first_s'] * 1e3:8.1f} ms warm "
                  f"({warm['disk_hits']} disk hits); process {cold['process_s']:.2f} s vs {warm['process_s']:.2f} s")
        else:
            print(f"  start-up {name}: {runs}")
    return dict(mode=mode, cases=out)


def _guarded(rows_fn, name):
    """Run one benchmark; an exception becomes an error row instead of ending the run."""
    try:
        return rows_fn()
    except Exception as exc:
        return [dict(name=name, error=f"{type(exc).__name__}: {exc}")]


def _print_rows(rows, repeats) -> None:
    import cupy as cp
    device = cp.cuda.runtime.getDeviceProperties(0)["name"].decode()
    print(f"Frost kernels on {device} (median of {repeats} runs, CUDA events; ratio = Frost's throughput over "
          "the baseline's, higher is better)")
    print(f"{'kernel':34} {'frost ms':>9} {'frost':>14} {'baseline':>28} {'base ms':>9} {'base':>14} {'ratio':>6} goal")
    for r in rows:
        if "error" in r:
            print(f"{r['name']:34} ERROR {r['error']}")
            continue
        goal = "" if r["goal"] is None else (f">= {r['goal']:.0%} " + ("met" if r["ratio"] >= r["goal"] else "NOT met"))
        print(f"{r['name']:34} {r['ms']:9.3f} {r['metric']:>14} {r['baseline']:>28} {r['baseline_ms']:9.3f} "
              f"{r['baseline_metric']:>14} {r['ratio']:6.2f} {goal}" + (f"  [{r['config']}]" if "config" in r else ""))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smaller sizes and fewer repeats")
    ap.add_argument("--out", type=Path, default=None, help="write the result as JSON here (default: not written)")
    ap.add_argument("--gemm-only", action="store_true", help="only the GEMMs (mma.sync and wgmma)")
    ap.add_argument("--startup-only", action="store_true",
                    help="only the kernel-cache start-up numbers (without a GPU: time to the first cubin)")
    args = ap.parse_args()
    t0 = time.perf_counter()
    if args.startup_only:
        try:
            import cupy  # noqa: F401
            mode = "launch" if cupy.cuda.runtime.getDeviceCount() > 0 else "compile"
        except Exception:
            mode = "compile"
        startup = bench_startup(mode)
        common.keep_result(args.out, dict(startup=startup, seconds=time.perf_counter() - t0))
        return
    import cupy as cp
    repeats = 5 if args.quick else 20
    rows = []
    if args.gemm_only:
        rows += _guarded(lambda: bench_gemm(2048 if args.quick else 4096, repeats), "gemm")
        _print_rows(rows, repeats)
        device = cp.cuda.runtime.getDeviceProperties(0)["name"].decode()
        common.keep_result(args.out, dict(device=device, repeats=repeats, results=rows,
                                          seconds=time.perf_counter() - t0))
        return
    rows += _guarded(lambda: bench_adamw((8 if args.quick else 64) * 2 ** 20, repeats), "adamw")
    rows += _guarded(lambda: bench_gemm(2048 if args.quick else 4096, repeats), "gemm")
    rows += _guarded(lambda: bench_softmax(4096 if args.quick else 16384, 4096, repeats), "softmax")
    rows += _guarded(lambda: bench_reduce((8 if args.quick else 64) * 2 ** 20, repeats), "reduce")
    startup = _guarded(lambda: [bench_startup("launch")], "startup")[0]
    device = cp.cuda.runtime.getDeviceProperties(0)["name"].decode()
    _print_rows(rows, repeats)
    common.keep_result(args.out, dict(device=device, repeats=repeats, results=rows, startup=startup,
                                      seconds=time.perf_counter() - t0))


if __name__ == "__main__":
    main()
