"""Reductions and softmax against PyTorch: dims (int, tuple, negative), keepdim, values, indices and gradients."""
import warnings

import numpy as np
import pytest
import torch

import frost

RNG = np.random.default_rng(1)


def _check(frost_fn, torch_fn, array, atol=1e-10, rtol=1e-7):
    f = frost.tensor(array, requires_grad=True)
    t = torch.tensor(array, requires_grad=True)
    fo, to = frost_fn(f), torch_fn(t)
    assert fo.shape == tuple(to.shape), (fo.shape, to.shape)
    assert fo.dtype.name == str(to.dtype).replace("torch.", "")
    np.testing.assert_allclose(fo.detach().numpy(), to.detach().numpy(), atol=atol, rtol=rtol)
    up = RNG.standard_normal(fo.shape)
    fo.backward(frost.tensor(up, dtype=fo.dtype))
    to.backward(torch.tensor(up, dtype=to.dtype))
    assert f.grad.dtype == f.dtype
    np.testing.assert_allclose(f.grad.numpy(), t.grad.numpy(), atol=atol, rtol=rtol)


DIMS = [None, 0, -1, 1, (0, 2), (-1, 0), (0, 1, 2)]


@pytest.mark.parametrize("dim", DIMS)
@pytest.mark.parametrize("keepdim", [False, True])
@pytest.mark.parametrize("name", ["sum", "mean", "amax", "amin", "logsumexp", "var", "std"])
def test_reductions(name, dim, keepdim):
    a = RNG.standard_normal((3, 4, 5)).transpose(1, 0, 2)  # non-contiguous (4, 3, 5)
    if name in ("amax", "amin"):
        a = RNG.integers(-2, 3, (4, 3, 5)).astype(np.float64)  # many ties
    if dim is None and name in ("logsumexp",):
        dim = (0, 1, 2)
    if dim is None and keepdim and name in ("sum", "mean", "var", "std"):
        pytest.skip("torch has no keepdim without dim for these")

    def call(mod, x):
        f = getattr(mod, name)
        if dim is None:
            return f(x)
        return f(x, dim, keepdim=keepdim)
    _check(lambda x: call(frost, x), lambda x: call(torch, x), a)


@pytest.mark.parametrize("correction", [0, 1, 2])
@pytest.mark.parametrize("dim", [None, 1, (0, 2)])
def test_var_std_correction(correction, dim):
    a = RNG.standard_normal((3, 4, 5))
    _check(lambda x: frost.var(x, dim, correction=correction), lambda x: torch.var(x, dim, correction=correction), a)
    _check(lambda x: x.std(dim, correction=correction), lambda x: x.std(dim, correction=correction), a)
    _check(lambda x: x.var(dim, unbiased=False), lambda x: x.var(dim, unbiased=False), a)


