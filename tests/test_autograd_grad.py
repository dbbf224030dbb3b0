"""Tests of frost.autograd.grad against torch.autograd.grad (float64): values, leaves and intermediate inputs,
several outputs, the untouched .grad, and PyTorch's errors."""
import numpy as np
import pytest
import torch

import frost
import frost.nn.functional as F


def _pair(values: np.ndarray):
    return frost.tensor(values, requires_grad=True), torch.tensor(values, requires_grad=True)


def _close(f: frost.Tensor, t: torch.Tensor) -> None:
    np.testing.assert_allclose(f.numpy(), t.detach().numpy(), rtol=1e-12, atol=1e-12)


def test_grad_of_leaves_and_of_an_intermediate_tensor_matches_torch():
    rng = np.random.default_rng(0)
    (fx, tx), (fw, tw) = _pair(rng.standard_normal((3, 4))), _pair(rng.standard_normal((4, 2)))
    fh, th = frost.tanh(fx @ fw), torch.tanh(tx @ tw)
    fl, tl = (fh * fh).sum() + fx.sum(), (th * th).sum() + tx.sum()
    for f, t in zip(frost.autograd.grad(fl, [fx, fh, fw]), torch.autograd.grad(tl, [tx, th, tw])):
        _close(f, t)
    assert fx.grad is None and fw.grad is None


def test_grad_leaves_existing_grads_alone_and_backward_still_works_after_retain_graph():
    fx, tx = _pair(np.array([1.0, -2.0, 3.0]))
    fx.grad = frost.tensor([5.0, 5.0, 5.0])
    fl = (fx ** 3).sum()
    (g,) = frost.autograd.grad(fl, fx, retain_graph=True)
    _close(g, torch.autograd.grad((tx ** 3).sum(), tx)[0])
    np.testing.assert_array_equal(fx.grad.numpy(), [5.0, 5.0, 5.0])
    fl.backward()
    np.testing.assert_allclose(fx.grad.numpy(), 5.0 + 3 * np.array([1.0, 4.0, 9.0]))


def test_grad_of_several_outputs_with_grad_outputs_matches_torch():
    rng = np.random.default_rng(1)
    fx, tx = _pair(rng.standard_normal(5))
    go = rng.standard_normal(5)
    f_outs, t_outs = [fx.sin(), fx * fx, (fx * 2).sum()], [tx.sin(), tx * tx, (tx * 2).sum()]
    f_go = [frost.tensor(go), frost.tensor(go), None]
    t_go = [torch.tensor(go), torch.tensor(go), None]
    _close(frost.autograd.grad(f_outs, [fx], f_go)[0], torch.autograd.grad(t_outs, [tx], t_go)[0])


def test_grad_through_a_layer_matches_torch():
    rng = np.random.default_rng(2)
    (fx, tx), (fw, tw), (fb, tb) = (_pair(rng.standard_normal(s)) for s in ((4, 3), (2, 3), (2,)))
    fl = F.cross_entropy(F.linear(fx, fw, fb), frost.tensor([0, 1, 1, 0]))
    tl = torch.nn.functional.cross_entropy(torch.nn.functional.linear(tx, tw, tb), torch.tensor([0, 1, 1, 0]))
    for f, t in zip(frost.autograd.grad(fl, (fw, fb, fx)), torch.autograd.grad(tl, (tw, tb, tx))):
        _close(f, t)


def test_tensor_hooks_on_inputs_run_and_their_result_is_returned():
    fx = frost.tensor([1.0, 2.0], requires_grad=True)
    seen = []
    fx.register_hook(lambda g: seen.append(g.numpy().copy()) or g * 10)
    (g,) = frost.autograd.grad((fx * fx).sum(), fx)
    np.testing.assert_array_equal(seen[0], [2.0, 4.0])
    np.testing.assert_array_equal(g.numpy(), [20.0, 40.0])


def test_unused_inputs_error_as_torch_unless_allowed_or_materialized():
    fx, fy = frost.tensor([1.0], requires_grad=True), frost.tensor([2.0, 3.0], requires_grad=True)
    with pytest.raises(RuntimeError, match="input 1 .*not have been used"):
        frost.autograd.grad((fx * 2).sum(), [fx, fy], retain_graph=True)
    tx, ty = torch.tensor([1.0], requires_grad=True), torch.tensor([2.0, 3.0], requires_grad=True)
    with pytest.raises(RuntimeError, match="not have been used"):
        torch.autograd.grad((tx * 2).sum(), [tx, ty], retain_graph=True)
    out = (fx * 2).sum()
    assert frost.autograd.grad(out, [fx, fy], allow_unused=True, retain_graph=True)[1] is None
    np.testing.assert_array_equal(frost.autograd.grad(out, [fy], materialize_grads=True)[0].numpy(), [0.0, 0.0])
    with pytest.raises(ValueError, match="allow_unused"):
        frost.autograd.grad(out, [fy], allow_unused=False, materialize_grads=True)


def test_non_scalar_output_needs_grad_outputs():
    fx = frost.tensor([1.0, 2.0], requires_grad=True)
    with pytest.raises(RuntimeError, match=r"only for scalar outputs.*\(2,\)"):
        frost.autograd.grad(fx * 2, fx)
    with pytest.raises(RuntimeError, match=r"grad_outputs\[0\] has shape \(3,\)"):
        frost.autograd.grad(fx * 2, fx, frost.ones(3))


def test_outputs_and_inputs_that_do_not_require_grad_are_refused():
    fx = frost.tensor([1.0, 2.0], requires_grad=True)
    with pytest.raises(RuntimeError, match="element 0 of outputs .*does not require grad"):
        frost.autograd.grad(frost.ones(2).sum(), fx)
    with pytest.raises(RuntimeError, match="input 0 .*does not require grad"):
        frost.autograd.grad((fx * 2).sum(), frost.ones(2))


def test_the_graph_is_freed_without_retain_graph():
    fx = frost.tensor([1.0, 2.0], requires_grad=True)
    out = (fx * fx).sum()
    frost.autograd.grad(out, fx)
    with pytest.raises(RuntimeError, match="a second time"):
        frost.autograd.grad(out, fx)


@pytest.mark.cuda
def test_grad_on_cuda_matches_torch():
    rng = np.random.default_rng(3)
    x, w = rng.standard_normal((3, 4)), rng.standard_normal((4, 2))
    fx, fw = frost.tensor(x, device="cuda", requires_grad=True), frost.tensor(w, device="cuda", requires_grad=True)
    tx, tw = torch.tensor(x, requires_grad=True), torch.tensor(w, requires_grad=True)
    fh, th = frost.tanh(fx @ fw), torch.tanh(tx @ tw)
    ours = frost.autograd.grad((fh * fh).sum(), [fx, fh, fw])
    for f, t in zip(ours, torch.autograd.grad((th * th).sum(), [tx, th, tw])):
        _close(f.cpu(), t)
    assert fx.grad is None and fw.grad is None
