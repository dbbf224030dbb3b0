"""Flat groups keep torch.optim's semantics: the gradients the user sees are the ones used, parameters without a
gradient are skipped, every parameter counts its own steps (kernels in the simulator, over NumPy buffers)."""
import warnings

import numpy as np
import pytest
import torch

import frost
from frost import dispatch
from frost.kernel.api import Kernel
from frost.optim import SGD, AdamW, flat
from frost.optim.flat import advance_step

SHAPES = [(4, 3), (5,)]


@pytest.fixture
def simulated_flat(monkeypatch):
    """Every group whose parameters all have gradients goes flat, its launches running in the kernel simulator."""
    monkeypatch.setattr(flat, "eligible", lambda params: all(p.grad is not None for p in params))
    monkeypatch.setattr(flat, "advance_step", advance_step.simulate)
    for cls in (SGD, AdamW):
        monkeypatch.setattr(cls, "flat_kernel", cls.flat_kernel.simulate)


def start(seed: int = 0):
    rng = np.random.default_rng(seed)
    arrays = [rng.standard_normal(s).astype(np.float32) for s in SHAPES]
    inputs = [[rng.standard_normal(s).astype(np.float32) for s in SHAPES] for _ in range(5)]
    return arrays, inputs


def loss(params, xs, lib, used):
    """sum_i (p_i * x_i)^2 over the parameters in `used`: the others get no gradient."""
    return sum(((params[i] * lib.tensor(xs[i])) ** 2).sum() for i in used)


OPTIMIZERS = [(AdamW, torch.optim.AdamW, dict(lr=0.05, weight_decay=0.1)),
              (SGD, torch.optim.SGD, dict(lr=0.05, momentum=0.9, dampening=0.3, weight_decay=0.1))]
IDS = ["AdamW", "SGD"]


def run_both(make, torch_make, options, inputs, arrays, used_at, zero_grad, set_to_none=True, torch_set_to_none=None):
    """The same loop in frost (flat groups simulated) and torch: (frost params, torch params, frost optimizer)."""
    fp = [frost.Tensor(a.copy(), requires_grad=True) for a in arrays]
    tp = [torch.tensor(a.astype(np.float64), requires_grad=True) for a in arrays]
    fopt, topt = make(fp, **options), torch_make(tp, **options)
    for step, xs in enumerate(inputs):
        for params, opt, lib in ((fp, fopt, frost), (tp, topt, torch)):
            zero_grad(params, opt, set_to_none if lib is frost or torch_set_to_none is None else torch_set_to_none)
            loss(params, xs, lib, used_at(step)).backward()
            opt.step()
    return fp, tp, fopt


def optimizer_zero_grad(params, opt, set_to_none):
    opt.zero_grad(set_to_none=set_to_none)


def model_zero_grad(params, opt, set_to_none):
    for p in params:  # what nn.Module.zero_grad() does: the gradient arrays of backward() are new ones
        p.grad = None


def assert_matches_torch(fp, tp):
    for i, (a, b) in enumerate(zip(fp, tp)):
        np.testing.assert_allclose(a.detach().numpy(), b.detach().numpy(), rtol=2e-5, atol=2e-6, err_msg=f"param {i}")


@pytest.mark.parametrize("make,torch_make,options", OPTIMIZERS, ids=IDS)
def test_gradients_made_outside_the_flat_buffer_are_the_ones_used(simulated_flat, make, torch_make, options):
    """model.zero_grad() sets .grad to None: backward() then makes new arrays, which the kernel must still read."""
    arrays, inputs = start()
    fp, tp, fopt = run_both(make, torch_make, options, inputs, arrays, lambda step: [0, 1], model_zero_grad)
    assert fopt._flat, "the group should have stayed flat"
    assert_matches_torch(fp, tp)
    assert all(np.shares_memory(p.grad.data, fopt._flat[0].grads) for p in fp)


@pytest.mark.parametrize("make,torch_make,options", OPTIMIZERS, ids=IDS)
def test_a_parameter_without_a_gradient_is_skipped(simulated_flat, make, torch_make, options):
    """Parameter 1 takes part in steps 0 and 3 only, its .grad None in the others (model.zero_grad()): torch leaves it
    (and its state) alone then."""
    arrays, inputs = start(1)
    with pytest.warns(UserWarning, match=r"param 0.1 has no gradient at this step .* group 0 leaves its one-launch"):
        fp, tp, fopt = run_both(make, torch_make, options, inputs, arrays,
                                lambda step: [0, 1] if step in (0, 3) else [0], model_zero_grad)
    assert not fopt._flat
    assert_matches_torch(fp, tp)
    if make is AdamW:
        assert [float(fopt.state[p]["step"].item()) for p in fp] == [5, 2]


