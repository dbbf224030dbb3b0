"""Shape ops and indexing against PyTorch: forward values, gradients (random upstream gradient), errors."""
import warnings

import numpy as np
import pytest
import torch

import frost

RNG = np.random.default_rng(2)


def _check(frost_fn, torch_fn, *arrays):
    fs = [frost.tensor(a, requires_grad=True) for a in arrays]
    ts = [torch.tensor(a, requires_grad=True) for a in arrays]
    fo, to = frost_fn(*fs), torch_fn(*ts)
    fo_list = list(fo) if isinstance(fo, (tuple, list)) else [fo]
    to_list = list(to) if isinstance(to, (tuple, list)) else [to]
    assert len(fo_list) == len(to_list)
    for f, t in zip(fo_list, to_list):
        assert f.shape == tuple(t.shape), (f.shape, t.shape)
        assert f.dtype.name == str(t.dtype).replace("torch.", "")
        np.testing.assert_array_equal(f.detach().numpy(), t.detach().numpy())
    ups = [RNG.standard_normal(f.shape) for f in fo_list]
    floss = sum((f * frost.tensor(u)).sum() for f, u in zip(fo_list, ups))
    tloss = sum((t * torch.tensor(u)).sum() for t, u in zip(to_list, ups))
    floss.backward()
    tloss.backward()
    for f, t in zip(fs, ts):
        assert f.grad.dtype == f.dtype and f.grad.shape == f.shape
        np.testing.assert_allclose(f.grad.numpy(), t.grad.numpy(), atol=1e-12)


A = RNG.standard_normal((2, 3, 4))


@pytest.mark.parametrize("fn", [
    lambda x: x.reshape(6, 4), lambda x: x.reshape((4, -1)), lambda x: x.view(-1), lambda x: x.view(2, 12),
    lambda x: x.permute(2, 0, 1), lambda x: x.permute((1, 2, 0)), lambda x: x.transpose(0, 2),
    lambda x: x.transpose(-1, -2), lambda x: x.mT, lambda x: x.flatten(), lambda x: x.flatten(1),
    lambda x: x.flatten(0, 1), lambda x: x.unsqueeze(0), lambda x: x.unsqueeze(-1), lambda x: x.unsqueeze(2),
    lambda x: x.unsqueeze(1).squeeze(), lambda x: x.unsqueeze(1).squeeze(1), lambda x: x.unsqueeze(1).squeeze(0),
    lambda x: x[:, :1].squeeze(1), lambda x: x.expand(5, 2, 3, 4), lambda x: x[:, :1].expand(-1, 3, -1),
    lambda x: x.permute(2, 0, 1).contiguous(), lambda x: x.repeat(2, 1, 3), lambda x: x.repeat(2, 1, 1, 2),
    lambda x: x.flip(0), lambda x: x.flip((0, 2)), lambda x: x.flip(-1),
    lambda x: x.permute(2, 0, 1).reshape(4, 6), lambda x: x.transpose(0, 1).flatten(),
])
def test_shape_ops(fn):
    _check(fn, fn, A)


def test_T_on_matrix_and_t():
    m = RNG.standard_normal((3, 5))
    _check(lambda x: x.T, lambda x: x.T, m)
    _check(lambda x: x.t(), lambda x: x.t(), m)


def test_contiguous_keeps_0d_tensors_0d():
    x = frost.tensor(2.0)
    assert x.contiguous().shape == ()
    y = frost.tensor([[1.0, 2.0], [3.0, 4.0]], requires_grad=True).T.contiguous()
    assert y.data.flags.c_contiguous


def test_views_share_memory_with_their_base():
    x = frost.zeros(2, 3)
    x.view(-1)[1] = 5.0
    x[1][2] = 7.0
    assert x.numpy()[0, 1] == 5.0 and x.numpy()[1, 2] == 7.0


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_cat_and_stack(dim):
    a, b, c = RNG.standard_normal((2, 3)), RNG.standard_normal((2, 3)), RNG.standard_normal((2, 3))
    _check(lambda *xs: frost.stack(xs, dim), lambda *xs: torch.stack(xs, dim), a, b, c)
    if dim == 0:
        a2 = RNG.standard_normal((4, 3))
    else:
        a2 = RNG.standard_normal((2, 5))
    _check(lambda *xs: frost.cat(xs, dim), lambda *xs: torch.cat(xs, dim), a, a2)


