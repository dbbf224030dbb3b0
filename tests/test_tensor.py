"""The Tensor class and creation functions against PyTorch: dtype inference, conversions, random, repr."""
import ml_dtypes
import numpy as np
import pytest
import torch

import frost

DTYPES = ["float32", "float64", "float16", "bfloat16", "int32", "int64", "uint8", "bool"]


def _name(t) -> str:
    return t.dtype.name if isinstance(t, frost.Tensor) else str(t.dtype).replace("torch.", "")


# ------------------------------------------------------------------ tensor(): dtype inference as torch.tensor

@pytest.mark.parametrize("data", [
    1, 2.5, True, [1, 2, 3], [1.0, 2.0], [[1, 2], [3, 4]], [True, False], [1, 2.5], [True, 2], [],
    [[1.5], [2.5]], np.float64(2.0), np.array([1, 2], dtype=np.int32), np.array([1.0], dtype=np.float64),
    np.array([1, 2], dtype=np.uint8), np.array([1.0, 2.0], dtype=np.float16), np.array([True]),
])
def test_tensor_dtype_inference(data):
    f, t = frost.tensor(data), torch.tensor(data)
    assert _name(f) == _name(t)
    assert f.shape == tuple(t.shape)
    np.testing.assert_array_equal(f.numpy(), t.numpy())


def test_tensor_from_bfloat16_numpy_and_tensors():
    a = np.array([1.5, 2.0], dtype=ml_dtypes.bfloat16)
    assert frost.tensor(a).dtype == frost.bfloat16
    parts = [frost.tensor(1.0), frost.tensor(2.0)]
    assert frost.tensor(parts).tolist() == [1.0, 2.0]


def test_tensor_copies_its_input():
    a = np.zeros(3)
    t = frost.tensor(a)
    a[0] = 5
    assert t.numpy()[0] == 0
    t2 = frost.tensor(t)
    t2.data[1] = 7
    assert t.numpy()[1] == 0
    f = frost.from_numpy(a)
    a[1] = 3
    assert f.numpy()[1] == 3  # from_numpy shares memory


@pytest.mark.parametrize("dt", DTYPES)
def test_tensor_with_dtype(dt):
    f = frost.tensor([0, 1, 2], dtype=dt)
    t = torch.tensor([0, 1, 2], dtype=getattr(torch, dt))
    assert f.dtype.name == dt
    np.testing.assert_array_equal(f.numpy().astype(np.float64), t.float().numpy())


def test_tensor_rejects_bad_data():
    with pytest.raises(TypeError, match="tensor\\(\\): cannot make a tensor from data of dtype"):
        frost.tensor(["a", "b"])


# ------------------------------------------------------------------ factories

@pytest.mark.parametrize("dt", [None] + DTYPES)
def test_zeros_ones_full_empty(dt):
    kw = {} if dt is None else {"dtype": dt}
    tkw = {} if dt is None else {"dtype": getattr(torch, dt)}
    pairs = [(frost.zeros(2, 3, **kw), torch.zeros(2, 3, **tkw)), (frost.ones((2, 3), **kw), torch.ones((2, 3), **tkw)),
             (frost.full((2,), 1, **kw), torch.full((2,), 1, **tkw)), (frost.empty([4], **kw), torch.empty([4], **tkw))]
    for f, t in pairs:
        assert _name(f) == _name(t) and f.shape == tuple(t.shape)
    np.testing.assert_array_equal(frost.ones(2, 3, **kw).numpy().astype(float), np.ones((2, 3)))


def test_factory_scalar_shapes():
    assert frost.zeros(()).shape == () and frost.ones([]).shape == ()
    assert frost.zeros(0, 3).shape == (0, 3)


@pytest.mark.parametrize("value", [2, 2.5, True])
def test_full_infers_dtype_from_fill_value(value):
    assert _name(frost.full((2, 2), value)) == _name(torch.full((2, 2), value))
    np.testing.assert_array_equal(frost.full((2, 2), value).numpy(), torch.full((2, 2), value).numpy())


