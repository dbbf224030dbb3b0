"""Elementwise ops against PyTorch: forward values, gradients with a random upstream gradient, dtypes, errors."""
import numpy as np
import pytest
import torch

import frost
from frost.ops import elementwise as E

RNG = np.random.default_rng(0)


def _pair(array, requires_grad=True):
    """The same data as a frost tensor and a torch tensor (float64 unless the array says otherwise)."""
    return frost.tensor(array, requires_grad=requires_grad), torch.tensor(array, requires_grad=requires_grad)


def _check(frost_fn, torch_fn, *arrays, atol=1e-10, rtol=1e-7, grads=True):
    """Forward and (with a random upstream gradient) backward of frost_fn against torch_fn."""
    fs, ts = zip(*(_pair(a, grads) for a in arrays))
    fo, to = frost_fn(*fs), torch_fn(*ts)
    assert fo.shape == tuple(to.shape)
    assert fo.dtype.name == str(to.dtype).replace("torch.", "")
    np.testing.assert_allclose(fo.detach().numpy(), to.detach().numpy(), atol=atol, rtol=rtol)
    if not grads:
        return
    up = RNG.standard_normal(fo.shape)
    fo.backward(frost.tensor(up, dtype=fo.dtype))
    to.backward(torch.tensor(up, dtype=to.dtype))
    for f, t in zip(fs, ts):
        assert f.grad is not None and f.grad.dtype == f.dtype and f.grad.shape == f.shape
        np.testing.assert_allclose(f.grad.numpy(), t.grad.numpy(), atol=atol, rtol=rtol)


def _noncontig(shape):
    """A non-contiguous float64 array of `shape` (a transposed view)."""
    return RNG.standard_normal(shape[::-1]).T


SHAPE_PAIRS = [((3, 4), (3, 4)), ((3, 4), (4,)), ((2, 1, 4), (3, 1)), ((), (2, 3)), ((5, 1), (1, 6))]


@pytest.mark.parametrize("sa,sb", SHAPE_PAIRS)
@pytest.mark.parametrize("op", ["add", "sub", "mul", "div"])
def test_binary_arithmetic_broadcast(op, sa, sb):
    a, b = RNG.standard_normal(sa), RNG.standard_normal(sb)
    if op == "div":
        b = b + np.sign(b) * 0.5
    fn = {"add": lambda x, y: x + y, "sub": lambda x, y: x - y, "mul": lambda x, y: x * y,
          "div": lambda x, y: x / y}[op]
    _check(fn, fn, a, b)


def test_noncontiguous_inputs():
    a = _noncontig((4, 5))
    b = np.ascontiguousarray(RNG.standard_normal((5, 8)))[:, ::2].T[:4]
    assert not a.flags.c_contiguous and not b.flags.c_contiguous
    _check(lambda x, y: (x * y + x).exp() / (y * y + 1), lambda x, y: (x * y + x).exp() / (y * y + 1), a, b)


@pytest.mark.parametrize("op", ["radd", "rsub", "rmul", "rdiv", "rpow"])
def test_reflected_scalar_ops(op):
    a = RNG.uniform(0.5, 2.0, (3, 4))
    fn = {"radd": lambda x: 2.5 + x, "rsub": lambda x: 2.5 - x, "rmul": lambda x: 2.5 * x,
          "rdiv": lambda x: 2.5 / x, "rpow": lambda x: 2.5 ** x}[op]
    _check(fn, fn, a)


def test_numpy_scalar_on_the_left_defers_to_tensor():
    x = frost.tensor([1.0, 2.0], requires_grad=True)
    out = np.float64(2.0) * x
    assert isinstance(out, frost.Tensor) and out.dtype == frost.float32
    np.testing.assert_allclose(out.detach().numpy(), [2.0, 4.0])
    for res in [np.ones(2) + x, np.ones(2, dtype=np.float32) * x, np.ones((3, 2), dtype=np.float32) @ x]:
        assert isinstance(res, frost.Tensor) and res.requires_grad
    plain = x.detach()
    assert np.asarray(plain).dtype == np.float32 and np.asarray(plain, dtype=np.float64).dtype == np.float64
    with pytest.raises(RuntimeError, match=r"requires grad\. Use tensor\.detach\(\)\.numpy\(\) instead"):
        np.asarray(x)  # as torch's __array__: the array would leave the graph


@pytest.mark.parametrize("exponent", [2, 3, 0.5, -1.5, 0])
def test_pow_scalar_exponent(exponent):
    a = RNG.uniform(0.3, 2.0, (4, 3))
    _check(lambda x: x ** exponent, lambda x: x ** exponent, a)


def test_pow_tensor_tensor_broadcast_and_zero_base():
    a = RNG.uniform(0.3, 2.0, (4, 3))
    a[0, 0] = 0.0
    b = RNG.uniform(0.5, 2.0, (3,))
    _check(lambda x, y: x ** y, lambda x, y: x ** y, a, b)


def test_pow_zero_exponent_at_zero_base_has_zero_grad():
    x = frost.tensor([0.0, 1.0], dtype=frost.float64, requires_grad=True)
    (x ** 0).sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [0.0, 0.0])


