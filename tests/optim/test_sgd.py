"""SGD against torch.optim.SGD: every option combination, 20 steps, float64."""
import itertools

import numpy as np
import pytest
import torch

import frost
from frost.optim import SGD, sgd_update
from optim_oracle import assert_params_close, assert_state_close, frost_params, initial_arrays, torch_params, train

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
    assert not np.allclose(fp[0].numpy(), arrays[0])  # it moved


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
    np.testing.assert_allclose(fp[1].numpy(), arrays[1] - 0.1)


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
