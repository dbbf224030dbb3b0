"""The simulator and the generated C++ agree (or the frontend refuses the kernel, naming its line): a review's cases
where they did not, one test each."""
import math

import ml_dtypes
import numpy as np
import pytest

import frost
from frost.kernel import (Array, KernelError, atomic_add, atomic_max, atomic_min, bf16, cdiv, f16, f32, f64, grid,
                          i32, i64, inf, kernel, tx, u8, u32)

ARCH = "sm_90"


def body(k) -> str:
    """The generated C++ after the prelude: the device functions and the kernel."""
    return k.source[k.source.find("#line"):]


def compiles(k):
    assert k.compile(ARCH)[:4] == b"\x7fELF"


# -- kernels the GPU test (test_kernel_agreement_gpu.py) runs too ---------------------------------------------------
@kernel
def narrow(x: Array[f64], out: Array[f16]):
    out[tx] = x[tx]
    out[1] = 1.000488281250001  # the same value as a literal: cgen writes it as an f32


@kernel
def casts(x: Array[f32], o32: Array[i32], ou: Array[u32], o8: Array[u8], o64: Array[i64]):
    o32[tx] = i32(x[tx])
    ou[tx] = u32(x[tx])
    o8[tx] = u8(x[tx])
    o64[tx] = i64(x[tx])


@kernel
def pop(a: Array[f32], b: Array[bf16], cnt: Array[i32]):
    a[atomic_add(cnt, 0, 1)] %= 2.0
    b[atomic_add(cnt, 1, 1)] += 1.0
    cnt[atomic_add(cnt, 2, 1) + 3] //= 2


@kernel
def bcond(x: Array[bf16], h: Array[f16], out: Array[i32]):
    v = x[tx]
    if v:
        out[tx] = 1
    if v and tx > 0:
        out[tx] += 2
    if not h[tx]:
        out[tx] += 4
    while v:
        out[tx] += 8
        v = bf16(0.0)
    out[tx] += 16 if h[tx] or x[tx] else 0


@kernel
def amax(hi: Array[f32], lo: Array[f32], v: f32):
    atomic_max(hi, 0, v)
    atomic_min(lo, 0, v)


# -- literals ----------------------------------------------------------------------------------------------------
def test_an_int_literal_must_fit_the_type_it_takes():
    def wide(x: Array[i32], out: Array[i32]):
        if x[0] < 3000000000:
            out[0] = 1
    with pytest.raises(KernelError, match=r"test_kernel_agreement.py:\d+: in wide: the literal 3000000000 takes the "
                                          r"type i32 here .* write i64\(3000000000\)"):
        kernel(wide).source

    def shifted(x: Array[i32], out: Array[i32]):
        if x[0] < (1 << 31):
            out[0] = 1
    with pytest.raises(KernelError, match="the literal 2147483648 takes the type i32"):
        kernel(shifted).source

    @kernel
    def fits(x: Array[i32], h: Array[u32], out: Array[i32]):
        out[0] = 1 if i64(x[0]) < 3000000000 else 2
        out[1] = x[0] * (-2147483648)   # INT_MIN, which C++ cannot write as one literal
        h[0] = h[0] ^ 0x9E3779B9        # above i32's range, fits the u32 it takes
    assert "3000000000LL" in fits.source and "(-2147483647 - 1)" in fits.source and "2654435769u" in fits.source
    compiles(fits)
    out, h = np.zeros(2, np.int32), np.zeros(1, np.uint32)
    fits.simulate[1, 1](np.array([1], np.int32), h, out)
    assert out.tolist() == [1, -2 ** 31] and h[0] == 0x9E3779B9


def test_a_float_literal_beyond_f32_is_inf_in_both():
    @kernel
    def big(out: Array[f32], h: Array[f16]):
        out[0] = 1e39
        out[1] = -1e39
        out[2] = 3.4e38
        h[0] = 1e39
    src = body(big)
    assert "inff" not in src.replace(big.src.filename, "") and "__int_as_float(0x7f800000)" in src
    compiles(big)
    out, h = np.zeros(3, np.float32), np.zeros(1, np.float16)
    big.simulate[1, 1](out, h)
    assert out.tolist() == [math.inf, -math.inf, float(np.float32(3.4e38))] and h[0] == np.inf


