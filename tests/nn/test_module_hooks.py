"""Tests of Module.register_full_backward_hook and register_full_backward_pre_hook: the calls and gradients they see
and what their results replace, against PyTorch's hooks on the same small modules (float64)."""
import warnings

import numpy as np
import pytest
import torch

import frost
from frost import nn


def _linear_pair(seed: int = 0):
    rng = np.random.default_rng(seed)
    w, b = rng.standard_normal((2, 3)), rng.standard_normal(2)
    f, t = nn.Linear(3, 2).double(), torch.nn.Linear(3, 2).double()
    f.weight.data[...], f.bias.data[...] = w, b
    with torch.no_grad():
        t.weight.copy_(torch.tensor(w))
        t.bias.copy_(torch.tensor(b))
    return f, t


class _TwoInOut:
    """forward(x, scale, y) -> (x * y, x + y, a non-tensor): a module with two tensor inputs, one number and two
    tensor outputs, for both libraries."""

    @staticmethod
    def forward(x, scale, y):
        return x * y * scale, x + y, "tag"


class FrostTwo(nn.Module):
    def forward(self, x, scale, y):
        return _TwoInOut.forward(x, scale, y)


class TorchTwo(torch.nn.Module):
    def forward(self, x, scale, y):
        return _TwoInOut.forward(x, scale, y)


def _recorder(log: list, kind: str):
    def hook(module, *grads):
        log.append((kind, [None if g is None else [None if a is None else a.detach().numpy().copy() for a in g]
                           for g in grads]))
    return hook


def _assert_same_log(f_log: list, t_log: list) -> None:
    assert [k for k, _ in f_log] == [k for k, _ in t_log]
    for (_, f_groups), (_, t_groups) in zip(f_log, t_log):
        for f_group, t_group in zip(f_groups, t_groups):
            assert len(f_group) == len(t_group)
            for a, b in zip(f_group, t_group):
                assert (a is None) == (b is None)
                if a is not None:
                    np.testing.assert_allclose(a, b, rtol=1e-12)


def test_hooks_on_a_linear_layer_see_torch_grad_input_and_grad_output():
    f, t = _linear_pair()
    f_log, t_log = [], []
    f.register_full_backward_pre_hook(_recorder(f_log, "pre"))
    f.register_full_backward_hook(_recorder(f_log, "full"))
    t.register_full_backward_pre_hook(_recorder(t_log, "pre"))
    t.register_full_backward_hook(_recorder(t_log, "full"))
    x = np.random.default_rng(1).standard_normal((4, 3))
    fx, tx = frost.tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
    (f(fx) ** 2).sum().backward()
    (t(tx) ** 2).sum().backward()
    _assert_same_log(f_log, t_log)
    np.testing.assert_allclose(fx.grad.numpy(), tx.grad.numpy(), rtol=1e-12)
    np.testing.assert_allclose(f.weight.grad.numpy(), t.weight.grad.numpy(), rtol=1e-12)


def test_two_inputs_two_outputs_and_non_tensor_arguments_as_torch():
    rng = np.random.default_rng(2)
    x, y = rng.standard_normal(3), rng.standard_normal(3)
    f_log, t_log = [], []
    f, t = FrostTwo(), TorchTwo()
    f.register_full_backward_hook(_recorder(f_log, "full"))
    t.register_full_backward_hook(_recorder(t_log, "full"))
    fx, fy = frost.tensor(x, requires_grad=True), frost.tensor(y, requires_grad=True)
    tx, ty = torch.tensor(x, requires_grad=True), torch.tensor(y, requires_grad=True)
    fa, fb, tag = f(fx, 2.0, fy)
    ta, tb, _ = t(tx, 2.0, ty)
    assert tag == "tag"
    (fa.sum() + (fb * fb).sum()).backward()
    (ta.sum() + (tb * tb).sum()).backward()
    _assert_same_log(f_log, t_log)
    assert len(f_log[0][1][0]) == 3 and f_log[0][1][0][1] is None and len(f_log[0][1][1]) == 3


def _assert_same_gradients_of_the_sum(f, t, x: np.ndarray) -> None:
    """Backward of the output's sum through both Linear layers from x: the input's and the parameters' gradients
    agree."""
    fx, tx = frost.tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
    f(fx).sum().backward()
    t(tx).sum().backward()
    for got, want in ((fx, tx), (f.weight, t.weight), (f.bias, t.bias)):
        np.testing.assert_allclose(got.grad.numpy(), want.grad.numpy(), rtol=1e-12)


def test_a_returned_grad_input_replaces_the_input_gradients():
    f, t = _linear_pair(3)
    f.register_full_backward_hook(lambda m, gi, go: (gi[0] * 3,))
    t.register_full_backward_hook(lambda m, gi, go: (gi[0] * 3,))
    _assert_same_gradients_of_the_sum(f, t, np.random.default_rng(4).standard_normal((2, 3)))


def test_a_returned_grad_output_reaches_the_parameters_and_inputs():
    f, t = _linear_pair(5)
    f.register_full_backward_pre_hook(lambda m, go: (go[0] * -2,))
    t.register_full_backward_pre_hook(lambda m, go: (go[0] * -2,))
    _assert_same_gradients_of_the_sum(f, t, np.random.default_rng(6).standard_normal((2, 3)))


def test_inputs_without_grad_call_the_hook_with_none_grad_input_as_torch():
    f, t = _linear_pair(7)
    f_log, t_log = [], []
    f.register_full_backward_hook(_recorder(f_log, "full"))
    t.register_full_backward_hook(_recorder(t_log, "full"))
    x = np.ones((2, 3))
    f(frost.tensor(x)).sum().backward()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # PyTorch warns that the hook fires at the outputs
        t(torch.tensor(x)).sum().backward()
    _assert_same_log(f_log, t_log)
    assert f_log[0][1][0] == [None]


def test_removed_hooks_do_not_run_and_bad_returns_are_refused():
    f, _ = _linear_pair()
    calls = []
    handle = f.register_full_backward_hook(lambda m, gi, go: calls.append(1))
    handle.remove()
    fx = frost.ones(1, 3, dtype=frost.float64, requires_grad=True)
    f(fx).sum().backward()
    assert calls == []
    f.register_full_backward_hook(lambda m, gi, go: (gi[0], gi[0]))
    with pytest.raises(RuntimeError, match="register_full_backward_hook: the hook returned 2 values"):
        f(fx).sum().backward()
