"""Adafactor against a fresh NumPy transcription of the paper's Algorithms 4 and 5 and against torch.optim.Adafactor;
its one-launch flat kernel (simulator here, GPU with -m cuda) against the array rule, flat state dicts."""
import numpy as np
import pytest
import torch

import frost
from frost.autograd import AnomalyError, detect_anomaly
from frost.optim import Adafactor, adafactor, adafactor_update, flat
from optim_oracle import (SHAPES, assert_gpu_flat_group_resumes_through_a_file, assert_resumes_exactly_through_a_file,
                          gradient, initial_arrays, run_frost,
                          run_on_fixed_gradients, torch_params)


def paper_factored(R, C, G, beta2, eps1):
    """Algorithm 4 on one n x m matrix: row and column *sums*, V = R C / (1^T R); returns the unclipped U, R, C."""
    G2 = G ** 2 + eps1
    R = beta2 * R + (1 - beta2) * G2 @ np.ones(G.shape[1])
    C = beta2 * C + (1 - beta2) * np.ones(G.shape[0]) @ G2
    V = np.outer(R, C) / R.sum()
    return G / np.sqrt(V), R, C


def paper_adafactor(arrays, steps, lr=1e-2, weight_decay=0.0, eps1=1e-30, eps2=1e-3, d=1.0, beta2_decay=-0.8):
    """Shazeer & Stern 2018, Algorithms 4 and 5: beta2_t = 1 - t^beta2_decay, rho_t = min(lr, 1/sqrt(t)) (lr = 1e-2),
    alpha_t = max(eps2, RMS(X_{t-1})) rho_t; tensors of ndim > 2 are a stack of matrices over the last two dims."""
    x = [a.copy() for a in arrays]
    rows = [np.zeros(a.shape[:-1]) if a.ndim >= 2 else None for a in arrays]
    cols = [np.zeros(a.shape[:-2] + a.shape[-1:]) if a.ndim >= 2 else None for a in arrays]
    vs = [np.zeros_like(a) if a.ndim < 2 else None for a in arrays]
    t = [0] * len(x)
    for step in steps:
        for i in range(len(x)):
            G = gradient(step, i, x[i])
            if G is None:
                continue
            t[i] += 1
            beta2 = 1 - t[i] ** beta2_decay
            alpha = max(eps2, np.sqrt(np.mean(x[i] ** 2))) * min(lr, 1 / np.sqrt(t[i]))
            X = x[i] * (1 - lr * weight_decay)
            if x[i].ndim >= 2:
                G = G.reshape(-1, *G.shape[-2:])  # a stack of matrices (one for a 2-D parameter)
                R, C = rows[i].reshape(-1, G.shape[1]), cols[i].reshape(-1, G.shape[2])
                U = np.empty_like(G)
                for k in range(len(G)):
                    U[k], R[k], C[k] = paper_factored(R[k], C[k], G[k], beta2, eps1)
                U = U / max(1.0, np.sqrt(np.mean(U ** 2)) / d)  # the RMS of the whole tensor's update
                x[i] = X - alpha * U.reshape(X.shape)
            else:  # Algorithm 5: an unfactored running average
                vs[i] = beta2 * vs[i] + (1 - beta2) * (G ** 2 + eps1)
                U = G / np.sqrt(vs[i])
                x[i] = X - alpha * U / max(1.0, np.sqrt(np.mean(U ** 2)) / d)
    return x


# lr=1e-3 caps the relative step from the first step on, lr=0.5 from none of them (1 / sqrt(t) < 0.5 from t = 5)
@pytest.mark.parametrize("options", [{}, dict(weight_decay=0.1), dict(lr=1e-3), dict(lr=0.5, beta2_decay=-0.5),
                                     dict(d=1.5, eps=(1e-20, 1e-2))],
                         ids=lambda o: "-".join(f"{k}={v}" for k, v in o.items()) or "defaults")
def test_adafactor_matches_the_paper_over_20_steps(options):
    arrays = initial_arrays()
    arrays[0] *= 1e-5  # RMS(X) < eps2 = 1e-3 all along: the parameter scale is eps2 for this matrix
    params = [frost.Tensor(a.copy(), requires_grad=True) for a in arrays]
    opt = Adafactor(params, **options)
    run_frost(opt, params, range(20))
    paper_options = {k: v for k, v in options.items() if k != "eps"}
    if "eps" in options:
        paper_options.update(eps1=options["eps"][0], eps2=options["eps"][1])
    want = paper_adafactor(arrays, range(20), **paper_options)
    for i, (p, x) in enumerate(zip(params, want)):
        np.testing.assert_allclose(p.detach().numpy(), x, rtol=1e-12, atol=1e-14, err_msg=f"param {i} {SHAPES[i]}")