def test_constant_folding_errors_name_the_kernel_and_line():
    def shift(out: Array[i32]):
        out[0] = 1 << -1

    def power(out: Array[f32]):
        out[0] = 2.0 ** 2000

    def cast_inf(out: Array[i32]):
        out[0] = i32(inf)

    def floor_inf(out: Array[f32]):
        out[0] = inf // 2

    def huge(out: Array[i32], x: i32):
        if x < 10 ** 20:
            out[0] = 1
    for fn, what in ((shift, "cannot be computed"), (power, "cannot be computed"), (cast_inf, "no integer value"),
                     (floor_inf, "cannot be computed"), (huge, "does not fit")):
        with pytest.raises(KernelError, match=rf"test_kernel_agreement.py:\d+: in {fn.__name__}: .*{what}"):
            kernel(fn).source


def test_constant_cdiv_folds_as_the_runtime_computes():
    @kernel
    def cd(out: Array[i32], x: i32):
        out[0] = cdiv(-6, 4)
        out[1] = cdiv(x, 4)
        out[2] = cdiv(7, 4)
    assert "out[0] = 0;" in cd.source
    out = np.zeros(3, np.int32)
    cd.simulate[1, 1](out, -6)
    assert out.tolist() == [0, 0, 2]


# -- conversions ---------------------------------------------------------------------------------------------------
def test_f64_to_f16_rounds_through_f32_as_the_gpu():
    assert "frost_to_f16((float)(x[tx]))" in narrow.source and "frost_to_f16(1.00048828125f)" in narrow.source
    v = 1 + 2.0 ** -11 + 2.0 ** -40  # f32 lands on the f16 halfway point and ties to even; directly it rounds up
    out = np.zeros(2, np.float16)
    narrow.simulate[1, 1](np.array([v], np.float64), out)
    assert out.tolist() == [1.0, 1.0] != [float(np.float16(v))] * 2


def test_float_to_int_casts_saturate_as_cvt_rzi():
    ptx = {line.split()[0] for line in casts.ptx(ARCH).splitlines() if "cvt.rzi" in line}
    assert {"cvt.rzi.s32.f32", "cvt.rzi.u32.f32", "cvt.rzi.s64.f32"} <= ptx  # saturating conversions (PTX ISA)
    x = np.array([np.nan, 3e9, -3e9, -1.0, 300.0, -2.75, 1e30], np.float32)
    o32, ou, o8, o64 = (np.zeros(7, t) for t in (np.int32, np.uint32, np.uint8, np.int64))
    casts.simulate[1, 7](x, o32, ou, o8, o64)
    assert o32.tolist() == [0, 2 ** 31 - 1, -2 ** 31, -1, 300, -2, 2 ** 31 - 1]
    assert ou.tolist() == [0, 3000000000, 0, 0, 300, 0, 2 ** 32 - 1]
    assert o8.tolist() == [0, 3000000000 & 255, 0, 0, 300 & 255, 0, 255]  # the low byte of the u32 conversion
    assert o64.tolist() == [-2 ** 63, 3000000000, -3000000000, -1, 300, -2, 2 ** 63 - 1]  # NaN: INT64_MIN on the GPU