def test_cat_promotes_and_grads_keep_dtypes():
    a = frost.ones(2, dtype=frost.float32, requires_grad=True)
    b = frost.ones(3, dtype=frost.float64, requires_grad=True)
    out = frost.cat([a, b])
    assert out.dtype == frost.float64
    out.sum().backward()
    assert a.grad.dtype == frost.float32 and b.grad.dtype == frost.float64


@pytest.mark.parametrize("args", [(2, 0), (3, 1), ([1, 3], 1), ((2, 1, 1), 1), (1, -1)])
def test_split(args):
    size, dim = args
    a = RNG.standard_normal((4, 4, 3))
    _check(lambda x: frost.split(x, size, dim), lambda x: torch.split(x, size, dim), a)
    _check(lambda x: x.split(size, dim), lambda x: x.split(size, dim), a)


@pytest.mark.parametrize("chunks,dim", [(2, 0), (3, 1), (4, 1), (2, -1)])
def test_chunk(chunks, dim):
    a = RNG.standard_normal((4, 5, 3))
    _check(lambda x: frost.chunk(x, chunks, dim), lambda x: torch.chunk(x, chunks, dim), a)


def test_shape_errors():
    x = frost.ones(2, 3)
    with pytest.raises(RuntimeError, match=r"reshape: shape \(4, 2\) is invalid for a tensor of shape \(2, 3\)"):
        x.reshape(4, 2)
    with pytest.raises(RuntimeError, match=r"permute: dims .* are not a permutation"):
        x.permute(0, 0)
    with pytest.raises(IndexError, match=r"permute: dims \(0, 5\) are out of range"):
        x.permute(0, 5)
    with pytest.raises(RuntimeError, match=r"expand: shape \(2, 3\) cannot be expanded to \(4, 3\)"):
        x.expand(4, 3)
    with pytest.raises(RuntimeError, match=r"cat: shapes"):
        frost.cat([x, frost.ones(2, 4)])
    with pytest.raises(RuntimeError, match=r"stack: all tensors must have the same shape"):
        frost.stack([x, frost.ones(3, 2)])
    with pytest.raises(RuntimeError, match=r"split: sizes \[1, 1\] do not add up to 3"):
        x.split([1, 1], 1)
    with pytest.raises(IndexError, match="unsqueeze: dim 4"):
        x.unsqueeze(4)
    with pytest.raises(IndexError, match="flatten: dim 2 is out of range"):
        x.flatten(2)
    with pytest.raises(RuntimeError, match="flatten: start_dim 1 comes after end_dim 0"):
        x.flatten(1, 0)
    with pytest.raises(RuntimeError, match="split: split_size must be positive"):
        x.split(0)
    with pytest.raises(RuntimeError, match="chunk: chunks must be positive"):
        x.chunk(0)
    with pytest.raises(ValueError, match="tensor\\(\\): nested sequences must be rectangular"):
        frost.tensor([[1, 2], [3]])


# ------------------------------------------------------------------ pad

@pytest.mark.parametrize("padding", [(1, 2), (0, 1, 2, 0), (1, 1, 1, 1, 1, 0)])
@pytest.mark.parametrize("mode", ["constant", "reflect", "replicate", "circular"])
def test_pad(padding, mode):
    a = RNG.standard_normal((2, 3, 4))
    if mode != "constant" and len(padding) == 6:
        a = RNG.standard_normal((1, 2, 3, 4))
    kwargs = {"value": 1.5} if mode == "constant" else {}
    _check(lambda x: frost.pad(x, padding, mode=mode, **kwargs),
           lambda x: torch.nn.functional.pad(x, padding, mode=mode, **kwargs), a)


