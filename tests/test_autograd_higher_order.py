"""Higher-order gradients (create_graph=True) against PyTorch CPU float64: per op, the gradient of
sum(w * op(...)^2) with its graph, then the gradient of that gradient (summed, and against a random vector: a
Hessian-vector product); a WGAN-GP gradient penalty on a small conv critic; Tensor.backward(create_graph=True); the
error for an op without a Tensor-level backward."""
import numpy as np
import pytest
import torch
import torch.nn.functional as TF

import frost
import frost.nn.functional as F

RTOL = 1e-10


def _both(values: np.ndarray, requires_grad: bool = True):
    return frost.tensor(values, requires_grad=requires_grad), torch.tensor(values, requires_grad=requires_grad)


def _close(f, t, rtol: float = RTOL) -> None:
    assert (f is None) == (t is None), (f, t)
    if f is not None:
        np.testing.assert_allclose(f.detach().numpy(), t.detach().numpy(), rtol=rtol, atol=rtol)


def check_second_order(f_op, t_op, arrays, seed: int = 0, rtol: float = RTOL) -> None:
    """f_op(*frost tensors) and t_op(*torch tensors) agree in the gradient of sum(w * out * out) (kept with its
    graph) and in the gradient of that gradient, summed and dotted with a random vector, for every input."""
    rng = np.random.default_rng(seed)
    pairs = [_both(np.asarray(a, dtype=np.float64)) for a in arrays]
    fx, tx = [f for f, _ in pairs], [t for _, t in pairs]
    fo, to = f_op(*fx), t_op(*tx)
    _close(fo, to, rtol)
    w = rng.standard_normal(to.shape)
    fg = frost.autograd.grad((fo * fo * frost.tensor(w)).sum(), fx, create_graph=True)
    tg = torch.autograd.grad((to * to * torch.tensor(w)).sum(), tx, create_graph=True)
    for f, t in zip(fg, tg):
        _close(f, t, rtol)
        assert f.requires_grad == t.requires_grad
    for vectors in ([np.ones(a.shape) for a in tx], [rng.standard_normal(a.shape) for a in tx]):
        fs = sum((g * frost.tensor(v)).sum() for g, v in zip(fg, vectors))
        ts = sum((g * torch.tensor(v)).sum() for g, v in zip(tg, vectors))
        fh = frost.autograd.grad(fs, fx, retain_graph=True, materialize_grads=True)
        th = torch.autograd.grad(ts, tx, retain_graph=True, materialize_grads=True)
        for f, t in zip(fh, th):
            _close(f, t, rtol)


def _positive(rng, shape):
    return np.abs(rng.standard_normal(shape)) + 0.5


R = np.random.default_rng(1)
A34, B4, B31, C234 = R.standard_normal((3, 4)), R.standard_normal(4), R.standard_normal((3, 1)), \
    R.standard_normal((2, 3, 4))
P34, P4 = _positive(R, (3, 4)), _positive(R, (4,))