def test_float_into_integer_needs_a_cast_everywhere():
    @frost.kernel.device
    def half(k: i32) -> i32:
        return k // 2

    @frost.kernel.device
    def declared(x: f32) -> i32:
        return x

    def annotated(x: Array[f32], out: Array[i32]):
        k: i32 = x[tx]
        out[tx] = k

    def literal(out: Array[i32]):
        j: i32 = 2.5
        out[0] = j

    def argument(x: Array[f32], out: Array[i32]):
        out[tx] = half(x[tx])

    def returned(x: Array[f32], out: Array[i32]):
        out[tx] = declared(x[tx])
    for fn, what in ((annotated, r"storing a f32 into a i32 local 'k' truncates; cast with i32"),
                     (literal, r"storing a float literal into a i32 local 'j' truncates"),
                     (argument, r"half\(\): passing a f32 to parameter 'k' \(i32\) truncates; cast with i32"),
                     (returned, r"storing a f32 into a i32 return value truncates")):
        with pytest.raises(KernelError, match=what):
            kernel(fn).source

    @kernel
    def cast(x: Array[f32], out: Array[i32]):
        k: i32 = i32(x[tx])
        out[tx] = k + half(i32(x[tx]))
    out = np.zeros(1, np.int32)
    cast.simulate[1, 1](np.array([3.75], np.float32), out)
    assert out[0] == 4


# -- device functions --------------------------------------------------------------------------------------------
@frost.kernel.device
def _relu(x):
    if x < 0:
        return 0
    return x


@frost.kernel.device
def _pair(x, k):
    if k < 0:
        return 0, 0.0
    return x, k


def test_device_return_type_unifies_every_return():
    @kernel
    def apply(x: Array[f32], out: Array[f32], k: Array[i32]):
        out[tx] = _relu(x[tx])
        a, b = _pair(x[tx], k[tx])
        k[tx] = i32(b) + 1
        x[tx] = a
    assert "static __device__ __forceinline__ float _relu_" in apply.source
    assert "_ret { float v0; float v1; };" in apply.source  # 0 beside an f32, 0.0 beside an i32: both f32
    compiles(apply)
    x = np.array([-1.0, 0.5, 2.75], np.float32)
    out, k = np.zeros(3, np.float32), np.array([1, 2, 3], np.int32)
    apply.simulate[1, 3](x.copy(), out, k)
    np.testing.assert_array_equal(out, np.maximum(x, 0))
    assert k.tolist() == [2, 3, 4]


def test_device_returns_of_two_types_are_an_error_naming_both_lines():
    @frost.kernel.device
    def mixed(x: f32, n: i32):
        if n > 0:
            return n
        return x

    def use(x: Array[f32]):
        x[tx] = mixed(x[tx], 1)
    first = mixed.fn.__code__.co_firstlineno + 3
    with pytest.raises(KernelError, match=rf"in mixed: returns a f32 here but a i32 at line {first}"):
        kernel(use).source


def test_a_device_function_must_return_on_every_path():
    @frost.kernel.device
    def maybe(x):
        if x > 0:
            return x

    @frost.kernel.device
    def bare(x):
        if x > 0:
            return
        return x

    @frost.kernel.device
    def both(x):
        if x > 0:
            return x
        else:
            return -x

    def use_maybe(x: Array[f32]):
        x[tx] = maybe(x[tx])

    def use_bare(x: Array[f32]):
        x[tx] = bare(x[tx])

    @kernel
    def use_both(x: Array[f32]):
        x[tx] = both(x[tx])
    with pytest.raises(KernelError, match="device function maybe returns a f32 but can reach its end without a "
                                          "return"):
        kernel(use_maybe).source
    with pytest.raises(KernelError, match="a bare return in bare, which returns a f32"):
        kernel(use_bare).source
    x = np.array([-2.0, 3.0], np.float32)
    use_both.simulate[1, 2](x)
    assert x.tolist() == [2.0, 3.0]