def test_pad_errors():
    with pytest.raises(ValueError, match="pad: padding"):
        frost.pad(frost.ones(3), (1, 2, 3))
    with pytest.raises(ValueError, match="pad: unknown mode"):
        frost.pad(frost.ones(1, 3), (1, 1), mode="wrap")
    with pytest.raises(ValueError, match="reflect padding"):
        frost.pad(frost.ones(1, 3), (3, 0), mode="reflect")


# ------------------------------------------------------------------ indexing

B = RNG.standard_normal((4, 5, 6))

BASIC = [
    lambda x: x[1], lambda x: x[-1], lambda x: x[1:3], lambda x: x[::2], lambda x: x[:, 1::2, 1::3],
    lambda x: x[..., 2], lambda x: x[None, 1, ..., None],
    lambda x: x[:, -2:], lambda x: x[1, 2, 3], lambda x: x[1, :, None, 2:5], lambda x: x[-3:-1, ..., 1::2],
]


@pytest.mark.parametrize("fn", BASIC)
def test_basic_indexing(fn):
    _check(fn, fn, B)


def test_negative_step_slice_matches_flip():
    a = frost.tensor(B, requires_grad=True)
    out = a.flip(1)[:, 1:4]
    t = torch.tensor(B).flip(1)[:, 1:4]
    np.testing.assert_array_equal(out.detach().numpy(), t.detach().numpy())


ADVANCED = [
    lambda x, I: x[I([0, 2, 2, 3])],  # repeated rows accumulate gradient
    lambda x, I: x[:, I([4, 0, 4])],
    lambda x, I: x[I([1, 1]), I([2, 2])],  # same element twice
    lambda x, I: x[I([[0, 1], [3, 3]])],
    lambda x, I: x[I([0, 3]), :, I([5, 5])],  # advanced indices split by a slice go first
    lambda x, I: x[..., I([1, 0, 1])],
    lambda x, I: x[I([-1, 0])],
    lambda x, I: x[I(2)],  # 0-d index tensor
]


@pytest.mark.parametrize("fn", ADVANCED)
def test_integer_array_indexing(fn):
    _check(lambda x: fn(x, lambda v: frost.tensor(v)), lambda x: fn(x, lambda v: torch.tensor(v)), B)


def test_list_index():
    _check(lambda x: x[[0, 0, 2]], lambda x: x[[0, 0, 2]], B)


def test_boolean_mask_indexing():
    mask = B > 0
    _check(lambda x: x[frost.tensor(mask)], lambda x: x[torch.tensor(mask)], B)
    row_mask = np.array([True, False, True, True])
    _check(lambda x: x[frost.tensor(row_mask)], lambda x: x[torch.tensor(row_mask)], B)
    _check(lambda x: x[:, frost.tensor(np.array([True, False, False, True, True]))],
           lambda x: x[:, torch.tensor(np.array([True, False, False, True, True]))], B)


def test_index_out_of_range_names_shape():
    x = frost.ones(3, 4)
    with pytest.raises(IndexError, match=r"index 5 is out of bounds .*tensor of shape \(3, 4\)"):
        x[5]
    with pytest.raises(IndexError, match=r"tensor of shape \(3, 4\)"):
        x[:, frost.tensor([0, 9])]


def test_setitem_without_grad():
    x = frost.zeros(3, 4)
    x[1] = 2.0
    x[:, 0] = frost.tensor([7.0, 8.0, 9.0])
    x[frost.tensor([2, 2])] = frost.tensor(3.0)
    x[x > 8.5] = -1.0
    t = torch.zeros(3, 4)
    t[1] = 2.0
    t[:, 0] = torch.tensor([7.0, 8.0, 9.0])
    t[torch.tensor([2, 2])] = torch.tensor(3.0)
    t[t > 8.5] = -1.0
    np.testing.assert_array_equal(x.numpy(), t.numpy())


