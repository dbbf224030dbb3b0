"""The scatter and index family (frost/ops/index.py) and getitem's placement of dims against PyTorch CPU float64:
values, gradients, in-place forms, and errors that name the op."""
import numpy as np
import pytest

import frost

torch = pytest.importorskip("torch")

RNG = np.random.default_rng(11)


def _leaves(*arrays):
    """(frost leaves, torch leaves) for float arrays; other arrays (indices, masks) as plain tensors."""
    fs, ts = [], []
    for a in arrays:
        grad = isinstance(a, np.ndarray) and a.dtype == np.float64
        fs.append(frost.tensor(a, requires_grad=grad) if isinstance(a, np.ndarray) else a)
        ts.append(torch.tensor(a, requires_grad=grad) if isinstance(a, np.ndarray) else a)
    return fs, ts


def _check(frost_fn, torch_fn, *arrays, atol=1e-12, values: bool = True):
    """Values (unless values=False: repeated indices leave the value written unspecified), then the gradients of
    every float input under a random upstream gradient."""
    fs, ts = _leaves(*arrays)
    fo, to = frost_fn(*fs), torch_fn(*ts)
    assert fo.shape == tuple(to.shape)
    if values:
        np.testing.assert_allclose(fo.detach().numpy(), to.detach().numpy(), atol=atol)
    up = RNG.standard_normal(fo.shape)
    fo.backward(frost.tensor(up))
    to.backward(torch.tensor(up))
    for f, t in zip(fs, ts):
        if isinstance(f, frost.Tensor) and f.requires_grad:
            np.testing.assert_allclose(f.grad.numpy(), t.grad.numpy(), atol=atol)


def _index(*shape, high):
    return RNG.integers(0, high, shape)


# ------------------------------------------------------------------ scatter, scatter_add

@pytest.mark.parametrize("dim", [0, 1, -1])
def test_scatter_and_scatter_add_match_torch(dim):
    x = RNG.standard_normal((4, 5))
    n = x.shape[dim]
    # a permutation per row or column (scatter's winner among repeats is unspecified), smaller than x elsewhere
    distinct = np.stack([RNG.permutation(n)[:3] for _ in range(3)])
    distinct = distinct.T if dim == 0 else distinct
    repeated = _index(*distinct.shape, high=n)  # repeats accumulate
    for index, frost_op, torch_op in ((distinct, frost.scatter, torch.scatter),
                                      (repeated, frost.scatter_add, torch.scatter_add)):
        src = RNG.standard_normal(index.shape[::-1]).T  # non-contiguous; PyTorch's gradient needs index's shape
        _check(lambda a, s: frost_op(a, dim, frost.tensor(index), s),
               lambda a, s: torch_op(a, dim, torch.tensor(index), s), x, src)
        larger = RNG.standard_normal((5, 6))  # src may be larger than index: its leading corner is read
        np.testing.assert_allclose(frost_op(frost.tensor(x), dim, frost.tensor(index), frost.tensor(larger)).numpy(),
                                   torch_op(torch.tensor(x), dim, torch.tensor(index), torch.tensor(larger)).numpy())
    _check(lambda a, s: a.scatter_add(dim, frost.tensor(repeated), s),
           lambda a, s: a.scatter_add(dim, torch.tensor(repeated), s), x, RNG.standard_normal(repeated.shape))


def test_scatter_gradient_with_repeated_indices():
    # the value written is unspecified, but each repeat gets its src gradient and self none there
    x, src = RNG.standard_normal((3, 4)), RNG.standard_normal((2, 4))
    index = np.array([[0, 1, 1, 2], [0, 1, 1, 2]])
    _check(lambda a, s: frost.scatter(a, 0, frost.tensor(index), s),
           lambda a, s: torch.scatter(a, 0, torch.tensor(index), s), x, src, values=False)


