"""Adam against torch.optim.Adam: every option combination, 20 steps, float64."""
import itertools

import numpy as np
import pytest
import torch

import frost
from frost.optim import Adam
from optim_oracle import assert_params_close, assert_state_close, frost_params, initial_arrays, torch_params, train

COMBOS = [dict(weight_decay=wd, amsgrad=a, maximize=m, betas=b)
          for wd, a, m, b in itertools.product([0.0, 0.1], [False, True], [False, True], [(0.9, 0.999), (0.8, 0.9)])]


@pytest.mark.parametrize("options", COMBOS, ids=lambda o: "-".join(f"{k}={v}" for k, v in o.items()))
def test_adam_matches_torch(options):
    arrays = initial_arrays()
    fp, tp = frost_params(arrays), torch_params(arrays)
    fopt = Adam(fp, lr=0.02, eps=1e-6, **options)
    topt = torch.optim.Adam(tp, lr=0.02, eps=1e-6, foreach=False, **options)
    train(fopt, topt, fp, tp, range(20))
    assert_params_close(fp, tp)
    assert_state_close(fopt, topt)
    assert not np.allclose(fp[0].detach().numpy(), arrays[0])


def test_adam_defaults_match_torch():
    arrays = initial_arrays(1)
    fp, tp = frost_params(arrays), torch_params(arrays)
    fopt, topt = Adam(fp), torch.optim.Adam(tp, foreach=False)
    assert {k: fopt.defaults[k] for k in fopt.defaults} == {k: topt.defaults[k] for k in fopt.defaults}
    train(fopt, topt, fp, tp, range(5))
    assert_params_close(fp, tp)


def test_adam_step_counter_is_a_float32_tensor_per_parameter():
    arrays = initial_arrays()
    fp = frost_params(arrays)
    opt = Adam(fp, lr=0.1)
    for step in range(3):
        for i, p in enumerate(fp):
            p.grad = None if (i == 0 and step == 0) else frost.ones_like(p)
        opt.step()
    assert opt.state[fp[0]]["step"].dtype == frost.float32 and opt.state[fp[0]]["step"].shape == ()
    assert opt.state[fp[0]]["step"].item() == 2.0 and opt.state[fp[1]]["step"].item() == 3.0


def test_adam_rejects_bad_betas():
    with pytest.raises(ValueError, match=r"betas must be two numbers in \[0, 1\), got \(0.9, 1.0\)"):
        Adam([frost.zeros(2, requires_grad=True)], betas=(0.9, 1.0))
