"""Muon against a NumPy transcription of the reference (Newton-Schulz on matrices, AdamW for the rest), 20 steps."""
import numpy as np
import pytest

import frost
from frost.optim import Muon, muon_update
from frost.optim.muon import zeropower_via_newtonschulz5

# a wide matrix, a tall one, a conv weight (viewed as 4 x 18, then as 9 x 2 rows > cols), a vector and a scalar
SHAPES = [(5, 8), (9, 3), (4, 2, 3, 3), (9, 2, 1, 1), (6,), ()]


# ---------------------------------------------------------------- the oracle, written from the reference's equations

def newton_schulz5(G, steps):
    a, b, c = 3.4445, -4.7750, 2.0315
    X = G / (np.linalg.norm(G) + 1e-7)
    if G.shape[0] > G.shape[1]:
        return newton_schulz5(G.T, steps).T
    for _ in range(steps):
        A = X @ X.T
        X = a * X + (b * A + c * A @ A) @ X
    return X


class Oracle:
    def __init__(self, arrays, lr, momentum, nesterov, ns_steps, wd, adam_lr, betas, eps, adam_wd):
        self.p = [a.copy() for a in arrays]
        self.buf = [np.zeros_like(a) for a in arrays]
        self.m, self.v = [np.zeros_like(a) for a in arrays], [np.zeros_like(a) for a in arrays]
        self.t = [0] * len(arrays)
        self.o = dict(lr=lr, momentum=momentum, nesterov=nesterov, ns_steps=ns_steps, wd=wd, adam_lr=adam_lr,
                      betas=betas, eps=eps, adam_wd=adam_wd)

    def step(self, grads):
        o = self.o
        for i, g in enumerate(grads):
            if g is None:
                continue
            p = self.p[i]
            if p.ndim >= 2:
                beta = o["momentum"]
                self.buf[i] = beta * self.buf[i] + (1 - beta) * g
                u = (1 - beta) * g + beta * self.buf[i] if o["nesterov"] else self.buf[i]
                G = u.reshape(u.shape[0], -1)
                O = newton_schulz5(G, o["ns_steps"]).reshape(p.shape)
                self.p[i] = p * (1 - o["lr"] * o["wd"]) - o["lr"] * np.sqrt(max(1, G.shape[0] / G.shape[1])) * O
            else:
                b1, b2 = o["betas"]
                self.t[i] += 1
                self.m[i] = b1 * self.m[i] + (1 - b1) * g
                self.v[i] = b2 * self.v[i] + (1 - b2) * g * g
                m_hat, v_hat = self.m[i] / (1 - b1 ** self.t[i]), self.v[i] / (1 - b2 ** self.t[i])
                self.p[i] = p * (1 - o["adam_lr"] * o["adam_wd"]) - o["adam_lr"] * m_hat / (np.sqrt(v_hat) + o["eps"])


def gradient(step, i, p):
    """Depends on the parameter (so errors compound); parameter 1 gets no gradient every third step."""
    if i == 1 and step % 3 == 0:
        return None
    return 0.3 * p + np.cos(np.arange(p.size).reshape(p.shape) * (1.3 + i) + 0.5 * step)


def initial(dtype=np.float64, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(s).astype(dtype) for s in SHAPES]


def set_grads(step, params):
    for i, p in enumerate(params):
        g = gradient(step, i, p.detach().numpy())
        p.grad = None if g is None else frost.tensor(g.astype(p.dtype.np), device=p.device)


OPTIONS = [dict(lr=0.02, momentum=0.95, nesterov=True, ns_steps=5, weight_decay=0.0, adam_lr=3e-4,
                adam_betas=(0.9, 0.95), adam_eps=1e-10, adam_weight_decay=0.0),
           dict(lr=0.05, momentum=0.9, nesterov=False, ns_steps=3, weight_decay=0.1, adam_lr=0.01,
                adam_betas=(0.8, 0.99), adam_eps=1e-8, adam_weight_decay=0.05)]


