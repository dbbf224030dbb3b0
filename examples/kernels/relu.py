"""ReLU forward and backward as Frost kernels: on a GPU they launch, elsewhere they run in the simulator."""
import numpy as np

import frost
from frost.backend import cuda
from frost.kernel import Array, bdx, bx, cdiv, f32, gdx, i32, tx


@frost.kernel
def relu_forward(x: Array[f32], y: Array[f32], n: i32):
    for i in range(bx * bdx + tx, n, gdx * bdx):  # a grid-stride loop
        y[i] = max(x[i], 0.0)


@frost.kernel
def relu_backward(x: Array[f32], dy: Array[f32], dx: Array[f32], n: i32):
    for i in range(bx * bdx + tx, n, gdx * bdx):
        dx[i] = dy[i] if x[i] > 0.0 else 0.0


def main(n: int = 1000) -> None:
    rng = np.random.default_rng(0)
    x, dy = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
    if cuda.is_available():
        import cupy as cp
        xg, dyg = cp.asarray(x), cp.asarray(dy)
        y, dx = cp.empty_like(xg), cp.empty_like(xg)
        relu_forward[cdiv(n, 256), 256](xg, y, n)
        relu_backward[cdiv(n, 256), 256](xg, dyg, dx, n)
        y, dx = cp.asnumpy(y), cp.asnumpy(dx)
    else:
        y, dx = np.empty_like(x), np.empty_like(x)
        relu_forward.simulate[2, 64](x, y, n)  # fewer threads than elements: the loop strides
        relu_backward.simulate[2, 64](x, dy, dx, n)
    np.testing.assert_array_equal(y, np.maximum(x, 0))
    np.testing.assert_array_equal(dx, np.where(x > 0, dy, 0))
    print("relu forward/backward: match NumPy")


if __name__ == "__main__":
    main()
