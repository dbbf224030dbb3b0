"""GELU in the linear layer's epilogue (frost/accel/epilogue.py): a jitted step's warm-up learns which products GELU
reads, the next warm-up call and the capture ask cuDNN for the product and its GELU in one graph, and GELU's op takes
the kept result instead of launching its kernel, only for the same unchanged product in the same form. On the CPU
with NumPy arrays standing in for CuPy ones (cuDNN's graph computed by NumPy, the GELU kernels in the simulator);
on a GPU, cuDNN's fused graph against float64 PyTorch and a jitted MLP step with and without the fusion."""
import ml_dtypes
import numpy as np
import pytest
import torch

import frost
import frost.nn.functional as F
from frost import backends, dispatch
from frost.accel import epilogue
from frost.accel import matmul as accel_matmul
from frost.backend import cudnn
from frost.kernel.api import Kernel


def _gelu64(x, form):
    return torch.nn.functional.gelu(torch.tensor(np.asarray(x, np.float64)),
                                    approximate="tanh" if form == "gelu_tanh" else "none").numpy()


class Step(list):
    """The cuDNN calls ("product", or the form computed in its epilogue) and GELU kernels launched; `mode` is
    "eager", "warming up" or "captured"."""
    mode = "eager"


@pytest.fixture
def gpu(monkeypatch):
    step = Step()
    monkeypatch.setattr(dispatch, "device_of", lambda array: "cuda")
    monkeypatch.setattr(cudnn, "available", lambda: True)
    monkeypatch.setattr(backends, "allow_tf32", True)
    monkeypatch.setattr(accel_matmul, "capturing", lambda: step.mode == "captured")
    for module in (accel_matmul, epilogue):
        monkeypatch.setattr(module, "warming_up", lambda: step.mode == "warming up")
    for table in ("_followed_by", "_recent", "_kept"):
        monkeypatch.setattr(epilogue, table, type(getattr(epilogue, table))())
    monkeypatch.setattr(epilogue, "_fused_in_warm_up", set())
    monkeypatch.setattr(epilogue, "FUSED_GELU", True)

    def matmul(a, b, out=None, bias=None, activation=None):   # the epilogue's activation of the unrounded sum
        exact = np.matmul(a.astype(np.float64), b) + (0 if bias is None else bias)
        step.append(activation or "product")
        if activation is None:
            return exact.astype(a.dtype)
        return exact.astype(a.dtype), _gelu64(exact, activation).astype(a.dtype)
    monkeypatch.setattr(cudnn, "matmul", matmul)

    def simulate(kernel, cfg):
        step.append(kernel.__name__)
        return kernel.simulate[cfg]
    monkeypatch.setattr(Kernel, "__getitem__", simulate)
    return step


def _mlp(x, w, b, approximate="tanh", requires_grad=False):
    tx = frost.tensor(x, requires_grad=requires_grad)
    return tx, F.gelu(F.linear(tx, frost.tensor(w), frost.tensor(b)), approximate=approximate)


def _operands(seed=0, rows=6, width=8, hidden=16):
    rng = np.random.default_rng(seed)
    return tuple(rng.standard_normal(s).astype(np.float32) for s in ((rows, width), (hidden, width), (hidden,)))


def _reference(x, w, b, approximate="tanh"):
    return _gelu64(x.astype(np.float64) @ w.T + b, "gelu_tanh" if approximate == "tanh" else "gelu")