def test_neg_and_abs_and_sign():
    a = RNG.standard_normal((3, 5))
    a[0, 0] = 0.0
    _check(lambda x: -x, lambda x: -x, a)
    _check(lambda x: abs(x), lambda x: abs(x), a)
    _check(lambda x: x.abs(), lambda x: x.abs(), a)


UNARY = {
    "exp": (frost.exp, torch.exp, None),
    "log": (frost.log, torch.log, "pos"),
    "sqrt": (frost.sqrt, torch.sqrt, "pos"),
    "rsqrt": (frost.rsqrt, torch.rsqrt, "pos"),
    "tanh": (frost.tanh, torch.tanh, None),
    "sigmoid": (frost.sigmoid, torch.sigmoid, None),
    "relu": (frost.relu, torch.relu, None),
    "silu": (frost.silu, torch.nn.functional.silu, None),
    "sin": (frost.sin, torch.sin, None),
    "cos": (frost.cos, torch.cos, None),
    "gelu": (frost.gelu, torch.nn.functional.gelu, None),
    "gelu_tanh": (lambda x: frost.gelu(x, approximate="tanh"),
                  lambda x: torch.nn.functional.gelu(x, approximate="tanh"), None),
    "leaky_relu": (lambda x: E.leaky_relu(x, 0.2), lambda x: torch.nn.functional.leaky_relu(x, 0.2), None),
    "softplus": (E.softplus, torch.nn.functional.softplus, None),
    "softplus_beta": (lambda x: E.softplus(x, beta=2.0, threshold=5.0),
                      lambda x: torch.nn.functional.softplus(x, beta=2.0, threshold=5.0), None),
}


@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary_float64(name):
    f, t, domain = UNARY[name]
    a = RNG.standard_normal((5, 7)) * 3
    if domain == "pos":
        a = np.abs(a) + 0.1
    _check(f, t, a.T)  # transposed: non-contiguous input


@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary_float32_stays_float32(name):
    f, t, domain = UNARY[name]
    a = (RNG.standard_normal((4, 6)) * 3).astype(np.float32)
    if domain == "pos":
        a = np.abs(a) + 0.1
    _check(f, t, a, atol=1e-5, rtol=1e-5)


def test_sigmoid_extremes_are_accurate_and_finite():
    a = np.array([-100.0, -30.0, -20.0, 0.0, 20.0, 100.0], dtype=np.float32)
    with frost.autograd.detect_anomaly():
        out = frost.sigmoid(frost.tensor(a)).numpy()
    np.testing.assert_allclose(out, torch.sigmoid(torch.tensor(a)).numpy(), rtol=1e-6, atol=1e-30)
    assert out[1] > 0  # 9.4e-14: representable, must not flush to 0


def test_relu_of_negative_is_positive_zero():
    out = frost.relu(frost.tensor([-1.0, 2.0]))
    assert not np.signbit(out.numpy()[0])
    assert repr(out) == "tensor([0., 2.])"


def test_relu_grad_at_zero_is_zero():
    x = frost.tensor([0.0, -1.0, 1.0], requires_grad=True)
    frost.relu(x).sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [0.0, 0.0, 1.0])


@pytest.mark.parametrize("op", ["maximum", "minimum"])
def test_maximum_minimum_with_ties(op):
    a = RNG.integers(-2, 3, (4, 5)).astype(np.float64)
    b = RNG.integers(-2, 3, (5,)).astype(np.float64)
    assert (a == b).any()
    _check(getattr(frost, op), getattr(torch, op), a, b)


def test_clamp_scalar_bounds_ties_pass_gradient():
    a = np.array([-2.0, -1.0, 0.0, 1.0, 2.0])
    _check(lambda x: frost.clamp(x, -1.0, 1.0), lambda x: torch.clamp(x, -1.0, 1.0), a)
    _check(lambda x: x.clamp(min=0.0), lambda x: x.clamp(min=0.0), a)
    _check(lambda x: x.clamp(max=0.0), lambda x: x.clamp(max=0.0), a)


def test_clamp_tensor_bounds():
    a = RNG.integers(-3, 4, (4, 5)).astype(np.float64)
    lo = RNG.integers(-3, 0, (5,)).astype(np.float64)
    hi = RNG.integers(0, 3, (4, 1)).astype(np.float64)
    _check(lambda x, l, h: frost.clamp(x, l, h), lambda x, l, h: torch.clamp(x, l, h), a, lo, hi)


def test_clamp_of_int_tensor():
    x = frost.tensor([-3, 0, 3])
    assert frost.clamp(x, -2, 2).dtype == frost.int64 and frost.clamp(x, -2, 2).tolist() == [-2, 0, 2]
    assert frost.clamp(x, -2.5, 2).dtype == frost.float32 and frost.clamp(x, -2.5, 2).tolist() == [-2.5, 0.0, 2.0]


def test_clamp_needs_a_bound():
    with pytest.raises(ValueError, match="clamp"):
        frost.clamp(frost.ones(2))


def test_where_broadcast_grads():
    cond = RNG.random((3, 4)) > 0.5
    a, b = RNG.standard_normal((3, 4)), RNG.standard_normal((4,))
    fa, ta = _pair(a)
    fb, tb = _pair(b)
    fo = frost.where(frost.tensor(cond), fa, fb)
    to = torch.where(torch.tensor(cond), ta, tb)
    np.testing.assert_allclose(fo.detach().numpy(), to.detach().numpy())
    up = RNG.standard_normal((3, 4))
    fo.backward(frost.tensor(up))
    to.backward(torch.tensor(up))
    np.testing.assert_allclose(fa.grad.numpy(), ta.grad.numpy())
    np.testing.assert_allclose(fb.grad.numpy(), tb.grad.numpy())