@pytest.mark.filterwarnings("ignore:The reduce argument of torch.scatter")
def test_scatter_value_and_reduce():
    x = RNG.standard_normal((3, 4))
    index = np.array([[2, 0, 1, 0]])
    _check(lambda a: frost.scatter(a, 0, frost.tensor(index), 1.5),
           lambda a: torch.scatter(a, 0, torch.tensor(index), 1.5), x)
    _check(lambda a: a.scatter(0, frost.tensor(index), value=-2.0),
           lambda a: a.scatter(0, torch.tensor(index), value=-2.0), x)
    dup = np.array([[0, 0, 2, 2], [0, 1, 2, 2]])
    for reduce in ("add", "multiply"):
        f = frost.scatter(frost.tensor(x), 0, frost.tensor(dup), frost.tensor(x[:2] + 1), reduce=reduce)
        t = torch.scatter(torch.tensor(x), 0, torch.tensor(dup), torch.tensor(x[:2] + 1), reduce=reduce)
        np.testing.assert_allclose(f.numpy(), t.numpy(), atol=1e-12)


# ------------------------------------------------------------------ scatter_reduce

@pytest.mark.parametrize("include_self", [True, False])
@pytest.mark.parametrize("reduce", ["sum", "prod", "mean", "amax", "amin"])
def test_scatter_reduce_matches_torch(reduce, include_self):
    x = RNG.standard_normal((5, 4))
    src = RNG.standard_normal((4, 6))[:, ::2]  # non-contiguous, index's shape (PyTorch's gradient needs it)
    index = _index(4, 3, high=3)  # repeats, and rows 3 and 4 of x that no index reaches
    _check(lambda a, s: frost.scatter_reduce(a, 0, frost.tensor(index), s, reduce, include_self=include_self),
           lambda a, s: torch.scatter_reduce(a, 0, torch.tensor(index), s, reduce, include_self=include_self),
           x, src)


@pytest.mark.parametrize("include_self", [True, False])
def test_scatter_reduce_prod_gradient_with_zeros(include_self):
    x = np.array([[0.0, 2.0, 3.0, 0.0], [1.0, 0.0, 2.0, 4.0]])
    src = np.array([[1.5, 0.0, 0.0, 2.0], [0.0, 3.0, 0.0, 0.5], [2.0, 2.0, 1.0, 0.0]])
    index = np.array([[0, 0, 1, 0], [0, 1, 1, 0], [1, 0, 1, 1]])
    _check(lambda a, s: a.scatter_reduce(0, frost.tensor(index), s, "prod", include_self=include_self),
           lambda a, s: a.scatter_reduce(0, torch.tensor(index), s, "prod", include_self=include_self), x, src)


@pytest.mark.parametrize("include_self", [True, False])
@pytest.mark.parametrize("reduce", ["amax", "amin"])
def test_scatter_reduce_extremes_share_ties(reduce, include_self):
    x = np.array([[1.0, 2.0, 0.0], [3.0, 1.0, 1.0]])
    if not include_self:
        # PyTorch counts a left-out self value among the ties when it equals the result (its src gradients then
        # sum to less than the upstream one); frost counts the values that take part, so compare where none ties
        x = x + 0.5
    src = np.array([[1.0, 2.0, 5.0], [1.0, 0.0, 1.0], [3.0, 2.0, 1.0]])
    index = np.array([[0, 0, 1], [0, 1, 1], [1, 0, 1]])
    _check(lambda a, s: frost.scatter_reduce(a, 0, frost.tensor(index), s, reduce, include_self=include_self),
           lambda a, s: torch.scatter_reduce(a, 0, torch.tensor(index), s, reduce, include_self=include_self),
           x, src)


def test_scatter_reduce_left_out_self_takes_no_share_of_ties():
    x, src = frost.tensor([1.0, 7.0], requires_grad=True), frost.tensor([1.0, 1.0], requires_grad=True)
    out = frost.scatter_reduce(x, 0, frost.tensor([0, 0]), src, "amax", include_self=False)
    out.backward(frost.tensor([1.0, 1.0]))
    assert out.tolist() == [1.0, 7.0] and x.grad.tolist() == [0.0, 1.0] and src.grad.tolist() == [0.5, 0.5]


