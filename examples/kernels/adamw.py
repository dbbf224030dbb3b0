"""The AdamW update as Frost kernels, checked against NumPy: the readable one-element kernel of docs/kernels.md, and
fast variants that move 16 bytes per access (load4/store4) for the bandwidth benchmark."""
import numpy as np

import frost
from frost.backend import cuda
from frost.kernel import (Array, Const, bx, cdiv, f32, gdx, i32, ldg4, load4, local, sqrt, static_range, store4,
                          tx)


@frost.kernel
def adamw_update(p: Array[f32], g: Array[f32], m: Array[f32], v: Array[f32], n: i32,
                 lr: f32, b1: f32, b2: f32, c1: f32, c2: f32, eps: f32, wd: f32):
    i = bx * 256 + tx
    if i >= n:
        return
    mi = b1 * m[i] + (1 - b1) * g[i]
    vi = b2 * v[i] + (1 - b2) * g[i] * g[i]
    m[i] = mi
    v[i] = vi
    p[i] -= lr * ((mi / c1) / (sqrt(vi / c2) + eps) + wd * p[i])


# -- fast variants: the same arithmetic, four floats per 16-byte access -------------------------------------
@frost.kernel.device
def adamw_one(p: f32, g: f32, m: f32, v: f32, lr: f32, b1: f32, b2: f32, c1: f32, c2: f32, eps: f32,
              wd: f32) -> (f32, f32, f32):
    """One element's update (as adamw_update computes it): the new p, m and v."""
    mi = b1 * m + (1 - b1) * g
    vi = b2 * v + (1 - b2) * g * g
    return p - lr * ((mi / c1) / (sqrt(vi / c2) + eps) + wd * p), mi, vi


@frost.kernel.device
def adamw_tail(p: Array[f32], g: Array[f32], m: Array[f32], v: Array[f32], first: i32, n: i32, lr: f32, b1: f32,
               b2: f32, c1: f32, c2: f32, eps: f32, wd: f32):
    """Elements first .. n-1 one at a time (the n % 4 that do not fill a 16-byte group)."""
    for k in range(first, n):
        p[k], m[k], v[k] = adamw_one(p[k], g[k], m[k], v[k], lr, b1, b2, c1, c2, eps, wd)


@frost.kernel
def adamw_update4(p: Array[f32], g: Array[f32], m: Array[f32], v: Array[f32], n: i32,
                  lr: f32, b1: f32, b2: f32, c1: f32, c2: f32, eps: f32, wd: f32):
    """Each thread updates 4 consecutive floats with 16-byte loads and stores (g through the read-only cache)."""
    i = (bx * 256 + tx) * 4
    if i + 4 <= n:
        p0, p1, p2, p3 = load4(p, i)
        g0, g1, g2, g3 = ldg4(g, i)
        m0, m1, m2, m3 = load4(m, i)
        v0, v1, v2, v3 = load4(v, i)
        p0, m0, v0 = adamw_one(p0, g0, m0, v0, lr, b1, b2, c1, c2, eps, wd)
        p1, m1, v1 = adamw_one(p1, g1, m1, v1, lr, b1, b2, c1, c2, eps, wd)
        p2, m2, v2 = adamw_one(p2, g2, m2, v2, lr, b1, b2, c1, c2, eps, wd)
        p3, m3, v3 = adamw_one(p3, g3, m3, v3, lr, b1, b2, c1, c2, eps, wd)
        store4(p, i, p0, p1, p2, p3)
        store4(m, i, m0, m1, m2, m3)
        store4(v, i, v0, v1, v2, v3)
    elif i < n:
        adamw_tail(p, g, m, v, i, n, lr, b1, b2, c1, c2, eps, wd)


