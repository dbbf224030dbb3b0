"""frost.einsum against torch.einsum in float64: values and every operand's gradient, for the equation forms PyTorch
takes (explicit and implicit output, '...', repeated subscripts, size-1 broadcasting, sublists), and its errors."""
import numpy as np
import pytest

import frost

torch = pytest.importorskip("torch")

RNG = np.random.default_rng(5)


def _check(equation, *arrays, atol=1e-10):
    fs = [frost.tensor(a, requires_grad=True) for a in arrays]
    ts = [torch.tensor(a, requires_grad=True) for a in arrays]
    fo, to = frost.einsum(equation, *fs), torch.einsum(equation, *ts)
    assert fo.shape == tuple(to.shape) and fo.dtype == frost.float64
    np.testing.assert_allclose(fo.detach().numpy(), to.detach().numpy(), atol=atol)
    up = RNG.standard_normal(fo.shape)
    fo.backward(frost.tensor(up))
    to.backward(torch.tensor(up))
    for f, t in zip(fs, ts):
        assert f.grad.shape == f.shape
        np.testing.assert_allclose(f.grad.numpy(), t.grad.numpy(), atol=atol)


CASES = [
    ("ij,jk->ik", (3, 4), (4, 5)),  # matmul
    ("ij,jk", (3, 4), (4, 5)),  # implicit output
    ("bij,bjk->bik", (2, 3, 4), (2, 4, 5)),  # batched
    ("i,j->ij", (3,), (4,)),  # outer
    ("i,i->", (4,), (4,)),  # dot
    ("ij->ji", (3, 4),),
    ("ij->", (3, 4),),
    ("ii->i", (4, 4)),  # diagonal
    ("ii", (4, 4)),  # trace
    ("iij->j", (3, 3, 2)),
    ("iji->ij", (3, 2, 3)),
    ("ba", (2, 3)),  # implicit output sorts: (a, b)
    ("aB", (2, 3)),  # ASCII: upper case first
    ("...ij->...ji", (2, 3, 4)),
    ("...ij,...jk->...ik", (2, 1, 3, 4), (5, 4, 2)),  # ellipsis dims broadcast
    ("i...,...->...", (2, 3), (1,)),
    ("...,...", (2, 3), (3,)),
    ("ij,jk->ik", (3, 1), (4, 5)),  # a summed subscript of size 1 broadcasts
    ("i,i->i", (3,), (1,)),
    ("ijk,k->", (2, 3, 4), (4,)),
    ("ij,ij,ij->i", (2, 3), (2, 3), (2, 3)),
    ("bn,anm,bm->ba", (2, 3), (4, 3, 5), (2, 5)),  # bilinear
    ("ij,kl->", (2, 3), (4, 5)),  # subscripts only one operand has
    ("ii,jk->ik", (3, 3), (2, 3)),
    ("b h i d, b h j d -> b h i j", (2, 2, 3, 4), (2, 2, 5, 4)),  # spaces, attention scores
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_einsum_matches_torch(case):
    equation, *shapes = case
    _check(equation, *(RNG.standard_normal(s) for s in shapes))


def test_non_contiguous_operands_and_a_list():
    a = RNG.standard_normal((5, 4)).T
    b = RNG.standard_normal((6, 5))[::2]
    _check("ij,kj->ik", a, b)
    f = frost.einsum("ij,kj->ik", [frost.tensor(a), frost.tensor(b)])
    np.testing.assert_allclose(f.numpy(), np.einsum("ij,kj->ik", a, b))


def test_sublist_form():
    a, b = RNG.standard_normal((2, 3)), RNG.standard_normal((3, 4))
    f = frost.einsum(frost.tensor(a), [0, 1], frost.tensor(b), [1, 2], [0, 2])
    np.testing.assert_allclose(f.numpy(), a @ b)
    e = frost.einsum(frost.tensor(a), [Ellipsis, 1], [1])
    np.testing.assert_allclose(e.numpy(), torch.einsum(torch.tensor(a), [Ellipsis, 1], [1]).numpy())


def test_integer_operands_and_zero_dim():
    a, b = np.arange(6).reshape(2, 3), np.arange(3)
    f = frost.einsum("ij,j->i", frost.tensor(a), frost.tensor(b))
    assert f.dtype == frost.int64 and f.tolist() == torch.einsum("ij,j->i", torch.tensor(a), torch.tensor(b)).tolist()
    _check("...,...->...", np.array(2.0), np.array(3.0))
    _check("i,i->i", np.zeros((0,)), np.zeros((0,)))


@pytest.mark.parametrize("equation, shapes, message", [
    ("ij,jk->ik", [(2, 3), (4, 4)], "subscript j has size 4 for operand 1 .* previously seen size 3"),
    ("ij->iij", [(2, 3)], "output subscript i appears more than once"),
    ("ij->k", [(2, 3)], "output subscript k does not appear"),
    ("ijk->ij", [(2, 3)], r"subscripts in the equation \(3\) .* dimensions \(2\) of operand 0"),
    ("ij,jk", [(2, 3)], r"fewer operands were provided \(1\)"),
    ("ij", [(2, 3), (3,)], "more operands"),
    ("ii->i", [(3, 4)], "subscript i is repeated for operand 0 .* 4 != 3"),
    ("i1", [(2, 3)], "invalid subscript '1'"),
    ("...i...->i", [(3,)], "an ellipsis was already found"),
    ("i.j", [(3, 3)], "not part of any ellipsis"),
])
def test_errors_name_einsum_and_the_operand(equation, shapes, message):
    with pytest.raises(RuntimeError, match=r"einsum\(\): .*" + message):
        frost.einsum(equation, *(frost.zeros(*s) for s in shapes))


def test_mixed_dtypes_are_refused():
    with pytest.raises(RuntimeError, match=r"einsum\(\): operands must have one dtype.*float64.*float32"):
        frost.einsum("i,i", frost.zeros(2, dtype=frost.float64), frost.zeros(2))


@pytest.mark.cuda
@pytest.mark.parametrize("equation, shapes", [("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]), ("iij->j", [(3, 3, 2)]),
                                              ("...ij,...jk->...ik", [(2, 1, 3, 4), (5, 4, 2)])])
def test_einsum_on_cuda_matches_cpu(equation, shapes):
    arrays = [RNG.standard_normal(s) for s in shapes]
    results = []
    for device in ("cpu", "cuda"):
        operands = [frost.tensor(a, device=device, requires_grad=True) for a in arrays]
        out = frost.einsum(equation, *operands)
        out.backward(frost.ones_like(out))
        results.append([out.detach().cpu().numpy()] + [o.grad.cpu().numpy() for o in operands])
    for cpu, cuda in zip(*results):
        np.testing.assert_allclose(cuda, cpu, atol=1e-10)