@pytest.mark.parametrize("reduce", ["sum", "prod", "mean", "amax", "amin"])
def test_scatter_reduce_integers(reduce):
    x = RNG.integers(-5, 6, (3, 4))
    src = RNG.integers(-5, 6, (3, 4))
    index = _index(3, 4, high=2)
    for include_self in (True, False):
        f = frost.scatter_reduce(frost.tensor(x), 1, frost.tensor(index), frost.tensor(src), reduce,
                                 include_self=include_self)
        t = torch.scatter_reduce(torch.tensor(x), 1, torch.tensor(index), torch.tensor(src), reduce,
                                 include_self=include_self)
        assert f.dtype == frost.int64 and f.tolist() == t.tolist()


def test_product_of_long_runs():
    # one place collects 40 factors (six doubling steps), another 1, a third none
    src = RNG.uniform(0.5, 1.5, (42,))
    index = np.array([0] * 40 + [2, 0])
    _check(lambda a, s: frost.scatter_reduce(a, 0, frost.tensor(index), s, "prod"),
           lambda a, s: torch.scatter_reduce(a, 0, torch.tensor(index), s, "prod"), RNG.standard_normal(4), src,
           atol=1e-10)


# ------------------------------------------------------------------ index_add, index_copy, index_fill

@pytest.mark.parametrize("dim", [0, 1, -1])
def test_index_add_copy_fill_match_torch(dim):
    x = RNG.standard_normal((4, 5, 3)).transpose(1, 0, 2)  # (5, 4, 3), non-contiguous
    n = x.shape[dim]
    shape = list(x.shape)
    shape[dim] = 3
    source = RNG.standard_normal(shape)
    repeated, distinct = np.array([1, 0, 1]), RNG.permutation(n)[:3]
    _check(lambda a, s: frost.index_add(a, dim, frost.tensor(repeated), s, alpha=2.5),
           lambda a, s: torch.index_add(a, dim, torch.tensor(repeated), s, alpha=2.5), x, source)
    _check(lambda a, s: a.index_copy(dim, frost.tensor(distinct), s),
           lambda a, s: a.index_copy(dim, torch.tensor(distinct), s), x, source)
    _check(lambda a: a.index_fill(dim, frost.tensor(repeated), -1.0),
           lambda a: a.index_fill(dim, torch.tensor(repeated), -1.0), x)
    _check(lambda a, v: frost.index_fill(a, dim, frost.tensor(repeated), v),
           lambda a, v: torch.index_fill(a, dim, torch.tensor(repeated), v), x, np.array(0.5))


def test_index_copy_gradient_with_repeated_indices():
    x, source = RNG.standard_normal((3, 2)), RNG.standard_normal((3, 2))
    index = np.array([2, 0, 2])
    _check(lambda a, s: frost.index_copy(a, 0, frost.tensor(index), s),
           lambda a, s: torch.index_copy(a, 0, torch.tensor(index), s), x, source, values=False)


def test_zero_d_self_and_empty_index():
    _check(lambda a, s: frost.index_add(a, 0, frost.tensor([0]), s, alpha=2),
           lambda a, s: torch.index_add(a, 0, torch.tensor([0]), s, alpha=2), np.array(2.0), np.array(3.0))
    _check(lambda a: a.index_fill(0, frost.tensor(0), 5.0), lambda a: a.index_fill(0, torch.tensor(0), 5.0),
           np.array(2.0))
    empty = np.zeros(0, dtype=np.int64)
    x = RNG.standard_normal((3, 2))
    _check(lambda a, s: a.index_copy(0, frost.tensor(empty), s), lambda a, s: a.index_copy(0, torch.tensor(empty), s),
           x, np.zeros((0, 2)))
    _check(lambda a, s: a.scatter_add(1, frost.tensor(empty.reshape(3, 0)), s),
           lambda a, s: a.scatter_add(1, torch.tensor(empty.reshape(3, 0)), s), x, np.zeros((3, 0)))
    _check(lambda a, s: a.scatter_reduce(1, frost.tensor(empty.reshape(3, 0)), s, "prod"),
           lambda a, s: a.scatter_reduce(1, torch.tensor(empty.reshape(3, 0)), s, "prod"), x, np.zeros((3, 0)))


# ------------------------------------------------------------------ index_put

