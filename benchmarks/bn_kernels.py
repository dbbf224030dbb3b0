"""Batch-norm GPU kernels at the seed ResNet's shapes: the old one-block-per-channel kernels against the split ones.

Run on a GPU machine:  python benchmarks/bn_kernels.py [--quick] [--out FILE.json]
Each kernel sequence is captured `--calls` times into a CUDA graph (as frost.jit runs a training step) and the
graph is replayed; the time per call is the median over replays, measured with CUDA events. Rows per layer
shape (batch 32: C16 at 32x32, C32 at 16x16, C64 at 8x8): the forward reduction (statistics), the backward
reduction (sum dy, sum dy * xhat), the two elementwise kernels, and the whole layer (forward + backward,
ReLU + residual). A sweep records the split reductions' block size / blocks-per-SM and the elementwise kernels'
values per thread; the new kernels' results are checked against the old ones and a float64 reference.
The old kernels are kept here (only here) for this comparison.
"""
import argparse
import json
import time
from pathlib import Path

import numpy as np

from frost.kernel import Array, Const, bdx, block_sum, bx, f32, i32, kernel, rsqrt, shared, tx
from frost.ops import norm

ROOT = Path(__file__).resolve().parents[1]
SEED_SHAPES = [(32, 16, 32, 32), (32, 32, 16, 16), (32, 64, 8, 8)]
LAYERS_PER_SHAPE = 7  # the seed ResNet-20 has 7 batch norms at each of the three shapes
MOMENTUM, EPS = 0.1, 1e-5