def test_factored_state_is_sublinear_and_named_as_in_pytorch():
    params = [frost.Tensor(a.copy(), requires_grad=True) for a in initial_arrays()]
    opt = Adafactor(params)
    run_frost(opt, params, range(3))
    shapes = {i: {k: v.shape for k, v in s.items()} for i, s in opt.state_dict()["state"].items()}
    assert shapes[0] == {"step": (), "row_var": (4, 1), "col_var": (1, 3)}
    assert shapes[1] == {"step": (), "variance": (3,)}
    assert shapes[2] == {"step": (), "variance": ()}
    assert shapes[3] == {"step": (), "row_var": (2, 2, 1), "col_var": (2, 1, 3)}


@pytest.mark.parametrize("wd", [0.0, 0.2])
def test_adafactor_matches_torch_where_the_variants_agree(wd):
    """torch clamps V at eps1^2 instead of adding eps1 to G^2: the same numbers when G^2 >> eps1 = 1e-30."""
    arrays = initial_arrays(2)
    fp, tp = [frost.Tensor(a.copy(), requires_grad=True) for a in arrays], torch_params(arrays)
    fopt = Adafactor(fp, weight_decay=wd)
    topt = torch.optim.Adafactor(tp, lr=1e-2, eps=(1e-30, 1e-3), weight_decay=wd, foreach=False)
    for t in range(20):
        run_frost(fopt, fp, [t])
        for i, p in enumerate(tp):
            g = gradient(t, i, p.detach().numpy())
            p.grad = None if g is None else torch.from_numpy(g)
        topt.step()
    for i, (a, b) in enumerate(zip(fp, tp)):
        np.testing.assert_allclose(a.detach().numpy(), b.detach().numpy(), rtol=1e-12, atol=1e-14, err_msg=f"param {i}")
    tsd = topt.state_dict()["state"]
    for i, state in fopt.state_dict()["state"].items():
        assert set(state) == set(tsd[i])
        for k in state:
            np.testing.assert_allclose(state[k].numpy(), tsd[i][k].numpy(), rtol=1e-12, atol=1e-14)


def test_first_step_is_clipped_to_rms_one():
    # step 1: beta2_1 = 0 so V = G^2 (vector) and U = sign(G) has RMS 1; alpha = max(1e-3, RMS(x)) * 1e-2
    p, g = np.array([3.0, -4.0, 0.0]), np.array([2.0, 0.5, -1.0])
    adafactor_update(p, g, np.zeros(3), None, lr=1e-2, step=1, beta2_decay=-0.8, eps=(0.0, 1e-3), d=1.0,
                     weight_decay=0.0)
    np.testing.assert_allclose(p, [3.0, -4.0, 0.0] - np.sqrt(25 / 3) * 1e-2 * np.array([1, 1, -1]), rtol=1e-14)


def test_state_dict_round_trip_through_a_file(tmp_path):
    make = lambda ps: Adafactor(ps, lr=0.03, d=1.2, weight_decay=0.01)  # noqa: E731
    opt2 = assert_resumes_exactly_through_a_file(tmp_path, make, Adafactor)
    # row_var (4, 1) and col_var (1, 3) loaded into a (4, 3) parameter
    assert opt2.param_groups[0]["d"] == 1.2 and opt2.state[opt2.param_groups[0]["params"][0]]["row_var"].shape == (4, 1)


def test_loading_state_of_the_wrong_shape_is_refused():
    a, b = frost.zeros(4, 3, requires_grad=True), frost.zeros(5, 3, requires_grad=True)
    opt = Adafactor([a])
    a.grad = frost.ones(4, 3)
    opt.step()
    with pytest.raises(ValueError, match=r"parameter 0 \(param 0.0, index 0 in the state dict\): state 'row_var' has "
                                         r"shape \(4, 1\), expected \(5, 1\) \(the parameter has shape \(5, 3\)\)"):
        Adafactor([b]).load_state_dict(opt.state_dict())


def test_flat_kernel_compiles_for_sm90():
    assert len(adafactor.adafactor_flat_kernel.compile(arch="sm_90")) > 1000