def test_setitem_on_tensor_requiring_grad_errors():
    x = frost.zeros(3, requires_grad=True)
    with pytest.raises(RuntimeError, match="__setitem__"):
        x[0] = 1.0
    with frost.no_grad():
        x[0] = 1.0
    assert x.detach().numpy()[0] == 1.0
    plain = frost.zeros(3)
    with pytest.raises(RuntimeError, match="__setitem__: the assigned value requires grad"):
        plain[0] = frost.ones((), requires_grad=True) * 2
    plain[0] = (frost.ones((), requires_grad=True) * 2).detach()
    assert plain.tolist() == [2.0, 0.0, 0.0]


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_gather(dim):
    a = RNG.standard_normal((4, 5))
    n = a.shape[dim]
    idx_shape = (3, 5) if dim == 0 else (4, 7)
    idx = RNG.integers(0, n, idx_shape)
    _check(lambda x: frost.gather(x, dim, frost.tensor(idx)), lambda x: torch.gather(x, dim, torch.tensor(idx)), a)


def test_gather_index_smaller_than_input():
    a = RNG.standard_normal((4, 5, 3))
    idx = RNG.integers(0, 5, (2, 6, 2))
    _check(lambda x: frost.gather(x, 1, frost.tensor(idx)), lambda x: torch.gather(x, 1, torch.tensor(idx)), a)


def test_gather_errors():
    with pytest.raises(RuntimeError, match="gather: index must be an integer tensor"):
        frost.gather(frost.ones(2, 2), 0, frost.ones(2, 2))
    with pytest.raises(RuntimeError, match=r"gather: index of shape \(2, 3\) does not fit input of shape \(2, 2\)"):
        frost.gather(frost.ones(2, 2), 0, frost.zeros(2, 3, dtype=frost.int64))


def test_cat_device_mismatch():
    class FakeCuda(frost.Tensor):
        @property
        def device(self):
            return frost.Device("cuda:0")
    with pytest.raises(RuntimeError, match=r"cat: tensors are on different devices: \['cpu', 'cuda:0'\]"):
        frost.cat([frost.ones(2), FakeCuda(np.ones(2, dtype=np.float32))])


@pytest.mark.parametrize("diagonal", [0, 1, -1, 3])
def test_tril_triu(diagonal):
    a = RNG.standard_normal((2, 4, 5))
    _check(lambda x: x.tril(diagonal), lambda x: x.tril(diagonal), a)
    _check(lambda x: frost.triu(x, diagonal), lambda x: torch.triu(x, diagonal), a)
    with pytest.raises(RuntimeError, match=r"tril: needs a tensor with at least 2 dimensions, got shape \(3,\)"):
        frost.tril(frost.ones(3))


def test_index_select_narrow_unbind_clone():
    a = RNG.standard_normal((4, 5, 3))
    idx = [3, 0, 3]
    _check(lambda x: x.index_select(1, frost.tensor(idx)), lambda x: x.index_select(1, torch.tensor(idx)), a)
    _check(lambda x: frost.index_select(x, -1, frost.tensor([2])),
           lambda x: torch.index_select(x, -1, torch.tensor([2])), a)
    _check(lambda x: x.narrow(1, 1, 3), lambda x: x.narrow(1, 1, 3), a)
    _check(lambda x: x.narrow(0, -2, 2), lambda x: x.narrow(0, -2, 2), a)
    _check(lambda x: x.unbind(1), lambda x: x.unbind(1), a)
    _check(lambda x: frost.unbind(x, -1), lambda x: torch.unbind(x, -1), a)
    _check(lambda x: x.clone() * 2, lambda x: x.clone() * 2, a)
    x = frost.ones(2)
    c = x.clone()
    c[0] = 5
    assert x.tolist() == [1.0, 1.0]
    with pytest.raises(RuntimeError, match="narrow: start 4 and length 3 exceed dim 1 of size 5"):
        frost.narrow(frost.ones(2, 5), 1, 4, 3)
    with pytest.raises(RuntimeError, match="index_select: index must be a 1-D integer tensor"):
        frost.index_select(frost.ones(2, 5), 1, frost.ones(2))


