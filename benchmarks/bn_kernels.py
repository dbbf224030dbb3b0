"""Batch-norm GPU kernels at the seed ResNet's shapes: six launches per layer (+ a counter kernel) against four.

Run on a GPU machine:  python benchmarks/bn_kernels.py [--quick] [--out FILE.json]
Each kernel sequence is captured `--calls` times into a CUDA graph (as frost.jit runs a training step) and the
graph is replayed; the time per call is the median over replays, measured with CUDA events. Rows per layer
shape (batch 32: C16 at 32x32, C32 at 16x16, C64 at 8x8), all with ReLU + residual:
  old: stats partial, stats finalize, apply (4 values per thread), num_batches_tracked += 1 (an int64 array op);
       backward partial, backward finalize, backward input (4 values per thread): 7 launches
  new: stats partial, apply merging the partials (1 value per thread, counts the batch);
       backward partial, backward input merging the partial sums (1 value per thread): 4 launches
A sweep times the fused elementwise kernels at 1, 2 and 4 values per thread, and the six-launch layer at 1 value
per thread (to separate the two changes). Both layers' results are checked against a float64 reference
(including the running statistics after one forward and the batch counter), and the new one for determinism.
"""
import argparse
import time
from pathlib import Path

import numpy as np

from frost.backend.cuda import graph_time_us
from frost.bench import common
from frost.accel import batch_norm as bn

ROOT = Path(__file__).resolve().parents[1]
SEED_SHAPES = [(32, 16, 32, 32), (32, 32, 16, 16), (32, 64, 8, 8)]
LAYERS_PER_SHAPE = 7  # the seed ResNet-20 has 7 batch norms at each of the three shapes
MOMENTUM, EPS = 0.1, 1e-5
OLD_PER_THREAD = 4    # the elementwise kernels' values per thread before the fusion


