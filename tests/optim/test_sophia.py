"""SophiaG against a NumPy transcription of the paper (20 steps), its sampled-label Hessian API, kernels, state."""
import numpy as np
import pytest
import torch

import frost
import frost.nn.functional as F
from frost.optim import SophiaG, sophiag_update
from frost.optim.flat import advance_step
from frost.optim.sophia import sample_labels, sophiag_flat_kernel, sophiag_hessian_update

SHAPES = [(4, 3), (5,), (), (2, 2, 3)]


# ---------------------------------------------------------------- the oracle, written from the paper (Algorithm 3)

class Oracle:
    """m = b1 m + (1-b1) g;  every k steps h = b2 h + (1-b2) ghat^2 (the estimate B ghat^2 enters as bs * h);
    theta = theta - lr wd theta;  theta = theta - lr clip(m / max(rho bs h, eps), 1)."""

    def __init__(self, arrays, lr, betas, rho, wd, eps, bs):
        self.p = [a.copy() for a in arrays]
        self.m, self.h = [np.zeros_like(a) for a in arrays], [np.zeros_like(a) for a in arrays]
        self.lr, self.betas, self.rho, self.wd, self.eps, self.bs = lr, betas, rho, wd, eps, bs
        self.clipped = self.unclipped = 0

    def step(self, grads):
        for i, g in enumerate(grads):
            if g is None:
                continue
            self.p[i] = self.p[i] - self.lr * self.wd * self.p[i]
            self.m[i] = self.betas[0] * self.m[i] + (1 - self.betas[0]) * g
            ratio = self.m[i] / np.maximum(self.rho * self.bs * self.h[i], self.eps)
            self.clipped += int(np.sum(np.abs(ratio) > 1))
            self.unclipped += int(np.sum(np.abs(ratio) < 1))
            self.p[i] = self.p[i] - self.lr * np.clip(ratio, -1, 1)

    def hessian(self, grads):
        for i, g in enumerate(grads):
            if g is not None:
                self.h[i] = self.betas[1] * self.h[i] + (1 - self.betas[1]) * g * g


def gradient(step, i, p, scale=1.0):
    if i == 2 and step % 4 == 0:
        return None
    return scale * (0.4 * p + np.sin(np.arange(p.size).reshape(p.shape) * (0.9 + i) + 0.6 * step))


def initial(dtype=np.float64, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(s).astype(dtype) for s in SHAPES]


def set_grads(step, params, scale=1.0):
    for i, p in enumerate(params):
        g = gradient(step, i, p.detach().numpy(), scale)
        p.grad = None if g is None else frost.tensor(g.astype(p.dtype.np), device=p.device)


OPTIONS = dict(lr=0.03, betas=(0.9, 0.95), rho=0.05, weight_decay=0.1, eps=1e-15, bs=64)


@pytest.mark.parametrize("scale", [1.0, 30.0], ids=["unit-gradients", "large-gradients"])
def test_sophia_matches_the_paper_over_20_steps_with_a_hessian_every_3(scale):
    arrays = initial()
    params = [frost.Tensor(a.copy(), requires_grad=True) for a in arrays]
    opt = SophiaG(params, k=3, **OPTIONS)
    oracle = Oracle(arrays, OPTIONS["lr"], OPTIONS["betas"], OPTIONS["rho"], OPTIONS["weight_decay"],
                    OPTIONS["eps"], OPTIONS["bs"])
    for step in range(20):
        set_grads(step, params, scale)
        opt.step()
        oracle.step([None if p.grad is None else p.grad.numpy() for p in params])
        if step % 3 == 2:  # a stand-in for the gradient of the loss on sampled labels
            set_grads(step, params, scale=0.7 * scale)
            opt.update_hessian()
            oracle.hessian([None if p.grad is None else p.grad.numpy() for p in params])
    assert oracle.clipped > 10 and oracle.unclipped > 10, (oracle.clipped, oracle.unclipped)
    for i, (p, want) in enumerate(zip(params, oracle.p)):
        np.testing.assert_allclose(p.detach().numpy(), want, rtol=1e-10, atol=1e-12,
                                   err_msg=f"parameter {i} {SHAPES[i]}")
        np.testing.assert_allclose(opt.state[p]["hessian"].numpy(), oracle.h[i], rtol=1e-12)
        np.testing.assert_allclose(opt.state[p]["exp_avg"].numpy(), oracle.m[i], rtol=1e-12)
    assert float(opt.state[params[0]]["step"].item()) == 20 and float(opt.state[params[2]]["step"].item()) == 15


