"""Row softmax: one block per row, block-wide max and sum through warp shuffles and shared memory."""
import numpy as np

import frost
from frost.backend import cuda
from frost.kernel import Array, bdx, block_max, block_sum, bx, exp, f32, inf, shared, tx


@frost.kernel
def softmax_rows(x: Array[f32, 2], y: Array[f32, 2]):
    row = bx
    n = x.shape[1]
    scratch = shared(f32, 32)
    m = -inf
    for c in range(tx, n, bdx):
        m = max(m, x[row, c])
    m = block_max(m, scratch)
    s = 0.0
    for c in range(tx, n, bdx):
        e = exp(x[row, c] - m)
        y[row, c] = e
        s += e
    s = block_sum(s, scratch)
    inv = 1.0 / s
    for c in range(tx, n, bdx):
        y[row, c] *= inv


def softmax_numpy(x):
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def main(rows: int = 3, cols: int = 300) -> None:
    x = np.random.default_rng(0).standard_normal((rows, cols)).astype(np.float32) * 4
    if cuda.is_available():
        import cupy as cp
        xg = cp.asarray(x)
        y = cp.empty_like(xg)
        softmax_rows[rows, 128](xg, y)
        y = cp.asnumpy(y)
    else:
        y = np.empty_like(x)
        softmax_rows.simulate[rows, 64](x, y)
    np.testing.assert_allclose(y, softmax_numpy(x.astype(np.float64)), rtol=1e-5, atol=1e-7)
    print("row softmax: matches NumPy")


if __name__ == "__main__":
    main()
