"""Shared harness for the optimizer tests: the same small model-like parameter set trained by frost and torch."""
from __future__ import annotations

import numpy as np
import torch

import frost

SHAPES = [(4, 3), (3,), (), (2, 2, 3), (5,)]
NO_GRAD_PARAM = 3  # gets no gradient on steps where step % 4 == 0, including the first


def initial_arrays(seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(shape) for shape in SHAPES]


def gradient(step: int, index: int, p: np.ndarray) -> np.ndarray | None:
    """A deterministic gradient that depends on the parameter (a quadratic pull plus a step-dependent push)."""
    if index == NO_GRAD_PARAM and step % 4 == 0:
        return None
    push = np.sin(np.arange(p.size).reshape(p.shape) + 0.7 * step + index)
    return np.asarray((0.5 + 0.1 * index) * p + push)


def frost_params(arrays) -> list[frost.Tensor]:
    return [frost.Tensor(a.copy(), requires_grad=True) for a in arrays]


def torch_params(arrays) -> list[torch.Tensor]:
    return [torch.tensor(a.copy(), requires_grad=True) for a in arrays]


def set_frost_grads(step: int, fparams) -> None:
    for i, fp in enumerate(fparams):
        g = gradient(step, i, fp.detach().numpy())
        fp.grad = None if g is None else frost.Tensor(g)


def set_torch_grads(step: int, tparams) -> None:
    for i, tp in enumerate(tparams):
        g = gradient(step, i, tp.detach().numpy())
        tp.grad = None if g is None else torch.from_numpy(g)


def set_grads(step: int, fparams, tparams) -> None:
    """Each side's gradient is computed from its own parameters, so differences would compound, not hide."""
    set_frost_grads(step, fparams)
    set_torch_grads(step, tparams)


def train(fopt, topt, fparams, tparams, steps: range) -> None:
    for step in steps:
        set_grads(step, fparams, tparams)
        fopt.step()
        topt.step()


def assert_params_close(fparams, tparams, rtol: float = 1e-12, atol: float = 1e-14) -> None:
    for i, (fp, tp) in enumerate(zip(fparams, tparams)):
        np.testing.assert_allclose(fp.detach().numpy(), tp.detach().numpy(), rtol=rtol, atol=atol,
                                   err_msg=f"parameter {i} of shape {SHAPES[i]}")


def assert_state_close(fopt, topt, rtol: float = 1e-12, atol: float = 1e-14) -> None:
    fsd, tsd = fopt.state_dict(), topt.state_dict()
    assert sorted(fsd["state"]) == sorted(tsd["state"])
    for index, tstate in tsd["state"].items():
        fstate = fsd["state"][index]
        assert set(fstate) == {k for k, v in tstate.items() if v is not None}, index
        for key, tv in tstate.items():
            if tv is None:
                continue
            np.testing.assert_allclose(fstate[key].numpy(), tv.numpy(), rtol=rtol, atol=atol,
                                       err_msg=f"state {key!r} of parameter {index}")
            assert fstate[key].dtype.name == str(tv.dtype).removeprefix("torch."), (key, fstate[key].dtype, tv.dtype)


def run_on_fixed_gradients(device: str, make_optimizer, steps: int = 20,
                           shapes=((16, 8), (16,), (3, 16), (3,)), step_lr: bool = False):
    """`steps` optimizer steps on fixed random float32 gradients (no model in between, so a GPU-vs-CPU comparison
    sees only the update rule). Gradients are copied into existing .grad tensors (views of a flat GPU buffer)."""
    rng = np.random.default_rng(1)
    params = [frost.tensor(rng.standard_normal(s).astype(np.float32), device=device, requires_grad=True)
              for s in shapes]
    opt = make_optimizer(params)
    sched = frost.optim.lr_scheduler.StepLR(opt, step_size=5, gamma=0.5) if step_lr else None
    for _ in range(steps):
        opt.zero_grad()
        for p in params:
            g = frost.tensor(rng.standard_normal(p.shape).astype(np.float32), device=device)
            if p.grad is None:
                p.grad = g
            else:
                p.grad.copy_(g)
        opt.step()
        if sched is not None:
            sched.step()
    return opt, [p.detach().cpu().numpy() for p in params]


def run_frost(opt, params, steps) -> None:
    """Frost alone: the harness's gradients, then opt.step(), for each step."""
    for step in steps:
        set_frost_grads(step, params)
        opt.step()


def assert_resumes_exactly_through_a_file(tmp_path, make, fresh):
    """20 steps straight, against 10 steps, frost.save of the parameters and the optimizer's state dict,
    frost.load into `fresh(params)` (an optimizer with other options) and 10 more: equal bit for bit.
    Returns the resumed optimizer, for checks of what its load restored."""
    arrays = initial_arrays(1)
    straight = frost_params(arrays)
    run_frost(make(straight), straight, range(20))
    first = frost_params(arrays)
    opt = make(first)
    run_frost(opt, first, range(10))
    frost.save({"params": [p.detach() for p in first], "opt": opt.state_dict()}, tmp_path / "ckpt.frost")
    saved = frost.load(tmp_path / "ckpt.frost")
    resumed = [frost.Tensor(p.numpy().copy(), requires_grad=True) for p in saved["params"]]
    opt2 = fresh(resumed)
    opt2.load_state_dict(saved["opt"])
    run_frost(opt2, resumed, range(10, 20))
    for a, b in zip(resumed, straight):
        np.testing.assert_array_equal(a.detach().numpy(), b.detach().numpy())
    return opt2


def assert_gpu_flat_group_resumes_through_a_file(tmp_path, make, fresh, shapes) -> dict:
    """On CUDA (flat groups): 20 steps straight against 10 steps, frost.save of the parameters and the state
    dict, frost.load into `fresh(params)` and 10 more: equal to float32 tolerance. Returns the saved state dict."""
    rng = np.random.default_rng(2)
    arrays = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    grads = [[rng.standard_normal(a.shape).astype(np.float32) for a in arrays] for _ in range(20)]

    def run(params, opt, steps):
        for t in steps:
            for p, g in zip(params, grads[t]):
                if p.grad is None:
                    p.grad = frost.tensor(g, device="cuda")
                else:
                    p.grad.copy_(frost.tensor(g, device="cuda"))
            opt.step()
        assert opt._flat

    def cuda_params():
        return [frost.tensor(a, device="cuda", requires_grad=True) for a in arrays]
    straight, first = cuda_params(), cuda_params()
    run(straight, make(straight), range(20))
    opt = make(first)
    run(first, opt, range(10))
    frost.save({"params": [p.detach().cpu() for p in first], "opt": opt.state_dict()}, tmp_path / "ckpt.frost")
    saved = frost.load(tmp_path / "ckpt.frost")
    resumed = [frost.tensor(p.numpy(), device="cuda", requires_grad=True) for p in saved["params"]]
    opt2 = fresh(resumed)
    opt2.load_state_dict(saved["opt"])
    assert float(opt2.state[resumed[0]]["step"].item()) == 10
    run(resumed, opt2, range(10, 20))
    for a, b in zip(resumed, straight):
        np.testing.assert_allclose(a.detach().cpu().numpy(), b.detach().cpu().numpy(), rtol=1e-6, atol=1e-7)
    return saved["opt"]