@pytest.mark.parametrize("options", OPTIONS, ids=["reference-defaults", "no-nesterov-decay"])
def test_muon_matches_the_reference_equations_over_20_steps(options):
    arrays = initial()
    params = [frost.Tensor(a.copy(), requires_grad=True) for a in arrays]
    opt = Muon(params, **options)
    oracle = Oracle(arrays, options["lr"], options["momentum"], options["nesterov"], options["ns_steps"],
                    options["weight_decay"], options["adam_lr"], options["adam_betas"], options["adam_eps"],
                    options["adam_weight_decay"])
    for step in range(20):
        set_grads(step, params)
        opt.step()
        oracle.step([None if p.grad is None else p.grad.numpy() for p in params])
    for i, (p, want) in enumerate(zip(params, oracle.p)):
        assert not np.allclose(p.detach().numpy(), arrays[i], atol=1e-4), f"parameter {i} barely moved"
        np.testing.assert_allclose(p.detach().numpy(), want, rtol=1e-10, atol=1e-12,
                                   err_msg=f"parameter {i} {SHAPES[i]}")
    np.testing.assert_allclose(opt.state[params[0]]["momentum_buffer"].numpy(), oracle.buf[0], rtol=1e-12)
    np.testing.assert_allclose(opt.state[params[4]]["exp_avg_sq"].numpy(), oracle.v[4], rtol=1e-12)


def test_newton_schulz_orthogonalizes():
    """The quintic iteration keeps G's singular vectors and maps its singular values into about [0.7, 1.2]."""
    G = np.random.default_rng(1).standard_normal((12, 7))
    O = zeropower_via_newtonschulz5(G, 5)
    U, s, Vt = np.linalg.svd(G, full_matrices=False)
    rotated = U.T @ O @ Vt.T  # diagonal when O = U S' V^T
    np.testing.assert_allclose(rotated - np.diag(np.diag(rotated)), 0, atol=1e-10)
    assert np.all((np.diag(rotated) > 0.6) & (np.diag(rotated) < 1.25)), np.diag(rotated)
    assert O.shape == G.shape and O.dtype == np.float64
    assert zeropower_via_newtonschulz5(G.astype(np.float32)).dtype == np.float32


def test_muon_update_alone_by_hand():
    """First step, momentum 0.5 with Nesterov: u = 0.75 g; a diagonal g orthogonalizes to a scaled identity."""
    p, g, buf = np.zeros((3, 3)), np.diag([2.0, 2.0, 2.0]), np.zeros((3, 3))
    muon_update(p, g, buf, lr=0.1, momentum=0.5, nesterov=True, ns_steps=5, weight_decay=0.0)
    np.testing.assert_allclose(buf, 0.5 * g)
    x = 1 / np.sqrt(3)  # the normalized diagonal entry, pushed through five quintic steps
    for _ in range(5):
        x = 3.4445 * x - 4.7750 * x ** 3 + 2.0315 * x ** 5
    np.testing.assert_allclose(p, -0.1 * x * np.eye(3), rtol=1e-6)


def test_groups_split_matrices_from_the_rest_and_use_muon_false():
    w, b, head = frost.zeros(4, 3, requires_grad=True), frost.zeros(4, requires_grad=True), frost.zeros(
        2, 4, requires_grad=True)
    opt = Muon([{"params": [w, b], "weight_decay": 0.1}, {"params": [head], "use_muon": False, "lr": 0.5,
                                                           "betas": (0.8, 0.9)}], lr=0.03, adam_lr=1e-3)
    kinds = [(g["use_muon"], g["lr"], g["weight_decay"], g["betas"], [tuple(p.shape) for p in g["params"]])
             for g in opt.param_groups]
    assert kinds == [(True, 0.03, 0.1, (0.9, 0.95), [(4, 3)]), (False, 1e-3, 0.0, (0.9, 0.95), [(4,)]),
                     (False, 0.5, 0.0, (0.8, 0.9), [(2, 4)])]
    for p in (w, b, head):
        p.grad = frost.ones(*p.shape)
    opt.step()
    assert set(opt.state[w]) == {"momentum_buffer"}
    assert set(opt.state[b]) == set(opt.state[head]) == {"step", "exp_avg", "exp_avg_sq"}
    np.testing.assert_allclose(head.detach().numpy(), -0.5, rtol=1e-6)  # AdamW's first step is lr * sign(g)


