"""Launch-time input checks shared by the GPU path and the simulator: the launch configuration (ints only, within
CUDA's limits on grid, block and dynamic shared memory) and integer scalars (an out-of-range value is refused
rather than wrapped). The GPU path is checked on the CPU through conftest.py's fake_cupy (each GPU test takes a
fresh copy of a kernel, `kernel(k.fn)`: a kernel keeps the functions it loaded, and with them an earlier test's
fake launch record)."""
import numpy as np
import pytest

import frost
from fake_cupy import FakeArray
from frost.kernel import Array, bdx, bx, f32, i32, i64, kernel, tx, u32
from frost.kernel import api
from frost.kernel.types import u8


@kernel
def scale(x: Array[f32], a: f32, n: i32):
    i = bx * bdx + tx
    if i < n:
        x[i] *= a


@kernel
def put_i(out: Array[i32], n: i32):
    if tx == 0:
        out[0] = n


@kernel
def put_u(out: Array[u32], n: u32):
    if tx == 0:
        out[0] = n


@kernel
def put_l(out: Array[i64], n: i64):
    if tx == 0:
        out[0] = n


# (launch configuration, exception, a pattern its message matches: the kernel's name, the value and the limit)
BAD_CONFIGS = [
    ((1, 2048), ValueError, r"scale: block x of 2048 .* exceeds CUDA's limit of 1024"),
    ((1, (32, 64)), ValueError, r"scale: a block of 2048 threads \(32, 64, 1\) exceeds CUDA's limit of 1024 threads"),
    ((1, (1, 1, 65)), ValueError, r"scale: block z of 65 .* exceeds CUDA's limit of 64"),
    ((1, (1, 1025)), ValueError, r"scale: block y of 1025 .* exceeds CUDA's limit of 1024"),
    ((2**31, 32), ValueError, r"scale: grid x of 2147483648 .* exceeds CUDA's limit of 2147483647"),
    (((1, 65536), 32), ValueError, r"scale: grid y of 65536 .* exceeds CUDA's limit of 65535"),
    (((1, 1, 65536), 32), ValueError, r"scale: grid z of 65536 .* exceeds CUDA's limit of 65535"),
    ((0, 32), ValueError, r"scale: grid must be 1 to 3 positive sizes, got 0"),
    (((2, -1), 32), ValueError, r"scale: grid must be 1 to 3 positive sizes, got \(2, -1\)"),
    (((), 32), ValueError, r"scale: grid must be 1 to 3 positive sizes, got \(\)"),
    (((1, 1, 1, 1), 32), ValueError, r"scale: grid must be 1 to 3 positive sizes, got \(1, 1, 1, 1\)"),
    ((1, 32, 10**9), ValueError, r"scale: 1000000000 bytes of dynamic shared memory is outside CUDA's limit of 0 "
                                 r"to 232448 bytes"),
    ((1, 32, 232449), ValueError, r"scale: 232449 bytes of dynamic shared memory"),
    ((1, 32, -5), ValueError, r"scale: -5 bytes of dynamic shared memory is outside"),
    ((1, 32, 4096.0), TypeError, r"scale: dynamic shared memory must be an int number of bytes, got 4096.0"),
    ((1, 32, True), TypeError, r"scale: dynamic shared memory must be an int number of bytes, got True"),
    ((1, (4.9,)), TypeError, r"scale: block sizes must be ints, got \(4.9,\) \(block x is float\)"),
    ((1, 32.0), TypeError, r"scale: block must be an int or a tuple of 1 to 3 ints, got 32.0 \(float\)"),
    (("12", 32), TypeError, r"scale: grid must be an int or a tuple of 1 to 3 ints, got '12' \(str\)"),
    ((2.5, 32), TypeError, r"scale: grid must be an int or a tuple of 1 to 3 ints, got 2.5 \(float\)"),
    ((True, 32), TypeError, r"scale: grid must be an int or a tuple of 1 to 3 ints, got True \(bool\)"),
    (((2, np.float64(3)), 32), TypeError, r"scale: grid sizes must be ints, .* \(grid y is float64\)"),
    ((np.array([2, 3]), 32), TypeError, r"scale: grid must be an int or a tuple of 1 to 3 ints"),
    ((1,), TypeError, r"scale: launch as k\[grid, block\]"),
    ((1, 32, 0, None, "extra"), TypeError, r"scale: launch as k\[grid, block\]"),
]