# a conv weight (factored over its last two dims, many small matrices), a Linear weight, a vector, a scalar, a 3-D
# tensor of 3 matrices, a channels-last conv weight (NHWC memory: its 3 x 2 matrices are strided), and (in a second
# group) a weight whose row DEAD_ROW and column DEAD_COL never get a gradient
FLAT_SHAPES = [(8, 4, 3, 3), (10, 64), (70,), (), (3, 5, 7), (6, 4, 3, 2), (6, 5)]
CHANNELS_LAST, DEAD, DEAD_ROW, DEAD_COL = 5, 6, 2, 3
FLAT_OPTIONS = [{}, dict(weight_decay=0.1), dict(lr=3e-3, beta2_decay=-0.5),
                dict(lr=2e-2, weight_decay=0.05, d=1.5, eps=(1e-20, 1e-2))]
SECOND_GROUP = dict(lr=0.8)  # rho = min(0.8, 1 / sqrt(t)) = 1 / sqrt(t) from step 2


def simulate_flat(monkeypatch) -> None:
    """Every group goes flat, its launches running in the kernel simulator over NumPy buffers."""
    monkeypatch.setattr(flat, "eligible", lambda params: True)
    monkeypatch.setattr(Adafactor, "flat_kernel", adafactor.adafactor_flat_kernel.simulate)
    monkeypatch.setattr(flat, "advance_step", flat.advance_step.simulate)


def flat_arrays(rng):
    arrays = [rng.standard_normal(s).astype(np.float32) for s in FLAT_SHAPES]
    arrays[1] *= 1e-4  # RMS(X) < eps2: the parameter scale is eps2 for the Linear weight
    arrays[CHANNELS_LAST] = np.ascontiguousarray(arrays[CHANNELS_LAST].transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)
    return arrays


def flat_gradients(rng, steps):
    grads = [[rng.standard_normal(s).astype(np.float32) for s in FLAT_SHAPES] for _ in range(steps)]
    for g in grads:
        g[DEAD][DEAD_ROW], g[DEAD][:, DEAD_COL] = 0, 0
    return grads


def make_flat_optimizer(params, options):
    opt = Adafactor([{"params": params[:DEAD]}, {"params": params[DEAD:], **SECOND_GROUP}], **options)
    opt.flat_threads = 64  # two warps: block_sum across warps, and the simulator stays fast
    return opt


def run_steps(opt, params, grads) -> None:
    for step_grads in grads:
        for p, g in zip(params, step_grads):
            if p.grad is None:
                p.grad = frost.Tensor(g.copy())
            else:
                p.grad.data[...] = g  # a view of the flat gradient buffer after the first step
        opt.step()


def reference_run(arrays, grads, options):
    """adafactor_update tensor by tensor on float32 arrays: (params, states) after the steps."""
    params, states = [a.copy() for a in arrays], []
    for p in params:
        states.append({name: np.zeros(shape, np.float32) for name, shape in filter(None, Adafactor.state_layout(p))})
    for step, step_grads in enumerate(grads, 1):
        for i, (p, g, state) in enumerate(zip(params, step_grads, states)):
            o = {**dict(lr=1e-2, beta2_decay=-0.8, eps=(1e-30, 1e-3), d=1.0, weight_decay=0.0), **options,
                 **(SECOND_GROUP if i >= DEAD else {})}
            adafactor_update(p, g, state.get("row_var", state.get("variance")), state.get("col_var"),
                             step=float(step), **o)
    return params, states


def assert_matches_reference(opt, params, ref_params, ref_states, steps):
    for i, (p, x, state) in enumerate(zip(params, ref_params, ref_states)):
        np.testing.assert_allclose(p.detach().numpy(), x, rtol=1e-5, atol=1e-6, err_msg=f"param {i} {FLAT_SHAPES[i]}")
        assert sorted(opt.state[p]) == sorted([*state, "step"]), i
        assert float(opt.state[p]["step"].item()) == steps
        for name, want in state.items():
            got = opt.state[p][name].numpy()
            assert got.shape == want.shape, (i, name)
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-30, err_msg=f"{name} of param {i}")


@pytest.mark.parametrize("options", FLAT_OPTIONS, ids=["defaults", "weight_decay", "lr_cap_decay", "lr_wd_d_eps"])
def test_simulated_flat_kernel_equals_the_cpu_rule(monkeypatch, options):
    simulate_flat(monkeypatch)
    rng = np.random.default_rng(3)
    arrays = flat_arrays(rng)
    grads = flat_gradients(rng, 4)
    params = [frost.Tensor(a.copy(order="K"), requires_grad=True) for a in arrays]
    opt = make_flat_optimizer(params, options)
    run_steps(opt, params, grads)
    assert sorted(opt._flat) == [0, 1], "both groups should have gone flat"
    assert opt._flat[0].last_strides.tolist() == [1, 1, 1, 1, 1, 4], "the flat group should keep channels-last"
    assert_matches_reference(opt, params, *reference_run(arrays, grads, options), steps=4)
    dead = params[DEAD].detach().numpy()
    assert np.isfinite(dead).all()
    if "weight_decay" not in options:  # U is 0 on the dead row: it never moves
        np.testing.assert_array_equal(dead[DEAD_ROW], arrays[DEAD][DEAD_ROW])


