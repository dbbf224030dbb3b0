"""The review's simulator/C++ agreement cases run on the GPU (`pytest -m cuda`): the device gives what the simulator
gives (test_kernel_agreement.py checks the simulator and the generated code without a GPU)."""
import ml_dtypes
import numpy as np
import pytest

from frost.kernel import Array, f32, grid, i32, i64, kernel, tx, u32
from test_kernel_agreement import amax, bcond, casts, narrow, pop

pytestmark = pytest.mark.cuda


@pytest.fixture
def cp():
    import cupy
    return cupy


def agree(cp, k, launch, *host_args):
    """Run k simulated on copies of host_args and on the device; every array argument must end equal (bitwise)."""
    sim = [a.copy() if isinstance(a, np.ndarray) else a for a in host_args]
    dev = [cp.asarray(a) if isinstance(a, np.ndarray) else a for a in host_args]
    k.simulate[launch](*sim)
    k[launch](*dev)
    cp.cuda.Device().synchronize()
    for s, d in zip(sim, dev):
        if isinstance(s, np.ndarray):
            np.testing.assert_array_equal(cp.asnumpy(d).view(np.uint8), s.view(np.uint8))
    return sim


@kernel
def loops(out: Array[i32], n: i64, m: u32):
    k = 4
    for i, j in grid(2, k):
        k = 1
        out[0] += 1
    for i, j in grid(n, 4):  # (an i32 j * 1000000000 would overflow: undefined in C++, so no test of j's type)
        out[1] += j
        if i * 3000000000 < 0:  # i is an i64: no overflow
            out[2] += 1
    for i in range(m, 0, -1):
        out[3] += 1
    out[4] = (out[0] - 7) * (-2147483648)


def test_agreement_cases_on_the_device(cp):
    x = np.array([np.nan, 3e9, -3e9, -1.0, 300.0, -2.75, 1e30], np.float32)
    o32, ou, o8, o64 = agree(cp, casts, (1, 7), x, *(np.zeros(7, t) for t in (np.int32, np.uint32, np.uint8,
                                                                                np.int64)))[1:]
    assert o32.tolist() == [0, 2 ** 31 - 1, -2 ** 31, -1, 300, -2, 2 ** 31 - 1] and o8.tolist()[4] == 44
    out = agree(cp, narrow, (1, 1), np.array([1 + 2.0 ** -11 + 2.0 ** -40], np.float64), np.zeros(2, np.float16))[1]
    assert out.tolist() == [1.0, 1.0]
    for stored, value, want in [(1.0, np.nan, 1.0), (np.nan, 2.0, 2.0)]:
        hi, lo = agree(cp, amax, (1, 1), np.array([stored], np.float32), np.array([stored], np.float32),
                       np.float32(value))[:2]
        assert hi.tolist() == lo.tolist() == [want]
    out = agree(cp, bcond, (1, 3), np.array([0, 1.5, np.nan], ml_dtypes.bfloat16), np.array([0, 0, 1], np.float16),
                np.zeros(3, np.int32))[2]
    assert out.tolist() == [4, 31, 27]
    a, b, cnt = agree(cp, pop, (1, 1), np.array([5.0, 7.0], np.float32), np.ones(2, ml_dtypes.bfloat16),
                      np.array([0, 0, 0, 9], np.int32))
    assert cnt.tolist() == [1, 1, 1, 4]
    out = agree(cp, loops, (1, 1), np.zeros(5, np.int32), np.int64(2), np.uint32(10))[0]
    assert out.tolist() == [8, 12, 0, 10, -2 ** 31]


def test_the_gpu_fuses_multiply_add_where_the_simulator_rounds_twice(cp):
    """The documented difference: not agreement, so the two results are checked against their own arithmetic."""
    @kernel
    def muladd(x: Array[f32], a: f32, b: f32):
        x[tx] = x[tx] * a + b
    a = np.float32(1 + 2.0 ** -12)
    sim, dev = np.array([a], np.float32), cp.asarray(np.array([a], np.float32))
    muladd.simulate[1, 1](sim, a, np.float32(-1.0))
    muladd[1, 1](dev, a, np.float32(-1.0))
    assert sim[0] == 2.0 ** -11 and float(dev[0]) == 2.0 ** -11 + 2.0 ** -24
