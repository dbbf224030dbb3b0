"""Matrix multiplication and the linear op against PyTorch: all the 1-D/batched/broadcast cases, grads, errors."""
import numpy as np
import pytest
import torch

import frost
from frost.ops.matmul import fold_batch_dims, linear, matmul

RNG = np.random.default_rng(3)


def _check(frost_fn, torch_fn, *arrays, atol=1e-10, rtol=1e-9):
    fs = [frost.tensor(a, requires_grad=True) for a in arrays]
    ts = [torch.tensor(a, requires_grad=True) for a in arrays]
    fo, to = frost_fn(*fs), torch_fn(*ts)
    assert fo.shape == tuple(to.shape)
    assert fo.dtype.name == str(to.dtype).replace("torch.", "")
    np.testing.assert_allclose(fo.detach().numpy(), to.detach().numpy(), atol=atol, rtol=rtol)
    up = RNG.standard_normal(fo.shape).astype(arrays[0].dtype)
    fo.backward(frost.tensor(up))
    to.backward(torch.tensor(up))
    for f, t in zip(fs, ts):
        assert f.grad.dtype == f.dtype and f.grad.shape == f.shape
        np.testing.assert_allclose(f.grad.numpy(), t.grad.numpy(), atol=atol, rtol=rtol)


SHAPES = [
    ((3, 4), (4, 5)), ((4,), (4,)), ((4,), (4, 5)), ((3, 4), (4,)), ((2, 3, 4), (4, 5)), ((3, 4), (2, 4, 5)),
    ((2, 1, 3, 4), (5, 4, 2)), ((4,), (2, 3, 4, 5)), ((2, 3, 4), (4,)), ((1, 3, 4), (6, 4, 2)),
]


@pytest.mark.parametrize("sa,sb", SHAPES)
def test_matmul_shapes(sa, sb):
    a, b = RNG.standard_normal(sa), RNG.standard_normal(sb)
    _check(lambda x, y: x @ y, lambda x, y: x @ y, a, b)
    _check(matmul, torch.matmul, a, b)


def test_matmul_noncontiguous_operands():
    a = RNG.standard_normal((5, 3)).T  # (3, 5), transposed
    b = RNG.standard_normal((2, 7, 5)).transpose(0, 2, 1)[:, :, ::2]  # (2, 5, 4), strided
    _check(lambda x, y: x @ y, lambda x, y: x @ y, a, b)


def test_matmul_float32_stays_float32():
    a = RNG.standard_normal((3, 4)).astype(np.float32)
    b = RNG.standard_normal((4, 2)).astype(np.float32)
    _check(lambda x, y: x @ y, lambda x, y: x @ y, a, b, atol=1e-5, rtol=1e-5)


def test_rmatmul_with_numpy_array():
    a = RNG.standard_normal((3, 4))
    b = frost.tensor(RNG.standard_normal((4, 2)), requires_grad=True)
    out = a @ b  # NumPy defers to Tensor.__rmatmul__ (__array_priority__)
    assert isinstance(out, frost.Tensor)
    np.testing.assert_allclose(out.detach().numpy(), a @ b.detach().numpy())
    out.sum().backward()
    np.testing.assert_allclose(b.grad.numpy(), a.T @ np.ones((3, 2)))


def test_integer_matmul():
    a, b = frost.tensor([[1, 2], [3, 4]]), frost.tensor([[5], [6]])
    assert (a @ b).dtype == frost.int64
    np.testing.assert_array_equal((a @ b).numpy(), [[17], [39]])


def test_matmul_errors():
    with pytest.raises(RuntimeError, match=r"matmul: shapes \(2, 3\) and \(4, 5\) cannot be multiplied \(3 != 4\)"):
        frost.ones(2, 3) @ frost.ones(4, 5)
    with pytest.raises(RuntimeError, match=r"matmul: shapes \(3,\) and \(2,\)"):
        frost.ones(3) @ frost.ones(2)
    with pytest.raises(RuntimeError, match=r"matmul: operands have different dtypes: \(2, 2\) frost.float32 and "
                                           r"\(2, 2\) frost.float64"):
        frost.ones(2, 2) @ frost.ones(2, 2, dtype=frost.float64)
    with pytest.raises(RuntimeError, match="need at least one dimension"):
        frost.ones(()) @ frost.ones(2)
    with pytest.raises(RuntimeError, match="cannot be broadcast|cannot be multiplied|batch"):
        frost.ones(2, 3, 4) @ frost.ones(3, 4, 5)


@pytest.mark.parametrize("xshape", [(5, 4), (2, 3, 4), (4,)])
@pytest.mark.parametrize("bias", [True, False])
def test_linear(xshape, bias):
    x, w = RNG.standard_normal(xshape), RNG.standard_normal((3, 4))
    arrays = [x, w] + ([RNG.standard_normal(3)] if bias else [])
    _check(lambda *a: linear(*a), lambda *a: torch.nn.functional.linear(*a), *arrays)


