"""Channels-last batch norm in one launch per direction: its time per layer against the launch plan (threads per
block, blocks in the grid), at the seed ResNet's shapes, float32 and bf16.

Run on a GPU machine:  python benchmarks/bn_plans.py [--out FILE.json]
Each row runs frost.ops.norm.batch_norm_act (ReLU + residual, training) through the op itself with the plan forced
(BN_NHWC_THREADS and the SM count bn_plan_nhwc sees patched), forward alone and its backward alone, each captured 10
times into a CUDA graph and replayed (median of 10 replays, CUDA events). A copy of x (read + write of the same
bytes) is the floor. Every plan's y and dx are compared with the default plan's.
"""
import argparse
from pathlib import Path

import numpy as np

import frost
from frost.backend.cuda import graph_time_us
from frost.bench import common
from frost.accel import batch_norm as bn
from frost.ops import norm

ROOT = Path(__file__).resolve().parents[1]
SEED_SHAPES = [(32, 16, 32, 32), (32, 32, 16, 16), (32, 64, 8, 8)]
THREADS = (128, 256, 512, 1024)
TARGET_BLOCKS = (16, 32, 64, 132)


def layer_inputs(shape, dtype: str) -> dict:
    rng = np.random.default_rng(0)
    C = shape[1]

    def activation(scale=1.0, shift=0.0):
        a = (rng.standard_normal(shape) * scale + shift).astype(np.float32)
        return frost.tensor(a, device="cuda").to(dtype=getattr(frost, dtype), memory_format=frost.channels_last)

    x = activation(2.0, 0.5)
    x.requires_grad = True
    return dict(x=x, residual=activation(), g=activation().data,
                weight=frost.tensor(rng.standard_normal(C).astype(np.float32), device="cuda"),
                bias=frost.tensor(rng.standard_normal(C).astype(np.float32), device="cuda"),
                running_mean=frost.zeros(C, device="cuda"), running_var=frost.ones(C, device="cuda"))


def forward(t: dict):
    return norm.batch_norm_act(t["x"], t["running_mean"], t["running_var"], t["weight"], t["bias"], training=True,
                               residual=t["residual"], relu=True)


def time_plan(t: dict) -> dict:
    y = forward(t)
    dx = y._ctx.backward(t["g"])[0]
    return dict(forward_us=graph_time_us(lambda: forward(t)),
                backward_us=graph_time_us(lambda: y._ctx.backward(t["g"])),
                y=y.data.astype("float32"), dx=dx.astype("float32"))


def sweep(shape, dtype: str, sms: int) -> list[dict]:
    t = layer_inputs(shape, dtype)
    n, C = int(np.prod(shape)) // shape[1], shape[1]
    copy_us = graph_time_us(lambda: bn._rows(t["x"].data).copy())
    default = time_plan(t)
    rows = [dict(shape=list(shape), dtype=dtype, plan="default", copy_us=copy_us,
                 plan_detail=list(bn.bn_plan_nhwc(n, C, sms, bn.BN_NHWC_THREADS)[0]),
                 forward_us=default["forward_us"], backward_us=default["backward_us"])]
    saved = bn.BN_NHWC_THREADS, bn._sms
    try:
        for threads in THREADS:
            for blocks in TARGET_BLOCKS:
                bn.BN_NHWC_THREADS, bn._sms = threads, (lambda x, b=blocks: b)
                plan, one = bn.bn_plan_nhwc(n, C, blocks, threads)
                if not one:
                    continue
                try:
                    r = time_plan(t)
                except Exception as e:  # e.g. more registers than 1024 threads have
                    rows.append(dict(shape=list(shape), dtype=dtype, plan=f"t{threads}-b{blocks}",
                                     error=str(e)[:120]))
                    continue
                rows.append(dict(shape=list(shape), dtype=dtype, plan=f"t{threads}-b{blocks}", copy_us=copy_us,
                                 plan_detail=list(plan), forward_us=r["forward_us"], backward_us=r["backward_us"],
                                 y_diff=float(abs(r["y"] - default["y"]).max()),
                                 dx_diff=float(abs(r["dx"] - default["dx"]).max())))
    finally:
        bn.BN_NHWC_THREADS, bn._sms = saved
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None, help="write the result as JSON here (default: not written)")
    args = parser.parse_args()
    sms = bn.multiprocessor_count(0)
    rows = [r for dtype in ("float32", "bfloat16") for shape in SEED_SHAPES for r in sweep(shape, dtype, sms)]
    print(f"{'shape':>16} {'dtype':>8} {'plan':>10} {'cb,G,lanes,U,S,fused':>24} {'fwd us':>7} {'bwd us':>7} "
          f"{'copy us':>7} {'y diff':>8} {'dx diff':>8}")
    for r in rows:
        if "error" in r:
            print(f"{str(tuple(r['shape'])):>16} {r['dtype']:>8} {r['plan']:>10} {r['error']}")
            continue
        print(f"{str(tuple(r['shape'])):>16} {r['dtype']:>8} {r['plan']:>10} {str(r['plan_detail']):>24} "
              f"{r['forward_us']:7.2f} {r['backward_us']:7.2f} {r['copy_us']:7.2f} {r.get('y_diff', 0):8.2g} "
              f"{r.get('dx_diff', 0):8.2g}")
    common.keep_result(args.out, dict(sms=sms, rows=rows))


if __name__ == "__main__":
    main()
