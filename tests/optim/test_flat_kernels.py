"""The one-launch GPU update of Adam/AdamW over flat buffers equals the CPU rule (simulator here, GPU with -m cuda)."""
import numpy as np
import pytest

import frost
from frost.optim.adam import adam_update
from frost.optim.adamw import adam_flat_kernel, adamw_update
from frost.optim import flat
from frost.optim.flat import advance_step
from optim_oracle import run_on_fixed_gradients


def test_kernels_compile_for_sm90():
    assert len(adam_flat_kernel.compile(arch="sm_90")) > 1000
    assert len(advance_step.compile(arch="sm_90")) > 1000


@pytest.mark.parametrize("decoupled,rule,maximize", [(1.0, adamw_update, False), (0.0, adam_update, False),
                                                     (1.0, adamw_update, True)])
def test_simulated_kernel_equals_the_cpu_rule_over_steps(decoupled, rule, maximize):
    rng = np.random.default_rng(0)
    n = 300  # two blocks, the second partly idle
    p = rng.standard_normal(n).astype(np.float32)
    m, v = np.zeros(n, np.float32), np.zeros(n, np.float32)
    p_ref, m_ref, v_ref = p.copy(), m.copy(), v.copy()
    hyper = np.array([0, 1e-2, 0.9, 0.98, 1e-8, 0.05, float(maximize), decoupled], np.float32)
    for step in range(1, 6):
        g = rng.standard_normal(n).astype(np.float32)
        advance_step.simulate[1, 32](hyper)
        adam_flat_kernel.simulate[2, 256](p, g, m, v, n, hyper)
        rule(p_ref, g, m_ref, v_ref, lr=1e-2, betas=(0.9, 0.98), eps=1e-8, weight_decay=0.05,
             step=float(step), maximize=maximize)
    assert hyper[0] == 5
    np.testing.assert_allclose(p, p_ref, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(m, m_ref, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(v, v_ref, rtol=1e-5, atol=1e-7)


@pytest.mark.cuda
@pytest.mark.parametrize("opt_cls", [frost.optim.AdamW, frost.optim.Adam])
def test_gpu_flat_update_equals_cpu_rule(opt_cls):
    options = dict(lr=1e-2, betas=(0.9, 0.98), eps=1e-8, weight_decay=0.01)
    make = lambda ps: opt_cls(ps, **options)  # noqa: E731
    _, cpu = run_on_fixed_gradients("cpu", make, shapes=[(16, 8), (16,), (3, 16), (3,)], step_lr=True)
    opt, gpu = run_on_fixed_gradients("cuda", make, shapes=[(16, 8), (16,), (3, 16), (3,)], step_lr=True)
    assert opt._flat, "the CUDA parameters should have been packed into a flat group"
    for a, b in zip(gpu, cpu):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    state = opt.state_dict()
    assert float(state["state"][0]["step"].item()) == 20


# The base class drives every elementwise flat group (advance_step, then one launch of the class's flat_kernel with
# its flat_hyper options): here each optimizer runs once with its groups flat, launches in the kernel simulator over
# NumPy buffers, and once tensor by tensor; the two must agree, parameters and state.
ELEMENTWISE = [
    (frost.optim.AdamW, dict(lr=1e-2, betas=(0.8, 0.9), weight_decay=0.1, maximize=True)),
    (frost.optim.Adam, dict(lr=1e-2, weight_decay=0.1)),
    (frost.optim.Lion, dict(lr=1e-2, betas=(0.8, 0.95), weight_decay=0.5)),
    (frost.optim.SophiaG, dict(lr=1e-2, rho=0.5, bs=8, weight_decay=0.1)),
    (frost.optim.Muon, dict(lr=1e-2, adam_lr=1e-2, adam_weight_decay=0.1)),  # its AdamW group goes flat
]


def run_flat_or_per_tensor(opt_cls, options, flat_groups):
    rng = np.random.default_rng(3)
    params = [frost.Tensor(rng.standard_normal(s).astype(np.float32), requires_grad=True) for s in [(5, 3), (7,), ()]]
    opt = opt_cls(params, **options)
    if not flat_groups:
        opt.flat_kernel = None
    for step in range(6):
        for p in params:
            g = rng.standard_normal(p.shape).astype(np.float32)
            if p.grad is None:
                p.grad = frost.Tensor(g)
            else:
                p.grad.data[...] = g  # a view into the flat gradient buffer once the group is flat
        opt.step()
        if isinstance(opt, frost.optim.SophiaG) and step % 2 == 1:
            opt.update_hessian()  # the refresh=1 launch (flat) or sophiag_hessian_update (per tensor)
    return opt, params


@pytest.mark.parametrize("opt_cls,options", ELEMENTWISE, ids=[c.__name__ for c, _ in ELEMENTWISE])
def test_simulated_flat_group_equals_the_per_tensor_path(monkeypatch, opt_cls, options):
    monkeypatch.setattr(flat, "eligible", lambda params: True)
    monkeypatch.setattr(flat, "advance_step", advance_step.simulate)
    monkeypatch.setattr(opt_cls, "flat_kernel", opt_cls.flat_kernel.simulate)
    flat_opt, flat_params = run_flat_or_per_tensor(opt_cls, options, flat_groups=True)
    opt, params = run_flat_or_per_tensor(opt_cls, options, flat_groups=False)
    assert flat_opt._flat and not opt._flat
    for i, (a, b) in enumerate(zip(flat_params, params)):
        np.testing.assert_allclose(a.detach().numpy(), b.detach().numpy(), rtol=1e-5, atol=1e-6, err_msg=f"param {i}")
        assert set(flat_opt.state[a]) == set(opt.state[b]), i
        for name, value in opt.state[b].items():
            np.testing.assert_allclose(flat_opt.state[a][name].numpy(), value.numpy(), rtol=1e-5, atol=1e-6,
                                       err_msg=f"param {i}, state {name}")