def test_flat_factored_state_is_sublinear(monkeypatch):
    simulate_flat(monkeypatch)
    rng = np.random.default_rng(5)
    params = [frost.Tensor(rng.standard_normal(s).astype(np.float32), requires_grad=True) for s in FLAT_SHAPES]
    opt = make_flat_optimizer(params, {})
    run_steps(opt, params, flat_gradients(rng, 1))
    group = opt._flat[0]
    rows, cols = group.state_segments["row_var"].reshape(-1, 2), group.state_segments["col_var"].reshape(-1, 2)
    # R (8*4*3, 10, 3*5, 6*4*3) or, for the vector and the scalar, V in buffer row_var; C (8*4*3, 64, 3*7, 6*4*2)
    assert rows[:, 1].tolist() == [96, 10, 70, 1, 15, 72] and cols[:, 1].tolist() == [96, 64, 0, 0, 21, 48]
    assert rows.dtype == np.int32 and (rows[:, 0] % flat.FlatGroup.ALIGN == 0).all()
    assert group.state["row_var"].size == 128 + 64 + 128 + 64 + 64 + 128 < group.params.size
    assert group.state["col_var"].size == 128 + 64 + 64 + 64 < group.params.size
    for p, (offset, n) in zip(params, rows):
        name = "row_var" if p.ndim >= 2 else "variance"
        np.testing.assert_array_equal(group.state["row_var"][offset:offset + n], opt.state[p][name].numpy().ravel())
        assert np.shares_memory(opt.state[p][name].data, group.state["row_var"])


def test_flat_state_dict_round_trip_to_flat_and_per_tensor(monkeypatch):
    """3 flat steps, state_dict, load into a fresh optimizer over copies of the parameters, 2 more steps (flat again,
    or per tensor): the same as 5 straight flat steps, with the per-tensor path's names and shapes."""
    simulate_flat(monkeypatch)
    rng = np.random.default_rng(6)
    arrays = flat_arrays(rng)
    grads = flat_gradients(rng, 5)
    options = dict(weight_decay=0.05, d=1.2)
    straight = [frost.Tensor(a.copy(order="K"), requires_grad=True) for a in arrays]
    run_steps(make_flat_optimizer(straight, options), straight, grads)
    first = [frost.Tensor(a.copy(order="K"), requires_grad=True) for a in arrays]
    opt = make_flat_optimizer(first, options)
    run_steps(opt, first, grads[:3])
    saved = opt.state_dict()
    for i, p in enumerate(first):
        shapes = {k: tuple(v.shape) for k, v in saved["state"][i].items()}
        assert shapes == {"step": (), **dict(filter(None, Adafactor.state_layout(p)))}, i
    for flat_again in (True, False):
        resumed = [frost.Tensor(p.data.copy(order="K"), requires_grad=True) for p in first]
        opt2 = make_flat_optimizer(resumed, {})
        opt2.load_state_dict(saved)
        if not flat_again:
            opt2.flat_kernel = None  # this optimizer stays on the per-tensor path
        run_steps(opt2, resumed, grads[3:])
        assert bool(opt2._flat) == flat_again
        for i, (a, b) in enumerate(zip(resumed, straight)):
            np.testing.assert_allclose(a.detach().numpy(), b.detach().numpy(), rtol=1e-5, atol=1e-6,
                                       err_msg=f"param {i}")
        assert float(opt2.state[resumed[0]]["step"].item()) == 5


def test_flat_group_without_a_layout_keeps_parameter_sized_state_at_the_parameters_offsets():
    """AdamW's elementwise kernel indexes parameters and state alike: the default layout must keep that."""
    params = [frost.Tensor(np.full(s, 1.0, np.float32), requires_grad=True) for s in [(2, 3), (70,), ()]]
    for p in params:
        p.grad = frost.Tensor(np.zeros(p.shape, np.float32))
    old = {params[1]: {"step": frost.Tensor(np.array(4.0, np.float32)), "exp_avg": frost.full((70,), 2.0)}}
    group = flat.FlatGroup(params, old, ("exp_avg", "exp_avg_sq"), 2, step=4.0)
    for name in ("exp_avg", "exp_avg_sq"):
        assert group.state[name].size == group.numel == 64 + 128 + 64
        np.testing.assert_array_equal(group.state_segments[name], group.segments)
    assert group.hyper[0] == 4 and float(old[params[1]]["step"].item()) == 4
    assert group.state["exp_avg"][64:64 + 70].tolist() == [2.0] * 70 and group.state["exp_avg"].sum() == 140
    assert all(old[p]["exp_avg"].shape == p.shape and np.shares_memory(old[p]["exp_avg"].data, group.state["exp_avg"])
               for p in params)


