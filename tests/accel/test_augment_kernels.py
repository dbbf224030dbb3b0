"""Tests of frost/accel/augment.py: the resident dataset's gather kernels, in the simulator and on the GPU, against
the CPU reference of frost/data/transforms.py bit for bit; and that the core's functions reach them."""
import numpy as np
import pytest

from frost import dispatch
from frost.accel.augment import GATHER_SCALED, augment_gpu, augment_kernel, gather_scaled_gpu
from frost.data import transforms as T
from frost.dtype import to_dtype

MEAN, STD = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)


def test_the_kernels_register_for_uint8_on_the_gpu():
    for op, fn in (("gather_scaled", gather_scaled_gpu), ("gather_augmented", augment_gpu)):
        (path,) = dispatch.registered(op)
        assert path.fn is fn and path.device == "cuda" and path.dtypes == frozenset({"uint8"})


def test_gpu_augment_kernel_equals_cpu_augment_bit_for_bit():
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (6, 8, 8, 3), dtype=np.uint8)
    index = np.array([4, 0, 5, 2], np.int32)
    size, padding = 8, 2
    oy = rng.integers(0, 2 * padding + 1, 4).astype(np.int32)
    ox = rng.integers(0, 2 * padding + 1, 4).astype(np.int32)
    flips = np.array([1, 0, 1, 0], np.int32)
    mean, std = np.array([0.49, 0.48, 0.45], np.float32), np.array([0.25, 0.24, 0.26], np.float32)
    out = np.full((4, 3, size, size), np.nan, np.float32)
    augment_kernel.simulate[(out.size + 127) // 128, 128](images.reshape(-1), index, oy, ox, flips, mean, std, out,
                                                          out.size, 8, 8, 3, size, padding)
    ref = T.augment(images[index], oy, ox, flips.astype(bool), size, padding, mean, std)
    np.testing.assert_array_equal(out, ref.transpose(0, 3, 1, 2))
    assert len(augment_kernel.compile(arch="sm_90")) > 1000


@pytest.mark.cuda
def test_gpu_augment_on_the_device_equals_cpu_augment():
    import cupy as cp
    rng = np.random.default_rng(1)
    images = rng.integers(0, 256, (50, 32, 32, 3), dtype=np.uint8)
    index = rng.permutation(50)[:32].astype(np.int32)
    oy, ox = rng.integers(0, 9, 32).astype(np.int32), rng.integers(0, 9, 32).astype(np.int32)
    flips = rng.integers(0, 2, 32).astype(np.int32)
    mean, std = (0.49, 0.48, 0.45), (0.25, 0.24, 0.26)
    out = augment_gpu(cp.asarray(images), cp.asarray(index), cp.asarray(oy), cp.asarray(ox), cp.asarray(flips),
                      32, 4, mean, std)
    ref = T.augment(images[index], oy, ox, flips.astype(bool), 32, 4, mean, std)
    np.testing.assert_array_equal(out.get(), ref.transpose(0, 3, 1, 2))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_gather_scaled_kernel_equals_to_float_of_the_gathered_images(dtype):
    rng = np.random.default_rng(2)
    images = rng.integers(0, 256, (7, 4, 5, 3), dtype=np.uint8)
    index = np.array([6, 0, 3, 3, 1], np.int64)
    out = gather_scaled_gpu(images, index, dtype, simulate=True)
    want = T.to_float(images[index]).astype(to_dtype(dtype).np)   # float32(x) / 255, rounded to nearest for bf16
    assert out.dtype == want.dtype and out.shape == (5, 4, 5, 3)
    np.testing.assert_array_equal(out.astype(np.float32), want.astype(np.float32))
    assert len(GATHER_SCALED[dtype].compile(arch="sm_90")) > 500


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_gpu_gather_scaled_equals_to_float_of_the_gathered_images(dtype):
    import cupy as cp
    rng = np.random.default_rng(3)
    images = rng.integers(0, 256, (50, 32, 32, 3), dtype=np.uint8)
    index = rng.permutation(50)[:32].astype(np.int64)
    out = gather_scaled_gpu(cp.asarray(images), cp.asarray(index), dtype)
    want = T.to_float(images[index]).astype(to_dtype(dtype).np)
    np.testing.assert_array_equal(cp.asnumpy(out).astype(np.float32), want.astype(np.float32))


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_gpu_core_functions_take_the_kernels_and_equal_the_host_reference(dtype):
    import cupy as cp
    rng = np.random.default_rng(5)
    images = cp.asarray(rng.integers(0, 256, (20, 8, 8, 3), dtype=np.uint8))
    index = cp.asarray(rng.permutation(20)[:6].astype(np.int64))
    oy, ox, flips = (cp.asarray(rng.integers(0, k, 6)) for k in (5, 5, 2))
    assert dispatch.lookup("gather_scaled", images, index, dtype=dtype) is gather_scaled_gpu
    assert dispatch.lookup("gather_augmented", images, index, oy, ox, flips, 8, 2, MEAN, STD) is augment_gpu
    fast = T.gather_scaled(images, index, dtype), T.gather_augmented(images, index, oy, ox, flips, 8, 2, MEAN, STD)
    with dispatch.disabled("gather_scaled", "gather_augmented"):
        slow = T.gather_scaled(images, index, dtype), T.gather_augmented(images, index, oy, ox, flips, 8, 2, MEAN, STD)
    for f, s in zip(fast, slow):
        assert isinstance(f, cp.ndarray) and isinstance(s, cp.ndarray) and f.dtype == s.dtype
        np.testing.assert_array_equal(cp.asnumpy(f).astype(np.float32), cp.asnumpy(s).astype(np.float32))


def test_the_kernel_reads_zeros_outside_the_padded_image_as_the_reference_does():
    rng = np.random.default_rng(11)
    images = rng.integers(0, 256, (3, 8, 8, 3), dtype=np.uint8)
    index = np.array([0, 1, 2, 0, 1], np.int32)
    oy = np.array([6, -3, 40, 0, 12], np.int32)
    ox = np.array([0, 2, 0, -30, 11], np.int32)
    flips = np.array([0, 1, 0, 0, 1], np.int32)
    mean, std = np.array(MEAN, np.float32), np.array(STD, np.float32)
    out = np.full((5, 3, 8, 8), np.nan, np.float32)
    augment_kernel.simulate[(out.size + 127) // 128, 128](images.reshape(-1), index, oy, ox, flips, mean, std, out,
                                                          out.size, 8, 8, 3, 8, 2)
    np.testing.assert_array_equal(out, T.gather_augmented(images, index, oy, ox, flips, 8, 2, MEAN, STD))


def test_the_gather_kernel_takes_strided_and_int32_indices():
    images = np.random.default_rng(12).integers(0, 256, (7, 2, 2, 3), dtype=np.uint8)
    index = np.array([6, 9, 0, 9, 3], np.int32)[::2]   # a strided int32 view: 6, 0, 3
    out = gather_scaled_gpu(images, index, "float32", simulate=True)
    np.testing.assert_array_equal(out, images[[6, 0, 3]].astype(np.float32) / np.float32(255))


def test_datasets_of_2_to_the_31_values_take_the_reference():
    from frost.accel.augment import indexes_in_32_bits

    class Huge:
        size = 2 ** 31
    assert indexes_in_32_bits(np.zeros((2, 2, 2, 3), np.uint8)) and not indexes_in_32_bits(Huge())