# (id, frost op, torch op, inputs): each op with broadcasting where it has some
ELEMENTWISE = [
    ("add", lambda x, y: x + y, lambda x, y: x + y, [A34, B4]),
    ("add_scalar", lambda x: 2.5 + x * x, lambda x: 2.5 + x * x, [A34]),
    ("sub", lambda x, y: x - y * y, lambda x, y: x - y * y, [A34, B31]),
    ("sub_scalar", lambda x: 1 - x * x, lambda x: 1 - x * x, [A34]),
    ("mul", lambda x, y: x * y, lambda x, y: x * y, [C234, B31]),
    ("mul_scalar", lambda x: x * x * 3.0, lambda x: x * x * 3.0, [A34]),
    ("div", lambda x, y: x / y, lambda x, y: x / y, [A34, P4]),
    ("div_scalar", lambda x: 2.0 / x, lambda x: 2.0 / x, [P34]),
    ("pow_int", lambda x: x ** 3, lambda x: x ** 3, [A34]),
    ("pow_float", lambda x: x ** 2.5, lambda x: x ** 2.5, [P34]),
    ("pow_zero", lambda x: x ** 0 + x, lambda x: x ** 0 + x, [A34]),
    ("pow_tensor", lambda x, y: x ** y, lambda x, y: x ** y, [P34, B4]),
    ("rpow", lambda x: 2.0 ** x, lambda x: 2.0 ** x, [A34]),
    ("neg", lambda x: -(x * x), lambda x: -(x * x), [A34]),
    ("exp", lambda x: x.exp(), lambda x: x.exp(), [A34]),
    ("log", lambda x: x.log(), lambda x: x.log(), [P34]),
    ("sqrt", lambda x: x.sqrt(), lambda x: x.sqrt(), [P34]),
    ("rsqrt", lambda x: x.rsqrt(), lambda x: x.rsqrt(), [P34]),
    ("square", lambda x: x.square(), lambda x: x.square(), [A34]),
    ("abs", lambda x: (x * x * x).abs(), lambda x: (x * x * x).abs(), [A34]),
    ("tanh", lambda x: x.tanh(), lambda x: x.tanh(), [A34]),
    ("sigmoid", lambda x: x.sigmoid(), lambda x: x.sigmoid(), [A34]),
    ("relu", lambda x: F.relu(x * x * x), lambda x: TF.relu(x * x * x), [A34]),
    ("leaky_relu", lambda x: F.leaky_relu(x * x * x, 0.2), lambda x: TF.leaky_relu(x * x * x, 0.2), [A34]),
    ("gelu", lambda x: F.gelu(x), lambda x: TF.gelu(x), [A34]),
    ("gelu_tanh", lambda x: F.gelu(x, approximate="tanh"), lambda x: TF.gelu(x, approximate="tanh"), [A34]),
    ("silu", lambda x: F.silu(x), lambda x: TF.silu(x), [A34]),
    ("softplus", lambda x: F.softplus(x, beta=2.0, threshold=1.0), lambda x: TF.softplus(x, 2.0, 1.0), [A34]),
    ("erf", lambda x: x.erf(), lambda x: x.erf(), [A34]),
    ("sin_cos", lambda x: x.sin() * x.cos(), lambda x: x.sin() * x.cos(), [A34]),
    ("log1p_expm1", lambda x: x.log1p() + x.expm1(), lambda x: x.log1p() + x.expm1(), [P34]),
    ("reciprocal", lambda x: x.reciprocal(), lambda x: x.reciprocal(), [P34]),
    ("clamp", lambda x: (x * x * x).clamp(-0.5, 0.7), lambda x: (x * x * x).clamp(-0.5, 0.7), [A34]),
    ("where", lambda x, y: frost.where(x > 0, x * x, y), lambda x, y: torch.where(x > 0, x * x, y), [A34, B4]),
    ("masked_fill", lambda x: (x * x).masked_fill(frost.tensor(A34 > 0), 0.5),
     lambda x: (x * x).masked_fill(torch.tensor(A34 > 0), 0.5), [A34]),
    ("cast", lambda x: (x * x).float().double() * x, lambda x: (x * x).float().double() * x, [A34]),
]

REDUCE_AND_SHAPE = [
    ("sum", lambda x: (x * x).sum(1), lambda x: (x * x).sum(1), [C234]),
    ("sum_keepdim", lambda x: (x * x).sum((0, 2), keepdim=True), lambda x: (x * x).sum((0, 2), keepdim=True), [C234]),
    ("sum_all", lambda x: (x * x * x).sum(), lambda x: (x * x * x).sum(), [C234]),
    ("mean", lambda x: (x * x).mean(-1), lambda x: (x * x).mean(-1), [C234]),
    ("mean_all", lambda x: (x * x * x).mean(), lambda x: (x * x * x).mean(), [C234]),
    ("reshape_view", lambda x: (x * x).reshape(6, 4).view(4, 6), lambda x: (x * x).reshape(6, 4).view(4, 6), [C234]),
    ("permute_transpose", lambda x: (x * x).permute(2, 0, 1).transpose(0, 2), lambda x: (x * x).permute(2, 0, 1)
     .transpose(0, 2), [C234]),
    ("expand", lambda x: (x * x).expand(2, 3, 4), lambda x: (x * x).expand(2, 3, 4), [B31]),
    ("squeeze_unsqueeze", lambda x: (x * x).unsqueeze(0).squeeze(-1), lambda x: (x * x).unsqueeze(0).squeeze(-1),
     [B31]),
    ("index_slices", lambda x: (x * x)[1:, ..., ::2], lambda x: (x * x)[1:, ..., ::2], [C234]),
    ("index_int", lambda x: (x * x)[:, 1], lambda x: (x * x)[:, 1], [C234]),
    ("index_advanced", lambda x: (x * x)[[0, 2, 0]], lambda x: (x * x)[[0, 2, 0]], [A34]),
    ("cat", lambda x, y: frost.cat([x * x, y], 1), lambda x, y: torch.cat([x * x, y], 1), [A34, B31]),
    ("stack", lambda x, y: frost.stack([x, y * x], -1), lambda x, y: torch.stack([x, y * x], -1), [A34, A34 + 1]),
    ("pad", lambda x: F.pad(x * x, (1, 2)), lambda x: TF.pad(x * x, (1, 2)), [A34]),
    ("flip_clone_contiguous", lambda x: (x * x).flip(1).clone().mT.contiguous(),
     lambda x: (x * x).flip(1).clone().mT.contiguous(), [A34]),
    ("rounding", lambda x: x * x + x.floor() + x.ceil() + x.round(), lambda x: x * x + x.floor() + x.ceil() + x.round(),
     [A34]),
    ("softmax", lambda x: F.softmax(x, 1), lambda x: TF.softmax(x, 1), [A34]),
    ("log_softmax", lambda x: F.log_softmax(x, 0), lambda x: TF.log_softmax(x, 0), [A34]),
]