def test_update_by_hand():
    """m = 0.1 g; with h = 0 every coordinate is clipped (a signed lr step); with a big h the step is m / (rho bs h)."""
    p, g, m = np.array([1.0, -1.0, 2.0]), np.array([0.5, -2.0, 0.0]), np.zeros(3)
    sophiag_update(p, g, m, np.zeros(3), step=1, lr=0.1, betas=(0.9, 0.99), rho=0.5, bs=2, eps=1e-15, weight_decay=0.0)
    np.testing.assert_allclose(m, 0.1 * g)
    np.testing.assert_allclose(p, [0.9, -0.9, 2.0])
    p, m, h = np.array([1.0]), np.zeros(1), np.array([10.0])
    sophiag_update(p, np.array([4.0]), m, h, step=2, lr=0.1, betas=(0.5, 0.99), rho=0.5, bs=2, eps=1e-15,
                   weight_decay=0.5)
    np.testing.assert_allclose(p, 1.0 * (1 - 0.05) - 0.1 * 2.0 / 10.0, rtol=1e-14)
    sophiag_hessian_update(h, np.array([3.0]), beta2=0.9)
    np.testing.assert_allclose(h, 0.9 * 10 + 0.1 * 9, rtol=1e-14)


def test_gauss_newton_bartlett_estimate_from_sampled_labels_matches_torch():
    """The documented loop on a softmax classifier: h gets (1 - beta2) * grad^2 of the mean CE on sampled labels."""
    rng = np.random.default_rng(2)
    x, w0 = rng.standard_normal((64, 5)), rng.standard_normal((5, 3))
    w = frost.Tensor(w0.copy(), requires_grad=True)
    opt = SophiaG([w], betas=(0.965, 0.99))
    frost.manual_seed(7)
    logits = frost.Tensor(x) @ w
    labels = sample_labels(logits)
    loss = F.cross_entropy(logits, labels)
    opt.zero_grad()
    loss.backward()
    opt.update_hessian()
    opt.zero_grad()
    assert w.grad is None and labels.dtype == "int64" and labels.shape == (64,)
    tw = torch.tensor(w0, requires_grad=True)
    torch.nn.functional.cross_entropy(torch.tensor(x) @ tw, torch.from_numpy(labels.numpy())).backward()
    np.testing.assert_allclose(opt.state[w]["hessian"].numpy(), 0.01 * tw.grad.numpy() ** 2, rtol=1e-10)
    assert float(opt.state[w]["step"].item()) == 0  # a Hessian refresh is not a step