def test_new_tensor_factories_follow_dtype():
    x = frost.ones(2, dtype=frost.float64)
    assert x.new_zeros(3).dtype == frost.float64 and x.new_zeros((2, 2)).shape == (2, 2)
    assert x.new_ones(2, dtype=frost.int32).dtype == frost.int32
    assert x.new_full((2,), 7).tolist() == [7.0, 7.0] and x.new_full((2,), 7).dtype == frost.float64
    assert x.new_tensor([1, 2]).dtype == frost.float64


def test_gather_and_index_select_refuse_negative_indices_as_torch():
    x = frost.tensor(RNG.standard_normal((2, 3)))
    with pytest.raises(IndexError, match=r"gather: index -1 is out of bounds for dim 1 of size 3"):
        x.gather(1, frost.tensor([[0], [-1]]))
    with pytest.raises(IndexError, match=r"index_select: index -2 is out of bounds for dim 0 of size 2"):
        x.index_select(0, frost.tensor([1, -2]))


def test_split_and_chunk_of_an_empty_dim_as_torch():
    f, t = frost.zeros(0, 3), torch.zeros(0, 3)
    for fn in (lambda a: a.split(2), lambda a: a.split([0, 0]), lambda a: a.chunk(3)):
        assert [tuple(p.shape) for p in fn(f)] == [tuple(p.shape) for p in fn(t)]


def test_a_uint8_index_is_a_mask_as_torch_reads_it():
    a = RNG.standard_normal((3, 2))
    mask = np.array([1, 0, 1], np.uint8)
    f, t = frost.tensor(a, requires_grad=True), torch.tensor(a, requires_grad=True)
    with pytest.warns(DeprecationWarning, match="uint8 tensor reads it as a mask"):
        fo = f[frost.tensor(mask)]
    with pytest.warns(UserWarning):
        to = t[torch.tensor(mask)]
    np.testing.assert_array_equal(fo.detach().numpy(), to.detach().numpy())
    fo.sum().backward()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # torch repeats its deprecation in the backward
        to.sum().backward()
    np.testing.assert_array_equal(f.grad.numpy(), t.grad.numpy())


def test_view_refuses_what_only_a_copy_can_give_as_pytorch():
    """view never copies: where the strides cannot give the shape it raises (torch's rule), elsewhere it shares."""
    rng = np.random.default_rng(0)
    cases = [((2, 3), (1, 0), (6,)), ((2, 3), (1, 0), (3, 2)), ((4, 6), None, (2, 2, 6)), ((4, 6), None, (24,)),
             ((2, 3, 4), (0, 2, 1), (2, 12)), ((2, 3, 4), (0, 2, 1), (8, 3)), ((2, 3, 4), (1, 0, 2), (3, 8)),
             ((2, 3, 4), (1, 0, 2), (6, 4)), ((1, 3, 1, 4), (2, 1, 0, 3), (3, 4)), ((2, 1, 3), (2, 1, 0), (-1,))]
    for shape, perm, new_shape in cases:
        base = rng.standard_normal(shape).astype(np.float32)
        ours, theirs = frost.tensor(base), torch.tensor(base)
        if perm is not None:
            ours, theirs = ours.permute(*perm), theirs.permute(*perm)
        try:
            expected = theirs.view(new_shape)
        except RuntimeError:
            with pytest.raises(RuntimeError, match=r"view: a tensor of shape .* cannot be viewed as shape"):
                ours.view(*new_shape)
            continue
        got = ours.view(*new_shape)
        np.testing.assert_array_equal(got.numpy(), expected.numpy())
        got.data[...] = 0  # a view: the write reaches the base
        assert not ours.numpy().any(), (shape, perm, new_shape)
    x = frost.tensor(np.zeros((3, 4), np.float32)).t()
    assert x.view_as(frost.zeros(4, 3)).shape == (4, 3)
    with pytest.raises(RuntimeError, match="use .reshape"):
        x.view_as(frost.zeros(12))