MATMUL = [
    ("matmul", lambda a, b: a @ b, lambda a, b: a @ b, [A34, R.standard_normal((4, 5))]),
    ("matmul_batched", lambda a, b: a @ b, lambda a, b: a @ b, [R.standard_normal((2, 1, 3, 4)),
                                                                R.standard_normal((3, 4, 2))]),
    ("matmul_vector_matrix", lambda a, b: a @ b, lambda a, b: a @ b, [B4, R.standard_normal((2, 4, 3))]),
    ("matmul_matrix_vector", lambda a, b: a @ b, lambda a, b: a @ b, [C234, B4]),
    ("matmul_vectors", lambda a, b: a @ b, lambda a, b: a @ b, [B4, B4 + 1]),
    ("linear", lambda x, w, b: F.linear(x, w, b), lambda x, w, b: TF.linear(x, w, b),
     [C234, R.standard_normal((5, 4)), R.standard_normal(5)]),
    ("linear_no_bias", lambda x, w: F.linear(x, w), lambda x, w: TF.linear(x, w), [B4, R.standard_normal((5, 4))]),
]

X = R.standard_normal((2, 3, 7, 6))
CONV = [
    ("conv2d", lambda x, w, b: F.conv2d(x, w, b, stride=2, padding=1), lambda x, w, b: TF.conv2d(x, w, b, 2, 1),
     [X, R.standard_normal((4, 3, 3, 3)), R.standard_normal(4)]),
    ("conv2d_dilated", lambda x, w: F.conv2d(x, w, stride=(1, 2), padding=(2, 0), dilation=2),
     lambda x, w: TF.conv2d(x, w, stride=(1, 2), padding=(2, 0), dilation=2), [X, R.standard_normal((2, 3, 2, 3))]),
    ("conv2d_same_unbatched", lambda x, w: F.conv2d(x, w, padding="same"), lambda x, w: TF.conv2d(x, w, padding="same"),
     [X[0], R.standard_normal((2, 3, 3, 3))]),
    ("conv_transpose2d", lambda x, w, b: F.conv_transpose2d(x, w, b, stride=2, padding=1, output_padding=1),
     lambda x, w, b: TF.conv_transpose2d(x, w, b, stride=2, padding=1, output_padding=1),
     [X, R.standard_normal((3, 2, 3, 3)), R.standard_normal(2)]),
    ("conv3d_transpose3d", lambda x, w, v: F.conv_transpose3d(F.conv3d(x, w, padding=1, stride=2), v, stride=2),
     lambda x, w, v: TF.conv_transpose3d(TF.conv3d(x, w, padding=1, stride=2), v, stride=2),
     [R.standard_normal((1, 2, 4, 5, 3)), R.standard_normal((3, 2, 3, 3, 3)), R.standard_normal((3, 2, 2, 1, 2))]),
    ("conv1d", lambda x, w, b: F.conv1d(x, w, b, stride=2, padding=1), lambda x, w, b: TF.conv1d(x, w, b, 2, 1),
     [X[:, :, 0], R.standard_normal((4, 3, 3)), R.standard_normal(4)]),
]