@pytest.mark.parametrize("accumulate", [False, True])
def test_index_put_matches_torch(accumulate):
    x = RNG.standard_normal((4, 5, 3))
    rows, cols = np.array([0, 2, 2, -1]), np.array([1, 4, 4, 0])  # a repeated place, a negative index
    values = RNG.standard_normal((4, 3))
    if not accumulate:
        rows, cols = rows[1:], cols[1:]
        values = values[1:]
    _check(lambda a, v: frost.index_put(a, (frost.tensor(rows), frost.tensor(cols)), v, accumulate),
           lambda a, v: torch.index_put(a, (torch.tensor(rows), torch.tensor(cols)), v, accumulate), x, values)
    # values broadcast, and a bool mask
    mask = RNG.random((4, 5)) > 0.5
    _check(lambda a, v: a.index_put((frost.tensor(mask),), v, accumulate=accumulate),
           lambda a, v: a.index_put((torch.tensor(mask),), v, accumulate=accumulate), x, RNG.standard_normal(3))


# ------------------------------------------------------------------ masks

def test_masked_select_and_masked_scatter_broadcast():
    x = RNG.standard_normal((3, 4)).T  # (4, 3), non-contiguous
    mask = RNG.random(3) > 0.4  # broadcasts along the rows
    mask[0] = True
    _check(lambda a: frost.masked_select(a, frost.tensor(mask)),
           lambda a: torch.masked_select(a, torch.tensor(mask)), x)
    _check(lambda a: a.masked_select(frost.tensor(mask[None, :])),
           lambda a: a.masked_select(torch.tensor(mask[None, :])), x[:1])
    source = RNG.standard_normal((5, 3))  # more values than places
    _check(lambda a, s: a.masked_scatter(frost.tensor(mask), s),
           lambda a, s: a.masked_scatter(torch.tensor(mask), s), x, source)


def test_masked_fill_function():
    x = RNG.standard_normal((2, 3))
    mask = np.array([True, False, True])
    _check(lambda a: frost.masked_fill(a, frost.tensor(mask), 7.0),
           lambda a: torch.masked_fill(a, torch.tensor(mask), 7.0), x)


# ------------------------------------------------------------------ in place

def test_in_place_forms_match_torch():
    x = RNG.standard_normal((3, 4))
    index = np.array([[2, 0, 1, 0]])
    src = RNG.standard_normal((1, 4))
    rows = np.array([0, 2])
    mask = x > 0
    calls = [
        ("scatter_", lambda t, T: (0, T(index), T(src))),
        ("scatter_add_", lambda t, T: (0, T(index), T(src))),
        ("scatter_reduce_", lambda t, T: (0, T(index), T(src), "amax")),
        ("index_add_", lambda t, T: (0, T(rows), T(x[:2]))),
        ("index_copy_", lambda t, T: (0, T(rows), T(x[:2] * 2))),
        ("index_fill_", lambda t, T: (1, T(np.array([3])), -1.0)),
        ("index_put_", lambda t, T: ((T(rows), T(np.array([1, 3]))), T(np.array([5.0, 6.0])), True)),
        ("masked_fill_", lambda t, T: (T(mask), 0.25)),
        ("masked_scatter_", lambda t, T: (T(mask), T(src.repeat(3, axis=0)))),
    ]
    for name, args in calls:
        f, t = frost.tensor(x), torch.tensor(x)
        version = f._version
        assert getattr(f, name)(*args(f, frost.tensor)) is f, name
        getattr(t, name)(*args(t, torch.tensor))
        np.testing.assert_allclose(f.numpy(), t.numpy(), err_msg=name)
        assert f._version == version + 1, name


def test_in_place_refuses_what_the_tape_would_lose():
    leaf = frost.tensor(RNG.standard_normal((3, 4)), requires_grad=True)
    with pytest.raises(RuntimeError, match="index_fill_"):
        leaf.index_fill_(0, frost.tensor([0]), 1.0)
    src = frost.tensor(RNG.standard_normal((1, 4)), requires_grad=True)
    with pytest.raises(RuntimeError, match="scatter_add_"):
        frost.zeros(3, 4, dtype=frost.float64).scatter_add_(0, frost.tensor([[0, 1, 2, 0]]), src)
    with frost.no_grad():
        leaf.index_fill_(0, frost.tensor([0]), 1.0)
    assert leaf[0].tolist() == [1.0] * 4