def test_where_with_scalar_and_mixed_dtypes():
    cond = frost.tensor([True, False, True])
    x = frost.tensor([1.0, 2.0, 3.0], requires_grad=True)
    out = frost.where(cond, x, 0.0)
    np.testing.assert_array_equal(out.detach().numpy(), [1.0, 0.0, 3.0])
    y = frost.tensor([1.0, 2.0, 3.0], dtype=frost.float64, requires_grad=True)
    out = frost.where(cond, x, y)
    assert out.dtype == frost.float64
    out.sum().backward()
    assert x.grad.dtype == frost.float32 and y.grad.dtype == frost.float64
    np.testing.assert_array_equal(x.grad.numpy(), [1, 0, 1])
    np.testing.assert_array_equal(y.grad.numpy(), [0, 1, 0])


def test_masked_fill():
    a = RNG.standard_normal((3, 4))
    mask = RNG.random((1, 4)) > 0.5
    _check(lambda x: x.masked_fill(frost.tensor(mask), -5.0),
           lambda x: x.masked_fill(torch.tensor(mask), -5.0), a)


def test_comparisons_match_torch():
    a = RNG.integers(-2, 3, (3, 4)).astype(np.float32)
    b = RNG.integers(-2, 3, (4,)).astype(np.float32)
    fa, fb, ta, tb = frost.tensor(a), frost.tensor(b), torch.tensor(a), torch.tensor(b)
    for op in ["__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__"]:
        f, t = getattr(fa, op)(fb), getattr(ta, op)(tb)
        assert f.dtype == frost.bool
        np.testing.assert_array_equal(f.numpy(), t.numpy())
        np.testing.assert_array_equal(getattr(fa, op)(1).numpy(), getattr(ta, op)(1).numpy())
    m = fa > 0
    np.testing.assert_array_equal((~m).numpy(), (~(ta > 0)).numpy())
    np.testing.assert_array_equal((m & (fb > 0)).numpy(), ((ta > 0) & (tb > 0)).numpy())
    np.testing.assert_array_equal((m | (fb > 0)).numpy(), ((ta > 0) | (tb > 0)).numpy())