T3 = np.array([2, 0, 1])
LOSSES = [
    ("cross_entropy", lambda x: F.cross_entropy(x, frost.tensor(T3)), lambda x: TF.cross_entropy(x, torch.tensor(T3)),
     [A34]),
    ("cross_entropy_weighted_smoothed", lambda x: F.cross_entropy(x, frost.tensor(T3), frost.tensor(P4),
                                                                  label_smoothing=0.2, ignore_index=1),
     lambda x: TF.cross_entropy(x, torch.tensor(T3), torch.tensor(P4), label_smoothing=0.2, ignore_index=1), [A34]),
    ("cross_entropy_spatial_sum", lambda x: F.cross_entropy(x, frost.tensor(T3[None, :].repeat(2, 0)),
                                                            reduction="sum"),
     lambda x: TF.cross_entropy(x, torch.tensor(T3[None, :].repeat(2, 0)), reduction="sum"),
     [R.standard_normal((2, 4, 3))]),
    ("nll_loss", lambda x: F.nll_loss(F.log_softmax(x, 1), frost.tensor(T3), reduction="none"),
     lambda x: TF.nll_loss(TF.log_softmax(x, 1), torch.tensor(T3), reduction="none"), [A34]),
    ("bce_with_logits", lambda x, y: F.binary_cross_entropy_with_logits(x, y, frost.tensor(B31),
                                                                        pos_weight=frost.tensor(P4)),
     lambda x, y: TF.binary_cross_entropy_with_logits(x, y, torch.tensor(B31), pos_weight=torch.tensor(P4)),
     [A34, R.uniform(size=(3, 4))]),
    ("bce_with_logits_sum", lambda x, y: F.binary_cross_entropy_with_logits(x, y, reduction="sum"),
     lambda x, y: TF.binary_cross_entropy_with_logits(x, y, reduction="sum"), [A34, R.uniform(size=(3, 4))]),
    ("mse_loss", lambda x, y: F.mse_loss(x * x, y, reduction="sum"), lambda x, y: TF.mse_loss(x * x, y,
                                                                                               reduction="sum"),
     [A34, R.standard_normal((3, 4))]),
]


@pytest.mark.parametrize("f_op, t_op, arrays", [c[1:] for c in ELEMENTWISE], ids=[c[0] for c in ELEMENTWISE])
def test_elementwise_second_derivatives_match_torch(f_op, t_op, arrays):
    check_second_order(f_op, t_op, arrays, rtol=1e-6 if f_op is ELEMENTWISE[-1][1] else RTOL)


OTHER_OPS = REDUCE_AND_SHAPE + MATMUL + CONV + LOSSES  # reductions, shapes, matmul/linear, convolutions, losses


@pytest.mark.parametrize("f_op, t_op, arrays", [c[1:] for c in OTHER_OPS], ids=[c[0] for c in OTHER_OPS])
def test_second_derivatives_of_the_other_ops_match_torch(f_op, t_op, arrays):
    check_second_order(f_op, t_op, arrays)


def test_third_derivative_matches_torch():
    (fx, tx) = _both(np.array([0.3, -1.2, 2.0]))
    fy, ty = (fx.tanh() * fx.exp()).sum(), (tx.tanh() * tx.exp()).sum()
    for _ in range(3):
        (fy,), (ty,) = frost.autograd.grad(fy, fx, create_graph=True), torch.autograd.grad(ty, tx, create_graph=True)
        _close(fy, ty)
        fy, ty = fy.sum(), ty.sum()


# ------------------------------------------------------------------ WGAN-GP