def test_a_warm_up_teaches_the_product_its_gelu_and_the_capture_fuses_it(gpu):
    x, w, b = _operands()
    gpu.mode = "warming up"
    _, first = _mlp(x, w, b)       # learns: GELU read this product
    assert gpu == ["product", "gelu_forward_vec4"]
    for mode in ("warming up", "captured"):
        gpu.mode = mode
        gpu.clear()
        _, out = _mlp(x, w, b)
        assert gpu == ["gelu_tanh"], mode     # one graph; GELU's kernel not launched
        np.testing.assert_allclose(out.numpy(), _reference(x, w, b), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(first.numpy(), _reference(x, w, b), rtol=1e-5, atol=1e-6)


def test_the_capture_fuses_only_what_a_warm_up_fused_before(gpu):
    """A capture never builds a fused graph first (building one times its plans, which a capture cannot)."""
    x, w, b = _operands()
    gpu.mode = "warming up"
    _mlp(x, w, b)
    gpu.mode = "captured"
    gpu.clear()
    _mlp(x, w, b)
    assert gpu == ["product", "gelu_forward_vec4"]


def test_eager_steps_and_other_products_are_not_fused(gpu):
    x, w, b = _operands()
    gpu.mode = "warming up"
    _mlp(x, w, b)
    F.linear(*(frost.tensor(a) for a in _operands(1, rows=5)))   # another signature, no GELU after it
    _mlp(x, w, b)
    gpu.clear()
    F.linear(*(frost.tensor(a) for a in _operands(1, rows=5)))
    assert gpu == ["product"]
    gpu.mode = "eager"
    gpu.clear()
    _, out = _mlp(x, w, b)
    assert "gelu_tanh" not in gpu and "gelu_forward_vec4" in gpu
    np.testing.assert_allclose(out.numpy(), _reference(x, w, b), rtol=1e-5, atol=1e-6)


def _learned(gpu, x, w, b):
    gpu.mode = "warming up"
    _mlp(x, w, b)
    _mlp(x, w, b)
    gpu.clear()


def test_a_changed_product_or_another_form_runs_the_kernel_on_what_is_there(gpu):
    x, w, b = _operands()
    _learned(gpu, x, w, b)
    h = F.linear(frost.tensor(x), frost.tensor(w), frost.tensor(b))
    h.add_(1.0)
    np.testing.assert_allclose(F.gelu(h, approximate="tanh").numpy(), _gelu64(x.astype(np.float64) @ w.T + b + 1,
                                                                                "gelu_tanh"), rtol=1e-5, atol=1e-6)
    assert gpu == ["gelu_tanh", "gelu_forward_vec4"]
    gpu.clear()
    _, out = _mlp(x, w, b, approximate="none")    # the epilogue made the tanh form: not this one
    np.testing.assert_allclose(out.numpy(), _reference(x, w, b, "none"), rtol=1e-5, atol=1e-6)
    assert gpu == ["gelu_tanh", "gelu_forward_vec4"]


def test_the_backward_of_a_fused_gelu_reads_the_product(gpu):
    x, w, b = _operands()
    _learned(gpu, x, w, b)
    tx, out = _mlp(x, w, b, requires_grad=True)
    g = np.random.default_rng(5).standard_normal(out.shape).astype(np.float32)
    out.backward(frost.tensor(g))
    assert gpu[0] == "gelu_tanh" and "gelu_forward_vec4" not in gpu
    t = torch.tensor(x.astype(np.float64), requires_grad=True)
    ref = torch.nn.functional.gelu(t @ torch.tensor(w.T.astype(np.float64)) + torch.tensor(b.astype(np.float64)),
                                   approximate="tanh")
    ref.backward(torch.tensor(g.astype(np.float64)))
    np.testing.assert_allclose(tx.grad.numpy(), t.grad.numpy(), rtol=1e-4, atol=1e-5)


def test_the_fusion_is_off_with_its_switch(gpu, monkeypatch):
    monkeypatch.setattr(epilogue, "FUSED_GELU", False)
    x, w, b = _operands()
    _learned(gpu, x, w, b)
    _mlp(x, w, b)
    assert gpu == ["product", "gelu_forward_vec4"]


@pytest.mark.cuda
@pytest.mark.parametrize("form", ["gelu_tanh", "gelu"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_on_the_gpu_cudnns_product_bias_and_gelu_match_float64(monkeypatch, form, dtype):
    cp = pytest.importorskip("cupy")
    if not cudnn.available():
        pytest.skip("needs the cuDNN frontend")
    dt = ml_dtypes.bfloat16 if dtype == "bfloat16" else np.dtype(dtype)
    rng = np.random.default_rng(3)
    x, w, b = (cp.asarray((rng.standard_normal(s) * scale).astype(dt))
               for s, scale in (((256, 64), 1.0), ((192, 64), 0.3), ((192,), 1.0)))
    fused = cudnn.matmul(x, w.T, bias=b, activation=form)
    assert fused is not None, cudnn.refusals()
    pre, act = fused
    want = x.get().astype(np.float64) @ w.get().astype(np.float64).T + b.get().astype(np.float64)
    roundoff = {"bfloat16": 2.0**-8, "float16": 2.0**-11}[dtype]
    for got, expected in ((pre, want), (act, _gelu64(want, form))):
        assert got.dtype == x.dtype and got.shape == (256, 192)
        # one rounding of the float32 result (two roundoffs of slack) and float32 sums over 64 terms
        np.testing.assert_allclose(got.get().astype(np.float64), expected, rtol=2 * roundoff,
                                   atol=2 * roundoff * np.abs(expected).max())


@pytest.mark.cuda
def test_on_the_gpu_a_jitted_mlp_step_with_the_fused_gelu_trains_as_without(monkeypatch):
    pytest.importorskip("cupy")
    if not cudnn.available():
        pytest.skip("needs the cuDNN frontend")
    results = []
    for fused in (True, False):
        monkeypatch.setattr(epilogue, "FUSED_GELU", fused)
        monkeypatch.setattr(epilogue, "_fused_in_warm_up", set())
        frost.manual_seed(0)
        model = frost.nn.Sequential(frost.nn.Linear(64, 256), frost.nn.GELU(approximate="tanh"),
                                    frost.nn.Linear(256, 64)).to("cuda")
        opt = frost.optim.AdamW(model.parameters(), lr=1e-3)
        x = frost.randn(128, 64, device="cuda")

        @frost.jit   # captures a step that takes a tensor (one without any runs eagerly)
        def step(x):
            opt.zero_grad()
            with frost.autocast(frost.bfloat16):
                loss = (model(x).float() - x).square().mean()
            loss.backward()
            opt.step()
            return loss

        losses = [step(x).item() for _ in range(6)]
        assert bool(epilogue._fused_in_warm_up) == fused
        results.append((losses, [p.detach().cpu().numpy() for p in model.parameters()]))
    (fused_losses, fused_params), (losses, params) = results
    # the epilogue's GELU rounds the float32 sum once; the kernel reads its bf16 rounding: a bf16 ulp apart
    np.testing.assert_allclose(fused_losses, losses, rtol=2e-2)
    for got, want in zip(fused_params, params):
        assert np.abs(got - want).max() <= 2e-2 * np.abs(want).max()