def test_var_of_one_element_is_nan_not_an_exception():
    x = frost.tensor([1.5], requires_grad=True)
    v = x.var()
    assert np.isnan(v.item())
    v.backward()
    t = torch.tensor([1.5], dtype=torch.float64, requires_grad=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's "degrees of freedom is <= 0"
        t.var().backward()
    np.testing.assert_allclose(x.grad.numpy(), t.grad.numpy())  # [nan], as torch (NaN compares equal here)


@pytest.mark.parametrize("dim", [0, 1, -1])
@pytest.mark.parametrize("keepdim", [False, True])
@pytest.mark.parametrize("name", ["max", "min"])
def test_max_min_with_dim_values_and_indices(name, dim, keepdim):
    a = RNG.standard_normal((4, 5, 3))
    f = frost.tensor(a, requires_grad=True)
    t = torch.tensor(a, requires_grad=True)
    fv, fi = getattr(f, name)(dim, keepdim=keepdim)
    tv, ti = getattr(t, name)(dim, keepdim=keepdim)
    res = getattr(f, name)(dim, keepdim=keepdim)
    assert res.values is fv or np.array_equal(res.values.detach().numpy(), fv.detach().numpy())
    assert fi.dtype == frost.int64 and fi.shape == tuple(ti.shape)
    np.testing.assert_array_equal(fi.numpy(), ti.numpy())
    np.testing.assert_allclose(fv.detach().numpy(), tv.detach().numpy())
    up = RNG.standard_normal(fv.shape)
    fv.backward(frost.tensor(up))
    tv.backward(torch.tensor(up))
    np.testing.assert_allclose(f.grad.numpy(), t.grad.numpy())


@pytest.mark.parametrize("name", ["max", "min"])
def test_max_min_full_reduction_splits_ties(name):
    a = np.array([[1.0, 3.0, 3.0], [-1.0, 3.0, -1.0]])
    _check(lambda x: getattr(x, name)(), lambda x: getattr(x, name)(), a)


def test_max_of_two_tensors_is_maximum():
    a, b = frost.tensor([1.0, 5.0]), frost.tensor([3.0, 2.0])
    np.testing.assert_array_equal(frost.max(a, b).numpy(), [3.0, 5.0])
    np.testing.assert_array_equal(frost.min(a, b).numpy(), [1.0, 2.0])


@pytest.mark.parametrize("dim", [None, 0, 1, -1])
@pytest.mark.parametrize("keepdim", [False, True])
def test_argmax_argmin(dim, keepdim):
    a = RNG.standard_normal((4, 6))
    for name in ["argmax", "argmin"]:
        f = getattr(frost.tensor(a), name)(dim, keepdim=keepdim)
        t = getattr(torch.tensor(a), name)(dim, keepdim=keepdim)
        assert f.dtype == frost.int64 and f.shape == tuple(t.shape)
        np.testing.assert_array_equal(f.numpy(), t.numpy())


@pytest.mark.parametrize("dim", [0, 1, -1])
@pytest.mark.parametrize("name", ["softmax", "log_softmax"])
def test_softmax_family(name, dim):
    a = RNG.standard_normal((3, 4, 5)) * 5
    _check(lambda x: getattr(frost, name)(x, dim), lambda x: getattr(torch, name)(x, dim), a)
    _check(lambda x: getattr(x, name)(dim), lambda x: getattr(x, name)(dim), a.transpose(2, 0, 1))


def test_softmax_large_logits_stay_finite():
    a = np.array([[1000.0, 0.0, -1000.0]], dtype=np.float32)
    _check(lambda x: frost.softmax(x, -1), lambda x: torch.softmax(x, -1), a, atol=1e-6)
    _check(lambda x: frost.log_softmax(x, -1), lambda x: torch.log_softmax(x, -1), a, atol=1e-4)
    _check(lambda x: frost.logsumexp(x, -1), lambda x: torch.logsumexp(x, -1), a, atol=1e-4)


def test_logsumexp_all_neg_inf_row():
    a = np.array([[-np.inf, -np.inf], [0.0, 1.0]])
    out = frost.logsumexp(frost.tensor(a), 1).numpy()
    np.testing.assert_allclose(out, torch.logsumexp(torch.tensor(a), 1).numpy())


@pytest.mark.parametrize("p", [2, 1, 3, float("inf"), "fro"])
@pytest.mark.parametrize("dim", [None, 1, (0, 1)])
@pytest.mark.parametrize("keepdim", [False, True])
def test_norm(p, dim, keepdim):
    a = RNG.standard_normal((3, 4))
    if dim is None and keepdim:
        pytest.skip("torch.norm ignores keepdim without dim")
    if p == "fro" and dim == 1:
        pytest.skip("torch's 'fro' wants two dims")
    _check(lambda x: frost.Tensor.norm(x, p, dim, keepdim), lambda x: torch.norm(x, p, dim, keepdim), a)


def test_norm_gradient_at_zero_is_zero():
    x = frost.zeros(3, dtype=frost.float64, requires_grad=True)
    with frost.autograd.detect_anomaly():
        x.norm().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [0.0, 0.0, 0.0])


