"""The one-launch GPU update of Adam/AdamW over flat buffers equals the CPU rule (simulator here, GPU with -m cuda)."""
import numpy as np
import pytest

import frost
from frost.optim.adam import adam_update
from frost.optim.adamw import adam_flat_kernel, adamw_update, advance_step
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
    hyper = np.array([0, 1e-2, 0.9, 0.98, 1e-8, 0.05, -1.0 if maximize else 1.0, decoupled], np.float32)
    for step in range(1, 6):
        g = rng.standard_normal(n).astype(np.float32)
        advance_step.simulate[1, 32](hyper)
        adam_flat_kernel.simulate[2, 256](p, g, m, v, n, hyper)
        rule(p_ref, g, m_ref, v_ref, lr=1e-2, beta1=0.9, beta2=0.98, eps=1e-8, weight_decay=0.05,
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
