"""frost/backend/cublas.py on the CPU: how each operand layout is handed to cuBLAS (the leading dimension, the batch
stride, whether cuBLAS transposes), checked by reading the array's memory back the way cuBLAS reads it; the products
themselves run on a GPU (tests/accel/test_matmul_kernels.py)."""
import numpy as np
import pytest

from frost.backend import cublas
from frost.backend.batched import batched_product


def _as_cublas_reads(array, transposed: bool, ld: int, batch_stride: int, shape: tuple) -> np.ndarray:
    """The (batch, rows, cols) matrix cuBLAS sees in `array`'s memory: column-major with leading dimension ld,
    the row-major matrix's transpose unless `transposed` (then the matrix itself)."""
    item = array.itemsize
    strides = (batch_stride * item, item, ld * item) if transposed else (batch_stride * item, ld * item, item)
    return np.lib.stride_tricks.as_strided(array, shape=shape, strides=strides)


def _layouts(rng):
    full = rng.standard_normal((8, 6, 9)).astype(np.float32)
    return {
        "row-major": full[:4, :5, :7],
        "transposed view": full[:4].transpose(0, 2, 1),
        "one matrix": full[:1, :5],
        "broadcast batch": np.broadcast_to(full[:1, :5, :7], (4, 5, 7)),
        "strided batch": full[::2, :3, 2:5],
        "reversed batch": full[::-1, :5, :7],
        "strided columns": full[:2, :, ::2],
        "one row": full[:3, :1, :],
        "one column": full[:3, :, :1],
    }


@pytest.mark.parametrize("name", list(_layouts(np.random.default_rng(0))))
def test_every_layout_is_read_back_as_the_same_matrix(name):
    m = _layouts(np.random.default_rng(0))[name]
    array, transposed, ld, batch_stride = cublas._operand(np, m)
    rows, cols = m.shape[1:]
    assert ld >= max(1, rows if transposed else cols) and batch_stride >= 0
    np.testing.assert_array_equal(_as_cublas_reads(array, transposed, ld, batch_stride, m.shape), m)
    if name in ("row-major", "transposed view", "broadcast batch", "strided batch", "one row", "one column"):
        assert np.shares_memory(array, m)   # read in place, no copy


def test_operands_and_output_take_three_dims_and_bad_shapes_are_named():
    a, b = np.ones((5, 7), np.float32), np.ones((7, 3), np.float32)
    product = batched_product(np, a, b)
    assert (product.a.shape, product.b.shape, product.out.shape, product.result.shape) == \
        ((1, 5, 7), (1, 7, 3), (1, 5, 3), (5, 3))
    out = np.empty((5, 3), np.float32)
    assert batched_product(np, a, b, out).result is out
    with pytest.raises(ValueError, match=r"matmul: shapes \(5, 7\) and \(5, 3\) do not multiply"):
        batched_product(np, a, np.ones((5, 3), np.float32))
    with pytest.raises(ValueError, match="matmul: batch dims 2 and 3 do not broadcast"):
        batched_product(np, np.ones((2, 5, 7), np.float32), np.ones((3, 7, 3), np.float32))
    with pytest.raises(ValueError, match=r"matmul: out must be a C-contiguous float32 array of shape \(5, 3\)"):
        batched_product(np, a, b, np.empty((3, 5), np.float32))


def test_16_bit_operands_may_write_float32_and_nothing_narrower_or_other():
    a, b = np.ones((5, 7), np.float16), np.ones((7, 3), np.float16)
    out = np.empty((5, 3), np.float32)
    assert batched_product(np, a, b, out).result is out
    with pytest.raises(ValueError, match=r"out must be a C-contiguous float16 or float32 array .* got float64"):
        batched_product(np, a, b, np.empty((5, 3), np.float64))
    with pytest.raises(ValueError, match=r"out must be a C-contiguous float32 array .* got float16"):
        batched_product(np, a.astype(np.float32), b.astype(np.float32), np.empty((5, 3), np.float16))