def _critics():
    rng = np.random.default_rng(7)
    frost_critic = frost.nn.Sequential(frost.nn.Conv2d(3, 4, 3, stride=2, padding=1), frost.nn.LeakyReLU(0.2),
                                       frost.nn.Conv2d(4, 6, 3, padding=1), frost.nn.LeakyReLU(0.2),
                                       frost.nn.Flatten(), frost.nn.Linear(6 * 4 * 4, 1)).double()
    torch_critic = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, stride=2, padding=1), torch.nn.LeakyReLU(0.2),
                                       torch.nn.Conv2d(4, 6, 3, padding=1), torch.nn.LeakyReLU(0.2),
                                       torch.nn.Flatten(), torch.nn.Linear(6 * 4 * 4, 1)).double()
    for fp, tp in zip(frost_critic.parameters(), torch_critic.parameters()):
        values = rng.standard_normal(tuple(tp.shape)) * 0.3
        with torch.no_grad():
            tp.copy_(torch.tensor(values))
        with frost.no_grad():
            fp.copy_(frost.tensor(values))
    return frost_critic, torch_critic


def _critic_loss(lib, critic, real, fake, eps, lam: float = 10.0):
    """WGAN-GP: the critic's Wasserstein loss plus lam * (||d critic(x_hat) / d x_hat|| - 1)^2 on interpolates."""
    x_hat = eps * real + (1 - eps) * fake
    x_hat.requires_grad_(True)
    (g,) = lib.autograd.grad(critic(x_hat).sum(), x_hat, create_graph=True)
    norm = ((g * g).reshape(g.shape[0], -1).sum(1) + 1e-12).sqrt()
    return critic(fake).mean() - critic(real).mean() + lam * ((norm - 1) ** 2).mean()


def test_wgan_gp_gradient_penalty_matches_torch():
    rng = np.random.default_rng(3)
    real, fake = rng.standard_normal((4, 3, 8, 8)), rng.standard_normal((4, 3, 8, 8))
    eps = rng.uniform(size=(4, 1, 1, 1))
    frost_critic, torch_critic = _critics()
    fl = _critic_loss(frost, frost_critic, *(frost.tensor(a) for a in (real, fake, eps)))
    tl = _critic_loss(torch, torch_critic, *(torch.tensor(a) for a in (real, fake, eps)))
    _close(fl, tl)
    fl.backward()
    tl.backward()
    for (name, fp), tp in zip(frost_critic.named_parameters(), torch_critic.parameters()):
        assert fp.grad is not None, name
        _close(fp.grad, tp.grad)


# ------------------------------------------------------------------ Tensor.backward(create_graph=True)


# the oracle's own advice to prefer autograd.grad: this test is about backward(create_graph=True) itself
@pytest.mark.filterwarnings("ignore:Using backward\\(\\) with create_graph=True")
def test_backward_with_create_graph_then_a_second_backward_matches_torch():
    rng = np.random.default_rng(4)
    (fx, tx), (fw, tw) = _both(rng.standard_normal((3, 4))), _both(rng.standard_normal((4, 2)))
    fl, tl = ((fx @ fw).tanh() ** 2).sum(), ((tx @ tw).tanh() ** 2).sum()
    fl.backward(create_graph=True)
    tl.backward(create_graph=True)
    for f, t in ((fx, tx), (fw, tw)):
        _close(f.grad, t.grad)
        assert f.grad.requires_grad == t.grad.requires_grad and f.grad.grad_fn is not None
    # the graph was retained (retain_graph defaults to create_graph): a second create_graph backward adds, out of place
    fl.backward(create_graph=True)
    tl.backward(create_graph=True)
    _close(fx.grad, tx.grad)
    fg, tg = fx.grad, tx.grad
    fx.grad = fw.grad = None
    tx.grad = tw.grad = None
    (fg * fg).sum().backward()
    (tg * tg).sum().backward()
    _close(fx.grad, tx.grad)
    _close(fw.grad, tw.grad)
    assert not fx.grad.requires_grad


def test_backward_with_create_graph_accumulates_into_an_existing_grad_as_torch_does():
    (fx, tx) = _both(np.array([0.5, -1.0, 2.0]))
    (fx ** 3).sum().backward()
    (tx ** 3).sum().backward()
    (fx ** 3).sum().backward(create_graph=True)
    (tx ** 3).sum().backward(create_graph=True)
    _close(fx.grad, tx.grad)
    fx.grad.sum().backward()  # into the same .grad, as PyTorch does (6x added to 6x^2)
    tx.grad.sum().backward()
    _close(fx.grad, tx.grad)