# -- names -------------------------------------------------------------------------------------------------------
def test_index_names_and_reserved_names_cannot_be_parameters_or_locals():
    @frost.kernel.device
    def dbl(lane: i32) -> i32:
        return lane * 2

    def via_device(out: Array[i32]):
        out[tx] = dbl(5)

    def param(out: Array[i32], warp: i32):
        out[tx] = warp

    def local(out: Array[i32]):
        frost_t1 = 1
        out[0] = frost_t1

    def loop(out: Array[i32]):
        for tx in range(4):  # noqa: F402  (the case: a loop variable named as a builtin)
            out[0] = 1

    def sim_helper(out: Array[f32]):
        _np = 1.0
        out[0] = _np
    for fn, what in ((via_device, "in dbl: parameter 'lane' has the name of the built-in index lane"),
                     (param, "in param: parameter 'warp' has the name of the built-in index warp"),
                     (local, "in local: local 'frost_t1': names starting with frost_ or _fk_"),
                     (loop, "loop variable 'tx' has the name of the built-in index"),
                     (sim_helper, "local '_np': names starting with")):
        with pytest.raises(KernelError, match=what):
            kernel(fn).source


def test_user_names_never_meet_generated_ones():
    @kernel
    def last(out: Array[i32], n: i32):
        i_end = n - 1
        c = 0
        for i in range(n):
            if i == i_end:
                c += 1
        out[0] = c

    @kernel
    def lenname(x: Array[f32], m: Array[f32, 2], n: i32):
        x_len = n
        m_p = 2.0
        x[0] = f32(x_len) + f32(len(x)) + m_p + m[0, 0]
    assert "frost_i_end" in last.source and "frost_x_len" in lenname.source and "frost_m_p" in lenname.source
    compiles(last)
    compiles(lenname)
    out = np.zeros(1, np.int32)
    last.simulate[1, 1](out, 4)
    assert out[0] == 1
    x = np.zeros(3, np.float32)
    lenname.simulate[1, 1](x, np.ones((2, 2), np.float32), 5)
    assert x[0] == 5 + 3 + 2 + 1


def test_cpp_keywords_and_alternative_tokens_are_renamed():
    @kernel
    def mix(a: Array[u32]):
        xor = a[0] ^ a[1]
        bitand = xor & 7
        constexpr = bitand + 1
        a[2] = constexpr
    assert "frost_kw_xor = " in mix.source and "frost_kw_constexpr" in mix.source
    compiles(mix)
    a = np.array([5, 3, 0], np.uint32)
    mix.simulate[1, 1](a)
    assert a[2] == (5 ^ 3) + 1


def test_a_loop_variable_cannot_be_assigned_after_its_loop():
    def reuse(out: Array[i32], n: i32):
        for i in range(n):
            out[i] = 1
        i = 7

    def bump(out: Array[i32], n: i32):
        for i in range(n):
            out[i] = 1
        i += 1
    for fn in (reuse, bump):
        with pytest.raises(KernelError, match=rf"in {fn.__name__}: 'i' is the loop variable of the loop at line \d+ "
                                              r"and cannot be assigned after that loop"):
            kernel(fn).source


# -- statements --------------------------------------------------------------------------------------------------
def test_augmented_element_assignment_evaluates_the_index_once():
    src = body(pop)
    assert src.count("atomicAdd") == 3
    compiles(pop)
    a, b, cnt = np.array([5.0, 7.0], np.float32), np.ones(2, ml_dtypes.bfloat16), np.array([0, 0, 0, 9], np.int32)
    pop.simulate[1, 1](a, b, cnt)
    assert a.tolist() == [1.0, 7.0] and b.astype(np.float32).tolist() == [2.0, 1.0] and cnt.tolist() == [1, 1, 1, 4]


def test_grid_extents_are_evaluated_once():
    @kernel
    def g(out: Array[i32]):
        k = 4
        c = 0
        for i, j in grid(2, k):
            k = 1
            c += 1
        out[0] = c
    assert "j < k;" not in g.source
    compiles(g)
    out = np.zeros(1, np.int32)
    g.simulate[1, 1](out)
    assert out[0] == 8


def test_grid_variables_each_have_their_own_type_in_the_simulator():
    @kernel
    def gt(out: Array[i32], n: i64):
        for i, j in grid(n, 4):
            v = j * 1000000000  # j is an i32: wraps at j = 3
            if v < 0:
                out[0] += 1
            w = i * 3000000000  # i is an i64: does not wrap
            if w < 0:
                out[1] += 1
    assert "for (long long i = 0;" in gt.source and "for (int j = 0;" in gt.source
    out = np.zeros(2, np.int32)
    gt.simulate[1, 1](out, 2)
    assert out.tolist() == [2, 0]


