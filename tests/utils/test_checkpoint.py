"""Tests of frost.utils.checkpoint: gradients equal to the run without checkpointing (bit for bit, with dropout
too), fewer arrays kept alive by the forward, and checkpoint_sequential against PyTorch's."""
import gc
import weakref

import numpy as np
import pytest
import torch
import torch.utils.checkpoint

import frost
from frost import nn
from frost.utils.checkpoint import checkpoint, checkpoint_sequential


def _block(seed: int, p: float = 0.0) -> nn.Module:
    frost.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 6), nn.Tanh(), nn.Dropout(p), nn.Linear(6, 6), nn.Tanh())


def _grads(model: nn.Module, loss: frost.Tensor, x: frost.Tensor) -> list:
    model.zero_grad()
    x.grad = None
    loss.backward()
    return [x.grad.numpy().copy()] + [p.grad.numpy().copy() for p in model.parameters()]


@pytest.mark.parametrize("p", [0.0, 0.5])
def test_gradients_equal_those_without_checkpointing(p: float):
    model = _block(0, p)
    x = frost.randn(4, 6, requires_grad=True)
    frost.manual_seed(1)
    plain = _grads(model, (model(x) ** 2).sum(), x)
    frost.manual_seed(1)
    out = checkpoint(model, x, use_reentrant=False)
    frost.randn(10)  # draws between forward and backward must not change the recomputed dropout masks
    checkpointed = _grads(model, (out ** 2).sum(), x)
    for a, b in zip(plain, checkpointed):
        np.testing.assert_array_equal(a, b)


def test_a_lambda_over_a_module_and_a_tuple_output():
    model = _block(2)
    x = frost.randn(3, 6, requires_grad=True)
    a, b = model(x), model(x * 2)
    plain = _grads(model, (a * b).sum(), x)
    a, b = checkpoint(lambda t: (model(t), model(t * 2)), x)
    np.testing.assert_array_equal(plain[0], _grads(model, (a * b).sum(), x)[0])
    a, b = checkpoint(lambda t: (model(t), model(t * 2)), x)
    for u, v in zip(plain, _grads(model, (a * b).sum(), x)):
        np.testing.assert_array_equal(u, v)


def test_inputs_without_grad_still_give_the_parameters_gradients():
    model = _block(3)
    x = frost.randn(2, 6)
    model.zero_grad()
    (model(x) ** 2).sum().backward()
    plain = [p.grad.numpy().copy() for p in model.parameters()]
    model.zero_grad()
    (checkpoint(model, x) ** 2).sum().backward()
    for a, p in zip(plain, model.parameters()):
        np.testing.assert_array_equal(a, p.grad.numpy())


class _Recording(nn.Module):
    """Tanh layers that keep a weak reference to every activation array they make."""

    def __init__(self, refs: list) -> None:
        super().__init__()
        self.refs = refs
        self.linear = nn.Linear(8, 8)

    def forward(self, x):
        for _ in range(4):
            x = frost.tanh(self.linear(x))
            self.refs.append(weakref.ref(x.data))
        return x


def test_the_forward_keeps_no_activation_arrays_alive():
    refs: list = []
    model = _Recording(refs)
    x = frost.randn(5, 8, requires_grad=True)
    kept = model(x)
    gc.collect()
    assert sum(r() is not None for r in refs) == 4  # plain autograd keeps every tanh output for its backward
    refs.clear()
    out = checkpoint(model, x)
    gc.collect()
    assert sum(r() is not None for r in refs) == 1  # only the result, which the caller holds
    out.sum().backward()
    assert x.grad is not None and kept is not None


def test_checkpoint_sequential_matches_torch():
    rng = np.random.default_rng(4)
    sizes = [(5, 5)] * 5
    weights = [rng.standard_normal(s) for s in sizes]
    f_layers, t_layers = [], []
    for w in weights:
        f, t = nn.Linear(5, 5, bias=False).double(), torch.nn.Linear(5, 5, bias=False).double()
        f.weight.data[...] = w
        with torch.no_grad():
            t.weight.copy_(torch.tensor(w))
        f_layers += [f, nn.Tanh()]
        t_layers += [t, torch.nn.Tanh()]
    x = rng.standard_normal((3, 5))
    fx, tx = frost.tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
    checkpoint_sequential(nn.Sequential(*f_layers), 3, fx).sum().backward()
    torch.utils.checkpoint.checkpoint_sequential(torch.nn.Sequential(*t_layers), 3, tx,
                                                 use_reentrant=False).sum().backward()
    np.testing.assert_allclose(fx.grad.numpy(), tx.grad.numpy(), rtol=1e-12)
    for f, t in zip(f_layers[::2], t_layers[::2]):
        np.testing.assert_allclose(f.weight.grad.numpy(), t.weight.grad.numpy(), rtol=1e-12)


def test_bad_arguments_are_refused():
    with pytest.raises(TypeError, match="checkpoint: function must be callable"):
        checkpoint(3, frost.ones(2))
    with pytest.raises(ValueError, match="checkpoint_sequential: segments .* got 4"):
        checkpoint_sequential([nn.Tanh(), nn.Tanh()], 4, frost.ones(2))
    with pytest.raises(TypeError, match="must return a Tensor"):
        checkpoint(lambda t: "no", frost.ones(2, requires_grad=True))


@pytest.mark.cuda
def test_gradients_with_dropout_on_cuda_equal_those_without_checkpointing():
    model = _block(0, 0.5).to("cuda")
    x = frost.randn(4, 6, device="cuda", requires_grad=True)
    frost.manual_seed(1)
    plain = _grads(model, (model(x) ** 2).sum(), x)
    frost.manual_seed(1)
    out = checkpoint(model, x)
    frost.randn(10, device="cuda")
    for a, b in zip(plain, _grads(model, (out ** 2).sum(), x)):
        np.testing.assert_array_equal(a, b)