@pytest.mark.parametrize("cfg, exc, pattern", BAD_CONFIGS, ids=[repr(c) for c, _, _ in BAD_CONFIGS])
def test_bad_launch_configurations_are_refused_in_the_simulator(cfg, exc, pattern, monkeypatch):
    def run(*args):  # (a grid of 2**31 blocks accepted would simulate for hours)
        raise AssertionError("the simulator ran a launch configuration it should have refused")
    monkeypatch.setattr(api.simulate, "run", run)
    with pytest.raises(exc, match=pattern):
        scale.simulate[cfg](np.ones(64, np.float32), 2.0, 8)


@pytest.mark.parametrize("cfg, exc, pattern", BAD_CONFIGS, ids=[repr(c) for c, _, _ in BAD_CONFIGS])
def test_bad_launch_configurations_are_refused_on_the_gpu_path(fake_cupy, cfg, exc, pattern):
    with pytest.raises(exc, match=pattern):
        kernel(scale.fn)[cfg](FakeArray(np.ones(64, np.float32)), 2.0, 8)
    assert not fake_cupy.launches


def test_bad_launch_configurations_are_refused_for_cuda_source(fake_cupy):
    k = frost.cuda_source('extern "C" __global__ void csrc(float* x) {}', "csrc")
    with pytest.raises(ValueError, match=r"csrc: block z of 65 .* exceeds CUDA's limit of 64"):
        k[1, (1, 1, 65)]
    with pytest.raises(ValueError, match=r"csrc: 300000 bytes of dynamic shared memory"):
        k[1, 32, 300_000]
    with pytest.raises(TypeError, match=r"csrc: grid must be an int or a tuple of 1 to 3 ints, got '4'"):
        k["4", 32]


def test_launch_configurations_at_the_limits_are_accepted():
    """The largest legal values pass (checked on the parsed configuration: simulating 2**31 - 1 blocks would take
    a while), NumPy integers and lists are taken, and smem None means 0."""
    cfg = api._launch_config(((2**31 - 1, 65535, 65535), (1, 16, 64), 232448, "s"), "k")
    assert cfg == ((2**31 - 1, 65535, 65535), (1, 16, 64), 232448, "s")
    assert api._launch_config((np.int64(3), [np.int32(4), np.uint8(2)], np.int64(0)), "k") == \
        ((3, 1, 1), (4, 2, 1), 0, None)
    assert api._launch_config(((5,), 1024, None), "k") == ((5, 1, 1), (1024, 1, 1), 0, None)
    assert all(type(v) is int for v in cfg[0] + cfg[1])
    x = np.ones(64, np.float32)
    scale.simulate[np.int64(2), (np.int32(32),), np.int64(16)](x, 2.0, 64)
    scale.simulate[[2], [32]](x, 2.0, 64)
    assert (x == 4).all()


def test_the_gpu_path_passes_the_checked_configuration(fake_cupy):
    x = FakeArray(np.ones(64, np.float32))
    kernel(scale.fn)[np.int64(2), [16, 2], np.int32(1024), "st"](x, 2.0, 64)
    (launch,) = fake_cupy.launches
    assert launch["grid"] == (2, 1, 1) and launch["block"] == (16, 2, 1) and launch["smem"] == 1024
    assert all(type(v) is int for v in launch["grid"] + launch["block"] + (launch["smem"],))


# (kernel, array dtype, out-of-range value, its type's name and range)
OUT_OF_RANGE = [
    (put_i, np.int32, 2**31, r"i32 \(-2147483648 to 2147483647\), got 2147483648"),
    (put_i, np.int32, -2**31 - 1, r"i32 \(-2147483648 to 2147483647\), got -2147483649"),
    (put_i, np.int32, 2**40, r"i32 .*, got 1099511627776"),
    (put_i, np.int32, np.int64(2**33), r"i32 .*, got np.int64\(8589934592\)"),
    (put_i, np.int32, np.uint32(2**31), r"i32 .*, got np.uint32\(2147483648\)"),
    (put_u, np.uint32, -1, r"u32 \(0 to 4294967295\), got -1"),
    (put_u, np.uint32, 2**32, r"u32 \(0 to 4294967295\), got 4294967296"),
    (put_u, np.uint32, np.int8(-1), r"u32 .*, got np.int8\(-1\)"),
    (put_l, np.int64, 2**63, r"i64 \(-9223372036854775808 to 9223372036854775807\), got 9223372036854775808"),
    (put_l, np.int64, np.uint64(2**64 - 1), r"i64 .*, got np.uint64\(18446744073709551615\)"),
]


