"""The math of frost.ops.math (element-wise functions, products, array helpers, median and quantile) against PyTorch
CPU float64: values and gradients, as frost.<name> and as Tensor methods."""
from functools import partial

import numpy as np
import pytest

import frost
from torch_compare import check_against_torch, check_cuda_matches_cpu

torch = pytest.importorskip("torch")

RNG = np.random.default_rng(5)
_check = partial(check_against_torch, rng=RNG)


def _both(name, arrays, *args, **kwargs):
    """frost.name and Tensor.name against torch's."""
    _check(lambda *a: getattr(frost, name)(*a, *args, **kwargs), lambda *a: getattr(torch, name)(*a, *args, **kwargs),
           arrays)
    if hasattr(torch.Tensor, name):
        _check(lambda x, *a: getattr(x, name)(*a, *args, **kwargs),
               lambda x, *a: getattr(x, name)(*a, *args, **kwargs), arrays)


# each function with inputs inside its domain, non-contiguous
UNARY = {
    "log2": lambda s: RNG.uniform(0.1, 5, s), "log10": lambda s: RNG.uniform(0.1, 5, s),
    "tan": lambda s: RNG.uniform(-1.2, 1.2, s), "sinh": lambda s: RNG.normal(0, 2, s),
    "cosh": lambda s: RNG.normal(0, 2, s), "asin": lambda s: RNG.uniform(-0.95, 0.95, s),
    "acos": lambda s: RNG.uniform(-0.95, 0.95, s), "atan": lambda s: RNG.normal(0, 3, s),
    "asinh": lambda s: RNG.normal(0, 3, s), "acosh": lambda s: RNG.uniform(1.05, 5, s),
    "atanh": lambda s: RNG.uniform(-0.95, 0.95, s), "square": lambda s: RNG.normal(0, 2, s),
}


@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary_matches_torch(name):
    _both(name, [UNARY[name]((5, 4)).T])


@pytest.mark.parametrize("name", ["atan2", "fmod", "hypot", "remainder", "pow"])
def test_binary_matches_torch_with_broadcasting(name):
    a = RNG.uniform(0.5, 3, (4, 3)).T * RNG.choice([-1, 1], (3, 4))
    b = RNG.uniform(0.5, 2, (4,)) * RNG.choice([-1, 1], 4)
    if name == "pow":
        a = np.abs(a)
    _both(name, [a, b])


@pytest.mark.parametrize("name", ["atan2", "fmod", "hypot", "remainder"])
def test_binary_with_a_number(name):
    a = RNG.uniform(0.5, 3, (3, 4))
    number = torch.tensor(1.5, dtype=torch.float64) if name in ("atan2", "hypot") else 1.5  # torch wants a tensor
    _check(lambda x: getattr(frost, name)(x, 1.5), lambda x: getattr(torch, name)(x, number), [a])


def test_fmod_and_remainder_of_integers():
    a, b = np.array([-7, -3, 3, 7]), np.array([2, -2, 2, -3])
    for name in ("fmod", "remainder"):
        assert getattr(frost, name)(frost.tensor(a), frost.tensor(b)).tolist() == \
            getattr(torch, name)(torch.tensor(a), torch.tensor(b)).tolist()
    with pytest.raises(ZeroDivisionError, match="fmod: integer division by zero"):
        frost.fmod(frost.tensor([3]), frost.tensor([0]))


def test_atan2_of_integers_is_float():
    out = frost.atan2(frost.tensor([1, -1]), frost.tensor([0, 0]))
    assert out.dtype == frost.float32
    np.testing.assert_allclose(out.numpy(), [np.pi / 2, -np.pi / 2], rtol=1e-6)


@pytest.mark.parametrize("weight", [0.3, 0.7, "tensor"])
def test_lerp(weight):
    start, end = RNG.standard_normal((3, 4)).T, RNG.standard_normal((4, 1))
    if weight == "tensor":
        _both("lerp", [start, end, RNG.uniform(-0.5, 1.5, (3,))])
    else:
        _both("lerp", [start, end], weight)


def test_lerp_weight_one_gives_end_exactly():
    start, end = frost.tensor([1e-3, 7.1]), frost.tensor([3.3, -2.2])
    assert frost.lerp(start, end, 1.0).tolist() == end.tolist()


def test_logical_ops():
    a, b = np.array([0, 1, 2, 0]), np.array([0.0, 0.0, 3.0, 1.5])
    for name in ("logical_and", "logical_or", "logical_xor"):
        out = getattr(frost, name)(frost.tensor(a), frost.tensor(b))
        assert out.dtype == frost.bool and out.tolist() == getattr(torch, name)(torch.tensor(a),
                                                                              torch.tensor(b)).tolist()
    assert frost.logical_not(frost.tensor(a)).tolist() == [True, False, False, True]


def test_clamp_min_and_max():
    a = np.array([-2.0, -1.0, 0.0, 1.0, 2.0])
    _both("clamp_min", [a], -1.0)
    _both("clamp_max", [a], 1.0)
    _both("clamp_min", [a, np.array([0.0, -1.0, 1.0, 1.0, 3.0])])  # a tensor bound


