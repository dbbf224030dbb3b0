"""Tests of frost/nn/activation.py against PyTorch: values, gradients, repr."""
import numpy as np
import pytest
import torch

import frost
from frost import nn

from .helpers import compare_layer

rng = np.random.default_rng(0)

CASES = [
    ("ReLU", (), {}), ("ReLU", (), dict(inplace=True)), ("GELU", (), {}), ("GELU", (), dict(approximate="tanh")),
    ("SiLU", (), {}), ("Sigmoid", (), {}), ("Tanh", (), {}), ("LeakyReLU", (), {}), ("LeakyReLU", (0.2,), {}),
    ("Softplus", (), dict(beta=2.0, threshold=5.0)), ("Softmax", (), dict(dim=1)), ("Softmax", (-1,), {}),
    ("LogSoftmax", (), dict(dim=1)),
]


@pytest.mark.parametrize("name,args,kwargs", CASES)
def test_activation_matches_torch(name, args, kwargs):
    f, t = getattr(nn, name)(*args, **kwargs), getattr(torch.nn, name)(*args, **kwargs)
    x = rng.standard_normal((3, 4, 5)) * 4
    if name == "ReLU":
        x[0, 0, :2] = [0.0, 1e-300]  # the kink
    inplace = kwargs.get("inplace", False)
    if inplace:
        t.inplace = False  # torch refuses an in-place op on a leaf that requires grad; frost answers out of place
    compare_layer(f, t, x)
    if inplace:
        t.inplace = True
    assert repr(f) == repr(t)


def test_softmax_without_dim_picks_pytorchs_legacy_dim():
    x = rng.standard_normal((2, 3))
    with pytest.warns(UserWarning, match="Implicit dimension"):
        compare_layer(nn.Softmax(), torch.nn.Softmax(), x)


def test_gelu_rejects_unknown_approximation():
    with pytest.raises(ValueError, match="approximate must be 'none' or 'tanh'"):
        nn.GELU("fast")


INPLACE_LAYERS = [("ReLU", ()), ("SiLU", ()), ("LeakyReLU", (0.2,))]


@pytest.mark.parametrize("name,args", INPLACE_LAYERS)
@pytest.mark.parametrize("no_grad_mode", [False, True])
def test_inplace_layer_without_gradient_overwrites_its_input_like_torch(name, args, no_grad_mode):
    # inplace=True used to be ignored: the input kept its values. Without a gradient to keep, frost now writes in
    # place as PyTorch (a leaf that requires grad under no_grad counts as needing none)
    x = rng.standard_normal((3, 4)) * 3
    f_in, t_in = frost.tensor(x, requires_grad=no_grad_mode), torch.tensor(x, requires_grad=no_grad_mode)
    version = f_in._version
    with frost.no_grad() if no_grad_mode else frost.enable_grad(), torch.set_grad_enabled(not no_grad_mode):
        f_out = getattr(nn, name)(*args, inplace=True)(f_in)
        t_out = getattr(torch.nn, name)(*args, inplace=True)(t_in)
    assert f_out is f_in and t_out is t_in
    assert f_in._version > version  # copy_ counted the change
    np.testing.assert_allclose(f_in.detach().numpy(), t_in.detach().numpy(), rtol=1e-14, atol=1e-16)


@pytest.mark.parametrize("name,args", INPLACE_LAYERS)
def test_inplace_layer_on_a_tensor_in_the_graph_keeps_torchs_values_and_gradients(name, args):
    # frost records no in-place op: an input that needs a gradient gets the out-of-place result (documented),
    # whose values and float64 gradients are those of torch's in-place op on a non-leaf
    x, g = rng.standard_normal((3, 4)) * 3, rng.standard_normal((3, 4))
    f_leaf, t_leaf = frost.tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
    f_in, t_in = f_leaf * 2.0, t_leaf * 2.0
    f_out = getattr(nn, name)(*args, inplace=True)(f_in)
    t_out = getattr(torch.nn, name)(*args, inplace=True)(t_in)
    assert f_out is not f_in and t_out is t_in
    np.testing.assert_array_equal(f_in.detach().numpy(), 2.0 * x)  # left as it was
    np.testing.assert_allclose(f_out.detach().numpy(), t_out.detach().numpy(), rtol=1e-15, atol=0)
    f_out.backward(frost.tensor(g))
    t_out.backward(torch.tensor(g))
    np.testing.assert_allclose(f_leaf.grad.numpy(), t_leaf.grad.numpy(), rtol=1e-14, atol=1e-15)


def test_inplace_relu_on_a_tensor_an_op_saved_makes_that_backward_refuse_like_torch():
    w_np, x_np = rng.standard_normal(4), rng.standard_normal(4)
    fw, tw = frost.tensor(w_np, requires_grad=True), torch.tensor(w_np, requires_grad=True)
    fx, tx = frost.tensor(x_np), torch.tensor(x_np)
    fy, ty = fw * fx, tw * tx  # saves x for w's gradient
    nn.ReLU(inplace=True)(fx)
    torch.nn.ReLU(inplace=True)(tx)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        ty.sum().backward()
    with pytest.raises(RuntimeError, match="changed in place"):
        fy.sum().backward()
