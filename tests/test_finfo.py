"""Tests of frost.finfo, frost.iinfo and frost.is_tensor against PyTorch's."""
import pytest
import torch

import frost

FIELDS = ("bits", "eps", "max", "min", "tiny", "smallest_normal", "resolution")


@pytest.mark.parametrize("name", ["float16", "bfloat16", "float32", "float64"])
def test_finfo_fields_match_torch(name):
    ours, theirs = frost.finfo(getattr(frost, name)), torch.finfo(getattr(torch, name))
    for field in FIELDS:
        assert getattr(ours, field) == getattr(theirs, field), field
    assert ours.dtype == theirs.dtype == name


def test_finfo_without_argument_is_the_default_float_dtype():
    assert frost.finfo().dtype == "float32" and frost.finfo().eps == torch.finfo().eps
    assert frost.finfo("float16").max == 65504.0


@pytest.mark.parametrize("name", ["uint8", "int8", "int16", "int32", "int64"])
def test_iinfo_fields_match_torch(name):
    ours, theirs = frost.iinfo(getattr(frost, name)), torch.iinfo(getattr(torch, name))
    assert (ours.bits, ours.min, ours.max, ours.dtype) == (theirs.bits, theirs.min, theirs.max, theirs.dtype)


def test_wrong_kinds_of_dtype_are_refused():
    with pytest.raises(TypeError, match=r"frost.finfo\(\) requires a floating point input type, got frost.int32"):
        frost.finfo(frost.int32)
    with pytest.raises(TypeError, match=r"frost.iinfo\(\) requires an integer input type, got frost.float32"):
        frost.iinfo(frost.float32)
    with pytest.raises(TypeError, match="iinfo"):
        frost.iinfo(frost.bool)


def test_is_tensor():
    assert frost.is_tensor(frost.ones(2)) and frost.is_tensor(frost.nn.Parameter(frost.ones(2)))
    assert not frost.is_tensor([1.0]) and not frost.is_tensor(torch.ones(2))
