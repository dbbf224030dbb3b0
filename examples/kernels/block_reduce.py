"""A sum reduction: each block reduces its slice in shared memory, then one atomic add per block."""
import numpy as np

import frost
from frost.backend import cuda
from frost.kernel import Array, atomic_add, bdx, block_sum, bx, f32, gdx, i32, shared, syncthreads, tx


# block_sum (frost/kernel/lib.py) is itself written in the language: a warp_sum, one shared slot per warp,
# a barrier, and a warp_sum of the slots.


@frost.kernel
def reduce_sum(x: Array[f32], out: Array[f32], n: i32):
    scratch = shared(f32, 32)
    acc = 0.0
    for i in range(bx * bdx + tx, n, gdx * bdx):
        acc += x[i]
    total = block_sum(acc, scratch)
    if tx == 0:
        atomic_add(out, 0, total)


@frost.kernel
def reduce_sum_tree(x: Array[f32], out: Array[f32], n: i32):
    """The classic shared-memory tree: halve the active threads at every step (blocks of 256)."""
    s = shared(f32, 256)
    i = bx * 256 + tx
    s[tx] = x[i] if i < n else 0.0
    syncthreads()
    stride = 128
    while stride > 0:
        if tx < stride:
            s[tx] += s[tx + stride]
        syncthreads()
        stride //= 2
    if tx == 0:
        atomic_add(out, 0, s[0])


def main(n: int = 1500) -> None:
    x = np.random.default_rng(0).standard_normal(n).astype(np.float32)
    results = []
    if cuda.is_available():
        import cupy as cp
        xg = cp.asarray(x)
        for k, grid, block in ((reduce_sum, 8, 128), (reduce_sum_tree, (n + 255) // 256, 256)):
            out = cp.zeros(1, cp.float32)
            k[grid, block](xg, out, n)
            results.append(float(out[0]))
    else:
        for k, grid, block in ((reduce_sum, 3, 128), (reduce_sum_tree, (n + 255) // 256, 256)):
            out = np.zeros(1, np.float32)
            k.simulate[grid, block](x, out, n)
            results.append(float(out[0]))
    for r in results:
        np.testing.assert_allclose(r, x.astype(np.float64).sum(), rtol=1e-4, atol=1e-3)
    print("block reductions: match NumPy")


if __name__ == "__main__":
    main()