@pytest.mark.parametrize("kwargs", [{}, {"nan": 1.5, "posinf": 9.0, "neginf": -9.0}])
def test_nan_to_num(kwargs):
    _both("nan_to_num", [np.array([np.nan, np.inf, -np.inf, 2.0, -3.0])], **kwargs)
    assert frost.nan_to_num(frost.tensor([1, 2])).tolist() == [1, 2]


def test_outer_bmm_addmm_baddbmm():
    _both("outer", [RNG.standard_normal(4), RNG.standard_normal(3)])
    a, b = RNG.standard_normal((2, 5, 3)), RNG.standard_normal((2, 4, 3)).transpose(0, 2, 1)
    _both("bmm", [a, b])
    m1, m2 = RNG.standard_normal((3, 5)), RNG.standard_normal((4, 5)).T
    _both("addmm", [RNG.standard_normal((3, 4)), m1, m2])
    _both("addmm", [RNG.standard_normal(4), m1, m2], beta=0.5, alpha=2.0)  # broadcast input
    _both("baddbmm", [RNG.standard_normal((2, 5, 4)), a, b], beta=2.0, alpha=-1.0)


def test_addmm_with_beta_zero_ignores_nan_input():
    m1, m2 = frost.ones(2, 2), frost.ones(2, 2)
    nan_input = frost.full((2, 2), float("nan"), requires_grad=True)
    out = frost.addmm(nan_input, m1, m2, beta=0)
    assert out.tolist() == [[2.0, 2.0], [2.0, 2.0]]
    out.sum().backward()
    assert nan_input.grad.tolist() == [[0.0, 0.0], [0.0, 0.0]]


@pytest.mark.parametrize("dims", [2, 1, 0, ([1, 0], [0, 2]), ([2], [1])])
def test_tensordot(dims):
    a, b = RNG.standard_normal((3, 4, 5)), RNG.standard_normal((4, 5, 2)) if dims != ([2], [1]) else \
        RNG.standard_normal((2, 5, 3))
    if dims == ([1, 0], [0, 2]):
        b = RNG.standard_normal((4, 2, 3))
    if dims in (1, 0):
        b = RNG.standard_normal((5, 2)) if dims == 1 else RNG.standard_normal((2,))
    _check(lambda x, y: frost.tensordot(x, y, dims), lambda x, y: torch.tensordot(x, y, dims), [a.T.copy().T, b])


@pytest.mark.parametrize("shifts,dims", [(2, None), (-1, 0), ((1, 3), (0, 1)), (5, -1)])
def test_roll(shifts, dims):
    _both("roll", [RNG.standard_normal((4, 3)).T], shifts, dims)


@pytest.mark.parametrize("shape", [(4,), (3, 3), (3, 5), (5, 2)])
@pytest.mark.parametrize("diagonal", [0, 1, -2])
def test_diag(shape, diagonal):
    _both("diag", [RNG.standard_normal(shape)], diagonal)


@pytest.mark.parametrize("shape", [(3, 3), (2, 4), (4, 2)])
def test_trace(shape):
    _both("trace", [RNG.standard_normal(shape)])
    ints = np.arange(np.prod(shape), dtype=np.int32).reshape(shape)
    out, expected = frost.trace(frost.tensor(ints)), torch.trace(torch.tensor(ints))
    assert out.dtype == frost.int64 and out.item() == expected.item()


@pytest.mark.parametrize("n,dim", [(1, -1), (2, 0), (3, 1), (0, 1)])
def test_diff(n, dim):
    _both("diff", [RNG.standard_normal((4, 5)).T], n, dim)


def test_diff_with_prepend_append_and_bools():
    x, pre, app = RNG.standard_normal((3, 4)), RNG.standard_normal((3, 1)), RNG.standard_normal((3, 2))
    _check(lambda a, p, q: frost.diff(a, 2, 1, p, q), lambda a, p, q: torch.diff(a, 2, 1, p, q), [x, pre, app])
    flags = np.array([True, True, False, True])
    assert frost.diff(frost.tensor(flags)).tolist() == torch.diff(torch.tensor(flags)).tolist()


@pytest.mark.parametrize("dim", [None, 0, 1, (0, 1)])
def test_count_nonzero(dim):
    a = RNG.integers(-1, 2, (4, 5)).astype(np.float64)
    out, expected = frost.count_nonzero(frost.tensor(a), dim), torch.count_nonzero(torch.tensor(a), dim)
    assert out.dtype == frost.int64 and out.tolist() == expected.tolist()


@pytest.mark.parametrize("n", [5, 6])
def test_median_of_all_values_splits_the_gradient_among_ties(n):
    a = RNG.integers(0, 3, n).astype(np.float64)  # many ties
    _both("median", [a])


@pytest.mark.parametrize("dim,keepdim", [(0, False), (1, True), (-1, False)])
def test_median_along_a_dim(dim, keepdim):
    a = RNG.permutation(24).astype(np.float64).reshape(4, 6).T  # distinct values: the index is unique
    fo, to = frost.tensor(a).median(dim, keepdim), torch.tensor(a).median(dim, keepdim)
    assert fo.indices.tolist() == to.indices.tolist()
    _check(lambda x: frost.median(x, dim, keepdim).values, lambda x: torch.median(x, dim, keepdim).values, [a])


