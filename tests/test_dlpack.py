"""DLPack both ways, with torch and NumPy: the values, and shared memory (a write through one side is seen by the
other), bfloat16 included."""
import gc

import ml_dtypes
import numpy as np
import pytest

import frost
from frost import dlpack

torch = pytest.importorskip("torch")

_DTYPES = [(frost.float32, torch.float32), (frost.float64, torch.float64), (frost.float16, torch.float16),
           (frost.bfloat16, torch.bfloat16), (frost.int64, torch.int64), (frost.int32, torch.int32),
           (frost.uint8, torch.uint8), (frost.bool, torch.bool)]


@pytest.mark.parametrize("frost_dtype, torch_dtype", _DTYPES, ids=[d.name for d, _ in _DTYPES])
def test_torch_reads_and_writes_a_frost_tensor(frost_dtype, torch_dtype):
    t = frost.arange(12).reshape(3, 4).to(frost_dtype)
    shared = torch.from_dlpack(t)
    assert shared.dtype == torch_dtype and tuple(shared.shape) == (3, 4)
    np.testing.assert_array_equal(shared.float().numpy(), t.float().numpy())
    shared[1, 2] = 1
    shared[2, 3] = 0
    assert t[1, 2].item() == 1 and t[2, 3].item() == 0


@pytest.mark.parametrize("frost_dtype, torch_dtype", _DTYPES, ids=[d.name for d, _ in _DTYPES])
def test_frost_reads_and_writes_a_torch_tensor(frost_dtype, torch_dtype):
    source = torch.arange(12).reshape(3, 4).to(torch_dtype)
    shared = frost.from_dlpack(source)
    assert shared.dtype == frost_dtype and shared.shape == (3, 4)
    np.testing.assert_array_equal(shared.float().numpy(), source.float().numpy())
    shared.data[0, 1] = 0
    shared.data[2, 0] = 1
    assert source[0, 1].item() == 0 and source[2, 0].item() == 1


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_non_contiguous_and_offset_torch_views_keep_their_strides(dtype):
    base = torch.arange(24, dtype=dtype).reshape(4, 6)
    view = base.t()[1:, ::2]  # transposed, strided, starting past the first element
    shared = frost.from_dlpack(view)
    np.testing.assert_array_equal(shared.float().numpy(), view.float().numpy())
    shared.data[0, 1] = -1
    assert view[0, 1].item() == -1 and base[2, 1].item() == -1
    back = torch.from_dlpack(frost.from_dlpack(view))
    assert back.stride() == view.stride() and back.data_ptr() == view.data_ptr()


def test_a_strided_frost_view_exports_its_strides():
    t = frost.arange(24.0).reshape(4, 6)[:, 1::2].T
    shared = torch.from_dlpack(t)
    np.testing.assert_array_equal(shared.numpy(), t.numpy())
    shared[0, 0] = 100
    assert t[0, 0].item() == 100


def test_numpy_both_ways():
    t = frost.arange(6.0)
    array = np.from_dlpack(t)
    array[0] = 9
    assert t[0].item() == 9
    source = np.arange(4, dtype=np.float32).reshape(2, 2)
    shared = frost.from_dlpack(source)
    source[1, 1] = 7
    assert shared[1, 1].item() == 7
    bf16 = frost.from_dlpack(frost.ones(3, dtype=frost.bfloat16))  # a frost tensor comes back as itself
    assert bf16.dtype == frost.bfloat16


@pytest.mark.parametrize("shape", [(), (0,), (2, 0, 3), (1,)])
def test_0d_and_empty_tensors(shape):
    for dtype in (torch.float32, torch.bfloat16):
        source = torch.zeros(shape, dtype=dtype)
        assert frost.from_dlpack(source).shape == shape
        assert tuple(torch.from_dlpack(frost.from_dlpack(source)).shape) == shape


def test_bfloat16_export_lives_as_long_as_its_consumer():
    t = frost.tensor([1.5, -2.0, 3.0], dtype=frost.bfloat16)
    shared = torch.from_dlpack(t)
    del t
    gc.collect()
    assert shared.tolist() == [1.5, -2.0, 3.0]  # the frost array is kept alive by the capsule's manager
    held = len(dlpack._exported)
    del shared
    gc.collect()
    assert len(dlpack._exported) == held - 1
    capsule = frost.ones(2, dtype=frost.bfloat16).__dlpack__()
    assert len(dlpack._exported) == held
    del capsule  # never consumed: its destructor lets go
    assert len(dlpack._exported) == held - 1


def test_bfloat16_import_lives_as_long_as_frost_uses_it():
    source = torch.tensor([0.5, 0.25], dtype=torch.bfloat16)
    shared = frost.from_dlpack(source)
    del source
    gc.collect()
    assert shared.data.dtype == ml_dtypes.bfloat16 and shared.tolist() == [0.5, 0.25]


def test_requires_grad_and_foreign_objects_are_refused():
    with pytest.raises(RuntimeError, match=r"__dlpack__: cannot export a tensor \(shape \(2,\)\) that requires grad"):
        torch.from_dlpack(frost.ones(2, requires_grad=True))
    assert torch.from_dlpack(frost.ones(2, requires_grad=True).detach()).tolist() == [1.0, 1.0]
    with pytest.raises(TypeError, match="frost.from_dlpack: expected an object with __dlpack__ .* got list"):
        frost.from_dlpack([1, 2])
    with pytest.raises(TypeError, match="frost.from_dlpack: unsupported DLPack dtype"):
        frost.from_dlpack(torch.ones(2, dtype=torch.complex64))
    assert frost.ones(2).__dlpack_device__() == (1, 0)


@pytest.mark.cuda
def test_cuda_tensors_share_memory_with_cupy():
    cupy = pytest.importorskip("cupy")
    t = frost.arange(6.0, device="cuda")
    array = cupy.from_dlpack(t)
    array[0] = 5
    assert t[0].item() == 5 and t.__dlpack_device__() == (2, 0)
    back = frost.from_dlpack(array)
    assert back.device == "cuda:0"
    np.testing.assert_array_equal(back.cpu().numpy(), frost.from_dlpack(array).cpu().numpy())
