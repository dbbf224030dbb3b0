"""frost.ops.shape.scatter_at's GPU path, run on a NumPy stand-in whose add.at / maximum.at / minimum.at refuse the
dtypes CuPy's atomics refuse (int64, bfloat16, float16 extremes, small integers) or get wrong (float32 and float64
extremes: CuPy compares through fmaxf/fminf, rounding float64 to float32 and dropping NaN), against NumPy's own
ufunc.at."""
import ml_dtypes
import numpy as np
import pytest

from frost.ops.shape import scatter_at

_ADD_OK = {"int32", "uint32", "uint64", "float16", "float32", "float64"}
_EXTREME_OK = {"int32", "uint32", "uint64"}


class _StrictAt:
    def __init__(self, ufunc, allowed):
        self.ufunc, self.allowed = ufunc, allowed

    def __call__(self, *args, **kwargs):
        return self.ufunc(*args, **kwargs)

    def at(self, target, pos, values):
        if str(target.dtype) not in self.allowed:
            raise TypeError(f"{self.ufunc.__name__}.at does not take {target.dtype} (as CuPy's)")
        self.ufunc.at(target, pos, values)


class _CupyLike:
    """NumPy under another name (so `xp is np` is False), with CuPy's ufunc.at dtype limits."""
    add = _StrictAt(np.add, _ADD_OK)
    maximum = _StrictAt(np.maximum, _EXTREME_OK)
    minimum = _StrictAt(np.minimum, _EXTREME_OK)

    def __getattr__(self, name):
        return getattr(np, name)


@pytest.mark.parametrize("ufunc", ["add", "maximum", "minimum"])
@pytest.mark.parametrize("dtype", ["int64", "int32", "int8", "uint8", "float16", "float32", "float64", "bfloat16"])
def test_matches_numpy_ufunc_at(ufunc, dtype):
    rng = np.random.default_rng(0)
    np_dtype = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(dtype)
    big = np_dtype.kind == "i" and np_dtype.itemsize == 8
    if np_dtype.kind in "iu":
        lo, hi = (-2 ** 62, 2 ** 62) if big else (np.iinfo(np_dtype).min // 2, np.iinfo(np_dtype).max // 2)
        target = rng.integers(lo, hi, size=(4, 5)).astype(np_dtype)
        values = rng.integers(lo, hi, size=(6, 5)).astype(np_dtype)
    else:
        target = rng.standard_normal((4, 5)).astype(np_dtype)
        values = rng.standard_normal((6, 5)).astype(np_dtype)
    idx = np.array([0, 2, 2, 3, 0, 2])  # repeated places accumulate
    expected = target.copy()
    if dtype == "bfloat16" and ufunc == "add":  # the GPU path sums bfloat16 in float32 and rounds once
        wide = expected.astype(np.float32)
        getattr(np, ufunc).at(wide, idx, values.astype(np.float32))
        expected = wide.astype(np_dtype)
    else:
        getattr(np, ufunc).at(expected, idx, values)
    got = target.copy()
    scatter_at(_CupyLike(), ufunc, got, idx, values)
    np.testing.assert_array_equal(got.astype(np.float64), expected.astype(np.float64))


def test_negative_int64_extremes_keep_their_order():
    target = np.array([-5, 7, 0], dtype=np.int64)
    got = target.copy()
    scatter_at(_CupyLike(), "maximum", got, np.array([0, 0, 2]), np.array([-9, -3, -1], dtype=np.int64))
    np.testing.assert_array_equal(got, [-3, 7, 0])
    scatter_at(_CupyLike(), "minimum", got, np.array([1, 2]), np.array([-2 ** 63, 2 ** 62], dtype=np.int64))
    np.testing.assert_array_equal(got, [-3, -2 ** 63, 0])


@pytest.mark.parametrize("ufunc", ["maximum", "minimum"])
@pytest.mark.parametrize("dtype", ["float64", "float32", "float16", "bfloat16"])
def test_float_extremes_are_exact_with_nan_infinities_and_signed_zeros(ufunc, dtype):
    np_dtype = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(dtype)
    # float64 values that float32 cannot tell apart (1 + 1e-12 and 1): CuPy's own atomics would return 1
    target = np.array([1.0, np.nan, -np.inf, 0.0, -0.0, 5.0, -2.5]).astype(np_dtype)
    values = np.array([1 + 1e-12, 3.0, -1e4, -0.0, 0.0, np.nan, np.inf, -7.0]).astype(np_dtype)
    idx = np.array([0, 1, 2, 3, 4, 5, 6, 6])
    expected = target.astype(np.float64)
    with np.errstate(invalid="ignore"):  # NumPy warns of the NaN it keeps
        getattr(np, ufunc).at(expected, idx, values.astype(np.float64))
    got = target.copy()
    scatter_at(_CupyLike(), ufunc, got, idx, values)
    np.testing.assert_array_equal(got.astype(np.float64), expected.astype(np_dtype).astype(np.float64))
    if dtype == "float64" and ufunc == "maximum":
        assert got[0] == 1 + 1e-12