def test_like_factories():
    base = frost.ones(2, 3, dtype=frost.float64)
    for fn in [frost.zeros_like, frost.ones_like, frost.empty_like, frost.randn_like, frost.rand_like]:
        out = fn(base)
        assert out.shape == (2, 3) and out.dtype == frost.float64
    assert frost.full_like(base, 7).dtype == frost.float64 and frost.full_like(base, 7).numpy()[0, 0] == 7
    assert frost.zeros_like(base, dtype=frost.int32).dtype == frost.int32
    assert frost.zeros_like(base, requires_grad=True).requires_grad
    assert frost.randn_like(base, requires_grad=True).requires_grad
    np.testing.assert_array_equal(frost.zeros_like(base).numpy(), np.zeros((2, 3)))


@pytest.mark.parametrize("args", [(5,), (2, 7), (1, 10, 3), (0.0, 1.0, 0.25), (5.0,), (-3, 3), (10, 0, -2)])
def test_arange(args):
    f, t = frost.arange(*args), torch.arange(*args)
    assert _name(f) == _name(t)
    np.testing.assert_allclose(f.numpy(), t.numpy())
    assert frost.arange(4, dtype=frost.float64).dtype == frost.float64


def test_linspace_and_eye():
    np.testing.assert_allclose(frost.linspace(0, 1, 5).numpy(), torch.linspace(0, 1, 5).numpy())
    assert frost.linspace(0, 1, 5).dtype == frost.float32
    np.testing.assert_array_equal(frost.eye(3).numpy(), torch.eye(3).numpy())
    np.testing.assert_array_equal(frost.eye(2, 3).numpy(), torch.eye(2, 3).numpy())
    assert frost.eye(2, dtype=frost.int64).dtype == frost.int64


# ------------------------------------------------------------------ random

def test_manual_seed_reproducibility():
    frost.manual_seed(123)
    a = [frost.randn(3, 4), frost.rand(5), frost.randint(0, 10, (6,)), frost.randperm(7)]
    frost.manual_seed(123)
    b = [frost.randn(3, 4), frost.rand(5), frost.randint(0, 10, (6,)), frost.randperm(7)]
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x.numpy(), y.numpy())
    frost.manual_seed(124)
    assert not np.array_equal(frost.randn(3, 4).numpy(), a[0].numpy())


def test_random_distributions_and_dtypes():
    frost.manual_seed(0)
    n = frost.randn(20000)
    assert n.dtype == frost.float32 and abs(n.mean().item()) < 0.05 and abs(n.std().item() - 1) < 0.05
    u = frost.rand(20000, dtype=frost.float64)
    assert u.dtype == frost.float64 and 0 <= u.amin().item() and u.amax().item() < 1
    assert abs(u.mean().item() - 0.5) < 0.02
    assert frost.randn(2, 3, dtype=frost.bfloat16).dtype == frost.bfloat16
    assert frost.randn((2, 3)).shape == (2, 3)
    r = frost.randint(3, 7, (1000,))
    assert r.dtype == frost.int64 and r.amin().item() == 3 and r.amax().item() == 6
    r2 = frost.randint(5, (4, 2))  # randint(high, size) as in torch
    assert r2.shape == (4, 2) and r2.amax().item() < 5
    p = frost.randperm(10)
    assert p.dtype == frost.int64 and sorted(p.tolist()) == list(range(10))
    assert frost.randn(3, requires_grad=True).requires_grad


def test_inplace_random_init():
    frost.manual_seed(1)
    n = 100_000
    w = frost.empty(n, dtype="float64")
    w.uniform_(-2, 2)  # mean 0, std 4 / sqrt(12); bounds below: 4 standard errors
    assert -2 <= w.amin().item() and w.amax().item() <= 2 and w.amin().item() < -1.99
    assert abs(w.mean().item()) < 4 * (4 / 12 ** 0.5) / n ** 0.5
    assert abs(w.std().item() - 4 / 12 ** 0.5) < 4 * (4 / 12 ** 0.5) / (2 * n) ** 0.5 * 1.1
    w.normal_(3.0, 0.5)
    assert abs(w.mean().item() - 3.0) < 4 * 0.5 / n ** 0.5 and abs(w.std().item() - 0.5) < 4 * 0.5 / (2 * n) ** 0.5


# ------------------------------------------------------------------ conversions

@pytest.mark.parametrize("src", DTYPES)
@pytest.mark.parametrize("dst", DTYPES)
def test_to_dtype_matches_torch(src, dst):
    data = [0, 1, 2, 3] if src not in ("bool",) else [True, False, True, True]
    f = frost.tensor(data, dtype=src).to(dst)
    t = torch.tensor(data, dtype=getattr(torch, src)).to(getattr(torch, dst))
    assert f.dtype.name == dst
    np.testing.assert_array_equal(f.numpy().astype(np.float64), t.double().numpy())