@pytest.mark.parametrize("k, dt, v, pattern", OUT_OF_RANGE, ids=[f"{k.__name__}-{v!r}" for k, _, v, _ in OUT_OF_RANGE])
def test_out_of_range_integer_scalars_are_refused_in_the_simulator(k, dt, v, pattern):
    out = np.zeros(1, dt)
    with pytest.raises(OverflowError, match=rf"{k.__name__}: argument 'n' is {pattern}, which does not fit"):
        k.simulate[1, 1](out, v)
    assert out[0] == 0


@pytest.mark.parametrize("k, dt, v, pattern", OUT_OF_RANGE, ids=[f"{k.__name__}-{v!r}" for k, _, v, _ in OUT_OF_RANGE])
def test_out_of_range_integer_scalars_are_refused_on_the_gpu_path(fake_cupy, k, dt, v, pattern):
    with pytest.raises(OverflowError, match=rf"{k.__name__}: argument 'n' is {pattern}, which does not fit"):
        kernel(k.fn)[1, 1](FakeArray(np.zeros(1, dt)), v)
    assert not fake_cupy.launches


@pytest.mark.parametrize("k, dt, v", [(put_i, np.int32, 2**31 - 1), (put_i, np.int32, -2**31),
                                      (put_i, np.int32, np.int64(-7)), (put_u, np.uint32, 2**32 - 1),
                                      (put_u, np.uint32, np.uint64(5)), (put_l, np.int64, -2**63),
                                      (put_l, np.int64, np.uint64(2**63 - 1)), (put_i, np.int32, True),
                                      (put_u, np.uint32, np.True_), (put_l, np.int64, False)])
def test_integer_scalars_in_range_and_bools_pass_unchanged(k, dt, v):
    """The range's ends pass exactly; a bool for an integer parameter passes as 0 or 1 (as Python's int(True))."""
    out = np.full(1, 99, dt)
    k.simulate[1, 1](out, v)
    assert out[0] == int(v) and out.dtype == dt


def test_the_gpu_path_converts_integer_scalars_to_the_parameters_type(fake_cupy):
    out, k = FakeArray(np.zeros(1, np.uint32)), kernel(put_u.fn)
    k[1, 1](out, 2**32 - 1)
    k[1, 1](out, True)
    k[1, 1](out, np.uint32(3))
    args = [launch["args"][2] for launch in fake_cupy.launches]
    assert [a.dtype for a in args] == [np.uint32] * 3 and [int(a) for a in args] == [2**32 - 1, 1, 3]


def test_floats_for_integer_parameters_stay_type_errors():
    with pytest.raises(TypeError, match="put_i: argument 'n' is i32, got the float 2.0; convert it explicitly"):
        put_i.simulate[1, 1](np.zeros(1, np.int32), 2.0)
    with pytest.raises(TypeError, match="argument 'n' is u32, got the float"):
        put_u.simulate[1, 1](np.zeros(1, np.uint32), np.float32(1e10))


def test_u8_scalars_are_range_checked():
    assert api._scalar_arg("k", "b", u8, 255) == 255
    with pytest.raises(OverflowError, match=r"k: argument 'b' is u8 \(0 to 255\), got 256"):
        api._scalar_arg("k", "b", u8, 256)


def test_cuda_source_integer_scalars_are_range_checked(fake_cupy):
    k = frost.cuda_source('extern "C" __global__ void fill(float* x, int n, unsigned int m) {}', "fill")
    x = FakeArray(np.zeros(3, np.float32))
    k[1, 32](x, 2**31 - 1, 2**32 - 1)
    (launch,) = fake_cupy.launches
    assert launch["args"][1] == 2**31 - 1 and launch["args"][2] == 2**32 - 1
    with pytest.raises(OverflowError, match=r"fill: argument 'n' is int \(-2147483648 to 2147483647\), got 2147483648"):
        k[1, 32](x, 2**31, 1)
    with pytest.raises(OverflowError, match=r"fill: argument 'm' is unsigned int \(0 to 4294967295\), got -1"):
        k[1, 32](x, 1, -1)
    with pytest.raises(TypeError, match=r"fill: argument 'n' has C type 'int', got the float 2.5"):
        k[1, 32](x, 2.5, 1)