@frost.kernel
def adamw_update4_ilp(p: Array[f32], g: Array[f32], m: Array[f32], v: Array[f32], n: i32,
                      lr: f32, b1: f32, b2: f32, c1: f32, c2: f32, eps: f32, wd: f32, UNROLL: Const[int] = 2):
    """A grid-stride loop over 16-byte groups; each thread loads UNROLL groups of all four arrays before it
    computes or stores any, so more loads are in flight per thread (the arrays may alias, so the compiler
    could not hoist them itself)."""
    n4 = n // 4
    stride = gdx * 256
    pr = local(f32, (UNROLL, 4))
    gr = local(f32, (UNROLL, 4))
    mr = local(f32, (UNROLL, 4))
    vr = local(f32, (UNROLL, 4))
    for q0 in range(bx * 256 + tx, n4, stride * UNROLL):
        for u in static_range(UNROLL):
            q = q0 + u * stride
            if q < n4:
                pr[u, 0], pr[u, 1], pr[u, 2], pr[u, 3] = load4(p, 4 * q)
                gr[u, 0], gr[u, 1], gr[u, 2], gr[u, 3] = ldg4(g, 4 * q)
                mr[u, 0], mr[u, 1], mr[u, 2], mr[u, 3] = load4(m, 4 * q)
                vr[u, 0], vr[u, 1], vr[u, 2], vr[u, 3] = load4(v, 4 * q)
        for u in static_range(UNROLL):
            q = q0 + u * stride
            if q < n4:
                for e in static_range(4):
                    pr[u, e], mr[u, e], vr[u, e] = adamw_one(pr[u, e], gr[u, e], mr[u, e], vr[u, e], lr, b1, b2,
                                                             c1, c2, eps, wd)
                store4(p, 4 * q, pr[u, 0], pr[u, 1], pr[u, 2], pr[u, 3])
                store4(m, 4 * q, mr[u, 0], mr[u, 1], mr[u, 2], mr[u, 3])
                store4(v, 4 * q, vr[u, 0], vr[u, 1], vr[u, 2], vr[u, 3])
    if bx == 0 and tx == 0:
        adamw_tail(p, g, m, v, n4 * 4, n, lr, b1, b2, c1, c2, eps, wd)


# variant name -> (kernel, extra compile-time constants); the benchmark times each, the tests check each
VARIANTS = {"scalar": (adamw_update, {}), "vec4": (adamw_update4, {}),
            "vec4_ilp1": (adamw_update4_ilp, dict(UNROLL=1)), "vec4_ilp2": (adamw_update4_ilp, dict(UNROLL=2)),
            "vec4_ilp4": (adamw_update4_ilp, dict(UNROLL=4))}


def launch_grid(variant: str, n: int, blocks_per_sm: int = 8, sms: int | None = None) -> int:
    """Blocks of 256 threads: one element (scalar) or 16 bytes (vec4) per thread, or a fixed grid-stride grid."""
    if variant == "scalar":
        return max(cdiv(n, 256), 1)
    if variant == "vec4":
        return max(cdiv(n, 1024), 1)
    if sms is None:
        import cupy
        sms = cupy.cuda.Device().attributes["MultiProcessorCount"]
    return max(1, min(sms * blocks_per_sm, cdiv(n, 1024)))


def adamw_step(p, g, m, v, step: int, lr=1e-3, b1=0.9, b2=0.999, eps=1e-8, wd=0.01, simulate=False,
               variant: str = "scalar", blocks_per_sm: int = 8, sms: int | None = None):
    """One AdamW step on flat float32 arrays (CuPy arrays on the GPU, NumPy arrays in the simulator).

    variant: a key of VARIANTS. The vec4 variants need p, g, m, v to start 16-byte aligned (any n works)."""
    if variant not in VARIANTS:
        raise ValueError(f"adamw_step: unknown variant {variant!r} (one of {sorted(VARIANTS)})")
    kern, consts = VARIANTS[variant]
    n = p.size
    c1, c2 = 1 - b1 ** step, 1 - b2 ** step
    if simulate and sms is None:
        sms = 2
    k = kern.simulate if simulate else kern
    k[launch_grid(variant, n, blocks_per_sm, sms), 256](p, g, m, v, n, lr, b1, b2, c1, c2, eps, wd, **consts)


def adamw_numpy(p, g, m, v, step, lr=1e-3, b1=0.9, b2=0.999, eps=1e-8, wd=0.01):
    m = b1 * m + (1 - b1) * g
    v = b2 * v + (1 - b2) * g * g
    p = p - lr * ((m / (1 - b1 ** step)) / (np.sqrt(v / (1 - b2 ** step)) + eps) + wd * p)
    return p, m, v


def main(n: int = 603) -> None:
    rng = np.random.default_rng(0)
    p0, g = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
    m0, v0 = rng.standard_normal(n).astype(np.float32) * 0.1, rng.random(n).astype(np.float32) * 0.1
    want = adamw_numpy(p0.astype(np.float64), g, m0, v0, step=3)
    for variant in VARIANTS:
        p, m, v = p0.copy(), m0.copy(), v0.copy()
        if cuda.is_available():
            import cupy as cp
            arrays = [cp.asarray(a) for a in (p, g, m, v)]
            adamw_step(*arrays, step=3, variant=variant)
            p, _, m, v = (cp.asnumpy(a) for a in arrays)
        else:
            adamw_step(p, g, m, v, step=3, simulate=True, variant=variant)
        for got, ref in zip((p, m, v), want):
            np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)
    print(f"adamw ({', '.join(VARIANTS)}): match NumPy")


if __name__ == "__main__":
    main()
