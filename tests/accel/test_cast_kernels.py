"""The cast kernels (frost.accel.cast): float32 <-> bf16/f16 bit for bit as NumPy's (ml_dtypes') astype, rounding to
nearest even, with infinities, NaN, overflow and subnormals, ragged lengths; the rules of the fast path; the op
`cast` (autocast's) through them with its gradient; NVRTC compiles; and on the GPU against CuPy's astype."""
import ml_dtypes
import numpy as np
import pytest

import frost
from frost import dispatch
from frost.accel import cast as cast_accel
from frost.ops.elementwise import cast

SIXTEEN = {"bfloat16": ml_dtypes.bfloat16, "float16": np.float16}


def _values(n: int, seed: int = 0) -> np.ndarray:
    """float32 values over every range a cast meets: large (f16 overflow), tiny (subnormal), specials, ties."""
    rng = np.random.default_rng(seed)
    with np.errstate(over="ignore"):
        x = (rng.standard_normal(n) * 10.0 ** rng.integers(-42, 39, n)).astype(np.float32)
    specials = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 65520.0, 1e-45, 1.00390625, 1.01171875], np.float32)
    x[:len(specials)] = specials[:n]
    return x


@pytest.mark.parametrize("name", sorted(SIXTEEN))
@pytest.mark.parametrize("n", [8, 1003])   # whole 16-byte chunks; a ragged end one value at a time
def test_casts_match_astype_bit_for_bit(simulated_gpu, name, n):
    x = _values(n)
    with np.errstate(over="ignore"):
        want = x.astype(SIXTEEN[name])
    got = cast_accel.cast_kernels(x, SIXTEEN[name])
    np.testing.assert_array_equal(got.view(np.uint16), want.view(np.uint16))
    back = cast_accel.cast_kernels(want, np.float32)
    np.testing.assert_array_equal(back.view(np.uint32), want.astype(np.float32).view(np.uint32))
    assert simulated_gpu == ["cast_from_f32", "cast_to_f32"]


def test_the_op_and_its_gradient_run_the_kernels(simulated_gpu):
    x = frost.Tensor(_values(64, seed=1).reshape(8, 8) / np.float32(1e30), requires_grad=True)
    y = cast(x, frost.bfloat16)
    want = x.detach().numpy().astype(ml_dtypes.bfloat16)
    np.testing.assert_array_equal(y.detach().numpy().view(np.uint16), want.view(np.uint16))
    y.backward(frost.Tensor(np.ones((8, 8), ml_dtypes.bfloat16)))
    assert x.grad.dtype == frost.float32 and (x.grad.numpy() == 1).all()
    assert simulated_gpu == ["cast_from_f32", "cast_to_f32"]


def test_what_the_kernels_do_not_take_is_astypes():
    aligned = np.zeros(64, np.float32)
    assert cast_accel.applies(aligned, dtype=ml_dtypes.bfloat16)
    assert not cast_accel.applies(aligned, dtype=np.float64)                  # not a float32 <-> 16-bit pair
    assert not cast_accel.applies(aligned.astype(np.float16), dtype=ml_dtypes.bfloat16)
    assert not cast_accel.applies(aligned[1:], dtype=ml_dtypes.bfloat16)    # 4 bytes past a 16-byte boundary
    assert not cast_accel.applies(aligned[:0], dtype=ml_dtypes.bfloat16)
    assert dispatch.lookup("cast", aligned.reshape(8, 8).T, dtype=np.float16) is None   # CPU, and not C order


def test_kernels_compile_for_sm90_without_spills(tmp_path, monkeypatch):
    monkeypatch.setenv("FROST_CACHE_DIR", str(tmp_path))
    for kernels in cast_accel.CAST_KERNELS.values():
        for kern in kernels:
            cubin = kern.compile("sm_90")
            assert cubin[:4] == b"\x7fELF" and b".nv.local" not in cubin, kern.__name__


@pytest.mark.cuda
@pytest.mark.parametrize("name", sorted(SIXTEEN))
def test_gpu_casts_match_cupys_astype(name):
    x = frost.tensor(_values(3 * 2**20 + 5, seed=2), device="cuda").data
    assert dispatch.lookup("cast", x, dtype=SIXTEEN[name]) is not None
    got = cast_accel.cast_kernels(x, SIXTEEN[name])
    want = x.astype(SIXTEEN[name])
    assert bool((got.view(np.uint16) == want.view(np.uint16)).all())
    back = cast_accel.cast_kernels(want, np.float32)
    assert bool((back.view(np.uint32) == want.astype(np.float32).view(np.uint32)).all())


def test_mixed_precision_arithmetic_promotes_and_returns_gradients_through_the_kernels(simulated_gpu):
    # a float32 tensor times a bf16 one: the bf16 operand widened by the kernel, its gradient rounded back by it
    rng = np.random.default_rng(3)
    x = frost.Tensor(rng.standard_normal((4, 16)).astype(np.float32), requires_grad=True)
    y = frost.Tensor(rng.standard_normal((4, 16)).astype(ml_dtypes.bfloat16), requires_grad=True)
    out = x * y
    assert out.dtype == frost.float32
    np.testing.assert_array_equal(out.detach().numpy(), x.detach().numpy() * y.detach().numpy().astype(np.float32))
    out.backward(frost.Tensor(np.full((4, 16), 1.0, np.float32)))
    want = x.detach().numpy().astype(ml_dtypes.bfloat16)
    np.testing.assert_array_equal(y.grad.numpy().view(np.uint16), want.view(np.uint16))
    assert simulated_gpu == ["cast_to_f32", "cast_from_f32"]
