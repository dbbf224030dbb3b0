"""Adafactor against a fresh NumPy transcription of the paper's Algorithms 4 and 5 and against torch.optim.Adafactor."""
import numpy as np
import pytest
import torch

import frost
from frost.autograd import AnomalyError, detect_anomaly
from frost.optim import Adafactor, adafactor_update
from optim_oracle import (SHAPES, assert_resumes_exactly_through_a_file, gradient, initial_arrays, run_frost,
                          run_on_fixed_gradients, torch_params)


def paper_factored(R, C, G, beta2, eps1):
    """Algorithm 4 on one n x m matrix: row and column *sums*, V = R C / (1^T R); returns the unclipped U, R, C."""
    G2 = G ** 2 + eps1
    R = beta2 * R + (1 - beta2) * G2 @ np.ones(G.shape[1])
    C = beta2 * C + (1 - beta2) * np.ones(G.shape[0]) @ G2
    V = np.outer(R, C) / R.sum()
    return G / np.sqrt(V), R, C


def paper_adafactor(arrays, steps, lr=1e-2, relative_step=True, scale_parameter=True, weight_decay=0.0,
                    eps1=1e-30, eps2=1e-3, d=1.0, decay=-0.8):
    """Shazeer & Stern 2018, Algorithms 4 and 5: beta2_t = 1 - t^decay, rho_t = min(1e-2, 1/sqrt(t)) (or lr, fixed),
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
            beta2 = 1 - t[i] ** decay
            rho = min(lr, 1 / np.sqrt(t[i])) if relative_step else lr
            alpha = max(eps2, np.sqrt(np.mean(x[i] ** 2))) * rho if scale_parameter else rho
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


@pytest.mark.parametrize("options", [{}, dict(weight_decay=0.1), dict(relative_step=False, lr=1e-3),
                                     dict(relative_step=False, scale_parameter=False, lr=3e-3),
                                     dict(lr=0.5, scale_parameter=False), dict(d=1.5, eps=(1e-20, 1e-2))],
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
        np.testing.assert_allclose(p.numpy(), x, rtol=1e-12, atol=1e-14, err_msg=f"param {i} {SHAPES[i]}")


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
        np.testing.assert_allclose(a.numpy(), b.detach().numpy(), rtol=1e-12, atol=1e-14, err_msg=f"param {i}")
    tsd = topt.state_dict()["state"]
    for i, state in fopt.state_dict()["state"].items():
        assert set(state) == set(tsd[i])
        for k in state:
            np.testing.assert_allclose(state[k].numpy(), tsd[i][k].numpy(), rtol=1e-12, atol=1e-14)


def test_first_step_is_clipped_to_rms_one():
    # step 1: beta2_1 = 0 so V = G^2 (vector) and U = sign(G) has RMS 1; alpha = max(1e-3, RMS(x)) * 1e-2
    p, g = np.array([3.0, -4.0, 0.0]), np.array([2.0, 0.5, -1.0])
    adafactor_update(p, g, None, None, np.zeros(3), lr=1e-2, step=1, beta2_decay=-0.8, eps1=0.0, eps2=1e-3, d=1.0,
                     weight_decay=0.0, relative_step=True, scale_parameter=True)
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
    with pytest.raises(ValueError, match=r"state 'row_var' of parameter 0 has shape \(4, 1\) .* shape \(5, 3\)"):
        Adafactor([b]).load_state_dict(opt.state_dict())


@pytest.mark.cuda
def test_gpu_update_equals_cpu_rule():
    make = lambda ps: Adafactor(ps, weight_decay=0.1)  # noqa: E731
    shapes = [(16, 8), (16,), (3, 16), (2, 3, 4)]
    _, gpu = run_on_fixed_gradients("cuda", make, shapes=shapes)
    _, cpu = run_on_fixed_gradients("cpu", make, shapes=shapes)
    for a, b in zip(gpu, cpu):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


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
    np.testing.assert_array_equal(b.numpy(), np.zeros(3))


def test_float32_and_bfloat16_params_keep_their_dtype():
    for dtype in ("float32", "bfloat16"):
        p = frost.ones(4, 3, dtype=dtype, requires_grad=True)
        opt = Adafactor([p], lr=0.1)
        for _ in range(3):
            p.grad = frost.full((4, 3), 0.5, dtype=dtype)
            opt.step()
        assert p.dtype == dtype and opt.state[p]["row_var"].dtype == dtype
        # U = sign(G) (RMS 1) and alpha = RMS(p) * min(0.1, 1/sqrt(t)) = 0.1 * p: p *= 0.9 each step
        np.testing.assert_allclose(p.numpy().astype(np.float32), 0.9 ** 3, rtol=1e-2)


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
    assert np.isfinite(p.numpy()).all()