def test_sum_dtypes():
    assert frost.tensor([1, 2], dtype=frost.int32).sum().dtype == frost.int64
    assert frost.tensor([True, True, False]).sum().item() == 2
    assert frost.ones(3).sum(dtype=frost.float64).dtype == frost.float64
    assert frost.ones(3, dtype=frost.float16).sum().dtype == frost.float16


@pytest.mark.parametrize("dt", ["float16", "bfloat16"])
def test_low_precision_sum_and_mean_accumulate_in_float32(dt):
    x = frost.ones(4096, dtype=dt) * 0.1
    t = torch.ones(4096, dtype=getattr(torch, dt)) * 0.1
    np.testing.assert_allclose(float(x.sum().item()), float(t.sum().item()), rtol=1e-2)
    np.testing.assert_allclose(float(x.mean().item()), float(t.mean().item()), rtol=1e-2)
    assert x.sum().dtype.name == dt


def test_mean_of_int_tensor_errors():
    with pytest.raises(TypeError, match="mean: needs a floating-point tensor"):
        frost.tensor([1, 2]).mean()


def test_bad_dim_errors():
    with pytest.raises(IndexError, match="sum: dim 3 is out of range for a tensor with 2 dimensions"):
        frost.ones(2, 3).sum(3)
    with pytest.raises(IndexError, match="softmax: dim -3"):
        frost.ones(2, 3).softmax(-3)
    with pytest.raises(RuntimeError, match=r"sum: dim \(0, -2\) names the same dimension more than once"):
        frost.ones(2, 3).sum((0, -2))
    with pytest.raises(TypeError, match=r"max: dim must be a single int, got \(0, 1\)"):
        frost.ones(2, 3).max(dim=(0, 1))


def test_reductions_of_float32_stay_float32():
    x = frost.randn(4, 5, requires_grad=True)
    for f in [lambda t: t.sum(1), lambda t: t.mean(0), lambda t: t.var(1), lambda t: t.amax(1),
              lambda t: t.max(1).values, lambda t: t.max(), lambda t: t.softmax(1), lambda t: t.log_softmax(0),
              lambda t: t.logsumexp(1), lambda t: t.norm(dim=1), lambda t: t.std()]:
        out = f(x)
        assert out.dtype == frost.float32
        x.grad = None
        g0 = out._ctx.backward(np.ones(out.shape, np.float32))[0]
        assert g0.dtype == np.float32


def test_all_any():
    a = np.array([[True, False], [True, True]])
    f, t = frost.tensor(a), torch.tensor(a)
    assert f.all().item() is False and f.any().item() is True
    np.testing.assert_array_equal(f.all(1).numpy(), t.all(1).numpy())
    np.testing.assert_array_equal(f.any(0, keepdim=True).numpy(), t.any(0, keepdim=True).numpy())


@pytest.mark.filterwarnings("ignore::UserWarning")  # torch warns on var with too few samples
@pytest.mark.parametrize("seed", range(30))
def test_random_reductions(seed):
    rng = np.random.default_rng(200 + seed)
    shape = tuple(int(n) for n in rng.integers(1, 5, int(rng.integers(1, 5))))
    a = rng.standard_normal(shape)
    if len(shape) >= 2 and rng.random() < 0.5:
        a = rng.standard_normal(shape[::-1]).T  # non-contiguous
    nd = len(shape)
    k = int(rng.integers(1, nd + 1))
    dims = tuple(int(d) - (nd if rng.random() < 0.5 else 0) for d in rng.permutation(nd)[:k])
    dim = dims[0] if len(dims) == 1 and rng.random() < 0.5 else dims
    keepdim = bool(rng.random() < 0.5)
    name = str(rng.choice(["sum", "mean", "amax", "amin", "logsumexp", "var", "std"]))
    _check(lambda x: getattr(x, name)(dim, keepdim=keepdim), lambda x: getattr(x, name)(dim, keepdim=keepdim), a)
    one = dims[0]
    for fn in ["softmax", "log_softmax"]:
        _check(lambda x: getattr(x, fn)(one), lambda x: getattr(x, fn)(one), a)


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_cumsum(dim):
    _check(lambda x: x.cumsum(dim), lambda x: x.cumsum(dim), RNG.standard_normal((3, 4, 5)).transpose(2, 0, 1))
    _check(lambda x: frost.cumsum(x, dim), lambda x: torch.cumsum(x, dim), RNG.standard_normal((3, 4, 5)))
    assert frost.tensor([[1, 2], [3, 4]], dtype=frost.int32).cumsum(dim).dtype == frost.int64