# ---------------------------------------------------------------- the old kernels (one block per channel)
@kernel
def old_batch_norm_stats(x: Array[f32], mean: Array[f32], invstd: Array[f32], running_mean: Array[f32],
                         running_var: Array[f32], n: i32, hw: i32, channels: i32, momentum: f32, eps: f32,
                         update_running: i32):
    c = bx
    scratch = shared(f32, 32)
    acc = 0.0
    for k in range(tx, n, bdx):
        acc += x[(k // hw) * channels * hw + c * hw + k % hw]
    mu = block_sum(acc, scratch) / f32(n)
    acc2 = 0.0
    for k in range(tx, n, bdx):
        d = x[(k // hw) * channels * hw + c * hw + k % hw] - mu
        acc2 += d * d
    var = block_sum(acc2, scratch) / f32(n)
    if tx == 0:
        mean[c] = mu
        invstd[c] = rsqrt(var + eps)
        if update_running != 0:
            running_mean[c] = (1 - momentum) * running_mean[c] + momentum * mu
            running_var[c] = (1 - momentum) * running_var[c] + momentum * var * f32(n) / f32(n - 1)


@kernel
def old_batch_norm_apply(x: Array[f32], y: Array[f32], mean: Array[f32], invstd: Array[f32], weight: Array[f32],
                         bias: Array[f32], residual: Array[f32], total: i32, hw: i32, channels: i32,
                         relu: Const[int], add_residual: Const[int]):
    i = bx * bdx + tx
    if i < total:
        c = (i // hw) % channels
        v = (x[i] - mean[c]) * invstd[c] * weight[c] + bias[c]
        if add_residual:
            v += residual[i]
        if relu:
            v = max(v, 0.0)
        y[i] = v


@kernel
def old_batch_norm_backward_reduce(dy: Array[f32], x: Array[f32], y: Array[f32], mean: Array[f32],
                                   invstd: Array[f32], dweight: Array[f32], dbias: Array[f32], n: i32, hw: i32,
                                   channels: i32, relu: Const[int]):
    c = bx
    scratch = shared(f32, 32)
    sum_g = 0.0
    sum_gx = 0.0
    for k in range(tx, n, bdx):
        i = (k // hw) * channels * hw + c * hw + k % hw
        g = dy[i]
        if relu:
            g = g if y[i] > 0 else 0.0
        sum_g += g
        sum_gx += g * (x[i] - mean[c])
    sum_g = block_sum(sum_g, scratch)
    sum_gx = block_sum(sum_gx, scratch)
    if tx == 0:
        dbias[c] = sum_g
        dweight[c] = sum_gx * invstd[c]


@kernel
def old_batch_norm_backward_input(dy: Array[f32], x: Array[f32], y: Array[f32], mean: Array[f32],
                                  invstd: Array[f32], weight: Array[f32], dweight: Array[f32], dbias: Array[f32],
                                  dx: Array[f32], dresidual: Array[f32], total: i32, hw: i32, channels: i32, n: i32,
                                  relu: Const[int], add_residual: Const[int]):
    i = bx * bdx + tx
    if i < total:
        c = (i // hw) % channels
        g = dy[i]
        if relu:
            g = g if y[i] > 0 else 0.0
        if add_residual:
            dresidual[i] = g
        xhat = (x[i] - mean[c]) * invstd[c]
        dx[i] = weight[c] * invstd[c] * (g - dbias[c] / f32(n) - xhat * dweight[c] / f32(n))


# ---------------------------------------------------------------- timing
def graph_us(fn, calls: int, repeats: int) -> float:
    """Microseconds per call of fn (a sequence of launches) captured `calls` times into one CUDA graph."""
    import cupy as cp
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        fn()  # compiles and loads the kernels outside the capture
        stream.synchronize()
        stream.begin_capture()
        for _ in range(calls):
            fn()
        graph = stream.end_capture()
        graph.launch(stream)
        times = []
        for _ in range(repeats):
            start, end = cp.cuda.Event(), cp.cuda.Event()
            start.record(stream)
            graph.launch(stream)
            end.record(stream)
            end.synchronize()
            times.append(cp.cuda.get_elapsed_time(start, end) * 1000 / calls)
    return float(np.median(times))


class Layer:
    """Buffers of one batch-norm layer (ReLU + residual) and the old and new kernel sequences over them."""

    def __init__(self, shape, sms: int) -> None:
        import cupy as cp
        rng = cp.random.default_rng(0)
        self.shape, self.sms = shape, sms
        N, C = shape[:2]
        self.C, self.total = C, int(np.prod(shape))
        self.n, self.hw = self.total // C, self.total // (N * C)
        self.x = rng.standard_normal(shape, dtype=cp.float32) * 2 + 0.5
        self.res = rng.standard_normal(shape, dtype=cp.float32)
        self.g = rng.standard_normal(shape, dtype=cp.float32)
        self.w = rng.standard_normal(C, dtype=cp.float32)
        self.b = rng.standard_normal(C, dtype=cp.float32)
        f = lambda: cp.empty(C, cp.float32)  # noqa: E731
        self.mean, self.invstd, self.dw, self.db = f(), f(), f(), f()
        self.rm, self.rv = cp.zeros(C, cp.float32), cp.ones(C, cp.float32)
        self.y, self.dx, self.dres = cp.empty_like(self.x), cp.empty_like(self.x), cp.empty_like(self.x)
        self.split(norm.BN_THREADS, norm.BN_BLOCKS_PER_SM)

    def split(self, threads: int, blocks_per_sm: int) -> None:
        import cupy as cp
        self.threads = threads
        self.U, self.S = norm.bn_split(self.n, self.C, self.sms, threads, blocks_per_sm)
        self.pa, self.pb = cp.empty(self.C * self.S, cp.float32), cp.empty(self.C * self.S, cp.float32)

    # -- old
    def old_forward_reduce(self):
        old_batch_norm_stats[self.C, 512](self.x, self.mean, self.invstd, self.rm, self.rv, self.n, self.hw, self.C,
                                          MOMENTUM, EPS, 1)

    def old_apply(self):
        old_batch_norm_apply[-(-self.total // 256), 256](self.x, self.y, self.mean, self.invstd, self.w, self.b,
                                                          self.res, self.total, self.hw, self.C, relu=1,
                                                          add_residual=1)

    def old_backward_reduce(self):
        old_batch_norm_backward_reduce[self.C, 512](self.g, self.x, self.y, self.mean, self.invstd, self.dw, self.db,
                                                    self.n, self.hw, self.C, relu=1)

    def old_backward_input(self):
        old_batch_norm_backward_input[-(-self.total // 256), 256](
            self.g, self.x, self.y, self.mean, self.invstd, self.w, self.dw, self.db, self.dx, self.dres,
            self.total, self.hw, self.C, self.n, relu=1, add_residual=1)

    def old_layer(self):
        self.old_forward_reduce()
        self.old_apply()
        self.old_backward_reduce()
        self.old_backward_input()

    # -- new
    def new_forward_reduce(self):
        norm.batch_norm_stats_partial[(self.S, self.C), self.threads](self.x, self.pa, self.pb, self.n, self.hw,
                                                                      self.C, self.S, U=self.U)
        norm.batch_norm_stats_finalize[self.C, 32](self.pa, self.pb, self.mean, self.invstd, self.rm, self.rv,
                                                   self.n, self.S, self.threads * self.U, MOMENTUM, EPS, 1)

    def new_apply(self, per_thread: int = norm.BN_APPLY_PER_THREAD):
        norm.batch_norm_apply[-(-self.total // (256 * per_thread)), 256](
            self.x, self.y, self.mean, self.invstd, self.w, self.b, self.res, self.total, self.hw, self.C,
            relu=1, add_residual=1, U=per_thread)

    def new_backward_reduce(self):
        norm.batch_norm_backward_partial[(self.S, self.C), self.threads](self.g, self.x, self.y, self.mean, self.pa,
                                                                         self.pb, self.n, self.hw, self.C, self.S,
                                                                         relu=1, U=self.U)
        norm.batch_norm_backward_finalize[self.C, 32](self.pa, self.pb, self.invstd, self.dw, self.db, self.S)

    def new_backward_input(self, per_thread: int = norm.BN_APPLY_PER_THREAD):
        norm.batch_norm_backward_input[-(-self.total // (256 * per_thread)), 256](
            self.g, self.x, self.y, self.mean, self.invstd, self.w, self.dw, self.db, self.dx, self.dres,
            self.total, self.hw, self.C, self.n, relu=1, add_residual=1, U=per_thread)

    def new_layer(self):
        self.new_forward_reduce()
        self.new_apply()
        self.new_backward_reduce()
        self.new_backward_input()

    def outputs(self):
        import cupy as cp
        return [cp.asnumpy(a) for a in (self.mean, self.invstd, self.y, self.dw, self.db, self.dx)]


def check(layer: Layer) -> dict:
    """Max relative errors of the new and old kernels' results against a float64 reference."""
    import cupy as cp
    x, g, res = (a.astype(cp.float64) for a in (layer.x, layer.g, layer.res))
    w, b = layer.w.astype(cp.float64), layer.b.astype(cp.float64)
    mean, var = x.mean(axis=(0, 2, 3)), x.var(axis=(0, 2, 3))
    invstd = 1 / cp.sqrt(var + EPS)
    cs = (1, -1, 1, 1)
    xhat = (x - mean.reshape(cs)) * invstd.reshape(cs)
    y = cp.maximum(xhat * w.reshape(cs) + b.reshape(cs) + res, 0)
    gm = cp.where(y > 0, g, 0)
    db, dw = gm.sum(axis=(0, 2, 3)), (gm * xhat).sum(axis=(0, 2, 3))
    dx = (w * invstd).reshape(cs) * (gm - db.reshape(cs) / layer.n - xhat * dw.reshape(cs) / layer.n)
    want = [cp.asnumpy(a) for a in (mean, invstd, y, dw, db, dx)]
    errors = {}
    for name, run in (("old", layer.old_layer), ("new", layer.new_layer)):
        run()
        cp.cuda.get_current_stream().synchronize()
        errors[name] = {k: float(np.max(np.abs(got - ref)) / max(float(np.max(np.abs(ref))), 1e-30))
                        for k, got, ref in zip(("mean", "invstd", "y", "dw", "db", "dx"), layer.outputs(), want)}
    first = layer.outputs()
    layer.new_layer()
    errors["new_deterministic"] = all(np.array_equal(a, b) for a, b in zip(first, layer.outputs()))
    return errors


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer calls and repeats, no sweep")
    ap.add_argument("--calls", type=int, default=None, help="kernel sequences per captured graph (default 100)")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "bn_kernels.json"))
    args = ap.parse_args()
    import cupy as cp
    calls = args.calls or (20 if args.quick else 100)
    repeats = 5 if args.quick else 20
    t0 = time.perf_counter()
    dev = cp.cuda.runtime.getDevice()
    props = cp.cuda.runtime.getDeviceProperties(dev)
    device, sms = props["name"].decode(), int(props["multiProcessorCount"])
    rows, sweeps, checks = [], {}, {}
    for shape in SEED_SHAPES:
        layer = Layer(shape, sms)
        label = f"C{shape[1]} {shape[2]}x{shape[3]}"
        checks[label] = check(layer)
        for what, old, new in (("forward reduce", layer.old_forward_reduce, layer.new_forward_reduce),
                               ("backward reduce", layer.old_backward_reduce, layer.new_backward_reduce),
                               ("apply", layer.old_apply, layer.new_apply),
                               ("backward input", layer.old_backward_input, layer.new_backward_input),
                               ("layer fwd+bwd", layer.old_layer, layer.new_layer)):
            t_old, t_new = graph_us(old, calls, repeats), graph_us(new, calls, repeats)
            rows.append(dict(shape=list(shape), layer=label, kernel=what, old_us=t_old, new_us=t_new,
                             speedup=t_old / t_new, split=dict(threads=layer.threads, U=layer.U, S=layer.S)))
        if not args.quick:
            sweep = {}
            for threads in (128, 256, 512):
                for bps in (1, 2, 4, 8):
                    layer.split(threads, bps)
                    key = f"threads{threads} blocks_per_sm{bps} (U{layer.U} S{layer.S})"
                    sweep[key] = dict(forward_reduce_us=graph_us(layer.new_forward_reduce, calls, repeats),
                                      backward_reduce_us=graph_us(layer.new_backward_reduce, calls, repeats))
            layer.split(norm.BN_THREADS, norm.BN_BLOCKS_PER_SM)
            for per_thread in (1, 2, 4, 8):
                sweep[f"elementwise U{per_thread}"] = dict(
                    apply_us=graph_us(lambda: layer.new_apply(per_thread), calls, repeats),
                    backward_input_us=graph_us(lambda: layer.new_backward_input(per_thread), calls, repeats))
            sweeps[label] = sweep
    per_step = {k: LAYERS_PER_SHAPE * sum(r[k] for r in rows if r["kernel"] == "layer fwd+bwd")
                for k in ("old_us", "new_us")}

    print(f"Batch-norm kernels on {device} ({sms} SMs), us per call inside a CUDA graph "
          f"(median of {repeats} replays of {calls} calls)")
    print(f"{'layer':14} {'kernel':16} {'old us':>8} {'new us':>8} {'speedup':>8}  split")
    for r in rows:
        s = r["split"]
        print(f"{r['layer']:14} {r['kernel']:16} {r['old_us']:8.2f} {r['new_us']:8.2f} {r['speedup']:8.2f}  "
              f"threads {s['threads']} U {s['U']} S {s['S']}")
    print(f"seed ResNet-20 step estimate ({LAYERS_PER_SHAPE} layers per shape, all as ReLU + residual): "
          f"old {per_step['old_us']:.0f} us, new {per_step['new_us']:.0f} us")
    for label, errs in checks.items():
        print(f"{label}: max rel error vs float64  old {max(errs['old'].values()):.2e}  "
              f"new {max(errs['new'].values()):.2e}  new deterministic: {errs['new_deterministic']}")
    for label, sweep in sweeps.items():
        print(f"sweep {label}:")
        for key, v in sweep.items():
            print(f"  {key:44} " + "  ".join(f"{k} {t:6.2f}" for k, t in v.items()))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(dict(device=device, sms=sms, calls_per_graph=calls, repeats=repeats,
                                              results=rows, step_estimate_us=per_step, accuracy=checks,
                                              sweeps=sweeps, seconds=time.perf_counter() - t0), indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