def test_named_parameters_and_add_param_group():
    model = frost.nn.Sequential(frost.nn.Linear(3, 4), frost.nn.ReLU(), frost.nn.Linear(4, 2))
    opt = Muon(model.named_parameters())
    assert [len(g["params"]) for g in opt.param_groups] == [2, 2]
    opt.add_param_group({"params": [frost.zeros(5, 5, requires_grad=True), frost.zeros(5, requires_grad=True)]})
    assert [g["use_muon"] for g in opt.param_groups] == [True, False, True, False]


def test_state_dict_round_trip_through_a_file(tmp_path):
    arrays = initial()
    run, resumed = ([frost.Tensor(a.copy(), requires_grad=True) for a in arrays] for _ in range(2))
    opt, opt2 = Muon(run, weight_decay=0.1, adam_lr=0.01), Muon(resumed, weight_decay=0.1, adam_lr=0.01)
    for step in range(10):
        set_grads(step, run)
        opt.step()
    frost.save({"params": run, "optimizer": opt.state_dict()}, tmp_path / "muon.safetensors")
    ckpt = frost.load(tmp_path / "muon.safetensors")
    for p, saved in zip(resumed, ckpt["params"]):
        p.data[...] = saved.detach().numpy()
    opt2.load_state_dict(ckpt["optimizer"])
    assert float(opt2.state[resumed[4]]["step"].item()) == 10
    for step in range(10, 20):
        set_grads(step, run)
        opt.step()
        set_grads(step, resumed)
        opt2.step()
    for a, b in zip(run, resumed):
        np.testing.assert_array_equal(a.detach().numpy(), b.detach().numpy())


@pytest.mark.parametrize("options, match", [
    (dict(lr=-1.0), r"Muon: lr \(-1.0\) must be >= 0"),
    (dict(momentum=1.0), r"momentum \(1.0\) must be in \[0, 1\)"),
    (dict(ns_steps=0), r"ns_steps \(0\) must be >= 1"),
    (dict(adam_eps=-1e-8), r"adam_eps \(-1e-08\)"),
    (dict(adam_betas=(0.9, 1.0)), r"Muon: adam_betas must be two numbers in \[0, 1\), got \(0.9, 1.0\)"),
])
def test_invalid_hyperparameters(options, match):
    with pytest.raises(ValueError, match=match):
        Muon([frost.zeros(2, 2, requires_grad=True)], **options)


@pytest.mark.cuda
def test_gpu_equals_cpu_on_fixed_gradients(exact_gpu_math):
    """Newton-Schulz on the GPU (cuDNN matmuls, TF32 off) and the AdamW groups' flat kernel equal the CPU path
    (float32) over 20 steps."""
    def run(device):
        params = [frost.tensor(a, device=device, requires_grad=True) for a in initial(np.float32)]
        opt = Muon(params, weight_decay=0.01, adam_lr=0.01, adam_weight_decay=0.01)
        rng = np.random.default_rng(1)
        for _ in range(20):
            for p in params:  # copy into the gradients: on the GPU they are views into the flat buffer
                g = frost.tensor(rng.standard_normal(p.shape).astype(np.float32), device=device)
                p.grad = g if p.grad is None else p.grad.copy_(g)
            opt.step()
        return opt, [p.detach().cpu().numpy() for p in params]

    _, cpu = run("cpu")
    opt, gpu = run("cuda")
    assert opt._flat, "the AdamW group should have been packed into a flat group"
    # Newton-Schulz multiplies a singular value near 0 by a = 3.4445 per iteration (3.4^5 ~ 480 over 5): float32
    # rounding that differs with the summation order (cuDNN vs NumPy's BLAS) grows to ~5e-5 per step, ~3e-4 after
    # 20 steps (measured on the H200); the reference runs this iteration in bfloat16.
    for a, b in zip(gpu, cpu):
        np.testing.assert_allclose(a, b, rtol=2e-3, atol=1e-3)