@pytest.mark.parametrize("dim", [0, 1, -1])
@pytest.mark.parametrize("descending", [False, True])
def test_sort_and_argsort(dim, descending):
    a = RNG.standard_normal((4, 5, 3))
    f, t = frost.tensor(a, requires_grad=True), torch.tensor(a, requires_grad=True)
    fv, fi = f.sort(dim, descending=descending)
    tv, ti = t.sort(dim, descending=descending)
    np.testing.assert_array_equal(fi.numpy(), ti.numpy())
    np.testing.assert_array_equal(fv.detach().numpy(), tv.detach().numpy())
    np.testing.assert_array_equal(frost.argsort(f, dim, descending).numpy(), torch.argsort(t, dim, descending).numpy())
    up = RNG.standard_normal(fv.shape)
    fv.backward(frost.tensor(up))
    tv.backward(torch.tensor(up))
    np.testing.assert_allclose(f.grad.numpy(), t.grad.numpy())


def test_sort_is_stable_for_ties():
    a = [2, 1, 2, 1, 0]
    np.testing.assert_array_equal(frost.tensor(a).sort().indices.numpy(),
                                  torch.tensor(a).sort(stable=True).indices.numpy())
    np.testing.assert_array_equal(frost.tensor(a).sort(descending=True).indices.numpy(),
                                  torch.tensor(a).sort(descending=True, stable=True).indices.numpy())


@pytest.mark.parametrize("k,dim,largest", [(1, -1, True), (3, 1, True), (2, 0, False), (5, -1, False)])
def test_topk(k, dim, largest):
    a = RNG.standard_normal((4, 5))
    f, t = frost.tensor(a, requires_grad=True), torch.tensor(a, requires_grad=True)
    fv, fi = f.topk(k, dim, largest=largest)
    tv, ti = t.topk(k, dim, largest=largest)
    np.testing.assert_array_equal(fi.numpy(), ti.numpy())
    np.testing.assert_array_equal(fv.detach().numpy(), tv.detach().numpy())
    up = RNG.standard_normal(fv.shape)
    fv.backward(frost.tensor(up))
    tv.backward(torch.tensor(up))
    np.testing.assert_allclose(f.grad.numpy(), t.grad.numpy())
    with pytest.raises(RuntimeError, match=r"topk: k=9 is out of range for dim -1 of size 5"):
        f.topk(9)


def test_std_of_a_constant_slice_has_a_zero_gradient():
    a = np.array([[1.0, 2.0, 3.0], [4.0, 4.0, 4.0]])
    _check(lambda t: t.std(dim=1), lambda t: t.std(dim=1), a)
    _check(lambda t: t.std(), lambda t: t.std(), np.full((2, 3), 7.0))


def test_var_and_std_refuse_integers_as_torch():
    for fn in (frost.Tensor.var, frost.Tensor.std):
        with pytest.raises(TypeError, match=r"var/std: needs a floating-point tensor, got frost.int64"):
            fn(frost.tensor([1, 2, 9]))