class Layer:
    """Buffers of one batch-norm layer (ReLU + residual) and the old and new kernel sequences over them."""

    def __init__(self, shape, sms: int) -> None:
        import cupy as cp
        rng = cp.random.default_rng(0)
        self.shape = shape
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
        self.reset_running()
        self.y, self.dx, self.dres = cp.empty_like(self.x), cp.empty_like(self.x), cp.empty_like(self.x)
        self.U, self.S = bn.bn_split(self.n, C, sms)
        self.chunk = bn.BN_THREADS * self.U
        self.pa, self.pb = cp.empty(C * self.S, cp.float32), cp.empty(C * self.S, cp.float32)
        self.pg, self.pgx = cp.empty(C * self.S, cp.float32), cp.empty(C * self.S, cp.float32)

    def reset_running(self):
        import cupy as cp
        self.rm, self.rv = cp.zeros(self.C, cp.float32), cp.ones(self.C, cp.float32)
        self.batches = cp.zeros((), cp.int64)

    def _partial(self):
        bn.batch_norm_stats_partial[(self.S, self.C), bn.BN_THREADS](self.x, self.pa, self.pb, self.n, self.hw,
                                                                         self.C, self.S, U=self.U)

    def _backward_partial(self):
        bn.batch_norm_backward_partial[(self.S, self.C), bn.BN_THREADS](self.g, self.x, self.y, self.mean,
                                                                            self.pg, self.pgx, self.n, self.hw,
                                                                            self.C, self.S, relu=1, U=self.U)

    def _apply(self, fused: int, per_thread: int):
        blocks = -(-self.total // (bn.BN_APPLY_THREADS * per_thread))
        bn.batch_norm_apply[blocks, bn.BN_APPLY_THREADS](
            self.x, self.y, self.pa, self.pb, self.mean, self.invstd, self.rm, self.rv, self.batches.reshape(1),
            self.w, self.b, self.res, self.total, self.hw, self.C, self.n, self.S, self.chunk, MOMENTUM, EPS, 1,
            fused, relu=1, add_residual=1, fused=fused, U=per_thread)

    def _backward_input(self, fused: int, per_thread: int):
        blocks = -(-self.total // (bn.BN_APPLY_THREADS * per_thread))
        bn.batch_norm_backward_input[blocks, bn.BN_APPLY_THREADS](
            self.g, self.x, self.y, self.mean, self.invstd, self.w, self.pg, self.pgx, self.dw, self.db, self.dx,
            self.dres, self.total, self.hw, self.C, self.n, self.S, relu=1, add_residual=1, fused=fused,
            U=per_thread)

    # -- old: finalize kernels, a separate counter kernel
    def old_forward(self, per_thread: int = OLD_PER_THREAD):
        self._partial()
        bn.batch_norm_stats_finalize[self.C, 32](self.pa, self.pb, self.mean, self.invstd, self.rm, self.rv,
                                                   self.n, self.S, self.chunk, MOMENTUM, EPS, 1)
        self._apply(0, per_thread)
        self.batches += 1

    def old_backward(self, per_thread: int = OLD_PER_THREAD):
        self._backward_partial()
        bn.batch_norm_backward_finalize[self.C, 32](self.pg, self.pgx, self.invstd, self.dw, self.db, self.S)
        self._backward_input(0, per_thread)

    def old_layer(self, per_thread: int = OLD_PER_THREAD):
        self.old_forward(per_thread)
        self.old_backward(per_thread)

    # -- new: the elementwise kernels merge the partials and count the batch
    def new_forward(self, per_thread: int = bn.BN_APPLY_PER_THREAD):
        self._partial()
        self._apply(1, per_thread)

    def new_backward(self, per_thread: int = bn.BN_APPLY_PER_THREAD):
        self._backward_partial()
        self._backward_input(1, per_thread)

    def new_layer(self, per_thread: int = bn.BN_APPLY_PER_THREAD):
        self.new_forward(per_thread)
        self.new_backward(per_thread)

    def outputs(self):
        import cupy as cp
        return [cp.asnumpy(a) for a in (self.mean, self.invstd, self.y, self.dw, self.db, self.dx, self.dres,
                                        self.rm, self.rv)]


KEYS = ("mean", "invstd", "y", "dw", "db", "dx", "dres", "running_mean", "running_var")


def check(layer: Layer) -> dict:
    """Max relative errors of each layer's results (after one call from fresh running stats) against float64."""
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
    rm, rv = MOMENTUM * mean, (1 - MOMENTUM) + MOMENTUM * var * layer.n / (layer.n - 1)
    want = [cp.asnumpy(a) for a in (mean, invstd, y, dw, db, dx, gm, rm, rv)]
    errors = {}
    for name, run in (("old", layer.old_layer), ("new", layer.new_layer)):
        layer.reset_running()
        run()
        cp.cuda.get_current_stream().synchronize()
        errors[name] = {k: float(np.max(np.abs(got - ref)) / max(float(np.max(np.abs(ref))), 1e-30))
                        for k, got, ref in zip(KEYS, layer.outputs(), want)}
        errors[name + "_batches_counted"] = int(layer.batches)
    first = layer.outputs()[:7]
    layer.new_layer()
    errors["new_deterministic"] = all(np.array_equal(a, b) for a, b in zip(first, layer.outputs()[:7]))
    return errors


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer calls and repeats, no sweep")
    ap.add_argument("--calls", type=int, default=None, help="kernel sequences per captured graph (default 100)")
    ap.add_argument("--out", type=Path, default=None, help="write the result as JSON here (default: not written)")
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
        assert bn.bn_fusable(layer.hw), shape
        label = f"C{shape[1]} {shape[2]}x{shape[3]}"
        checks[label] = check(layer)
        for what, old, new, launches in (("forward", layer.old_forward, layer.new_forward, (4, 2)),
                                         ("backward", layer.old_backward, layer.new_backward, (3, 2)),
                                         ("layer fwd+bwd", layer.old_layer, layer.new_layer, (7, 4))):
            t_old, t_new = graph_time_us(old, calls, repeats), graph_time_us(new, calls, repeats)
            rows.append(dict(shape=list(shape), layer=label, what=what, old_us=t_old, new_us=t_new,
                             speedup=t_old / t_new, launches_old=launches[0], launches_new=launches[1],
                             split=dict(threads=bn.BN_THREADS, U=layer.U, S=layer.S)))
        if not args.quick:
            sweep = {f"six launches + counter, elementwise U{u}":
                     graph_time_us(lambda: layer.old_layer(u), calls, repeats) for u in (1, OLD_PER_THREAD)}
            for u in (1, 2, 4):
                if bn.bn_fusable(layer.hw, bn.BN_APPLY_THREADS, u):
                    sweep[f"four launches, elementwise U{u}"] = graph_time_us(lambda: layer.new_layer(u), calls,
                                                                              repeats)
            sweeps[label] = sweep
    per_step = {k: LAYERS_PER_SHAPE * sum(r[k] for r in rows if r["what"] == "layer fwd+bwd")
                for k in ("old_us", "new_us")}

    print(f"Batch-norm layer (ReLU + residual) on {device} ({sms} SMs), us per call inside a CUDA graph "
          f"(median of {repeats} replays of {calls} calls)")
    print(f"{'layer':12} {'what':14} {'old us':>8} {'new us':>8} {'speedup':>8}  launches  split")
    for r in rows:
        s = r["split"]
        print(f"{r['layer']:12} {r['what']:14} {r['old_us']:8.2f} {r['new_us']:8.2f} {r['speedup']:8.2f}  "
              f"{r['launches_old']} -> {r['launches_new']}    U {s['U']} S {s['S']}")
    print(f"seed ResNet-20 step estimate ({LAYERS_PER_SHAPE} layers per shape, all as ReLU + residual): "
          f"old {per_step['old_us']:.0f} us, new {per_step['new_us']:.0f} us")
    for label, errs in checks.items():
        print(f"{label}: max rel error vs float64  old {max(errs['old'].values()):.2e}  "
              f"new {max(errs['new'].values()):.2e}  batches counted old {errs['old_batches_counted']} "
              f"new {errs['new_batches_counted']}  new deterministic: {errs['new_deterministic']}")
    for label, sweep in sweeps.items():
        print(f"sweep {label}: " + "  ".join(f"{k} {t:.2f}" for k, t in sweep.items()))
    common.keep_result(args.out, dict(device=device, sms=sms, calls_per_graph=calls, repeats=repeats, results=rows,
                                      step_estimate_us=per_step, accuracy=checks, sweeps=sweeps,
                                      seconds=time.perf_counter() - t0))


if __name__ == "__main__":
    main()
