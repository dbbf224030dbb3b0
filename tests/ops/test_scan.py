"""Cumulative ops (cumprod, cummax, cummin, logcumsumexp) against PyTorch CPU float64: values, indices, gradients."""
import numpy as np
import pytest
import torch

import frost

RNG = np.random.default_rng(3)


def _values_and_grads(frost_fn, torch_fn, array):
    """Run both ops on `array` and backward an upstream gradient; return (frost out, torch out, frost grad,
    torch grad)."""
    f = frost.tensor(array, requires_grad=True)
    t = torch.tensor(array, requires_grad=True)
    fo, to = frost_fn(f), torch_fn(t)
    up = RNG.standard_normal(fo.shape)
    fo.backward(frost.tensor(up))
    to.backward(torch.tensor(up))
    return fo, to, f.grad, t.grad


def _check(frost_fn, torch_fn, array, atol=1e-10, rtol=1e-7):
    fo, to, fg, tg = _values_and_grads(frost_fn, torch_fn, array)
    assert fo.shape == tuple(to.shape) and fo.dtype.name == str(to.dtype).replace("torch.", "")
    np.testing.assert_allclose(fo.detach().numpy(), to.detach().numpy(), atol=atol, rtol=rtol)
    assert fg.dtype == frost.float64
    np.testing.assert_allclose(fg.numpy(), tg.numpy(), atol=atol, rtol=rtol)


@pytest.mark.parametrize("dim", [0, 1, -1, 2])
@pytest.mark.parametrize("name", ["cumprod", "logcumsumexp"])
def test_scans_match_torch(name, dim):
    a = RNG.standard_normal((3, 4, 5)).transpose(1, 0, 2)  # non-contiguous
    _check(lambda x: getattr(frost, name)(x, dim), lambda x: getattr(torch, name)(x, dim), a)
    _check(lambda x: getattr(x, name)(dim), lambda x: getattr(x, name)(dim), a)


@pytest.mark.parametrize("row", [[2.0, 0.0, 3.0, 4.0], [0.0, 2.0, 3.0, 0.0], [1.5, 0.0, 0.0, 2.0],
                                 [0.0, 0.0, 0.0, 0.0], [2.0, 3.0, -1.0, 0.0]])
def test_cumprod_gradient_with_zeros(row):
    _check(lambda x: frost.cumprod(x, 1), lambda x: torch.cumprod(x, 1), np.array([row, row[::-1]]))


def test_cumprod_integer_and_dtype():
    x = frost.tensor([[1, 2, 3], [4, 5, 6]], dtype=frost.int32)
    out = frost.cumprod(x, 1)
    assert out.dtype == frost.int64
    assert out.tolist() == torch.cumprod(torch.tensor([[1, 2, 3], [4, 5, 6]], dtype=torch.int32), 1).tolist()
    assert frost.cumprod(x, 0, dtype=frost.float64).dtype == frost.float64


@pytest.mark.parametrize("dim", [0, 1, -1])
@pytest.mark.parametrize("name", ["cummax", "cummin"])
def test_running_extremes_values_indices_and_gradients(name, dim):
    # many ties (the latest index wins, as PyTorch) and a long row (several scan steps)
    a = RNG.integers(-2, 3, (5, 37)).astype(np.float64)
    fo, to, fg, tg = _values_and_grads(lambda x: getattr(frost, name)(x, dim).values,
                                       lambda x: getattr(torch, name)(x, dim).values, a)
    np.testing.assert_array_equal(fo.detach().numpy(), to.detach().numpy())
    np.testing.assert_allclose(fg.numpy(), tg.numpy(), atol=1e-12)
    f_idx = getattr(frost.tensor(a), name)(dim).indices
    assert f_idx.dtype == frost.int64
    np.testing.assert_array_equal(f_idx.numpy(), getattr(torch.tensor(a), name)(dim).indices.numpy())


@pytest.mark.parametrize("name", ["cummax", "cummin"])
def test_running_extremes_with_nan_and_integers(name):
    a = np.array([[2.0, np.nan, -1.0, np.nan, 0.5], [1.0, 1.0, 3.0, 0.0, 3.0]])
    f, t = getattr(frost, name)(frost.tensor(a), 1), getattr(torch, name)(torch.tensor(a), 1)
    np.testing.assert_array_equal(f.values.numpy(), t.values.numpy())
    np.testing.assert_array_equal(f.indices.numpy(), t.indices.numpy())
    ints = np.array([[3, 1, 4, 1, 5, 9, 2, 6]], dtype=np.int32)
    f, t = getattr(frost, name)(frost.tensor(ints), 1), getattr(torch, name)(torch.tensor(ints), 1)
    assert f.values.dtype == frost.int32
    assert f.values.tolist() == t.values.tolist() and f.indices.tolist() == t.indices.tolist()


def test_logcumsumexp_of_a_long_row():
    _check(lambda x: frost.logcumsumexp(x, -1), lambda x: torch.logcumsumexp(x, -1),
           RNG.standard_normal((2, 37)) * 30, atol=1e-9)


def test_logcumsumexp_is_stable_for_large_and_infinite_inputs():
    a = np.array([[1000.0, -1000.0, 999.0, -np.inf], [-np.inf, -np.inf, 0.0, 700.0]])
    _check(lambda x: frost.logcumsumexp(x, 1), lambda x: torch.logcumsumexp(x, 1), a)


def test_scans_of_a_zero_dim_tensor():
    for name in ["cumprod", "logcumsumexp"]:
        _check(lambda x: getattr(frost, name)(x, 0), lambda x: getattr(torch, name)(x, 0), np.array(1.5))
    f, t = frost.cummax(frost.tensor(2.0), -1), torch.cummax(torch.tensor(2.0), -1)
    assert f.values.shape == () and f.values.item() == t.values.item() and f.indices.item() == 0


@pytest.mark.parametrize("name", ["cumsum", "cumprod", "cummax", "cummin", "logcumsumexp"])
def test_dim_out_of_range_names_the_op_and_dim(name):
    with pytest.raises(IndexError, match=f"{name}: dim 5"):
        getattr(frost, name)(frost.ones(2, 3), 5)
    with pytest.raises(IndexError):
        getattr(torch, name)(torch.ones(2, 3), 5)