def test_an_empty_dim_tuple_reduces_everything_as_torch():
    a = RNG.standard_normal((2, 3))
    for name in ("sum", "mean", "amax"):
        _check(lambda t: getattr(t, name)(dim=()), lambda t: getattr(t, name)(dim=()), a)


def test_max_and_min_of_a_tensor_holding_nan_send_the_gradient_to_the_nan():
    a = np.array([1.0, np.nan, 3.0])
    for name in ("max", "min"):
        f, t = frost.tensor(a, requires_grad=True), torch.tensor(a, requires_grad=True)
        getattr(f, name)().backward()
        getattr(t, name)().backward()
        np.testing.assert_array_equal(f.grad.numpy(), t.grad.numpy())


@pytest.mark.parametrize("dtype", ["uint8", "int8", "int64"])
def test_logsumexp_of_integers_is_float32_as_torch(dtype):
    a = np.array([[1, 2, 3], [100, 100, 100]], dtype=dtype)
    fo, to = frost.tensor(a).logsumexp(1), torch.tensor(a).logsumexp(1)
    assert fo.dtype == frost.float32
    np.testing.assert_allclose(fo.numpy(), to.numpy(), rtol=1e-6)


@pytest.mark.parametrize("dtype", ["int8", "int64", "float64", "bool"])
def test_descending_sort_topk_and_argsort_at_the_dtype_limits(dtype):
    """Negating the minimum of an integer type overflows; NaN sorts first in descending order, as torch."""
    values = {"int8": [-128, 5, 0, 5, 127, -128], "int64": [np.iinfo(np.int64).min, 3, 0, 3],
              "float64": [1.0, np.nan, 3.0, -np.inf, 3.0], "bool": [True, False, True, False]}[dtype]
    a = np.array(values, dtype=dtype)
    f, t = frost.tensor(a), torch.tensor(a)
    fs, ts = f.sort(descending=True), t.sort(descending=True, stable=True)
    np.testing.assert_array_equal(fs.values.numpy(), ts.values.numpy())
    np.testing.assert_array_equal(fs.indices.numpy(), ts.indices.numpy())  # stable: ties keep their order
    if dtype != "bool":
        np.testing.assert_array_equal(f.topk(2).values.numpy(), t.topk(2).values.numpy())


def test_norm_of_order_0_counts_the_non_zeros():
    a = np.array([[0.0, 2.0, -1.0], [0.0, 0.0, 3.0]])
    f, t = frost.tensor(a, requires_grad=True), torch.tensor(a, requires_grad=True)
    fo, to = f.norm(p=0, dim=1), torch.linalg.vector_norm(t, ord=0, dim=1)
    np.testing.assert_array_equal(fo.detach().numpy(), to.detach().numpy())
    fo.sum().backward()  # a count: no gradient flows (torch's graph has none)
    np.testing.assert_array_equal(f.grad.numpy(), np.zeros_like(a))


def test_reductions_over_a_non_empty_dim_of_an_empty_tensor_as_torch():
    f, t = frost.zeros(0, 3), torch.zeros(0, 3)
    assert f.max(dim=1).values.shape == tuple(t.max(dim=1).values.shape) == (0,)
    assert f.amin(dim=1).shape == (0,) and f.softmax(1).shape == f.log_softmax(1).shape == (0, 3)
    with pytest.raises(RuntimeError, match=r"max: cannot reduce an empty tensor of shape \(0, 3\) over a dimension"):
        f.max(dim=0)