@pytest.mark.cuda
@pytest.mark.parametrize("options", [dict(weight_decay=0.1), dict(lr=3e-3, beta2_decay=-0.5)])
def test_gpu_update_equals_cpu_rule(options):
    make = lambda ps: Adafactor(ps, **options)  # noqa: E731
    shapes = [(16, 8), (16,), (3, 16), (2, 3, 4), (64, 64, 3, 3), (10, 64), ()]
    opt, gpu = run_on_fixed_gradients("cuda", make, shapes=shapes, step_lr=True)
    _, cpu = run_on_fixed_gradients("cpu", make, shapes=shapes, step_lr=True)
    assert opt._flat, "the CUDA parameters should have been packed into a flat group"
    for a, b in zip(gpu, cpu):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    state = opt.state_dict()["state"]
    assert float(state[0]["step"].item()) == 20
    assert state[4]["row_var"].shape == (64, 64, 3, 1) and state[6]["variance"].shape == ()


@pytest.mark.parametrize("kwargs,match", [(dict(lr=-1.0), r"Adafactor: lr \(-1.0\)"),
                                          (dict(eps=(1e-30, -1.0)), r"Adafactor: .*eps \(\(1e-30, -1.0\)\)"),
                                          (dict(weight_decay=-0.5), r"Adafactor: .*weight_decay \(-0.5\)"),
                                          (dict(beta2_decay=0.5), r"Adafactor: beta2_decay \(0.5\) must be <= 0"),
                                          (dict(d=0.5), r"Adafactor: d \(0.5\) must be >= 1")])
def test_invalid_hyperparameters_are_named(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Adafactor([frost.zeros(3, requires_grad=True)], **kwargs)


def test_anomaly_mode_names_the_parameter_with_a_nan_gradient():
    w, b = frost.ones(2, 3, requires_grad=True), frost.zeros(3, requires_grad=True)
    opt = Adafactor([("fc.weight", w), ("fc.bias", b)])
    w.grad, b.grad = frost.Tensor(np.array([[0, 1, 2], [3, np.nan, 5]], np.float32)), frost.ones(3)
    with detect_anomaly(), pytest.raises(AnomalyError, match="'fc.weight'"):
        opt.step()
    np.testing.assert_array_equal(b.detach().numpy(), np.zeros(3))


def test_float32_and_bfloat16_params_keep_their_dtype():
    for dtype in ("float32", "bfloat16"):
        p = frost.ones(4, 3, dtype=dtype, requires_grad=True)
        opt = Adafactor([p], lr=0.1)
        for _ in range(3):
            p.grad = frost.full((4, 3), 0.5, dtype=dtype)
            opt.step()
        assert p.dtype == dtype and opt.state[p]["row_var"].dtype == dtype
        # U = sign(G) (RMS 1) and alpha = RMS(p) * min(0.1, 1/sqrt(t)) = 0.1 * p: p *= 0.9 each step
        np.testing.assert_allclose(p.detach().numpy().astype(np.float32), 0.9 ** 3, rtol=1e-2)


def test_dead_units_in_float32_give_no_nan():
    """A row and a column of zero gradients (a dead unit): eps1 * eps1 underflows float32, the update must not."""
    import numpy as np
    import frost
    p = frost.tensor(np.ones((4, 3), np.float32), requires_grad=True)
    opt = frost.optim.Adafactor([p])
    for _ in range(3):
        g = np.zeros((4, 3), np.float32)
        g[:2, :2] = 0.1
        p.grad = frost.tensor(g)
        opt.step()
    assert np.isfinite(p.detach().numpy()).all()


@pytest.mark.cuda
def test_flat_group_state_dict_round_trip(tmp_path):
    """10 flat steps, frost.save / frost.load of parameters and state, 10 more in a fresh flat group: as 20 straight."""
    state = assert_gpu_flat_group_resumes_through_a_file(tmp_path, lambda ps: Adafactor(ps, weight_decay=0.1),
                                                         Adafactor, [(8, 4, 3, 3), (10, 64), (16,), (3, 5, 7)])["state"]
    assert state[0]["row_var"].shape == (8, 4, 3, 1) and state[2]["variance"].shape == (16,)
