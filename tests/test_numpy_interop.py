"""Tests for frost/numpy_interop.py: NumPy functions on tensors run Frost's ops (graph kept) or refuse, as PyTorch."""
import types

import numpy as np
import pytest
import torch

import frost
from frost.backend import cuda

RNG = np.random.default_rng(0)
X = RNG.uniform(0.5, 2.0, (3, 4))  # positive: log and sqrt are defined
Y = RNG.uniform(0.5, 2.0, (3, 4))
REFUSAL = "Can't call numpy() on Tensor that requires grad. Use tensor.detach().numpy() instead."


def pair(values):
    return frost.tensor(values, requires_grad=True), torch.tensor(values, requires_grad=True)


def assert_graph_as_torch(ours, theirs, frost_inputs, torch_inputs):
    """Same values, and the same gradients of a weighted sum (PyTorch's ops on float64 are the oracle)."""
    assert isinstance(ours, frost.Tensor) and ours.grad_fn is not None
    np.testing.assert_allclose(ours.detach().numpy(), theirs.detach().numpy(), rtol=1e-12, atol=1e-12)
    weights = RNG.standard_normal(theirs.shape)
    (ours * frost.tensor(weights)).sum().backward()
    (theirs * torch.tensor(weights)).sum().backward()
    for f, t in zip(frost_inputs, torch_inputs):
        np.testing.assert_allclose(f.grad.numpy(), t.grad.numpy(), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("ufunc, torch_op", [
    (np.exp, torch.exp), (np.log, torch.log), (np.sqrt, torch.sqrt), (np.tanh, torch.tanh), (np.sin, torch.sin),
    (np.cos, torch.cos), (np.negative, torch.neg), (np.absolute, torch.abs), (np.square, torch.square),
    (np.log1p, torch.log1p), (np.expm1, torch.expm1), (np.reciprocal, torch.reciprocal),
], ids=lambda f: getattr(f, "__name__", ""))
def test_unary_ufuncs_run_frosts_op_and_keep_the_graph(ufunc, torch_op):
    f, t = pair(X)
    assert_graph_as_torch(ufunc(f), torch_op(t), [f], [t])


@pytest.mark.parametrize("ufunc, torch_op", [
    (np.add, torch.add), (np.subtract, torch.sub), (np.multiply, torch.mul), (np.divide, torch.div),
    (np.power, torch.pow), (np.maximum, torch.maximum), (np.minimum, torch.minimum), (np.matmul, None),
], ids=lambda f: getattr(f, "__name__", ""))
def test_binary_ufuncs_run_frosts_op_and_keep_the_graph(ufunc, torch_op):
    (fa, ta), (fb, tb) = pair(X), pair(Y)
    if ufunc is np.matmul:
        (fb, tb) = pair(Y.T.copy())
        torch_op = torch.matmul
    assert_graph_as_torch(ufunc(fa, fb), torch_op(ta, tb), [fa, fb], [ta, tb])


def test_numbers_and_arrays_on_either_side():
    f, t = pair(X)
    assert_graph_as_torch(np.add(f, 1.5), t + 1.5, [f], [t])
    f, t = pair(X)
    assert_graph_as_torch(np.float64(2.0) * f, 2.0 * t, [f], [t])
    f, t = pair(X)
    assert_graph_as_torch(Y - f, torch.tensor(Y) - t, [f], [t])  # ndarray.__sub__ asks the tensor: Frost's sub
    f, t = pair(X)
    assert_graph_as_torch(np.subtract(Y, f), torch.tensor(Y) - t, [f], [t])
    comparison = np.greater(f, 1.0)
    assert isinstance(comparison, frost.Tensor) and comparison.dtype == frost.bool
    np.testing.assert_array_equal(comparison.numpy(), X > 1.0)


@pytest.mark.parametrize("call, torch_call", [
    (lambda a: np.sum(a), lambda a: a.sum()),
    (lambda a: np.sum(a, axis=1, keepdims=True), lambda a: a.sum(1, keepdim=True)),
    (lambda a: np.mean(a, axis=0), lambda a: a.mean(0)),
    (lambda a: np.max(a, axis=1), lambda a: a.amax(1)),
    (lambda a: np.amin(a), lambda a: a.amin()),
    (lambda a: np.var(a), lambda a: a.var(correction=0)),  # NumPy's ddof=0 default
    (lambda a: np.std(a, axis=1, ddof=1), lambda a: a.std(1, correction=1)),
    (lambda a: np.cumsum(a), lambda a: a.reshape(-1).cumsum(0)),
    (lambda a: np.cumsum(a, axis=1), lambda a: a.cumsum(1)),
    (lambda a: np.cumprod(a, axis=1), lambda a: a.cumprod(1)),
    (lambda a: np.prod(a), lambda a: a.prod()),
    (lambda a: np.prod(a, axis=0, keepdims=True), lambda a: a.prod(0, keepdim=True)),
    (lambda a: np.reshape(a, (4, 3)), lambda a: a.reshape(4, 3)),
    (lambda a: np.transpose(a), lambda a: a.T),
    (lambda a: np.concatenate([a, a * 2], axis=1), lambda a: torch.cat([a, a * 2], 1)),
    (lambda a: np.concatenate([a, a], axis=None), lambda a: torch.cat([a.reshape(-1), a.reshape(-1)])),
    (lambda a: np.stack([a, a]), lambda a: torch.stack([a, a])),
    (lambda a: np.expand_dims(a, 1), lambda a: a.unsqueeze(1)),
    (lambda a: np.squeeze(np.expand_dims(a, 0)), lambda a: a),
    (lambda a: np.where(a > 1.0, a, 0.0), lambda a: torch.where(a > 1.0, a, 0.0)),
    (lambda a: np.clip(a, 0.8, 1.5), lambda a: a.clamp(0.8, 1.5)),
    (lambda a: np.flip(a, axis=1), lambda a: a.flip(1)),
    (lambda a: np.triu(a, 1), lambda a: a.triu(1)),
    (lambda a: np.dot(a, a.T), lambda a: a @ a.T),
])
def test_numpy_functions_frost_has_run_frosts_op_and_keep_the_graph(call, torch_call):
    f, t = pair(X)
    ours = call(f)
    np.testing.assert_allclose(ours.detach().numpy(), call(X), rtol=1e-12)  # NumPy's own answer on the array
    assert_graph_as_torch(ours, torch_call(t), [f], [t])


def test_shape_questions_answer_without_reading_values():
    f = frost.ones(2, 3, requires_grad=True)
    assert np.shape(f) == (2, 3) and np.ndim(f) == 2 and np.size(f) == 6 and np.size(f, 1) == 3


@pytest.mark.parametrize("call", [
    lambda a: np.median(a), lambda a: np.arctan2(a, a), lambda a: np.add.reduce(a), lambda a: np.sort(a),
    lambda a: np.exp(a, out=np.empty(a.shape)), lambda a: np.sum(a, where=a.detach().numpy() > 1),
    lambda a: np.round(a, 2), lambda a: np.concatenate([a, a], dtype=np.float32), lambda a: np.allclose(a, a),
])
def test_numpy_functions_frost_lacks_refuse_a_tensor_that_requires_grad(call):
    with pytest.raises(TypeError) as info:
        call(frost.tensor(X, requires_grad=True))
    assert str(info.value).startswith("numpy.") and str(info.value).endswith(REFUSAL)


def test_numpy_functions_frost_lacks_read_a_tensor_that_does_not_require_grad_as_pytorch():
    f = frost.tensor(X)
    assert np.median(f) == np.median(X) and np.allclose(f, X) and isinstance(np.sort(f), np.ndarray)
    angle = np.arctan2(f, f)  # a ufunc: its array comes back as a tensor (PyTorch's __array_wrap__)
    assert isinstance(angle, frost.Tensor)
    np.testing.assert_array_equal(angle.numpy(), np.arctan2(X, X))
    expected = torch.tensor(X).numpy().copy()
    np.testing.assert_array_equal(np.asarray(f), expected)
    out = frost.zeros(3, 4, dtype="float64")
    before = out._version
    assert np.exp(f, out=out) is out and out._version == before + 1  # NumPy wrote into it: counted
    np.testing.assert_allclose(out.numpy(), np.exp(X))


class FakeCudaArray:
    """What Frost takes for a CuPy array on cuda:0 (its class's module is named cupy), on a CPU-only machine."""

    shape, ndim, dtype, size = (4,), 1, np.dtype(np.float64), 4
    device = types.SimpleNamespace(id=0)


FakeCudaArray.__module__ = "cupy"


def test_a_cuda_tensor_is_never_copied_to_the_host_implicitly(monkeypatch):
    monkeypatch.setattr(cuda, "cupy", lambda: types.SimpleNamespace(ndarray=FakeCudaArray))
    on_gpu = frost.Tensor(FakeCudaArray())
    assert str(on_gpu.device) == "cuda:0"
    for call in (np.median, lambda a: np.arctan2(a, a), lambda a: np.allclose(a, a)):
        with pytest.raises(TypeError, match=r"can't convert cuda:0 device type tensor to numpy\. Use Tensor\.cpu\(\)"):
            call(on_gpu)

