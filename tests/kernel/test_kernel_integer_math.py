"""Integer intrinsics of the kernel language: mulhi (CUDA __umulhi/__mulhi) and u32 arithmetic wrapping mod 2^32."""
import numpy as np
import pytest

from frost.kernel import Array, KernelError, bx, f32, i32, i64, kernel, mulhi, tx, u32

ARCH = "sm_90"


@kernel
def mulhi_u32(a: Array[u32], b: Array[u32], out: Array[u32], n: i32):
    i = bx * 64 + tx
    if i < n:
        out[i] = mulhi(a[i], b[i])


@kernel
def mulhi_i32(a: Array[i32], b: Array[i32], out: Array[i32], n: i32):
    i = bx * 64 + tx
    if i < n:
        out[i] = mulhi(a[i], b[i])


@kernel
def philox_like(x: Array[u32], hi: Array[u32], lo: Array[u32], n: i32):
    """A Philox-style round: a literal multiplier above 2^31 adapts to u32; the low word wraps."""
    i = bx * 64 + tx
    if i < n:
        hi[i] = mulhi(x[i], 0xD2511F53)
        lo[i] = x[i] * 0xD2511F53


def _edge_values(rng, dtype):
    info = np.iinfo(dtype)
    edges = np.array([0, 1, 2, info.max, info.max - 1, info.min, info.min + 1, 0x7FFFFFFF, 0xD2511F53 & info.max],
                     dtype=np.int64)
    edges = edges[(edges >= info.min) & (edges <= info.max)].astype(dtype)
    rand = rng.integers(info.min, info.max, size=100, dtype=dtype, endpoint=True)
    return np.concatenate([edges, rand])


def test_mulhi_u32_compiles_and_matches_uint64_math():
    assert mulhi_u32.compile(ARCH)[:4] == b"\x7fELF"
    assert "__umulhi(" in mulhi_u32.source
    rng = np.random.default_rng(0)
    a = _edge_values(rng, np.uint32)
    b = np.roll(_edge_values(rng, np.uint32), 3)
    a, b = np.concatenate([a, a]), np.concatenate([b, a])  # also every value times itself
    out = np.zeros_like(a)
    mulhi_u32.simulate[(a.size + 63) // 64, 64](a, b, out, a.size)
    want = ((a.astype(np.uint64) * b.astype(np.uint64)) >> np.uint64(32)).astype(np.uint32)
    np.testing.assert_array_equal(out, want)
    half = a.size // 2
    assert out[half + list(a[half:]).index(0xFFFFFFFF)] == 0xFFFFFFFE  # (2^32 - 1)^2 >> 32


def test_mulhi_i32_compiles_and_matches_signed_64_bit_product():
    assert mulhi_i32.compile(ARCH)[:4] == b"\x7fELF"
    assert "__mulhi(" in mulhi_i32.source
    rng = np.random.default_rng(1)
    a = _edge_values(rng, np.int32)
    b = np.roll(_edge_values(rng, np.int32), 5)
    out = np.zeros_like(a)
    mulhi_i32.simulate[(a.size + 63) // 64, 64](a, b, out, a.size)
    want = np.array([(int(x) * int(y)) >> 32 for x, y in zip(a, b)], dtype=np.int64).astype(np.int32)
    np.testing.assert_array_equal(out, want)
    small = np.array([-1, -2 ** 31, -2 ** 31, 3], np.int32), np.array([1, -2 ** 31, 2 ** 31 - 1, -5], np.int32)
    out = np.zeros(4, np.int32)
    mulhi_i32.simulate[1, 64](*small, out, 4)
    assert out.tolist() == [-1, 2 ** 30, -2 ** 30, -1]  # negative products have an all-ones (or floored) high word


def test_mulhi_with_a_large_literal_and_wrapping_low_word():
    assert philox_like.compile(ARCH)[:4] == b"\x7fELF"
    x = np.array([0, 1, 0xFFFFFFFF, 0x12345678, 0x9E3779B9], np.uint32)
    hi, lo = np.zeros_like(x), np.zeros_like(x)
    philox_like.simulate[1, 64](x, hi, lo, x.size)
    prod = x.astype(np.uint64) * np.uint64(0xD2511F53)
    np.testing.assert_array_equal(hi, (prod >> np.uint64(32)).astype(np.uint32))
    np.testing.assert_array_equal(lo, (prod & np.uint64(0xFFFFFFFF)).astype(np.uint32))


def test_u32_arithmetic_wraps_modulo_2_32():
    @kernel
    def u32_ops(a: Array[u32], b: Array[u32], out: Array[u32], n: i32):
        i = bx * 64 + tx
        if i < n:
            x = a[i]
            y = b[i]
            out[8 * i] = x * y
            out[8 * i + 1] = x + y
            out[8 * i + 2] = x - y
            out[8 * i + 3] = x ^ y
            out[8 * i + 4] = x >> (y & 31)
            out[8 * i + 5] = x << (y & 31)
            out[8 * i + 6] = (x << 13) ^ (x >> 19) + 0x9E3779B9 * x
            z = x
            z *= 0xD2511F53
            z += y
            z ^= z >> 7
            out[8 * i + 7] = z
    assert u32_ops.compile(ARCH)[:4] == b"\x7fELF"
    rng = np.random.default_rng(2)
    a = _edge_values(rng, np.uint32)
    b = np.roll(_edge_values(rng, np.uint32), 1)
    out = np.zeros(8 * a.size, np.uint32)
    u32_ops.simulate[(a.size + 63) // 64, 64](a, b, out, a.size)
    M = (1 << 32) - 1
    want = []
    for x, y in zip(map(int, a), map(int, b)):
        z = (x * 0xD2511F53) & M
        z = (z + y) & M
        z ^= z >> 7
        want += [(x * y) & M, (x + y) & M, (x - y) & M, x ^ y, x >> (y & 31), (x << (y & 31)) & M,
                 ((x << 13) & M) ^ (((x >> 19) + 0x9E3779B9 * x) & M), z]
    np.testing.assert_array_equal(out, np.array(want, np.uint64).astype(np.uint32))


def test_mulhi_type_errors():
    @kernel
    def floats(a: Array[f32], out: Array[u32]):
        out[0] = mulhi(a[0], a[1])
    with pytest.raises(KernelError, match=r"mulhi\(\) takes u32 or i32 integers, got f32"):
        floats.compile(ARCH)

    @kernel
    def wide(a: Array[i64], out: Array[i64]):
        out[0] = mulhi(a[0], a[1])
    with pytest.raises(KernelError, match=r"mulhi\(\) takes u32 or i32 integers.*i64"):
        wide.compile(ARCH)

    @kernel
    def arity(a: Array[u32], out: Array[u32]):
        out[0] = mulhi(a[0])
    with pytest.raises(KernelError, match=r"mulhi\(\) takes 2 arguments, got 1"):
        arity.compile(ARCH)