def test_dtype_shortcuts():
    x = frost.tensor([1.7, -2.2])
    assert x.double().dtype == frost.float64 and x.half().dtype == frost.float16
    assert x.bfloat16().dtype == frost.bfloat16 and x.float().dtype == frost.float32
    assert x.long().tolist() == [1, -2] and x.int().dtype == frost.int32
    assert x.bool().tolist() == [True, True]
    assert x.to("float64").dtype == frost.float64 and x.to(frost.float16).dtype == frost.float16
    assert x.to("cpu") is x and x.cpu() is x
    assert x.to(dtype=frost.float32) is x
    assert x.type_as(frost.zeros(1, dtype=frost.float64)).dtype == frost.float64


def test_item_numpy_tolist():
    assert frost.tensor(2.5).item() == 2.5 and isinstance(frost.tensor(2.5).item(), float)
    assert frost.tensor(3).item() == 3 and isinstance(frost.tensor(3).item(), int)
    assert frost.tensor(True).item() is True
    assert isinstance(frost.tensor([1.5], dtype=frost.bfloat16).item(), float)
    assert isinstance(frost.tensor([2], dtype=frost.uint8).item(), int)
    assert frost.tensor([[1, 2]]).tolist() == [[1, 2]]
    assert frost.tensor([1.5, 2.0], dtype=frost.bfloat16).tolist() == [1.5, 2.0]
    x = frost.ones(2, 2)
    assert isinstance(x.numpy(), np.ndarray) and x.numpy().dtype == np.float32
    with pytest.raises(RuntimeError, match="item\\(\\): a tensor with 4 elements"):
        x.item()
    assert float(frost.tensor([2.0])) == 2.0 and int(frost.tensor(3)) == 3
    with pytest.raises(RuntimeError, match="ambiguous"):
        bool(frost.ones(2))
    assert [1, 2, 3][frost.tensor(1)] == 2


def test_tensor_properties():
    x = frost.zeros(2, 3, 4)
    assert x.shape == (2, 3, 4) and x.ndim == 3 and x.dim() == 3 and x.numel() == 24
    assert x.size() == (2, 3, 4) and x.size(-1) == 4 and len(x) == 2 and x.element_size() == 4
    assert x.device == "cpu" and str(x.device) == "cpu" and x.is_floating_point()
    assert [t.shape for t in frost.zeros(2, 3)] == [(3,), (3,)]
    with pytest.raises(TypeError, match="len\\(\\) of a 0-d tensor"):
        len(frost.tensor(1.0))


def test_requires_grad_and_detach():
    x = frost.ones(2)
    assert x.requires_grad_() is x and x.requires_grad and x.is_leaf
    d = x.detach()
    assert not d.requires_grad and np.shares_memory(d.numpy(), x.detach().numpy())
    x.requires_grad_(False)
    assert not x.requires_grad
    y = frost.ones(2, requires_grad=True) * 2
    y.detach_()
    assert not y.requires_grad and y.grad_fn is None


def torch_refusal(read) -> str:
    """PyTorch's message when `read` takes the values of a tensor that requires grad (the oracle)."""
    with pytest.raises(RuntimeError) as info:
        read(torch.ones(2, requires_grad=True))
    return str(info.value)


def test_numpy_refuses_a_tensor_that_requires_grad_as_pytorch():
    message = torch_refusal(lambda t: t.numpy())
    assert "detach().numpy()" in message
    leaf, made = frost.ones(2, requires_grad=True), frost.ones(2, requires_grad=True) * 2
    for t in (leaf, made):
        with pytest.raises(RuntimeError) as info:
            t.numpy()
        assert str(info.value) == message
        with frost.no_grad(), pytest.raises(RuntimeError, match="detach"):
            t.numpy()  # requires_grad is what counts, as in PyTorch
        assert str(pytest.raises(RuntimeError, np.asarray, t).value) == torch_refusal(np.asarray)  # __array__ too
        np.testing.assert_array_equal(t.detach().numpy(), t.detach().data)
        assert np.shares_memory(t.detach().numpy(), t.data)
    # reading the values otherwise stays allowed, as PyTorch allows it
    assert made.tolist() == [2.0, 2.0] and made[0].item() == 2.0
    assert repr(leaf) == "tensor([1., 1.], requires_grad=True)"
    assert frost.tensor([leaf[0], made[1]]).tolist() == [1.0, 2.0]