def test_norm_edge_cases_as_pytorch():
    """p < 1 at zero entries (gradient 0, not NaN), float16 (computed in float32: 100^2 overflows), integers refused."""
    a = np.array([[0.0, 2.0, -3.0], [1.0, 0.0, 0.5]])
    g = RNG.standard_normal(2)
    x, t = frost.tensor(a, requires_grad=True), torch.tensor(a, requires_grad=True)
    x.norm(0.5, dim=1).backward(frost.tensor(g))
    t.norm(0.5, dim=1).backward(torch.tensor(g))
    np.testing.assert_allclose(x.grad.numpy(), t.grad.numpy(), rtol=1e-12)
    half = np.full(100, 100.0, np.float16)
    for p in (2, 3):
        ours, theirs = frost.tensor(half).norm(p), torch.tensor(half).norm(p)
        assert ours.dtype == frost.float16 and float(ours.item()) == float(theirs.item())
    for p in (1, 2, float("inf")):
        with pytest.raises(TypeError, match="norm: needs a floating-point tensor"):
            frost.tensor([1, -2]).norm(p)


def test_logsumexp_of_an_empty_dim_softmax_of_integers_and_all_of_uint8_as_pytorch():
    ours, theirs = frost.zeros(3, 0).logsumexp(1), torch.zeros(3, 0).logsumexp(1)
    assert ours.tolist() == theirs.tolist() == [float("-inf")] * 3
    for op in (frost.softmax, frost.log_softmax):
        with pytest.raises(TypeError, match="needs a floating-point tensor, got frost.int64"):
            op(frost.tensor([[1, 2, 3]]), -1)
    u8 = np.array([[1, 0], [2, 3]], np.uint8)
    for name in ("all", "any"):
        ours, theirs = getattr(frost.tensor(u8), name)(1), getattr(torch.tensor(u8), name)(1)
        assert ours.tolist() == theirs.tolist() and ours.dtype == frost.uint8 and theirs.dtype == torch.uint8


# ------------------------------------------------------------------ prod, var_mean, std_mean, NumPy's argument names

@pytest.mark.parametrize("dim", [None, 0, 1, -1])
@pytest.mark.parametrize("keepdim", [False, True])
def test_prod_matches_torch(dim, keepdim):
    a = RNG.uniform(0.5, 1.5, (3, 4, 5)) * RNG.choice([-1, 1], (3, 4, 5))
    if dim is None:
        _check(frost.prod, torch.prod, a)
        return
    _check(lambda x: frost.prod(x, dim, keepdim=keepdim), lambda x: torch.prod(x, dim, keepdim=keepdim), a)
    _check(lambda x: x.prod(dim, keepdim), lambda x: x.prod(dim, keepdim), a)


@pytest.mark.parametrize("row", [[2.0, 0.0, 3.0, 4.0], [0.0, 2.0, 3.0, 0.0], [0.0, 0.0, 0.0, 0.0],
                                 [-1.5, 2.0, 3.0, 0.5]])
def test_prod_gradient_with_zeros(row):
    a = np.array([row, row[::-1], [1.0, 2.0, 3.0, 4.0]])
    _check(lambda x: frost.prod(x, 1), lambda x: torch.prod(x, 1), a)
    _check(lambda x: frost.prod(x, 0, keepdim=True), lambda x: torch.prod(x, 0, keepdim=True), a)
    _check(frost.prod, torch.prod, a)
    _check(frost.prod, torch.prod, np.array(row))


def test_prod_dtypes_and_errors():
    ints = np.array([[1, 2, 3], [4, 5, 6]], dtype=np.int32)
    for f, t in [(frost.prod(frost.tensor(ints)), torch.prod(torch.tensor(ints))),
                 (frost.prod(frost.tensor(ints), 1), torch.prod(torch.tensor(ints), 1)),
                 (frost.tensor([True, False]).prod(), torch.tensor([True, False]).prod()),
                 (frost.prod(frost.tensor(ints), 0, dtype=frost.float64), torch.prod(torch.tensor(ints), 0,
                                                                                    dtype=torch.float64))]:
        assert f.dtype.name == str(t.dtype).replace("torch.", "") and f.tolist() == t.tolist()
    _check(lambda x: frost.prod(x, 0), lambda x: torch.prod(x, 0), np.array(2.5))  # 0-d
    with pytest.raises(IndexError, match="prod: dim 2 is out of range"):
        frost.prod(frost.ones(2, 3), 2)


