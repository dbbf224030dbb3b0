"""SGD against torch.optim.SGD: every option combination, 20 steps, float64; its flat kernel against the rule."""
import itertools

import numpy as np
import pytest
import torch

import frost
from frost.optim import SGD, flat, sgd, sgd_update
from frost.optim.flat import advance_step
from frost.optim.sgd import sgd_flat_kernel
from optim_oracle import (assert_params_close, assert_state_close, frost_params, initial_arrays, run_on_fixed_gradients,
                          torch_params, train)

COMBOS = [dict(momentum=m, dampening=d, weight_decay=wd, nesterov=n, maximize=mx)
          for m, d, wd, n, mx in itertools.product([0.0, 0.9], [0.0, 0.3], [0.0, 0.1], [False, True], [False, True])
          if not (n and (m == 0 or d != 0))]


@pytest.mark.parametrize("options", COMBOS, ids=lambda o: "-".join(f"{k}={v}" for k, v in o.items()))
def test_sgd_matches_torch(options):
    arrays = initial_arrays()
    fp, tp = frost_params(arrays), torch_params(arrays)
    fopt = SGD(fp, lr=0.05, **options)
    topt = torch.optim.SGD(tp, lr=0.05, foreach=False, **options)
    train(fopt, topt, fp, tp, range(20))
    assert_params_close(fp, tp)
    assert_state_close(fopt, topt)
    assert not np.allclose(fp[0].detach().numpy(), arrays[0])  # it moved


def test_sgd_first_step_buffer_is_a_copy_of_the_gradient():
    p = np.array([1.0, 2.0])
    g = np.array([0.5, -1.0])
    buf = sgd_update(p, g, None, lr=0.1, momentum=0.9)
    np.testing.assert_array_equal(buf, [0.5, -1.0])
    np.testing.assert_allclose(p, [0.95, 2.1])
    buf[0] = 7.0
    assert g[0] == 0.5  # the buffer does not alias the gradient


def test_sgd_without_momentum_keeps_no_state():
    arrays = initial_arrays()
    fp = frost_params(arrays)
    opt = SGD(fp, lr=0.1)
    for p in fp:
        p.grad = frost.ones_like(p)
    opt.step()
    assert opt.state_dict()["state"] == {}
    np.testing.assert_allclose(fp[1].detach().numpy(), arrays[1] - 0.1)


def test_sgd_rejects_bad_options():
    p = [frost.zeros(2, requires_grad=True)]
    with pytest.raises(ValueError, match="Nesterov momentum needs momentum > 0 and dampening = 0"):
        SGD(p, lr=0.1, nesterov=True)
    with pytest.raises(ValueError, match="Nesterov"):
        SGD(p, lr=0.1, momentum=0.9, dampening=0.1, nesterov=True)
    with pytest.raises(ValueError, match=r"lr \(-1\)"):
        SGD(p, lr=-1)


def test_sgd_float32_params_stay_float32():
    p = frost.Tensor(np.ones(3, dtype=np.float32), requires_grad=True)
    opt = SGD([p], lr=0.1, momentum=0.9, weight_decay=0.01)
    for _ in range(2):
        p.grad = frost.Tensor(np.full(3, 0.5, dtype=np.float32))
        opt.step()
    assert p.dtype == frost.float32 and opt.state[p]["momentum_buffer"].dtype == frost.float32


MOMENTUM_COMBOS = [o for o in COMBOS if o["momentum"] > 0]


def _hyper(lr, o) -> np.ndarray:
    return np.array([0, lr, o["momentum"], o["dampening"], o["weight_decay"], o["nesterov"], o["maximize"]],
                    np.float32)