# ------------------------------------------------------------------ errors

def test_errors_name_the_op_dim_and_shapes():
    x = frost.zeros(3, 4, dtype=frost.float64)
    src = frost.ones(2, 4, dtype=frost.float64)
    with pytest.raises(IndexError, match=r"scatter: index 5 is out of bounds for dim 0 of size 3.*\(3, 4\)"):
        frost.scatter(x, 0, frost.tensor([[5, 0]]), src)
    with pytest.raises(IndexError, match=r"scatter_add: index -1 is out of bounds for dim 1 of size 4"):
        frost.scatter_add(x, 1, frost.tensor([[-1]]), src)
    with pytest.raises(RuntimeError, match=r"scatter_reduce: index must be no larger than self.*\(1, 5\)"):
        frost.scatter_reduce(x, 0, frost.tensor([[0, 1, 2, 0, 1]]), src, "sum")
    with pytest.raises(RuntimeError, match="scatter: index and src must have as many dimensions as self"):
        frost.scatter(x, 0, frost.tensor([0, 1]), 1.0)
    with pytest.raises(RuntimeError, match="scatter: index must be an integer tensor"):
        frost.scatter(x, 0, frost.tensor([[0.0]]), 1.0)
    with pytest.raises(RuntimeError, match=r"scatter: self \(float64, shape \(3, 4\)\) and src \(float32"):
        frost.scatter(x, 0, frost.tensor([[0]]), frost.ones(1, 1))
    with pytest.raises(RuntimeError, match="scatter_reduce: reduce must be one of"):
        frost.scatter_reduce(x, 0, frost.tensor([[0]]), src, "max")
    with pytest.raises(IndexError, match=r"index_add: index 7 is out of bounds for dim 0 of size 3"):
        frost.index_add(x, 0, frost.tensor([7]), frost.ones(1, 4, dtype=frost.float64))
    with pytest.raises(RuntimeError, match=r"index_copy: source of shape \(1, 3\) does not fit self of shape"):
        frost.index_copy(x, 0, frost.tensor([0]), frost.ones(1, 3, dtype=frost.float64))
    with pytest.raises(IndexError, match=r"index_put: index 3 is out of bounds for dim 0 of size 3"):
        frost.index_put(x, (frost.tensor([3]),), frost.tensor(1.0, dtype=frost.float64))
    with pytest.raises(RuntimeError, match="masked_select: mask must be a bool tensor"):
        frost.masked_select(x, frost.ones(3, 4))
    with pytest.raises(RuntimeError, match=r"masked_select: mask of shape \(2,\) does not broadcast"):
        frost.masked_select(x, frost.tensor([True, False]))
    with pytest.raises(RuntimeError, match="masked_scatter: mask .* selects 12 places but source"):
        frost.masked_scatter(x, frost.ones(3, 4, dtype=frost.bool), src)


# ------------------------------------------------------------------ getitem places dims as PyTorch

PATTERNS = {
    "slice, int, slice, tensor": lambda T: (slice(None), 0, slice(None), T([0, 2, 2])),
    "int, slice, tensor": lambda T: (1, slice(None), T([3, 0])),
    "slice, tensor, slice, int": lambda T: (slice(None), T([1, 2]), slice(None), 4),
    "None, slice, int, slice, tensor": lambda T: (None, slice(None), 0, slice(None), T([0, 1])),
    "slices with steps around an int": lambda T: (slice(1, None), -1, slice(None, None, 2), T([[0, 4], [1, 1]])),
    "ellipsis between an int and a tensor": lambda T: (slice(None), 0, Ellipsis, T([1, 1, 0])),
    "mask, int": lambda T: (slice(None), T([True, False, True]), slice(None), 2),
    "int, bool, slice, tensor": lambda T: (0, True, slice(None), T([0, 2])),
    "0-d tensor as an int": lambda T: (slice(None), T(1), slice(None), T([3, 1])),
    "tensors apart, int between": lambda T: (T([0, 1]), 2, slice(None), T([1, 4])),
    "adjacent int and tensor": lambda T: (slice(None), 1, T([0, 3]), slice(None)),
}