@pytest.mark.parametrize("name", ["var_mean", "std_mean"])
@pytest.mark.parametrize("dim,keepdim,correction", [(None, False, 1), (1, True, 0), ((0, 2), False, 2),
                                                    (-1, False, 1)])
def test_var_mean_and_std_mean_match_torch(name, dim, keepdim, correction):
    a = RNG.standard_normal((3, 4, 5))
    for which in (0, 1):
        def frost_fn(x, which=which):
            return getattr(frost, name)(x, dim, keepdim=keepdim, correction=correction)[which]

        def torch_fn(x, which=which):
            return getattr(torch, name)(x, dim, keepdim=keepdim, correction=correction)[which]
        _check(frost_fn, torch_fn, a)
    # both results in one graph: the gradient sums over them, as torch's
    f, t = frost.tensor(a, requires_grad=True), torch.tensor(a, requires_grad=True)
    fv, fm = getattr(frost, name)(f, dim, keepdim=keepdim, correction=correction)
    tv, tm = getattr(torch, name)(t, dim, keepdim=keepdim, correction=correction)
    (fv * 2 + fm).sum().backward()
    (tv * 2 + tm).sum().backward()
    np.testing.assert_allclose(f.grad.numpy(), t.grad.numpy(), atol=1e-10)


REDUCTIONS_WITH_AXIS = ["sum", "mean", "amax", "amin", "var", "std", "prod", "argmax", "argmin", "logsumexp",
                        "norm", "all", "any", "max", "min"]


@pytest.mark.parametrize("name", REDUCTIONS_WITH_AXIS)
def test_numpy_argument_names_axis_and_keepdims(name):
    """axis= for dim= and keepdims= for keepdim=, as PyTorch accepts them, on the functions and the methods."""
    a = RNG.standard_normal((3, 4))
    if name in ("all", "any"):
        a = a > 0
    f_arg, t_arg = frost.tensor(a), torch.tensor(a)
    # the oracle is called with dim= and keepdim= (torch.norm has no axis=)
    for f, t in [(getattr(frost, name)(f_arg, axis=1, keepdims=True), getattr(torch, name)(t_arg, dim=1,
                                                                                           keepdim=True)),
                 (getattr(f_arg, name)(axis=0), getattr(t_arg, name)(dim=0)),
                 (getattr(f_arg, name)(1, keepdims=True), getattr(t_arg, name)(1, keepdim=True))]:
        if name in ("max", "min"):
            np.testing.assert_array_equal(f.indices.numpy(), t.indices.numpy())
            f, t = f.values, t.values
        assert f.shape == tuple(t.shape) and f.dtype.name == str(t.dtype).replace("torch.", "")
        np.testing.assert_allclose(f.numpy(), t.numpy(), atol=1e-12)
    with pytest.raises(TypeError, match=f"{name}: got both dim and axis"):
        getattr(frost, name)(f_arg, dim=0, axis=1)


def test_axis_keeps_the_gradient():
    _check(lambda x: frost.sum(x, axis=(0, 2), keepdims=True), lambda x: torch.sum(x, axis=(0, 2), keepdims=True),
           RNG.standard_normal((2, 3, 4)))
    _check(lambda x: x.var(axis=1, correction=0), lambda x: x.var(axis=1, correction=0),
           RNG.standard_normal((2, 3, 4)))


def test_logsumexp_needs_a_dim_as_torchs():
    x = frost.tensor(RNG.standard_normal((2, 3)))
    with pytest.raises(TypeError, match="dim"):
        x.logsumexp()
    with pytest.raises(TypeError, match="dim"):
        torch.tensor(x.numpy()).logsumexp()
    np.testing.assert_allclose(x.logsumexp(axis=1).numpy(), torch.tensor(x.numpy()).logsumexp(1).numpy(), rtol=1e-12)