@pytest.mark.parametrize("make,torch_make,options", OPTIMIZERS, ids=IDS)
def test_optimizer_zero_grad_fills_a_flat_group_with_zeros(simulated_flat, make, torch_make, options):
    """opt.zero_grad() keeps a flat group's gradients (zeros): as torch after zero_grad(set_to_none=False), a
    parameter that backward() does not reach is updated with a zero gradient (decay, momentum)."""
    arrays, inputs = start(2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fp, tp, fopt = run_both(make, torch_make, options, inputs, arrays,
                                lambda step: [0, 1] if step in (0, 3) else [0], optimizer_zero_grad,
                                torch_set_to_none=False)
    assert fopt._flat
    assert_matches_torch(fp, tp)


def test_a_step_without_any_gradient_changes_nothing(simulated_flat):
    arrays, inputs = start(3)
    params = [frost.Tensor(a.copy(), requires_grad=True) for a in arrays]
    opt = AdamW(params, lr=0.1)
    loss(params, inputs[0], frost, [0, 1]).backward()
    opt.step()
    before = [p.detach().numpy().copy() for p in params]
    for p in params:
        p.grad = None
    opt.step()  # torch has no gradients here and changes nothing
    assert opt._flat and float(opt.state[params[0]]["step"].item()) == 1
    for a, b in zip(params, before):
        np.testing.assert_array_equal(a.detach().numpy(), b)


@pytest.mark.parametrize("make,torch_make,options", OPTIMIZERS, ids=IDS)
def test_parameters_that_took_different_numbers_of_steps_keep_their_own_counters(simulated_flat, make, torch_make,
                                                                                   options):
    """Step 0 updates parameter 0 only (the group cannot go flat then); from step 1 both have gradients, but one
    device counter cannot serve them: the group stays per tensor, as torch (SGD: a first step copies the gradient)."""
    arrays, inputs = start(4)
    fp, tp, fopt = run_both(make, torch_make, options, inputs, arrays, lambda step: [0] if step == 0 else [0, 1],
                            optimizer_zero_grad)
    assert not fopt._flat and fopt._never_flat == {0}
    assert_matches_torch(fp, tp)


def test_loaded_state_with_different_step_counts_is_not_packed(simulated_flat):
    arrays, inputs = start(5)
    params = [frost.Tensor(a.copy(), requires_grad=True) for a in arrays]
    opt = AdamW(params, lr=0.05)
    for step in range(3):
        opt.zero_grad()
        loss(params, inputs[step], frost, [0] if step < 2 else [0, 1]).backward()
        opt.step()
    saved = opt.state_dict()
    assert [float(saved["state"][i]["step"].item()) for i in (0, 1)] == [3, 1]
    opt2 = AdamW(params, lr=0.05)
    opt2.load_state_dict(saved)
    opt2.zero_grad()
    loss(params, inputs[3], frost, [0, 1]).backward()
    opt2.step()
    assert not opt2._flat and [float(opt2.state[p]["step"].item()) for p in params] == [4, 2]


def test_common_step():
    a, b = frost.zeros(2), frost.zeros(3)
    step = lambda n: {"step": frost.Tensor(np.array(n, np.float32))}  # noqa: E731
    assert flat.common_step([a, b], {}) == 0
    assert flat.common_step([a, b], {a: step(3), b: step(3)}) == 3
    assert flat.common_step([a, b], {a: step(3), b: step(2)}) is None
    assert flat.common_step([a, b], {a: step(3)}) is None  # b has taken none
    buffer = {"momentum_buffer": frost.zeros(2)}
    assert flat.common_step([a, b], {a: buffer, b: dict(buffer)}) == 1  # SGD's state: one step taken at least


def test_a_parameter_whose_data_was_replaced_leaves_the_flat_buffer(simulated_flat):
    arrays, inputs = start(6)
    params = [frost.Tensor(a.copy(), requires_grad=True) for a in arrays]
    opt = SGD(params, lr=0.1, momentum=0.9)
    loss(params, inputs[0], frost, [0, 1]).backward()
    opt.step()
    params[1].data = params[1].data.copy()  # as model.to() would: the buffer no longer holds it
    before = params[1].detach().numpy().copy()
    opt.zero_grad()
    loss(params, inputs[1], frost, [0, 1]).backward()
    grad = params[1].grad.numpy().copy()
    buf = opt.state[params[1]]["momentum_buffer"].numpy().copy()
    with pytest.warns(UserWarning, match=r"param 0.1 no longer lies in the group's flat buffer"):
        opt.step()
    assert not opt._flat
    np.testing.assert_allclose(params[1].detach().numpy(), before - 0.1 * (0.9 * buf + grad), rtol=1e-6)


def test_an_option_the_kernel_lacks_set_later_leaves_the_flat_path(simulated_flat):
    """AMSGrad turned on after the group went flat: from then on the per-tensor rule (the kernel has no AMSGrad)."""
    arrays, inputs = start(7)
    runs = []
    for flat_groups in (True, False):
        params = [frost.Tensor(a.copy(), requires_grad=True) for a in arrays]
        opt = AdamW(params, lr=0.05)
        if not flat_groups:
            opt.flat_kernel = None
        for step, xs in enumerate(inputs):
            opt.param_groups[0]["amsgrad"] = step >= 2
            opt.zero_grad()
            loss(params, xs, frost, [0, 1]).backward()
            opt.step()
            assert bool(opt._flat) == (flat_groups and step < 2)
        runs.append(params)
    for a, b in zip(*runs):
        np.testing.assert_allclose(a.detach().numpy(), b.detach().numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.cuda
def test_gpu_flat_groups_follow_the_cpu_run():
    """On the GPU (real flat groups): new gradient arrays and a parameter left out of some steps, as on the CPU."""
    arrays, inputs = start(8)
    results = {}
    for device in ("cpu", "cuda"):
        params = [frost.Tensor(a.copy(), requires_grad=True).to(device) for a in arrays]
        params = [p.detach().requires_grad_() for p in params]
        opt = AdamW(params, lr=0.05, weight_decay=0.1)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for step, xs in enumerate(inputs):
                model_zero_grad(params, opt, True)
                xs = [frost.tensor(x, device=device) for x in xs]
                sum(((params[i] * xs[i]) ** 2).sum() for i in ([0, 1] if step in (0, 1, 3) else [0])).backward()
                opt.step()
                if device == "cuda" and step == 1:
                    assert opt._flat, "two steps with every gradient: the CUDA group should be flat"
        results[device] = [p.detach().numpy() for p in params]
        steps = [float(opt.state[p]["step"].item()) for p in params]
        assert steps == [5, 3], device
    for a, b in zip(results["cuda"], results["cpu"]):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def _two_flat_groups(device: str = "cpu", groups: int = 2):
    """Parameters in two AdamW groups (or one), flat after one step, with fresh gradients in the buffers."""
    arrays, inputs = start(9)
    params = [frost.Tensor(a.copy()).to(device).requires_grad_() for a in arrays]
    split = [{"params": params[:1]}, {"params": params[1:], "weight_decay": 0.0}] if groups == 2 else params
    opt = AdamW(split, lr=0.05, weight_decay=0.1)
    for xs in inputs[:2]:
        opt.zero_grad()
        loss(params, [frost.tensor(x, device=device) for x in xs], frost, [0, 1]).backward()
        opt.step()
    return params, opt


@pytest.mark.parametrize("norm_type", [2.0, 3.0, float("inf"), -float("inf")])
def test_clip_grad_norm_over_whole_flat_buffers_matches_torch(simulated_flat, monkeypatch, norm_type):
    params, opt = _two_flat_groups()
    assert len(opt._flat) == 2
    grads = [p.grad for p in params]
    assert len(flat.groups_of(grads)) == 2
    want = [torch.tensor(g.numpy().astype(np.float64), requires_grad=False) for g in grads]
    holders = [torch.zeros_like(w, requires_grad=True) for w in want]
    for h, w in zip(holders, want):
        h.grad = w.clone()
    total_want = torch.nn.utils.clip_grad_norm_(holders, 0.5, norm_type)
    monkeypatch.setattr(dispatch, "device_of", lambda array: "cuda")   # the buffers' fast path on NumPy buffers
    monkeypatch.setattr(Kernel, "__getitem__", lambda self, cfg: self.simulate[cfg])   # and its kernels simulated
    assert dispatch.lookup("gradient_buffers", grads[0], grads=grads) is flat.gradient_buffers
    total = frost.nn.utils.clip_grad_norm_(params, 0.5, norm_type)   # -inf: the gaps' zeros would count, not asked
    np.testing.assert_allclose(float(total), float(total_want), rtol=1e-6)
    for g, h in zip(grads, holders):
        np.testing.assert_allclose(g.numpy(), h.grad.numpy(), rtol=1e-6, atol=1e-7)


def test_the_whole_buffers_hold_exactly_the_groups_gradients(simulated_flat):
    params, opt = _two_flat_groups()
    grads = [p.grad for p in params]
    assert len(flat.groups_of(grads[:1])) == 1                     # one whole group
    one_group, _ = _two_flat_groups(groups=1)
    assert flat.groups_of([p.grad for p in one_group][:1]) is None    # half a group: its other gradient left out
    assert flat.groups_of(grads + [frost.zeros(3)]) is None        # a gradient outside every buffer
    buffers = flat.gradient_buffers(grads)
    assert len(buffers) == 2 and all(any(b is group.grads for group in opt._flat.values()) for b in buffers)


@pytest.mark.cuda
def test_gpu_clip_grad_norm_of_flat_groups_matches_the_per_parameter_path():
    results = []
    for off in ((), ("gradient_buffers",)):
        params, _ = _two_flat_groups("cuda")
        grads = [p.grad for p in params]
        with dispatch.disabled(*off):
            assert (dispatch.lookup("gradient_buffers", grads[0], grads=grads) is None) == bool(off)
            total = frost.nn.utils.clip_grad_norm_(params, 0.5)
        results.append((float(total), [p.grad.numpy() for p in params]))
    np.testing.assert_allclose(results[0][0], results[1][0], rtol=1e-6)
    for a, b in zip(results[0][1], results[1][1]):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