def test_in_place_helpers_without_grad():
    x = frost.zeros(3)
    x.add_(2).mul_(3).sub_(1).div_(5)
    np.testing.assert_allclose(x.numpy(), [1.0, 1.0, 1.0])
    x.add_(frost.ones(3), alpha=2.0)
    np.testing.assert_allclose(x.numpy(), [3.0, 3.0, 3.0])
    x.clamp_(max=2.0)
    np.testing.assert_allclose(x.numpy(), [2.0, 2.0, 2.0])
    x.copy_(frost.tensor([1.0, 2.0, 3.0], dtype=frost.float64))
    assert x.dtype == frost.float32 and x.tolist() == [1.0, 2.0, 3.0]
    x.zero_()
    assert x.tolist() == [0.0, 0.0, 0.0]
    x.fill_(4)
    assert x.tolist() == [4.0, 4.0, 4.0]


# ------------------------------------------------------------------ repr, as PyTorch prints

@pytest.mark.parametrize("make", [
    lambda m: m.tensor([1.0, 2.0, 3.0]),
    lambda m: m.tensor([0.5, 1.0]),
    lambda m: m.tensor([[1.5, 2.0], [3.0, 4.0]]),
    lambda m: m.tensor(3.0),
    lambda m: m.tensor(0.25),
    lambda m: m.tensor([1e10, 1.0]),
    lambda m: m.tensor([1e-5, 1.0]),
    lambda m: m.tensor([123456.7, 1.0]),
    lambda m: m.tensor([float("nan"), 1.5, float("inf")]),
    lambda m: m.tensor([-0.0, 1.0]),
    lambda m: m.tensor([-1.25, 100.0]),
    lambda m: m.tensor([0.0, 0.0]),
    lambda m: m.tensor([1, 2, 3]),
    lambda m: m.tensor([-10, 2]),
    lambda m: m.tensor([True, False]),
    lambda m: m.tensor([1, 2], dtype=m.int32),
    lambda m: m.tensor([1.0, 2.0], dtype=m.float64),
    lambda m: m.tensor([1.0, 2.0], dtype=m.float16),
    lambda m: m.tensor([1.5, 2.0], dtype=m.bfloat16),
    lambda m: m.tensor([]),
    lambda m: m.zeros(0, 3),
    lambda m: m.tensor([1.0, 2.0], requires_grad=True),
    lambda m: m.arange(24).reshape(2, 3, 4),
    lambda m: m.arange(24.0).reshape(2, 3, 4) / 7,
    lambda m: m.arange(40.0) / 3,
    lambda m: m.arange(3000.0).reshape(3, 1000),
    lambda m: m.arange(2000),
    lambda m: m.arange(5000.0).reshape(10, 10, 50) / 9,
], ids=lambda f: "")
def test_repr_matches_torch(make):
    f, t = make(frost), make(torch)
    expected = repr(t).replace("torch.", "frost.")
    assert repr(f) == expected


def test_repr_of_result_names_the_op():
    x = frost.tensor([1.0, 2.0], requires_grad=True)
    assert repr(x * 2) == "tensor([2., 4.], grad_fn=<mul>)"


def test_view_dtype_reinterprets_the_bytes_like_pytorch():
    x = frost.tensor([1.0, -2.0, 0.5])
    bits = x.view(frost.int32)
    assert bits.dtype == frost.int32
    np.testing.assert_array_equal(bits.numpy(), torch.tensor([1.0, -2.0, 0.5]).view(torch.int32).numpy())
    with pytest.raises(RuntimeError, match=r"view: cannot view frost.float32 \(itemsize 4\) as frost.int64"):
        x.view(frost.int64)