def test_create_graph_with_grad_outputs_keeps_their_graph():
    (fx, tx), (fv, tv) = _both(np.array([0.5, -1.0, 2.0])), _both(np.array([1.0, 2.0, -1.0]))
    (fg,) = frost.autograd.grad(fx.sin(), fx, grad_outputs=fv, create_graph=True)
    (tg,) = torch.autograd.grad(tx.sin(), tx, grad_outputs=tv, create_graph=True)
    for f, t in zip(frost.autograd.grad(fg.sum(), [fx, fv]), torch.autograd.grad(tg.sum(), [tx, tv])):
        _close(f, t)


def test_create_graph_grad_of_an_unused_input_follows_allow_unused():
    (fx, _), (fy, _) = _both(np.array([1.0, 2.0])), _both(np.array([3.0]))
    with pytest.raises(RuntimeError, match="not have been used"):
        frost.autograd.grad((fx * fx).sum(), [fx, fy], create_graph=True)
    gx, gy = frost.autograd.grad((fx * fx).sum(), [fx, fy], create_graph=True, allow_unused=True)
    assert gy is None and gx.requires_grad


# ------------------------------------------------------------------ errors and the first-order path


def test_an_op_without_a_tensor_level_backward_is_refused_by_name_before_anything_runs():
    fx = frost.tensor(np.random.default_rng(5).standard_normal((1, 1, 4, 4)), requires_grad=True)
    y = F.max_pool2d(fx * fx, 2).sum()
    with pytest.raises(RuntimeError, match=r"create_graph=True\): the backward of 'max_pool2d' is not "
                                           r"differentiable in Frost yet \(ops that are: .*conv2d"):
        frost.autograd.grad(y, fx, create_graph=True)
    with pytest.raises(RuntimeError, match="backward of 'max_pool2d' is not differentiable"):
        y.backward(create_graph=True)
    assert fx.grad is None
    (g,) = frost.autograd.grad(y, fx)  # the graph is intact: first-order gradients still run
    assert g.shape == fx.shape


def test_grouped_convolution_is_refused_by_name():
    fx = frost.tensor(np.ones((1, 2, 4, 4)), requires_grad=True)
    fw = frost.tensor(np.ones((2, 1, 3, 3)), requires_grad=True)
    with pytest.raises(RuntimeError, match="'conv2d' is not differentiable in Frost yet with groups=2"):
        frost.autograd.grad(F.conv2d(fx, fw, groups=2).sum(), fx, create_graph=True)


def test_create_graph_refuses_a_freed_graph():
    fx = frost.tensor([1.0, 2.0], requires_grad=True)
    y = (fx.exp() * fx).sum()
    y.backward()
    with pytest.raises(RuntimeError, match="a second time"):
        frost.autograd.grad(y, fx, create_graph=True)


def test_first_order_gradients_have_no_graph_and_retain_graph_still_defaults_to_false():
    fx = frost.tensor([1.0, 2.0], requires_grad=True)
    y = (fx.exp() * fx).sum()
    (g,) = frost.autograd.grad(y, fx, retain_graph=True)
    assert not g.requires_grad
    y.backward()
    assert not fx.grad.requires_grad
    with pytest.raises(RuntimeError, match="a second time"):
        y.backward()


@pytest.mark.cuda
def test_create_graph_on_cuda_takes_the_fast_paths_tensor_level_backward():
    """gelu and cross_entropy run frost.accel's kernels on the GPU; their nodes still get the Tensor-level backward
    (frost.tensor.record_tensor_backward), so the second derivatives match PyTorch's (float32 tolerances)."""
    rng = np.random.default_rng(6)
    x, target = rng.standard_normal((8, 5)).astype(np.float32), rng.integers(0, 5, 8)
    fx = frost.tensor(x, device="cuda", requires_grad=True)
    tx = torch.tensor(x.astype(np.float64), requires_grad=True)
    fl = F.cross_entropy(F.gelu(fx, approximate="tanh") * 2, frost.tensor(target, device="cuda"))
    tl = TF.cross_entropy(TF.gelu(tx, approximate="tanh") * 2, torch.tensor(target))
    (fg,), (tg,) = frost.autograd.grad(fl, fx, create_graph=True), torch.autograd.grad(tl, tx, create_graph=True)
    _close(fg.cpu(), tg, rtol=1e-4)
    _close(frost.autograd.grad((fg * fg).sum(), fx)[0].cpu(), torch.autograd.grad((tg * tg).sum(), tx)[0], rtol=1e-3)