@pytest.mark.parametrize("xshape,wshape", [((2, 0), (4, 0)), ((2, 3, 0), (4, 0)), ((2, 4), (0, 4)),
                                           ((0, 4), (3, 4)), ((2, 0, 4), (3, 4))])
@pytest.mark.parametrize("bias", [True, False])
def test_linear_with_zero_size_dims_matches_torch(xshape, wshape, bias):
    # reshape(-1, 0) cannot infer the rows: in_features=0 used to fail; PyTorch answers the bias, broadcast
    x, w = RNG.standard_normal(xshape), RNG.standard_normal(wshape)
    arrays = [x, w] + ([RNG.standard_normal(wshape[0])] if bias else [])
    _check(lambda *a: linear(*a), lambda *a: torch.nn.functional.linear(*a), *arrays)


def test_linear_errors():
    with pytest.raises(RuntimeError, match=r"linear: .*\(2, 5\).*\(3, 4\)"):
        linear(frost.ones(2, 5), frost.ones(3, 4))
    with pytest.raises(RuntimeError, match=r"linear: bias of shape \(4,\) does not fit weight of shape \(3, 4\)"):
        linear(frost.ones(2, 4), frost.ones(3, 4), frost.ones(4))


def test_matmul_device_mismatch_names_both():
    class FakeCuda(frost.Tensor):  # no GPU here: a tensor that only says it lives on one
        @property
        def device(self):
            return frost.Device("cuda:0")
    with pytest.raises(RuntimeError, match=r"matmul: operands are on different devices: \(2, 3\) on cpu and "
                                           r"\(3, 2\) on cuda:0"):
        frost.ones(2, 3) @ FakeCuda(np.ones((3, 2), dtype=np.float32))


@pytest.mark.parametrize("dt", ["bfloat16", "float16"])
def test_low_precision_matmul_keeps_dtype(dt):
    a, b = RNG.standard_normal((3, 4)), RNG.standard_normal((4, 2))
    fa, fb = frost.tensor(a, dtype=dt, requires_grad=True), frost.tensor(b, dtype=dt, requires_grad=True)
    ta, tb = torch.tensor(a, dtype=getattr(torch, dt)), torch.tensor(b, dtype=getattr(torch, dt))
    out = fa @ fb
    assert out.dtype.name == dt
    np.testing.assert_allclose(out.detach().numpy().astype(np.float64), (ta @ tb).double().detach().numpy(), atol=0.05,
                               rtol=0.02)
    out.sum().backward()
    assert fa.grad.dtype.name == dt and fb.grad.dtype.name == dt
    lin = linear(fa, frost.tensor(b.T, dtype=dt, requires_grad=True), frost.zeros(2, dtype=dt, requires_grad=True))
    assert lin.dtype.name == dt


@pytest.mark.cuda
def test_gpu_float32_matmul_without_tf32_is_exact(exact_gpu_math):
    import cupy as cp
    from frost.ops.matmul import matmul_arrays
    rng = np.random.default_rng(0)
    for m, k, n in ((4, 320, 10), (320, 4, 10), (64, 64, 64)):
        a, b = rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal((k, n)).astype(np.float32)
        want = a.astype(np.float64) @ b.astype(np.float64)
        got = matmul_arrays(cp, cp.asarray(a), cp.asarray(b)).get()
        assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max(), (m, k, n)


@pytest.mark.parametrize("sa, sb", [((2, 3, 4, 5), (2, 3, 5, 6)), ((2, 3, 4, 5), (1, 3, 5, 6)),
                                    ((2, 1, 4, 5), (3, 5, 6)), ((4, 5), (2, 3, 5, 6)), ((2, 3, 4, 5), (5, 6))])
def test_batch_dims_fold_into_one_stack_of_matrices(sa, sb):
    """The GPU multiplies (B, H, T, D) products as 3-D stacks (cuDNN, capturable): the folding broadcasts the batch
    dims as matmul does."""
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal(sa), rng.standard_normal(sb)
    a3, b3, batch = fold_batch_dims(np, a, b)
    assert a3.ndim == b3.ndim == 3 and a3.shape[0] == b3.shape[0] == int(np.prod(batch))
    np.testing.assert_allclose(np.matmul(a3, b3).reshape(batch + (sa[-2], sb[-1])), np.matmul(a, b), rtol=1e-12)


@pytest.mark.cuda
def test_four_dimensional_products_on_the_gpu_equal_the_cpu():
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal((2, 3, 16, 8)).astype(np.float32), rng.standard_normal((2, 3, 8, 16)).astype(np.float32)
    with _tf32_off():
        got = matmul(frost.tensor(a, device="cuda"), frost.tensor(b, device="cuda")).numpy()
    np.testing.assert_allclose(got, a @ b, rtol=1e-5, atol=1e-5)


class _tf32_off:
    def __enter__(self):
        self.before, frost.backends.allow_tf32 = frost.backends.allow_tf32, False

    def __exit__(self, *exc):
        frost.backends.allow_tf32 = self.before