def test_range_down_over_an_unsigned_variable():
    @kernel
    def countdown(out: Array[i32], n: u32):
        c = 0
        for i in range(n, 0, -1):
            c += 1
        out[0] = c
    assert "i > frost_i_end; i += 4294967295u" in countdown.source  # i - 1 in unsigned arithmetic
    out = np.zeros(1, np.int32)
    countdown.simulate[1, 1](out, 10)
    assert out[0] == 10

    def by_two(out: Array[i32], n: u32):
        for i in range(n, 0, -2):
            out[0] += 1
    with pytest.raises(KernelError, match=r"range\(\) with step -2 on a u32 loop variable can step below zero"):
        kernel(by_two).source


# -- conditions and boolean operators ----------------------------------------------------------------------------
def test_16_bit_floats_as_conditions():
    assert "if (frost_float(v) != 0.0f) {" in bcond.source
    compiles(bcond)
    out = np.zeros(3, np.int32)
    bcond.simulate[1, 3](np.array([0, 1.5, np.nan], ml_dtypes.bfloat16), np.array([0, 0, 1], np.float16), out)
    assert out.tolist() == [4, 1 + 2 + 4 + 8 + 16, 1 + 2 + 8 + 16]  # NaN is true, as in Python


def test_and_or_as_values_need_bools():
    def orv(x: Array[f32], out: Array[f32]):
        v = x[tx] or 7.0
        out[tx] = v
    with pytest.raises(KernelError, match=r"in orv: `or` on a f32: Python gives one of the operands"):
        kernel(orv).source

    @kernel
    def conds(x: Array[f32], out: Array[i32]):
        if x[tx] and not (x[tx] or 0.0):  # truth in a condition: numbers are fine
            out[tx] = 5
        b = x[tx] > 0.0 or x[tx] < -1.0  # bools as values
        out[tx] += i32(b)
    compiles(conds)
    out = np.zeros(3, np.int32)
    conds.simulate[1, 3](np.array([0.0, 2.0, -3.0], np.float32), out)
    assert out.tolist() == [0, 1, 1]


# -- atomics and floating point ----------------------------------------------------------------------------------
def test_float_atomic_max_and_min_ignore_a_nan_value():
    assert "frost_isnan_bits(v)) break;" in frost.kernel.cgen.PRELUDE
    compiles(amax)
    hi, lo = np.array([1.0], np.float32), np.array([1.0], np.float32)
    amax.simulate[1, 1](hi, lo, np.float32("nan"))
    assert hi.tolist() == [1.0] and lo.tolist() == [1.0]
    hi, lo = np.array([np.nan], np.float32), np.array([np.nan], np.float32)
    amax.simulate[1, 1](hi, lo, np.float32(2.0))
    assert hi.tolist() == [2.0] and lo.tolist() == [2.0]


def test_gpu_contracts_multiply_add_and_the_docs_say_so():
    """NVRTC fuses a * b + c (one rounding, --fmad=true for speed); the simulator rounds twice: the documented
    last-bit difference."""
    @kernel
    def muladd(x: Array[f32], a: f32, b: f32):
        x[tx] = x[tx] * a + b
    assert any("fma.rn.f32" in line for line in muladd.ptx(ARCH).splitlines())
    a = np.float32(1 + 2.0 ** -12)
    x = np.array([a], np.float32)
    muladd.simulate[1, 1](x, a, np.float32(-1.0))
    fused = np.float32(float(a) * float(a) - 1.0)
    assert x[0] == np.float32(a * a) - np.float32(1.0) != fused  # rounded twice: 2^-11, fused: 2^-11 + 2^-24
    assert "fused multiply-add" in frost.kernel.__doc__
