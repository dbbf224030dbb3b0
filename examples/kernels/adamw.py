"""The AdamW update as one Frost kernel (the first kernel of KERNELS.md), checked against NumPy."""
import numpy as np

import frost
from frost.backend import cuda
from frost.kernel import Array, bx, cdiv, f32, i32, sqrt, tx


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


def adamw_step(p, g, m, v, step: int, lr=1e-3, b1=0.9, b2=0.999, eps=1e-8, wd=0.01, simulate=False):
    """One AdamW step on flat float32 arrays (CuPy arrays on the GPU, NumPy arrays in the simulator)."""
    n = p.size
    c1, c2 = 1 - b1 ** step, 1 - b2 ** step
    k = adamw_update.simulate if simulate else adamw_update
    k[cdiv(n, 256), 256](p, g, m, v, n, lr, b1, b2, c1, c2, eps, wd)


def adamw_numpy(p, g, m, v, step, lr=1e-3, b1=0.9, b2=0.999, eps=1e-8, wd=0.01):
    m = b1 * m + (1 - b1) * g
    v = b2 * v + (1 - b2) * g * g
    p = p - lr * ((m / (1 - b1 ** step)) / (np.sqrt(v / (1 - b2 ** step)) + eps) + wd * p)
    return p, m, v


def main(n: int = 600) -> None:
    rng = np.random.default_rng(0)
    p, g = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
    m, v = np.zeros(n, np.float32), np.zeros(n, np.float32)
    want = adamw_numpy(p.astype(np.float64), g, m, v, step=1)
    if cuda.is_available():
        import cupy as cp
        arrays = [cp.asarray(a) for a in (p, g, m, v)]
        adamw_step(*arrays, step=1)
        p, g, m, v = (cp.asnumpy(a) for a in arrays)
    else:
        adamw_step(p, g, m, v, step=1, simulate=True)
    for got, ref in zip((p, m, v), want):
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)
    print("adamw: matches NumPy")


if __name__ == "__main__":
    main()