def test_pad_takes_torchs_argument_order():
    a = RNG.standard_normal((1, 2, 4))
    for args, kwargs in [(((1, 2), "reflect"), {}), (((1, 1), "constant", 3.0), {}),
                         (((2, 0),), dict(mode="constant", value=None))]:
        _check(lambda x: frost.pad(x, *args, **kwargs), lambda x: torch.nn.functional.pad(x, *args, **kwargs), a)


def test_flip_is_a_copy_as_in_pytorch():
    x = frost.tensor([0.0, 1.0, 2.0])
    y = x.flip(0)
    y[0] = 9.0
    x.fill_(5.0)
    assert x.tolist() == [5.0, 5.0, 5.0] and y.tolist() == [9.0, 1.0, 0.0]


def test_an_empty_list_index_selects_nothing():
    a = np.arange(12).reshape(3, 4)
    x, t = frost.tensor(a), torch.tensor(a)
    assert x[[]].shape == tuple(t[[]].shape) == (0, 4) and x[[]].dtype == frost.int64
    x[[]] = 0
    assert x.tolist() == a.tolist()


@pytest.mark.parametrize("dims", [(), []])
def test_flip_of_no_dims_is_a_copy_as_torch(dims):
    a = np.arange(6.0).reshape(2, 3)
    f, t = frost.tensor(a, requires_grad=True), torch.tensor(a, requires_grad=True)
    fo, to = f.flip(dims), t.flip(dims)
    np.testing.assert_array_equal(fo.detach().numpy(), to.detach().numpy())
    fo.data[0, 0] = 100.0  # a copy: writing to it leaves the input alone
    assert f.detach().numpy()[0, 0] == 0.0
    fo.backward(frost.ones(2, 3) * 2)
    np.testing.assert_array_equal(f.grad.numpy(), np.full((2, 3), 2.0))
    assert frost.flip(frost.tensor(a), dims).tolist() == torch.flip(torch.tensor(a), dims).tolist()


# ------------------------------------------------------------------ pad: negative widths crop


@pytest.mark.parametrize("padding", [(-1, 2), (2, -1), (-2, -1), (-1, 0, 1, -2), (-3, 2), (3, -3)])
@pytest.mark.parametrize("mode", ["constant", "reflect", "replicate", "circular"])
def test_pad_negative_widths_crop(padding, mode):
    """Constant and circular padding crop first (circular then wraps what is left); reflect and replicate index the
    whole input, as PyTorch's."""
    if mode == "circular" and padding in ((-3, 2), (3, -3)):
        padding = (-2, 2)  # PyTorch's own result is a self-overlapping copy beyond what the crop keeps
    a = RNG.standard_normal((2, 4, 5)).transpose(0, 2, 1)[..., ::-1]
    _check(lambda x: frost.pad(x, padding, mode=mode), lambda x: torch.nn.functional.pad(x, padding, mode=mode),
           a.copy())
    x = frost.Tensor(a, requires_grad=True)  # strided input
    frost.pad(x, padding, mode=mode).sum().backward()
    assert x.grad.shape == a.shape


def test_pad_negative_width_errors():
    x = frost.ones(1, 2, 5)
    with pytest.raises(RuntimeError, match=r"pad: padding \(-6, 2\) of dim 2 leaves 1 of its 5 elements .*"
                                           r"'constant'"):
        frost.pad(x, (-6, 2))
    with pytest.raises(RuntimeError, match=r"pad: padding \(-5, 0\) of dim 2 leaves 0 of its 5 elements .*"
                                           r"'replicate'"):
        frost.pad(x, (-5, 0), mode="replicate")
    with pytest.raises(RuntimeError, match=r"pad: circular padding \(6, 0\) of dim 2 wraps around more than once: "
                                           r"it may add at most the 5 elements"):
        frost.pad(x, (6, 0), mode="circular")
    with pytest.raises(RuntimeError, match=r"pad: circular padding \(-3, 3\) of dim 2 wraps around more than once"):
        frost.pad(x, (-3, 3), mode="circular")
    assert frost.pad(x, (5, 5), mode="circular").shape == (1, 2, 15)  # wrapping exactly once is fine
    assert frost.pad(x, (-5, 0)).shape == (1, 2, 0)
