"""Frost's dtypes: names, NumPy storage, conversion and the promotion rules (checked against PyTorch)."""
import pickle

import ml_dtypes
import numpy as np
import pytest
import torch

import frost
from frost.dtype import promote, result_type, scalar_result, to_dtype

NAMES = ["float16", "bfloat16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8", "bool"]


def _torch(name):
    return getattr(torch, name)


def test_public_dtypes_and_aliases():
    assert frost.float32.np == np.float32 and frost.bfloat16.np == ml_dtypes.bfloat16
    assert frost.float is frost.float32 and frost.double is frost.float64
    assert frost.half is frost.float16 and frost.long is frost.int64
    for alias in ["float", "double", "half", "long", "int", "short", "bool"]:  # the aliases torch has
        assert getattr(frost, alias).name == str(getattr(torch, alias)).replace("torch.", ""), alias
    assert frost.bool.np == np.bool_
    assert repr(frost.float32) == "frost.float32"
    assert frost.float16.is_floating_point and frost.bfloat16.is_floating_point
    assert not frost.int32.is_floating_point and not frost.bool.is_floating_point
    assert frost.bfloat16.itemsize == 2


@pytest.mark.parametrize("spec,name", [
    ("float32", "float32"), ("float", "float32"), ("double", "float64"), ("half", "float16"), ("long", "int64"),
    (float, "float32"), (int, "int64"), (bool, "bool"), (np.float64, "float64"), (np.dtype("uint8"), "uint8"),
    (ml_dtypes.bfloat16, "bfloat16"), (frost.int32, "int32"),
])
def test_to_dtype(spec, name):
    assert to_dtype(spec).name == name


def test_to_dtype_errors():
    with pytest.raises(TypeError, match="unknown dtype name 'float8'"):
        to_dtype("float8")
    with pytest.raises(TypeError, match="unsupported dtype complex128"):
        to_dtype(np.complex128)


def test_dtype_equality_and_hash():
    assert frost.float32 == "float32" and frost.float32 == np.float32
    assert frost.float32 != frost.float64
    assert len({frost.float32, to_dtype("float"), to_dtype(np.float32)}) == 1


def test_dtype_pickles_to_the_same_singleton():
    assert pickle.loads(pickle.dumps(frost.bfloat16)) is frost.bfloat16


@pytest.mark.parametrize("a", NAMES)
@pytest.mark.parametrize("b", NAMES)
def test_promote_matches_torch(a, b):
    expected = torch.promote_types(_torch(a), _torch(b))
    assert promote(to_dtype(a), to_dtype(b)).name == str(expected).replace("torch.", "")


@pytest.mark.parametrize("a", ["float16", "float32", "int32", "int64", "uint8", "bool"])
@pytest.mark.parametrize("b", ["float64", "int64", "int8", "bool", "bfloat16"])
def test_result_type_with_zero_dim_tensor_matches_torch(a, b):
    ta, tb = torch.ones(2, dtype=_torch(a)), torch.ones((), dtype=_torch(b))
    assert result_type(to_dtype(a), 1, to_dtype(b), 0).name == str((ta + tb).dtype).replace("torch.", "")
    assert result_type(to_dtype(b), 0, to_dtype(a), 1).name == str((tb + ta).dtype).replace("torch.", "")


@pytest.mark.parametrize("a", NAMES)
@pytest.mark.parametrize("scalar", [3, 2.5, True])
def test_scalar_result_matches_torch(a, scalar):
    t = torch.ones(2, dtype=_torch(a))
    assert scalar_result(to_dtype(a), scalar).name == str(torch.result_type(t, scalar)).replace("torch.", "")
