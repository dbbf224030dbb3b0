"""Every op on the GPU against the same op on the CPU: forward values and input gradients."""
import zlib

import numpy as np
import pytest

import frost
import frost.nn.functional as F

pytestmark = pytest.mark.cuda


def _inputs(shapes, seed):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(s).astype(np.float32) for s in shapes]


def _run(fn, arrays, device):
    ts = [frost.tensor(a, device=device, requires_grad=True) for a in arrays]
    out = fn(*ts)
    rng = np.random.default_rng(99)
    g = rng.standard_normal(out.shape).astype(np.float32)
    out.backward(frost.tensor(g, device=device))
    return out.detach().cpu().numpy(), [t.grad.cpu().numpy() for t in ts]


LABELS = np.array([1, 0, 3, 2, 4, 1, 0, 2])

OPS = {
    "add": (lambda a, b: a + b, [(4, 5), (5,)]),
    "sub": (lambda a, b: a - b, [(4, 5), (4, 1)]),
    "mul": (lambda a, b: a * b, [(2, 3, 4), (3, 4)]),
    "div": (lambda a, b: a / (b * b + 1), [(4, 5), (4, 5)]),
    "pow": (lambda a: (a * a + 1) ** 1.5, [(6, 7)]),
    "exp_log": (lambda a: (a.exp() + 1).log(), [(6, 7)]),
    "sqrt": (lambda a: (a * a + 0.5).sqrt(), [(6, 7)]),
    "tanh_sigmoid": (lambda a: a.tanh() * a.sigmoid(), [(6, 7)]),
    "relu": (lambda a: F.relu(a), [(6, 7)]),
    "gelu": (lambda a: F.gelu(a), [(6, 7)]),
    "gelu_tanh": (lambda a: F.gelu(a, approximate="tanh"), [(6, 7)]),
    "silu": (lambda a: F.silu(a), [(6, 7)]),
    "abs_clamp": (lambda a: a.abs().clamp(0.1, 1.0), [(6, 7)]),
    "where_max": (lambda a, b: frost.where(a > b, a, b) + frost.maximum(a, b), [(6, 7), (6, 7)]),
    "matmul": (lambda a, b: a @ b, [(3, 4, 5), (5, 6)]),
    "linear": (lambda x, w, b: F.linear(x, w, b), [(8, 5), (3, 5), (3,)]),
    "sum_mean": (lambda a: a.sum(1).mean(), [(4, 5, 6)]),
    "max_dim": (lambda a: a.max(1).values, [(4, 5)]),
    "var": (lambda a: a.var(0), [(7, 3)]),
    "logsumexp": (lambda a: a.logsumexp(1), [(4, 9)]),
    "softmax": (lambda a: F.softmax(a, dim=-1), [(4, 9)]),
    "log_softmax": (lambda a: F.log_softmax(a, dim=1), [(4, 9)]),
    "reshape_permute": (lambda a: a.reshape(4, 6).permute(1, 0).flatten(), [(2, 3, 4)]),
    "index": (lambda a: a[1:, ::2] + a[[0, 0, 2]][:, :3].sum(), [(3, 6)]),
    "cat_stack": (lambda a, b: frost.cat([a, b], 0) * frost.stack([a, b]).sum(0).mean(), [(2, 3), (2, 3)]),
    "expand": (lambda a: a.expand(3, 4, 5), [(4, 1)]),
    "conv2d": (lambda x, w, b: F.conv2d(x, w, b, stride=1, padding=1), [(2, 3, 8, 8), (4, 3, 3, 3), (4,)]),
    "conv2d_stride2": (lambda x, w: F.conv2d(x, w, stride=2, padding=1), [(2, 4, 9, 9), (6, 4, 3, 3)]),
    "conv2d_1x1": (lambda x, w: F.conv2d(x, w, stride=2), [(2, 4, 8, 8), (6, 4, 1, 1)]),
    "conv2d_groups": (lambda x, w: F.conv2d(x, w, padding=1, groups=2), [(2, 4, 6, 6), (6, 2, 3, 3)]),
    "max_pool2d": (lambda x: F.max_pool2d(x, 2), [(2, 3, 8, 8)]),
    "avg_pool2d": (lambda x: F.avg_pool2d(x, 3, stride=2, padding=1), [(2, 3, 8, 8)]),
    "adaptive_avg_pool2d": (lambda x: F.adaptive_avg_pool2d(x, 1), [(2, 3, 8, 8)]),
    "batch_norm": (lambda x, w, b: F.batch_norm(x, None, None, w, b, training=True), [(4, 3, 5, 5), (3,), (3,)]),
    "layer_norm": (lambda x, w, b: F.layer_norm(x, (6,), w, b), [(4, 6), (6,), (6,)]),
    "rms_norm": (lambda x, w: F.rms_norm(x, (6,), w), [(4, 6), (6,)]),
    "cross_entropy": (lambda x: F.cross_entropy(x, frost.tensor(LABELS, device=x.device), label_smoothing=0.1),
                      [(8, 5)]),
    "mse": (lambda a, b: F.mse_loss(a, b), [(4, 5), (4, 5)]),
    "bce_logits": (lambda a, b: F.binary_cross_entropy_with_logits(a, b.sigmoid()), [(4, 5), (4, 5)]),
    "sdpa_causal": (lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
                    [(2, 5, 4), (2, 5, 4), (2, 5, 4)]),
    "embedding": (lambda w: F.embedding(frost.tensor([[1, 2], [2, 0]], device=w.device), w), [(4, 3)]),
}


@pytest.mark.parametrize("name", sorted(OPS))
def test_op_gpu_matches_cpu(name):
    fn, shapes = OPS[name]
    arrays = _inputs(shapes, seed=zlib.crc32(name.encode()) % 1000)  # hash() of a str changes per process
    out_cpu, grads_cpu = _run(fn, arrays, "cpu")
    out_gpu, grads_gpu = _run(fn, arrays, "cuda")
    tol = dict(rtol=2e-3, atol=2e-3)  # TF32 tensor cores in convolutions and matmuls
    np.testing.assert_allclose(out_gpu, out_cpu, **tol)
    for gg, gc in zip(grads_gpu, grads_cpu):
        np.testing.assert_allclose(gg, gc, **tol)


def test_mixing_devices_is_an_error():
    a = frost.ones(3)
    b = frost.ones(3, device="cuda")
    with pytest.raises(RuntimeError, match="different devices"):
        a + b


def test_to_and_back_keeps_values_and_gradient_flows():
    x = frost.randn(5, requires_grad=True)
    y = (x.cuda() * 2).sum()
    y.backward()
    assert x.grad.device == "cpu"
    np.testing.assert_allclose(x.grad.numpy(), 2 * np.ones(5))