def test_median_with_nan_is_nan():
    a = np.array([[1.0, np.nan, 3.0], [3.0, 2.0, 1.0]])
    fo, to = frost.median(frost.tensor(a), 1), torch.median(torch.tensor(a), 1)
    np.testing.assert_array_equal(fo.values.numpy(), to.values.numpy())
    assert fo.indices.tolist() == to.indices.tolist()
    assert np.isnan(frost.median(frost.tensor(a)).item())


@pytest.mark.parametrize("interpolation", ["linear", "lower", "higher", "midpoint", "nearest"])
@pytest.mark.parametrize("q", [0.3, [0.0, 0.25, 0.5, 1.0]])
@pytest.mark.parametrize("dim,keepdim", [(None, False), (None, True), (1, False), (0, True)])
def test_quantile(interpolation, q, dim, keepdim):
    a = RNG.permutation(20).astype(np.float64).reshape(5, 4) + RNG.uniform(0, 0.5, (5, 4))
    qf = frost.tensor(q) if isinstance(q, list) else q
    qt = torch.tensor(q, dtype=torch.float64) if isinstance(q, list) else q
    _check(lambda x: frost.quantile(x, qf, dim, keepdim, interpolation),
           lambda x: torch.quantile(x, qt, dim, keepdim, interpolation=interpolation), [a])


def test_quantile_with_nan_is_nan():
    a = np.array([[1.0, np.nan, 3.0], [3.0, 2.0, 1.0]])
    np.testing.assert_array_equal(frost.quantile(frost.tensor(a), 0.5, 1).numpy(),
                                  torch.quantile(torch.tensor(a), 0.5, 1).numpy())


def test_bad_inputs_name_the_op_and_shapes():
    with pytest.raises(RuntimeError, match=r"bmm: expects two 3-D tensors, got shapes \(2, 3\) and \(2, 3, 4\)"):
        frost.bmm(frost.zeros(2, 3), frost.zeros(2, 3, 4))
    with pytest.raises(RuntimeError, match=r"bmm: shapes \(2, 3, 4\) and \(2, 5, 4\) do not fit"):
        frost.bmm(frost.zeros(2, 3, 4), frost.zeros(2, 5, 4))
    with pytest.raises(RuntimeError, match=r"addmm: input of shape \(3, 3\) cannot be broadcast to .* \(2, 2\)"):
        frost.addmm(frost.zeros(3, 3), frost.zeros(2, 4), frost.zeros(4, 2))
    with pytest.raises(RuntimeError, match=r"outer: expects two 1-D tensors, got shapes \(2, 2\) and \(3,\)"):
        frost.outer(frost.zeros(2, 2), frost.zeros(3))
    with pytest.raises(RuntimeError, match=r"tensordot: contracted dimensions must match.*\(2, 3\) and \(4, 5\)"):
        frost.tensordot(frost.zeros(2, 3), frost.zeros(4, 5), 1)
    with pytest.raises(RuntimeError, match=r"roll: shifts and dims must align"):
        frost.roll(frost.zeros(2, 3), (1, 2), 0)
    with pytest.raises(RuntimeError, match=r"diag: expects a 1-D or 2-D tensor, got shape \(2, 2, 2\)"):
        frost.diag(frost.zeros(2, 2, 2))
    with pytest.raises(RuntimeError, match=r"trace: expects a matrix .* got shape \(3,\)"):
        frost.trace(frost.zeros(3))
    with pytest.raises(ValueError, match=r"quantile: q must be .* in \[0, 1\]"):
        frost.quantile(frost.zeros(3), 1.5)
    with pytest.raises(RuntimeError, match=r"lerp: input .* and end .* must have the same dtype"):
        frost.lerp(frost.zeros(2), frost.zeros(2, dtype=frost.float64), 0.5)
    with pytest.raises(RuntimeError, match=r"atan2: shapes \(2,\) and \(3,\) cannot be broadcast"):
        frost.atan2(frost.zeros(2), frost.zeros(3))


@pytest.mark.cuda
def test_math_on_cuda_matches_cpu():
    a, b = RNG.uniform(0.2, 0.9, (3, 4)), RNG.uniform(0.2, 0.9, (4,))
    cases = [(frost.asin, [a]), (frost.log2, [a]), (frost.atan2, [a, b]), (frost.fmod, [a, b]),
             (frost.hypot, [a, b]), (lambda x, y: frost.lerp(x, y.expand(3, 4), 0.3), [a, b]),
             (lambda x: frost.roll(x, 1, 0), [a]), (frost.diag, [a]), (frost.trace, [a]),
             (lambda x: frost.diff(x, 1, 0), [a]), (lambda x: frost.quantile(x, 0.4, 1), [a]),
             (lambda x, y: frost.tensordot(x, y, 1), [a, b])]
    check_cuda_matches_cpu(cases)