@pytest.mark.parametrize("options", MOMENTUM_COMBOS, ids=lambda o: "-".join(f"{k}={v}" for k, v in o.items()))
def test_simulated_kernel_equals_the_cpu_rule(options):
    rng = np.random.default_rng(0)
    n = 300  # two blocks of 256, the second partly idle
    p = rng.standard_normal(n).astype(np.float32)
    buf, p_ref, buf_ref = np.zeros(n, np.float32), p.copy(), None
    hyper = _hyper(0.05, options)
    for _ in range(4):
        g = rng.standard_normal(n).astype(np.float32)
        advance_step.simulate[1, 32](hyper)
        sgd_flat_kernel.simulate[2, 256](p, g, buf, n, hyper)
        buf_ref = sgd_update(p_ref, g, buf_ref, lr=0.05, **options)
    np.testing.assert_allclose(buf, buf_ref, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(p, p_ref, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("options", [dict(dampening=0.3), dict(nesterov=True, weight_decay=0.1)],
                         ids=["dampening", "nesterov"])
def test_simulated_kernel_follows_momentum_set_to_zero_and_back(options):
    """A flat group packs with momentum > 0; a schedule may then set it to 0 (plain SGD: dampening plays no part and
    the buffer is left as it was, as in PyTorch) and back (the old buffer resumes)."""
    rng = np.random.default_rng(1)
    n = 300
    p = rng.standard_normal(n).astype(np.float32)
    buf, p_ref, buf_ref = np.zeros(n, np.float32), p.copy(), None
    hyper = _hyper(0.05, dict(momentum=0.9, dampening=0.0, weight_decay=0.0, nesterov=False, maximize=False))
    for momentum in [0.9, 0.9, 0.0, 0.0, 0.9]:
        o = dict(momentum=momentum, dampening=0.0, weight_decay=0.0, nesterov=False, maximize=False) | options
        hyper[1:] = _hyper(0.05, o)[1:]
        g = rng.standard_normal(n).astype(np.float32)
        advance_step.simulate[1, 32](hyper)
        sgd_flat_kernel.simulate[2, 256](p, g, buf, n, hyper)
        buf_ref = sgd_update(p_ref, g, buf_ref, lr=0.05, **o)
        np.testing.assert_allclose(buf, buf_ref, rtol=1e-6, atol=1e-6, err_msg=f"momentum {momentum}")
        np.testing.assert_allclose(p, p_ref, rtol=1e-6, atol=1e-6, err_msg=f"momentum {momentum}")


def test_flat_group_stays_flat_while_momentum_is_zero_and_matches_torch(monkeypatch):
    """A schedule that sets momentum to 0 and back: the packed group keeps its one launch (the kernel serves momentum
    0 as PyTorch does: plain SGD, the buffer left as it was) and follows torch.optim.SGD."""
    monkeypatch.setattr(flat, "eligible", lambda params: all(p.grad is not None for p in params))
    monkeypatch.setattr(SGD, "flat_kernel", sgd.sgd_flat_kernel.simulate)
    monkeypatch.setattr(flat, "advance_step", flat.advance_step.simulate)
    arrays = [a.astype(np.float32) for a in initial_arrays()]
    fp, tp = [frost.Tensor(a.copy(), requires_grad=True) for a in arrays], torch_params(initial_arrays())
    options = dict(lr=0.05, momentum=0.9, dampening=0.3, weight_decay=0.1)
    fopt, topt = SGD(fp, **options), torch.optim.SGD(tp, foreach=False, **options)
    rng = np.random.default_rng(4)
    for momentum in [0.9, 0.9, 0.0, 0.0, 0.8]:
        for opt in (fopt, topt):
            opt.param_groups[0]["momentum"] = momentum
        for f, t in zip(fp, tp):
            g = rng.standard_normal(f.shape)
            f.grad, t.grad = frost.Tensor(g.astype(np.float32)), torch.from_numpy(g)
        fopt.step(), topt.step()
        assert fopt._flat, f"momentum {momentum}: the group should have stayed flat"
    for i, (f, t) in enumerate(zip(fp, tp)):
        np.testing.assert_allclose(f.detach().numpy(), t.detach().numpy(), rtol=1e-5, atol=1e-6, err_msg=f"param {i}")


def test_flat_group_continues_from_per_tensor_state(monkeypatch):
    """Three per-tensor steps (buffers, no step counter, as PyTorch keeps SGD's state), then the group goes flat:
    the kernel must not take its first flat step for a first step (dampening shows it)."""
    options = dict(momentum=0.9, dampening=0.3, weight_decay=0.1)
    arrays = [a.astype(np.float32) for a in initial_arrays()]
    params = [frost.Tensor(a.copy(), requires_grad=True) for a in arrays]
    ref, bufs = [a.copy() for a in arrays], [None] * len(arrays)
    opt = SGD(params, lr=0.05, **options)
    rng = np.random.default_rng(2)
    for step in range(6):
        if step == 3:  # from now on every group goes flat, its launches in the simulator over NumPy buffers
            monkeypatch.setattr(flat, "eligible", lambda params: True)
            monkeypatch.setattr(SGD, "flat_kernel", sgd.sgd_flat_kernel.simulate)
            monkeypatch.setattr(flat, "advance_step", flat.advance_step.simulate)
        for i, p in enumerate(params):
            g = rng.standard_normal(p.shape).astype(np.float32)
            if p.grad is None:
                p.grad = frost.Tensor(g.copy())
            else:
                p.grad.data[...] = g
            bufs[i] = sgd_update(ref[i], g, bufs[i], lr=0.05, **options)
        opt.step()
        assert bool(opt._flat) == (step >= 3)
    for i, p in enumerate(params):
        np.testing.assert_allclose(p.detach().numpy(), ref[i], rtol=1e-5, atol=1e-6, err_msg=f"param {i}")
        np.testing.assert_allclose(opt.state[p]["momentum_buffer"].numpy(), bufs[i], rtol=1e-5, atol=1e-6)
    assert float(opt.state[params[0]]["step"].item()) == 4  # the flat counter: 1 for the per-tensor steps, + 3


def test_a_group_without_momentum_does_not_go_flat(monkeypatch):
    monkeypatch.setattr(flat, "eligible", lambda params: True)
    p = frost.Tensor(np.ones(3, np.float32), requires_grad=True)
    p.grad = frost.Tensor(np.ones(3, np.float32))
    opt = SGD([p], lr=0.1)
    opt.step()
    assert not opt._flat and opt.state_dict()["state"] == {}


@pytest.mark.cuda
@pytest.mark.parametrize("options", [dict(momentum=0.9, nesterov=True, weight_decay=1e-2),
                                     dict(momentum=0.8, dampening=0.3, maximize=True)], ids=["nesterov", "dampening"])
def test_gpu_flat_update_equals_cpu_rule(options):
    make = lambda ps: SGD(ps, lr=1e-2, **options)  # noqa: E731
    _, cpu = run_on_fixed_gradients("cpu", make, step_lr=True)
    opt, gpu = run_on_fixed_gradients("cuda", make, step_lr=True)
    assert opt._flat, "the CUDA parameters should have been packed into a flat group"
    for a, b in zip(gpu, cpu):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