def test_floor_divide_and_remainder_match_torch():
    a = np.array([-7, -3, 0, 3, 7])
    fa, ta = frost.tensor(a), torch.tensor(a)
    np.testing.assert_array_equal((fa // 2).numpy(), (ta // 2).numpy())
    np.testing.assert_array_equal((fa % 3).numpy(), (ta % 3).numpy())
    np.testing.assert_array_equal((fa % -3).numpy(), (ta % -3).numpy())


# ------------------------------------------------------------------ dtypes: promotion and no needless upcasts

@pytest.mark.parametrize("da,db", [
    ("float32", "float64"), ("float16", "float32"), ("float16", "bfloat16"), ("int32", "float16"),
    ("int32", "int64"), ("uint8", "int8"), ("bool", "int32"), ("bool", "float32"), ("uint8", "bool"),
    ("int64", "bfloat16"),
])
def test_tensor_tensor_promotion(da, db):
    fa, fb = frost.ones(3, dtype=da), frost.ones(3, dtype=db)
    ta, tb = torch.ones(3, dtype=getattr(torch, da)), torch.ones(3, dtype=getattr(torch, db))
    assert (fa + fb).dtype.name == str((ta + tb).dtype).replace("torch.", "")
    assert (fb * fa).dtype.name == str((tb * ta).dtype).replace("torch.", "")


@pytest.mark.parametrize("da,db", [("float32", "float64"), ("int32", "float64"), ("int32", "int64"),
                                   ("bool", "int64"), ("float16", "float64"), ("uint8", "int8")])
def test_zero_dim_tensor_promotion(da, db):
    fa, fb = frost.ones(3, dtype=da), frost.ones((), dtype=db)
    ta, tb = torch.ones(3, dtype=getattr(torch, da)), torch.ones((), dtype=getattr(torch, db))
    assert (fa + fb).dtype.name == str((ta + tb).dtype).replace("torch.", "")
    assert (fb + fa).dtype.name == str((tb + ta).dtype).replace("torch.", "")


@pytest.mark.parametrize("dt", ["float32", "float64", "float16", "bfloat16", "int32", "int64", "uint8", "bool"])
@pytest.mark.parametrize("scalar", [2, 2.5, True])
def test_tensor_scalar_promotion(dt, scalar):
    f, t = frost.ones(3, dtype=dt), torch.ones(3, dtype=getattr(torch, dt))
    for fo, to in [(f + scalar, t + scalar), (scalar * f, scalar * t), (f / scalar, t / scalar)]:
        assert fo.dtype.name == str(to.dtype).replace("torch.", ""), (fo.dtype, to.dtype)
        np.testing.assert_allclose(fo.numpy().astype(np.float64), to.float().numpy().astype(np.float64))


@pytest.mark.parametrize("dt", ["float32", "float16", "bfloat16"])
def test_backward_keeps_low_precision_dtypes(dt):
    x = frost.randn(4, 5, dtype=dt, requires_grad=True)
    w = frost.randn(5, dtype=dt, requires_grad=True)
    y = frost.relu(x * w + x) - x / 3.0
    y = frost.maximum(y, frost.sigmoid(x)) * frost.tanh(w)
    assert y.dtype.name == dt
    seen = []
    fn = y._ctx.backward
    y._ctx.backward = lambda g: [seen.append(r.dtype) or r for r in fn(g)]
    y.sum().backward()
    assert x.grad.dtype.name == dt and w.grad.dtype.name == dt
    assert all(str(d) == dt for d in seen)


def test_ops_on_float32_do_not_upcast_inside():
    # every gradient array handed between ops must already be float32 (no float64 detours)
    x = frost.randn(3, 4, requires_grad=True)
    w = frost.randn(4, requires_grad=True)
    ops = []
    y = frost.exp(frost.gelu(x) * w + 2.0) / (1.0 + frost.silu(x)) - frost.minimum(x, w) + frost.clamp(x, -0.5, 0.5)
    stack, seen = [y], set()
    while stack:
        t = stack.pop()
        if t._ctx is None or id(t) in seen:
            continue
        seen.add(id(t))
        fn = t._ctx.backward
        t._ctx.backward = (lambda fn, name: lambda g: [ops.append((name, None if r is None else r.dtype)) or r
                                                       for r in fn(g)])(fn, t._ctx.name)
        stack.extend(t._ctx.parents)
    y.sum().backward()
    assert ops and all(d is None or d == np.float32 for _, d in ops), ops


def test_cast_gradient_returns_to_source_dtype():
    x = frost.randn(3, dtype=frost.float32, requires_grad=True)
    y = x.to(frost.float64) * 2
    assert y.dtype == frost.float64
    y.sum().backward()
    assert x.grad.dtype == frost.float32
    np.testing.assert_array_equal(x.grad.numpy(), [2, 2, 2])
    h = x.half()
    assert h.dtype == frost.float16 and h.requires_grad
    (h.float() * 3).sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [5, 5, 5])
    assert x.to(frost.int64).requires_grad is False


def test_unary_on_int_tensor_gives_float32():
    out = frost.exp(frost.tensor([0, 1]))
    assert out.dtype == frost.float32
    np.testing.assert_allclose(out.numpy(), [1.0, np.e], rtol=1e-6)


# ------------------------------------------------------------------ errors

def test_broadcast_error_names_op_and_shapes():
    with pytest.raises(RuntimeError, match=r"add: shapes \(3, 4\) and \(5,\) cannot be broadcast"):
        frost.ones(3, 4) + frost.ones(5)
    with pytest.raises(RuntimeError, match=r"mul: shapes \(2, 3\) and \(3, 2\)"):
        frost.ones(2, 3) * frost.ones(3, 2)


def test_unsupported_operand_error():
    with pytest.raises(TypeError, match="add: unsupported operand str"):
        frost.ones(2) + "a"


def test_device_mismatch_message_names_both_devices():
    # no second device here: check the message builder with a tensor that only pretends to live on a GPU
    class FakeCuda(frost.Tensor):
        @property
        def device(self):
            return frost.Device("cuda:0")
    fake = FakeCuda(np.ones(3, dtype=np.float32))
    with pytest.raises(RuntimeError, match=r"add: operands are on different devices: .*device=cpu.*device=cuda:0"):
        frost.ones(3) + fake
    with pytest.raises(RuntimeError, match=r"where: condition is on cuda:0 but values are on cpu"):
        frost.where(FakeCuda(np.ones(3, dtype=bool)), frost.ones(3), frost.zeros(3))


@pytest.mark.parametrize("dt", ["float32", "float16", "bfloat16", "float64"])
def test_erf_array_accuracy(dt):
    x = np.linspace(-6, 6, 2001).astype(frost.tensor([1.0], dtype=dt).data.dtype)
    ref = torch.erf(torch.tensor(x.astype(np.float64))).numpy()
    got = E.erf_array(x).astype(np.float64)
    tol = {"float64": 1e-15, "float32": 3e-7, "float16": 1e-3, "bfloat16": 8e-3}[dt]
    np.testing.assert_allclose(got, ref, atol=tol, rtol=0)
    assert E.erf_array(x).dtype == x.dtype


@pytest.mark.parametrize("dt", ["bfloat16", "float16"])
def test_low_precision_ops_keep_dtype_and_match_torch(dt):
    a = RNG.standard_normal((3, 4))
    fns = [lambda m, x: x.clamp(-0.5, 0.5), lambda m, x: x * 2.0 + 1, lambda m, x: x.exp(), lambda m, x: x.sigmoid(),
           lambda m, x: m.maximum(x, x * 0.3), lambda m, x: m.where(x > 0, x, x * 0.5), lambda m, x: 1 - x / 3,
           lambda m, x: x.relu(), lambda m, x: x.tanh(), lambda m, x: x ** 2]
    eps = 2.0 ** -8 if dt == "bfloat16" else 2.0 ** -11  # torch computes these in the same dtype: within 2 roundings
    g = RNG.standard_normal(a.shape)

    def close(ours, theirs):
        want = theirs.double().numpy()
        np.testing.assert_allclose(ours.detach().numpy().astype(np.float64), want, rtol=2 * eps,
                                   atol=2 * eps * abs(want).max())
    for fn in fns:
        fx = frost.tensor(a, dtype=dt, requires_grad=True)
        tx = torch.tensor(a, dtype=getattr(torch, dt), requires_grad=True)
        fo, to = fn(frost, fx), fn(torch, tx)
        assert fo.dtype.name == dt
        close(fo, to.detach())
        fo.backward(frost.tensor(g, dtype=dt))
        to.backward(torch.tensor(g, dtype=getattr(torch, dt)))
        assert fx.grad.dtype.name == dt
        close(fx.grad, tx.grad)


def _random_broadcast_pair(rng):
    """Two shapes that broadcast: a common shape with some dims set to 1 or dropped from the front."""
    full = tuple(int(n) for n in rng.integers(1, 5, int(rng.integers(0, 5))))
    def view(shape):
        shape = [1 if rng.random() < 0.3 else n for n in shape]
        return tuple(shape[int(rng.integers(0, len(shape) + 1)):]) if shape and rng.random() < 0.3 else tuple(shape)
    return view(full), view(full)


def _random_array(rng, shape):
    """float64 data of `shape`, made non-contiguous half of the time (a transposed view of a copy)."""
    if len(shape) >= 2 and rng.random() < 0.5:
        return rng.standard_normal(shape[::-1]).T
    return rng.standard_normal(shape)


@pytest.mark.parametrize("seed", range(40))
def test_random_broadcasting_binary_ops(seed):
    rng = np.random.default_rng(100 + seed)
    sa, sb = _random_broadcast_pair(rng)
    a, b = _random_array(rng, sa), _random_array(rng, sb)
    ops = {"add": lambda x, y: x + y, "sub": lambda x, y: x - y, "mul": lambda x, y: x * y,
           "div": lambda x, y: x / (y * y + 0.5), "pow": lambda x, y: (x * x + 0.5) ** y,
           "maximum": lambda x, y: (frost if isinstance(x, frost.Tensor) else torch).maximum(x, y),
           "where": lambda x, y: (frost if isinstance(x, frost.Tensor) else torch).where(x > y, x, y * 2)}
    name = str(rng.choice(sorted(ops)))
    _check(ops[name], ops[name], a, b)


MORE_UNARY = {
    "log1p": (frost.log1p, torch.log1p, "pos"), "expm1": (frost.expm1, torch.expm1, None),
    "reciprocal": (frost.reciprocal, torch.reciprocal, "pos"), "erf": (frost.erf, torch.erf, None),
    "floor": (frost.floor, torch.floor, None), "ceil": (frost.ceil, torch.ceil, None),
    "round": (frost.round, torch.round, None),
    "m_gelu": (lambda x: x.gelu(), torch.nn.functional.gelu, None),
    "m_silu": (lambda x: x.silu(), torch.nn.functional.silu, None),
    "m_softplus": (lambda x: x.softplus(), torch.nn.functional.softplus, None),
    "m_leaky_relu": (lambda x: x.leaky_relu(0.1), lambda x: torch.nn.functional.leaky_relu(x, 0.1), None),
}


@pytest.mark.parametrize("name", sorted(MORE_UNARY))
def test_more_unary(name):
    f, t, domain = MORE_UNARY[name]
    a = RNG.standard_normal((4, 5)) * 2
    if domain == "pos":
        a = np.abs(a) + 0.1
    if name == "round":
        a[0, :3] = [0.5, 1.5, -2.5]  # halves round to even
    _check(f, t, a.T)


def test_method_forms_of_operators():
    a, b = RNG.standard_normal((3, 4)), RNG.standard_normal((4,))
    _check(lambda x, y: x.add(y, alpha=2).sub(y).mul(x).div(y * y + 1).neg(),
           lambda x, y: x.add(y, alpha=2).sub(y).mul(x).div(y * y + 1).neg(), a, b)
    fa, ta = frost.tensor(a), torch.tensor(a)
    for op in ["eq", "ne", "lt", "le", "gt", "ge"]:
        np.testing.assert_array_equal(getattr(fa, op)(0.1).numpy(), getattr(ta, op)(0.1).numpy())
    np.testing.assert_array_equal(fa.gt(0).logical_and(fa.lt(1)).numpy(), ta.gt(0).logical_and(ta.lt(1)).numpy())
    np.testing.assert_array_equal(fa.gt(1).logical_or(fa.lt(-1)).numpy(), ta.gt(1).logical_or(ta.lt(-1)).numpy())
    assert fa.add(1, alpha=2).tolist() == (ta + 2).tolist()


def test_inf_and_nan_results_do_not_warn():
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # any NumPy RuntimeWarning fails the test
        x = frost.tensor([0.0, -1.0, 4.0], requires_grad=True)
        out = frost.log(x) + frost.sqrt(x) + 1 / x + x.rsqrt() + frost.log1p(x - 1) + x.reciprocal() + x ** 0.5
        out.sum().backward()
        assert not np.isfinite(out.detach().numpy()[:2]).any() and np.isfinite(out.detach().numpy()[2])


def test_remainder_gradients():
    a = RNG.uniform(-5, 5, (3, 4))
    b = RNG.uniform(0.5, 2, (4,)) * np.sign(RNG.standard_normal(4))
    _check(lambda x, y: x % y, lambda x, y: x % y, a, b)


def test_masked_fill_with_a_tensor_value_passes_it_its_gradient():
    a, mask = RNG.standard_normal((2, 3)), np.array([[True, False, True], [False, False, True]])
    fx, tx = frost.tensor(a, requires_grad=True), torch.tensor(a, requires_grad=True)
    fv, tv = frost.tensor(1.5, dtype=frost.float64, requires_grad=True), torch.tensor(1.5, dtype=torch.float64,
                                                                                     requires_grad=True)
    up = RNG.standard_normal((2, 3))
    (fx.masked_fill(frost.tensor(mask), fv) * frost.tensor(up)).sum().backward()
    (tx.masked_fill(torch.tensor(mask), tv) * torch.tensor(up)).sum().backward()
    np.testing.assert_allclose(fv.grad.numpy(), tv.grad.numpy(), rtol=1e-12)
    np.testing.assert_allclose(fx.grad.numpy(), tx.grad.numpy(), rtol=1e-12)


def test_erf_and_gelu_of_0_d_tensors():
    for value in (0.5, -1.25):
        for dtype, tdtype in ((frost.float64, torch.float64), (frost.float32, torch.float32)):
            f, t = frost.tensor(value, dtype=dtype), torch.tensor(value, dtype=tdtype)
            np.testing.assert_allclose(frost.erf(f).numpy(), torch.erf(t).numpy(), rtol=1e-6)
            np.testing.assert_allclose(frost.nn.functional.gelu(f).numpy(),
                                       torch.nn.functional.gelu(t).numpy(), rtol=1e-6)


@pytest.mark.parametrize("name", ["maximum", "minimum"])
def test_maximum_and_minimum_with_nan_pass_the_gradient_to_both_as_torch(name):
    a = np.array([1.0, np.nan, 3.0, np.nan, 2.0])
    b = np.array([2.0, 1.0, np.nan, np.nan, 2.0])
    fx, fy = frost.tensor(a, requires_grad=True), frost.tensor(b, requires_grad=True)
    tx, ty = torch.tensor(a, requires_grad=True), torch.tensor(b, requires_grad=True)
    getattr(frost, name)(fx, fy).sum().backward()
    getattr(torch, name)(tx, ty).sum().backward()
    np.testing.assert_array_equal(fx.grad.numpy(), tx.grad.numpy())
    np.testing.assert_array_equal(fy.grad.numpy(), ty.grad.numpy())


def test_masked_fill_with_a_broadcast_tensor_value_sums_its_gradient_per_element():
    """A value of shape (3,) broadcast over (2, 3): its gradient sums the masked places per column (a 0-d value
    gets all of them, as torch's)."""
    a, mask = RNG.standard_normal((2, 3)), np.array([[True, False, True], [True, True, False]])
    up = RNG.standard_normal((2, 3))
    x = frost.tensor(a, requires_grad=True)
    value = frost.tensor([1.0, 2.0, 3.0], dtype=frost.float64, requires_grad=True)
    (x.masked_fill(frost.tensor(mask), value) * frost.tensor(up)).sum().backward()
    np.testing.assert_allclose(value.grad.numpy(), (up * mask).sum(axis=0), rtol=1e-12)
    np.testing.assert_allclose(x.grad.numpy(), up * ~mask, rtol=1e-12)


@pytest.mark.parametrize("op", ["and", "or", "xor", "invert"])
@pytest.mark.parametrize("dtype", ["bool", "int64", "uint8", "int8"])
def test_bitwise_operators_as_pytorch(op, dtype):
    """& | ^ ~ are bitwise on integers (logical on bools), with scalars on either side, as torch's."""
    a = np.array([6, 5, 0, 3], dtype=dtype) if dtype != "bool" else np.array([True, False, True, False])
    b = np.array([3, 3, 1, 7], dtype=dtype) if dtype != "bool" else np.array([True, True, False, False])
    cases = {"and": [lambda x, y: x & y, lambda x, y: x & 1, lambda x, y: 1 & x],
             "or": [lambda x, y: x | y, lambda x, y: x | 2, lambda x, y: 2 | x],
             "xor": [lambda x, y: x ^ y, lambda x, y: x ^ 1, lambda x, y: 1 ^ x],
             "invert": [lambda x, y: ~x]}[op]
    for f in cases:
        ours, theirs = f(frost.tensor(a), frost.tensor(b)), f(torch.tensor(a), torch.tensor(b))
        assert ours.tolist() == theirs.tolist() and ours.dtype.name == str(theirs.dtype).split(".")[-1]
    with pytest.raises(TypeError, match="bitwise_and: defined for bool and integer tensors only"):
        frost.ones(2) & frost.ones(2)


def test_out_of_range_int_scalars_wrap_into_small_integer_types_as_pytorch():
    for dtype, values, f in [("uint8", [1, 200], lambda x: x + (-2)), ("uint8", [1, 200], lambda x: x + 300),
                             ("int8", [1, -1], lambda x: x * 1000), ("uint8", [1, 200], lambda x: x * -1)]:
        ours, theirs = f(frost.tensor(values, dtype=dtype)), f(torch.tensor(values, dtype=getattr(torch, dtype)))
        assert ours.tolist() == theirs.tolist() and ours.dtype == dtype


def test_integer_division_by_zero_raises_on_the_cpu_as_pytorch():
    for f in (lambda x: x // 0, lambda x: x % 0, lambda x: x // frost.tensor([0, 1]), lambda x: 7 % x):
        with pytest.raises(ZeroDivisionError, match="integer division by zero"):
            f(frost.tensor([0, -3]))
    assert (frost.tensor([5.0]) // 0).tolist() == (torch.tensor([5.0]) // 0).tolist()  # floats: inf, as torch


def test_clamp_with_tensor_bounds_keeps_nan_as_pytorch():
    x = [float("nan"), -2.0, 0.5, 3.0]
    for kwargs in (dict(min=[0.0] * 4), dict(max=[1.0] * 4), dict(min=[0.0] * 4, max=[1.0] * 4)):
        ours = frost.clamp(frost.tensor(x), **{k: frost.tensor(v) for k, v in kwargs.items()})
        theirs = torch.clamp(torch.tensor(x), **{k: torch.tensor(v) for k, v in kwargs.items()})
        np.testing.assert_array_equal(ours.numpy(), theirs.numpy())


def test_where_wants_a_bool_condition_and_takes_two_numbers():
    cond = [True, False, True]
    for a, b in [(1.0, 0.0), (1, 0), (2, 0.5), (True, False)]:
        ours, theirs = frost.where(frost.tensor(cond), a, b), torch.where(torch.tensor(cond), a, b)
        assert ours.tolist() == theirs.tolist() and ours.dtype.name == str(theirs.dtype).split(".")[-1]
    for bad in (frost.tensor([1.0, 0.0]), frost.tensor([1, 0])):
        with pytest.raises(TypeError, match="where: the condition must be a bool tensor"):
            frost.where(bad, frost.ones(2), frost.zeros(2))
    u8 = frost.tensor([100, 200], dtype="uint8")
    with pytest.raises(RuntimeError, match="where: the value 300 cannot be converted to frost.uint8 without overflow"):
        frost.where(u8 > 150, u8, 300)
    with pytest.raises(RuntimeError, match="value cannot be converted to type uint8_t without overflow"):
        torch.where(torch.tensor([True, False]), torch.tensor([100, 200], dtype=torch.uint8), 300)


def test_rounding_an_integer_tensor_gives_a_new_tensor():
    i = frost.tensor([1, 2])
    for r in (i.floor(), i.ceil(), i.round()):
        r.add_(10)
    assert i.tolist() == [1, 2]


def test_relu_passes_the_gradient_at_nan_as_pytorch():
    x = frost.tensor([float("nan"), -1.0, 2.0], requires_grad=True)
    t = torch.tensor([float("nan"), -1.0, 2.0], requires_grad=True)
    frost.relu(x).sum().backward()
    torch.relu(t).sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), t.grad.numpy())


@pytest.mark.parametrize("dt", ["float16", "bfloat16"])
@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_half_precision_gelu_and_leaky_relu_compute_in_float32_as_pytorch(dt, approximate):
    """gelu's negative tail survives (1 + erf(...) in float16 lost it) and leaky_relu keeps bfloat16.

    The oracle is float64 torch on the rounded inputs: a result computed in float32 and rounded once to
    the 16-bit dtype is within one unit in the last place of it, plus float32's own error in the negative
    tail: 1 + erf(x / sqrt 2) cancels there, so one float32 rounding of 1 is scaled by |x| in the value, and
    by the derivative's factors in the gradient (x times d/dx of tanh's argument for the tanh form).
    PyTorch's own 16-bit bits are not the oracle: they depend on which CPU vector path ran (bfloat16
    gelu(-5) differs between machines)."""
    a = np.array([-5.0, -4.0, -3.5, -1.0, 0.5, 3.0])
    ulp = 2.0 ** (-10 if dt == "float16" else -7)
    subnormal = 2.0 ** -24 if dt == "float16" else 0.0
    value_tail = 2.0 ** -23 * np.abs(a) + subnormal
    grad_tail = 2.0 ** -23 * ((1 + np.abs(a)) ** 3 / 2 if approximate == "tanh" else 1.0)
    x64 = torch.tensor(a, dtype=getattr(torch, dt)).double().requires_grad_()
    g = torch.tensor(np.random.default_rng(1).standard_normal(a.shape), dtype=getattr(torch, dt))
    fx = frost.tensor(x64.detach().numpy(), dtype=dt, requires_grad=True)
    for ours, exact in [(frost.nn.functional.gelu(fx, approximate=approximate),
                         torch.nn.functional.gelu(x64, approximate=approximate)),
                        (frost.nn.functional.leaky_relu(fx, 0.1), torch.nn.functional.leaky_relu(x64, 0.1))]:
        assert ours.dtype.name == dt
        _assert_within(ours.detach().numpy(), exact.detach().numpy(), ulp, value_tail)
        fx.grad, x64.grad = None, None
        ours.backward(frost.tensor(g.double().numpy(), dtype=dt))
        exact.backward(g.double())
        assert fx.grad.dtype.name == dt
        _assert_within(fx.grad.numpy(), x64.grad.numpy(), ulp, grad_tail * np.abs(g.double().numpy()) + subnormal)


def _assert_within(actual: np.ndarray, exact: np.ndarray, rtol: float, atol: np.ndarray) -> None:
    err = np.abs(actual.astype(np.float64) - exact)
    assert np.all(err <= rtol * np.abs(exact) + atol), (actual, exact, err)


# ------------------------------------------------------------------ sign, copysign, div(rounding_mode), isclose

def test_sgn_and_sign_match_torch():
    a = np.array([[-2.0, 0.0, 3.0], [-0.0, 1e-300, -np.inf]])
    for name in ["sign", "sgn"]:
        for f_out, t_out in [(getattr(frost, name)(frost.tensor(a)), getattr(torch, name)(torch.tensor(a))),
                             (getattr(frost.tensor(a), name)(), getattr(torch.tensor(a), name)())]:
            assert f_out.dtype == frost.float64
            np.testing.assert_array_equal(f_out.numpy(), t_out.numpy())
        f = frost.tensor(a, requires_grad=True)
        getattr(frost, name)(f).sum().backward()
        np.testing.assert_array_equal(f.grad.numpy(), np.zeros_like(a))  # torch's is a zero tensor too


@pytest.mark.parametrize("sa,sb", SHAPE_PAIRS)
def test_copysign_matches_torch(sa, sb):
    a, b = RNG.standard_normal(sa), RNG.standard_normal(sb)
    _check(frost.copysign, torch.copysign, a, b)


def test_copysign_zeros_scalars_and_integers():
    a, b = np.array([0.0, -0.0, 2.0, -3.0]), np.array([-1.0, 1.0, -0.0, 0.0])
    _check(frost.copysign, torch.copysign, a, b)
    _check(lambda x: x.copysign(-2.0), lambda x: x.copysign(-2.0), a)
    fi, ti = frost.tensor([1, -2, 3]), torch.tensor([1, -2, 3])
    f, t = frost.copysign(fi, -1), torch.copysign(ti, -1)
    assert f.dtype.name == str(t.dtype).replace("torch.", "") and f.tolist() == t.tolist()


@pytest.mark.parametrize("mode", [None, "trunc", "floor"])
def test_div_rounding_modes_match_torch(mode):
    a, b = RNG.standard_normal((3, 4)) * 5, RNG.standard_normal((4,))
    b = b + np.sign(b) * 0.5
    _check(lambda x, y: frost.div(x, y, rounding_mode=mode), lambda x, y: torch.div(x, y, rounding_mode=mode),
           a, b)
    _check(lambda x, y: x.div(y, rounding_mode=mode), lambda x, y: x.div(y, rounding_mode=mode), a, b)
    ints_a, ints_b = np.array([7, -7, 7, -7, 0, 6]), np.array([2, 2, -2, -2, 3, -3])
    f = frost.div(frost.tensor(ints_a), frost.tensor(ints_b), rounding_mode=mode)
    t = torch.div(torch.tensor(ints_a), torch.tensor(ints_b), rounding_mode=mode)
    assert f.dtype.name == str(t.dtype).replace("torch.", "") and f.tolist() == t.tolist()
    f, t = frost.div(frost.tensor(ints_a), -2, rounding_mode=mode), torch.div(torch.tensor(ints_a), -2,
                                                                              rounding_mode=mode)
    assert f.dtype.name == str(t.dtype).replace("torch.", "") and f.tolist() == t.tolist()


def test_div_rejects_unknown_rounding_mode_and_integer_zero():
    with pytest.raises(RuntimeError, match="rounding_mode to be one of None, 'trunc', or 'floor' but found 'up'"):
        frost.div(frost.ones(2), 2, rounding_mode="up")
    with pytest.raises(ZeroDivisionError, match="div"):
        frost.div(frost.tensor([1, 2]), frost.tensor([1, 0]), rounding_mode="trunc")


def test_isclose_and_allclose_match_torch():
    a = np.array([1.0, 2.0, np.nan, np.inf, -np.inf, 1e-9, 100.0])
    b = np.array([1.0 + 1e-6, 2.1, np.nan, np.inf, np.inf, 0.0, 100.001])
    for kwargs in [{}, {"equal_nan": True}, {"rtol": 1e-3, "atol": 0.0}, {"rtol": 0.0, "atol": 0.2}]:
        f = frost.isclose(frost.tensor(a), frost.tensor(b), **kwargs)
        t = torch.isclose(torch.tensor(a), torch.tensor(b), **kwargs)
        assert f.dtype == frost.bool and f.tolist() == t.tolist()
        assert frost.tensor(a).isclose(frost.tensor(b), **kwargs).tolist() == t.tolist()
        assert frost.allclose(frost.tensor(a), frost.tensor(b), **kwargs) == torch.allclose(
            torch.tensor(a), torch.tensor(b), **kwargs)
    assert frost.isclose(frost.ones(2, 3), frost.ones(3)).shape == (2, 3)  # broadcasts, as torch
    with pytest.raises(RuntimeError, match="isclose: .*float32 and float64"):
        frost.isclose(frost.ones(2), frost.ones(2, dtype=frost.float64))
    with pytest.raises(RuntimeError, match="isclose: shapes"):
        frost.isclose(frost.ones(2), frost.ones(3))