def test_the_documented_loop_trains_a_classifier():
    """The module docstring's loop, on a softmax regression: the loss falls and h fills in every k steps."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((128, 6)).astype(np.float32)
    y = (x @ rng.standard_normal((6, 4))).argmax(axis=1)
    model = frost.nn.Linear(6, 4)
    opt = SophiaG(model.parameters(), lr=0.05, bs=128, k=5)
    k = opt.defaults["k"]
    frost.manual_seed(1)
    losses, hessian_sums = [], []
    for step in range(30):
        loss = F.cross_entropy(model(frost.tensor(x)), frost.tensor(y))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
        if step % k == k - 1:
            logits = model(frost.tensor(x))
            loss = F.cross_entropy(logits, sample_labels(logits))
            opt.zero_grad()
            loss.backward()
            opt.update_hessian()
            opt.zero_grad()
            hessian_sums.append(float(opt.state[model.weight]["hessian"].numpy().sum()))
    assert losses[-1] < 0.6 * losses[0], losses
    assert len(hessian_sums) == 6 and all(h > 0 for h in hessian_sums)
    assert float(opt.state[model.weight]["step"].item()) == 30


def test_sample_labels_follows_the_softmax():
    probs = np.array([0.1, 0.0, 0.6, 0.3])
    logits = frost.tensor(np.log(np.where(probs > 0, probs, 1e-300)), dtype="float32").reshape(1, 4).expand(40000, 4)
    frost.manual_seed(0)
    first = sample_labels(logits).numpy()
    frequencies = np.bincount(first, minlength=4) / first.size
    np.testing.assert_allclose(frequencies, probs, atol=0.01)  # 4 standard errors at most
    assert frequencies[1] == 0
    frost.manual_seed(0)
    np.testing.assert_array_equal(sample_labels(logits).numpy(), first)  # drawn from Frost's generator
    sequence = sample_labels(frost.randn(2, 7, 11))  # (batch, time, vocab) -> (batch, time)
    assert sequence.shape == (2, 7) and sequence.numpy().min() >= 0 and sequence.numpy().max() < 11


def test_state_dict_round_trip_through_a_file(tmp_path):
    arrays = initial()
    run, resumed = ([frost.Tensor(a.copy(), requires_grad=True) for a in arrays] for _ in range(2))
    opt, opt2 = SophiaG(run, k=3, **OPTIONS), SophiaG(resumed, k=3, **OPTIONS)

    def train(opt, params, steps):
        for step in steps:
            set_grads(step, params)
            opt.step()
            if step % 3 == 2:
                set_grads(step, params, scale=0.7)
                opt.update_hessian()

    train(opt, run, range(10))
    frost.save({"params": run, "optimizer": opt.state_dict()}, tmp_path / "sophia.safetensors")
    ckpt = frost.load(tmp_path / "sophia.safetensors")
    for p, saved in zip(resumed, ckpt["params"]):
        p.data[...] = saved.detach().numpy()
    opt2.load_state_dict(ckpt["optimizer"])
    assert set(opt2.state[resumed[0]]) == {"step", "exp_avg", "hessian"} and opt2.param_groups[0]["k"] == 3
    train(opt, run, range(10, 20))
    train(opt2, resumed, range(10, 20))
    for a, b in zip(run, resumed):
        np.testing.assert_array_equal(a.detach().numpy(), b.detach().numpy())


def test_kernel_compiles_for_sm90():
    assert len(sophiag_flat_kernel.compile(arch="sm_90")) > 1000


def test_simulated_kernel_equals_the_cpu_rule_over_steps():
    rng = np.random.default_rng(0)
    n = 300  # two blocks, the second partly idle
    p = rng.standard_normal(n).astype(np.float32)
    m, h = np.zeros(n, np.float32), np.zeros(n, np.float32)
    p_ref, m_ref, h_ref = p.copy(), m.copy(), h.copy()
    lr, beta1, beta2, rho, bs, eps, wd = 0.01, 0.9, 0.95, 0.05, 16.0, 1e-15, 0.1
    hyper = np.array([0, lr, beta1, beta2, rho, bs, eps, wd], np.float32)
    for step in range(1, 7):
        g = rng.standard_normal(n).astype(np.float32)
        advance_step.simulate[1, 32](hyper)
        sophiag_flat_kernel.simulate[2, 256](p, g, m, h, n, hyper, 0)
        sophiag_update(p_ref, g, m_ref, h_ref, step=step, lr=lr, betas=(beta1, beta2), rho=rho, bs=bs, eps=eps,
                       weight_decay=wd)
        if step % 2 == 0:
            g_hat = (0.3 * rng.standard_normal(n)).astype(np.float32)
            sophiag_flat_kernel.simulate[2, 256](p, g_hat, m, h, n, hyper, 1)
            sophiag_hessian_update(h_ref, g_hat, beta2=beta2)
    assert hyper[0] == 6
    assert 0 < np.sum(np.abs(m_ref) > rho * bs * h_ref) < n  # both clipped and unclipped coordinates
    np.testing.assert_allclose(p, p_ref, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(m, m_ref, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(h, h_ref, rtol=1e-5, atol=1e-9)


@pytest.mark.parametrize("options, match", [
    (dict(lr=-1.0), r"SophiaG: lr \(-1.0\) must be >= 0"),
    (dict(rho=-0.1), r"rho \(-0.1\)"),
    (dict(k=0), r"k \(0\) must be >= 1"),
    (dict(bs=0), r"bs \(0\) must be > 0"),
    (dict(betas=(1.0, 0.99)), r"SophiaG: betas must be two numbers in \[0, 1\), got \(1.0, 0.99\)"),
])
def test_invalid_hyperparameters(options, match):
    with pytest.raises(ValueError, match=match):
        SophiaG([frost.zeros(2, requires_grad=True)], **options)


@pytest.mark.cuda
def test_gpu_flat_kernels_equal_the_cpu_rule():
    def run(device):
        params = [frost.tensor(a, device=device, requires_grad=True) for a in initial(np.float32)]
        opt = SophiaG(params, k=3, **OPTIONS)
        rng = np.random.default_rng(1)

        def load_grads(scale):  # copy into the gradients: on the GPU they are views into the flat buffer
            for p in params:
                g = frost.tensor(scale * rng.standard_normal(p.shape).astype(np.float32), device=device)
                p.grad = g if p.grad is None else p.grad.copy_(g)

        for step in range(20):
            load_grads(1.0)
            opt.step()
            if step % 3 == 2:
                load_grads(0.5)
                opt.update_hessian()
        return opt, [p.detach().cpu().numpy() for p in params]

    _, cpu = run("cpu")
    opt, gpu = run("cuda")
    assert opt._flat, "the CUDA parameters should have been packed into a flat group"
    for a, b in zip(gpu, cpu):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    assert float(opt.state_dict()["state"][0]["step"].item()) == 20