@pytest.mark.parametrize("pattern", PATTERNS)
def test_getitem_places_dims_as_torch(pattern):
    x = RNG.standard_normal((2, 3, 4, 5))
    _check(lambda a: a[PATTERNS[pattern](frost.tensor)], lambda a: a[PATTERNS[pattern](torch.tensor)], x)


@pytest.mark.parametrize("pattern", PATTERNS)
def test_setitem_places_dims_as_torch(pattern):
    x = RNG.standard_normal((2, 3, 4, 5))
    f, t = frost.tensor(x), torch.tensor(x)
    value = RNG.standard_normal(tuple(t[PATTERNS[pattern](torch.tensor)].shape))
    f[PATTERNS[pattern](frost.tensor)] = frost.tensor(value)
    t[PATTERNS[pattern](torch.tensor)] = torch.tensor(value)
    np.testing.assert_array_equal(f.numpy(), t.numpy())


# ------------------------------------------------------------------ on the GPU, against the CPU

@pytest.mark.cuda
@pytest.mark.parametrize("reduce", ["sum", "prod", "mean", "amax", "amin"])
def test_scatter_reduce_on_cuda_matches_cpu(reduce):
    x, src = RNG.standard_normal((5, 4)), RNG.standard_normal((6, 4))
    index = frost.tensor(_index(6, 4, high=3))
    results = []
    for device in ("cpu", "cuda"):
        a = frost.tensor(x, device=device, requires_grad=True)
        s = frost.tensor(src, device=device, requires_grad=True)
        out = frost.scatter_reduce(a, 0, index.to(device), s, reduce, include_self=False)
        out.backward(frost.tensor(np.cos(np.arange(20.0)).reshape(5, 4), device=device))
        results.append([out.detach().cpu().numpy(), a.grad.cpu().numpy(), s.grad.cpu().numpy()])
    for cpu, cuda in zip(*results):  # float64 throughout: CuPy's own float64 atomicMax rounds through float32
        np.testing.assert_allclose(cuda, cpu, rtol=1e-12, atol=1e-12)


@pytest.mark.cuda
def test_index_ops_on_cuda_match_cpu():
    x = RNG.standard_normal((4, 3))
    rows = np.array([0, 3, 0])
    results = []
    for device in ("cpu", "cuda"):
        a = frost.tensor(x, device=device, requires_grad=True)
        idx = frost.tensor(rows, device=device)
        out = (frost.index_add(a, 0, idx, a[:3] * 2) + frost.index_put(a, (idx,), a[1], accumulate=True)
               + frost.masked_scatter(a, a > 0, a.flip(0)) + frost.scatter_add(a, 0, idx[None, :].expand(2, 3), a))
        out.sum().backward()
        results.append([out.detach().cpu().numpy(), a.grad.cpu().numpy(),
                        frost.masked_select(a, a > 0).detach().cpu().numpy()])
    for cpu, cuda in zip(*results):
        np.testing.assert_allclose(cuda, cpu, atol=1e-12)


@pytest.mark.cuda
def test_getitem_on_cuda_places_dims_as_cpu():
    x = frost.tensor(RNG.standard_normal((2, 3, 4, 5)))
    for make in PATTERNS.values():
        cpu = x[make(frost.tensor)]
        cuda = x.cuda()[make(lambda v: frost.tensor(v, device="cuda"))]
        assert cuda.shape == cpu.shape
        np.testing.assert_array_equal(cuda.cpu().numpy(), cpu.numpy())


def test_out_of_range_raises_on_cpu_before_any_write():
    x = frost.tensor([1.0, 2.0, 3.0], dtype=frost.float64)
    with pytest.raises(IndexError, match="index_put"):
        x.index_put_((frost.tensor([0, 5]),), frost.tensor([9.0, 9.0], dtype=frost.float64))
    assert x.tolist() == [1.0, 2.0, 3.0] and x._version == 0