def test_a_number_on_the_left_of_floor_division_and_remainder():
    values = [3.0, -7.5, 2.0, 0.75]
    x, t = frost.tensor(values, dtype=frost.float64), torch.tensor(values, dtype=torch.float64)
    for number in (10, -4.5):
        np.testing.assert_array_equal((number // x).numpy(), (number // t).numpy())
        np.testing.assert_array_equal((number % x).numpy(), (number % t).numpy())


def test_in_place_arithmetic_keeps_the_tensor_and_pytorchs_types():
    """x op= y changes x itself (aliases and view bases see it), casting back only within x's kind, as torch."""
    for code in ["x -= 1", "x.sub_(m.tensor([1, 1]))", "x //= 2", "x %= 4", "x **= 2", "x &= 3", "x |= 8", "x ^= 1",
                 "x.add_(m.tensor([1, 2]), alpha=3)", "x.mul_(2)", "x += m.tensor([[1, 2]])[0]", "x.clamp_(6, 7)"]:
        results = []
        for m in (frost, torch):
            base = m.tensor([[5, 6]])
            x = base[0]
            exec(code, {"m": m, "x": x})
            results.append((base.tolist(), str(x.dtype).split(".")[-1]))
        assert results[0] == results[1], code
    u = frost.tensor([250], dtype="uint8")
    u -= 255
    assert u.tolist() == torch.tensor([250], dtype=torch.uint8).sub_(255).tolist()
    for code in ["x /= 2", "x += 0.5", "x.mul_(1.5)"]:
        with pytest.raises(RuntimeError, match="can't be cast to the tensor's type frost.int64"):
            exec(code, {"x": frost.tensor([5, 6])})
    with pytest.raises(RuntimeError, match=r"the result's shape \(2, 2\) does not fit the tensor's \(2,\)"):
        frost.ones(2).add_(frost.ones(2, 2))


def test_in_place_ops_refuse_an_operand_that_requires_grad():
    """The change would not be recorded, so the operand's gradient would be lost silently."""
    w = frost.tensor([1.0, 2.0], requires_grad=True)
    for op in (lambda a: a.add_(w), lambda a: a.mul_(w), lambda a: a.copy_(w * 2), lambda a: a.clamp_(min=w),
               lambda a: a.fill_(w.sum())):
        a = frost.zeros(2)
        with pytest.raises(RuntimeError, match="an operand requires grad"):
            op(a)
        assert a.tolist() == [0.0, 0.0]
    a = frost.zeros(2)
    a += w  # the operator form is done out of place and recorded
    a.sum().backward()
    assert w.grad.tolist() == [1.0, 1.0]
    with frost.no_grad():
        frost.zeros(2).add_(w)


def test_t_refuses_more_than_two_dims_and_fill_a_non_scalar():
    with pytest.raises(RuntimeError, match=r"t: expects a tensor with at most 2 dimensions, got shape \(2, 3, 4\)"):
        frost.zeros(2, 3, 4).t()
    assert frost.zeros(3).t().shape == (3,)
    with pytest.raises(RuntimeError, match="fill_: the value must be a number or a 0-d tensor"):
        frost.ones(2).fill_(frost.tensor([3.0, 4.0]))
    assert frost.ones(2).fill_(frost.tensor(3.0)).tolist() == [3.0, 3.0]


def test_tensor_keeps_precision_and_the_dtypes_of_numpy_scalars_and_tensors_as_pytorch():
    for make in [lambda m: m.tensor([np.float32(1), 2.5]), lambda m: m.tensor([np.int64(1), 2.5]),
                 lambda m: m.tensor([m.tensor(1.0), 2.0]), lambda m: m.tensor([np.float16(1), 2.0]),
                 lambda m: m.tensor([np.uint8(1), np.int8(2)]), lambda m: m.tensor([True, 2]), lambda m: m.tensor([]),
                 lambda m: m.tensor(3.5), lambda m: m.tensor([np.float64(1), 2]),
                 lambda m: m.tensor([0.1, 1 / 3], dtype=m.float64), lambda m: m.tensor(0.1, dtype=m.float64),
                 lambda m: m.ones(2, dtype=m.float64).new_tensor([0.1]), lambda m: m.tensor([np.float64(0.1)]),
                 lambda m: m.tensor([np.int32(1)]), lambda m: m.tensor([1, 2.5]), lambda m: m.tensor([[1, 2]]),
                 lambda m: m.tensor([m.tensor(0.1, dtype=m.float64), m.tensor(1 / 3, dtype=m.float64)])]:
        ours, theirs = make(frost), make(torch)
        assert ours.tolist() == theirs.tolist() and ours.dtype.name == str(theirs.dtype).split(".")[-1]


def test_arange_checks_its_step_and_steps_in_integers_for_integer_types():
    assert frost.arange(0, 5, 1.5, dtype="int64").tolist() == torch.arange(0, 5, 1.5, dtype=torch.int64).tolist()
    assert frost.arange(5, 0, -2).tolist() == torch.arange(5, 0, -2).tolist()
    with pytest.raises(RuntimeError, match="arange: the step -1 cannot go from start 0 to end 5"):
        frost.arange(0, 5, -1)
    with pytest.raises(RuntimeError, match="arange: step must be nonzero"):
        frost.arange(0, 5, 0)


def test_sizes_must_be_integers_and_random_floats_floating():
    with pytest.raises(TypeError, match=r"sizes must be integers, got \(2.0,\)"):
        frost.zeros(2.0)
    assert frost.zeros(np.int64(2), 3).shape == (2, 3)
    for draw in (frost.randn, frost.rand):
        with pytest.raises(TypeError, match="the dtype must be a floating one"):
            draw(4, dtype="int64")


def test_to_another_tensor_takes_its_dtype_and_retain_grad_needs_grad():
    mask = frost.tensor([1, 0])
    assert mask.to(frost.ones(2, dtype="float64")).dtype == frost.float64
    with pytest.raises(RuntimeError, match="retain_grad: the tensor .* does not require grad"):
        frost.ones(2).retain_grad()
    i = frost.tensor([1, 2, 3])
    i.requires_grad = True  # an assignment (requires_grad_ refuses integers at once)
    with pytest.raises(RuntimeError, match="a int64 tensor of shape \\(3,\\) requires grad; only floating-point"):
        (i.float() * 0.75).sum().backward()


def test_a_cpu_torch_tensor_becomes_an_array():
    """torch.Tensor defines __cuda_array_interface__ on its class (it raises on a CPU tensor): read it as an array."""
    t = frost.Tensor(torch.arange(3.0))
    assert isinstance(t.data, np.ndarray) and (t + 1).tolist() == [1.0, 2.0, 3.0]


def test_in_place_arithmetic_on_floats_runs_in_place_with_the_out_of_place_result():
    rng = np.random.default_rng(0)
    for dtype in ("float32", "float64", "float16", "bfloat16"):
        p, g = (frost.tensor(rng.standard_normal(6), dtype=dtype) for _ in range(2))
        for op, ref in [(lambda x: x.add_(g, alpha=-0.01), lambda x: x + g * -0.01), (lambda x: x.mul_(0.999),
                        lambda x: x * 0.999), (lambda x: x.sub_(g), lambda x: x - g), (lambda x: x.div_(g),
                        lambda x: x / g), (lambda x: x.add_(2), lambda x: x + 2)]:
            want, before = ref(p), p.data
            assert op(p) is p and p.data is before  # the tensor's own memory
            np.testing.assert_array_equal(p.numpy(), want.numpy(), err_msg=dtype)


def test_random_ops_refuse_what_torch_refuses():
    with pytest.raises(RuntimeError, match="randperm: n must be non-negative"):
        frost.randperm(-1)
    with pytest.raises(RuntimeError, match=r"randint: \[250, 300\) does not fit frost.uint8"):
        frost.randint(250, 300, (3,), dtype="uint8")
    assert frost.randint(0, 256, (100,), dtype="uint8").numpy().max() <= 255
    for draw in (lambda t: t.uniform_(0, 10), lambda t: t.normal_()):
        with pytest.raises(TypeError, match="draws floating-point numbers"):
            draw(frost.zeros(3, dtype="int64"))


@pytest.mark.parametrize("name", DTYPES + ["int8", "int16"])
def test_type_names_the_tensor_type_as_torch(name):
    f, t = frost.zeros(2, dtype=getattr(frost, name)), torch.zeros(2, dtype=getattr(torch, name))
    assert f.type() == t.type().replace("torch.", "frost.")


def test_type_with_a_dtype_casts():
    x = frost.tensor([1.5, -2.5], requires_grad=True)
    y = x.type(frost.float64)
    assert y.dtype == frost.float64 and y.tolist() == [1.5, -2.5]
    y.sum().backward()
    assert x.grad.dtype == frost.float32 and x.grad.tolist() == [1.0, 1.0]
    assert x.type("float16").dtype == frost.float16
    assert x.type("frost.LongTensor").dtype == frost.int64 and x.type("frost.LongTensor").tolist() == [1, -2]
    with pytest.raises(ValueError, match="type: unknown tensor type 'frost.FooTensor'"):
        x.type("frost.FooTensor")
