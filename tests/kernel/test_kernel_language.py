"""The kernel language's features: each kernel compiles to an sm_90 cubin and its simulation matches NumPy."""
import math
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

import frost
from frost.kernel import (Array, Const, KernelError, SimulationError, bdx, bf16, bx, by, f32, f64, grid,
                          i32, i64, inf, kernel, nan, static_range, tx, ty, u32, u8)

ARCH = "sm_90"


def compiles(k, **consts):
    cubin = k.compile(ARCH, **consts)
    assert cubin[:4] == b"\x7fELF"
    return cubin


def test_elementwise_and_promotion():
    @kernel
    def axpb(x: Array[f32], y: Array[f32], a: f32, b: i32, n: i32):
        i = bx * bdx + tx
        if i < n:
            y[i] = a * x[i] + b / 2 + 7 // 2 + f32(i) * 0.5
    compiles(axpb)
    x = np.arange(70, dtype=np.float32)
    y = np.zeros(70, np.float32)
    axpb.simulate[3, 32](x, y, 1.5, 3, 70)
    want = (np.float32(1.5) * x + np.float32(1.5) + 3 + np.arange(70, dtype=np.float32) * 0.5)
    np.testing.assert_array_equal(y, want)


def test_c_division_and_remainder_truncate():
    @kernel
    def divmod_(a: Array[i32], b: Array[i32], q: Array[i32], r: Array[i32], fq: Array[f32]):
        i = tx
        q[i] = a[i] // b[i]
        r[i] = a[i] % b[i]
        fq[i] = a[i] / b[i]
    compiles(divmod_)
    a = np.array([7, -7, 7, -7, 0, 5], np.int32)
    b = np.array([2, 2, -2, -2, 3, 5], np.int32)
    q, r, fq = np.zeros(6, np.int32), np.zeros(6, np.int32), np.zeros(6, np.float32)
    divmod_.simulate[1, 6](a, b, q, r, fq)
    np.testing.assert_array_equal(q, np.trunc(a / b).astype(np.int32))
    np.testing.assert_array_equal(r, a - b * np.trunc(a / b).astype(np.int32))
    np.testing.assert_allclose(fq, a / b, rtol=1e-6)


def test_integer_types_wrap_like_c():
    @kernel
    def ints(out: Array[i32], big: Array[i64], small: Array[u8], uo: Array[u32]):
        x = 2147483647
        out[0] = x + 1
        big[0] = i64(x) + 1
        small[0] = small[0] + 200
        uo[0] = u32(0) - 1
        uo[1] = u32(7) >> 1 | 8
    compiles(ints)
    out, big = np.zeros(1, np.int32), np.zeros(1, np.int64)
    small, uo = np.array([100], np.uint8), np.zeros(2, np.uint32)
    ints.simulate[1, 1](out, big, small, uo)
    assert out[0] == -2 ** 31 and big[0] == 2 ** 31 and small[0] == 44
    assert uo[0] == 2 ** 32 - 1 and uo[1] == 11


def test_f32_math_rounds_as_f32_and_f64_as_f64():
    @kernel
    def sums(x: Array[f32], y: Array[f64], out32: Array[f32], out64: Array[f64]):
        s = 0.0
        d: f64 = 0.0
        for i in range(len(x)):
            s += x[i]
            d += y[i]
        out32[0] = s
        out64[0] = d
    compiles(sums)
    x = np.full(1000, 0.1, np.float32)
    o32, o64 = np.zeros(1, np.float32), np.zeros(1, np.float64)
    sums.simulate[1, 1](x, x.astype(np.float64), o32, o64)
    want = np.float32(0)
    for v in x:
        want = np.float32(want + v)
    assert o32[0] == want and o32[0] != np.float32(100.0)
    assert o64[0] == pytest.approx(float(np.sum(x.astype(np.float64))), rel=1e-12)


def test_math_builtins():
    @kernel
    def maths(x: Array[f32], out: Array[f32]):
        i = tx
        v = x[i]
        k = 0
        out[k * 16 + i] = sqrt(v)
        out[16 + i] = rsqrt(v)
        out[32 + i] = exp(-v) + exp2(v) + log(v) + log2(v)
        out[48 + i] = tanh(v) + sin(v) + cos(v) + erf(v)
        out[64 + i] = abs(-v) + min(v, 1.0) + max(v, 2.0) + floor(v) + ceil(v)
        out[80 + i] = fma(v, v, 1.0) + pow(v, 1.5)
        out[96 + i] = min(inf, v) + (1.0 if v > 1.0 else 0.0)
        out[112 + i] = f32(abs(i32(v) - 3))
    compiles(maths)
    x = np.linspace(0.1, 4.0, 16).astype(np.float32)
    out = np.zeros(128, np.float32)
    maths.simulate[1, 16](x, out)
    erf = np.vectorize(math.erf)
    want = np.concatenate([np.sqrt(x), 1 / np.sqrt(x), np.exp(-x) + np.exp2(x) + np.log(x) + np.log2(x),
                           np.tanh(x) + np.sin(x) + np.cos(x) + erf(x),
                           x + np.minimum(x, 1) + np.maximum(x, 2) + np.floor(x) + np.ceil(x),
                           x * x + 1 + x ** 1.5, x + (x > 1), np.abs(x.astype(np.int32) - 3)])
    np.testing.assert_allclose(out, want, rtol=2e-6, atol=1e-6)


FAST_EXP2_INPUTS = np.array([0.0, 1.0, -1.0, 0.5, 10.25, -20.5, 127.5, -125.0, -126.0, -126.5, -149.0, -1000.0,
                             -np.inf, 1e-40, np.inf, np.nan], np.float32)


def fast_exp2_want(x):
    """ex2.approx.ftz.f32's results up to its rounding: subnormal inputs read as 0, results below 2^-126 are 0."""
    r = np.exp2(np.where(np.abs(x) < 2.0 ** -126, 0, x).astype(np.float64))
    return np.where(r < 2.0 ** -126, 0.0, r)   # +inf stays +inf, NaN NaN


@kernel
def fast_exp2_kernel(x: Array[f32], out: Array[f32]):
    out[tx] = fast_exp2(x[tx])


def test_fast_exp2_flushes_subnormals():
    """fast_exp2 in the simulator: 2^x, with 2^-126.5 and 2^-149 (subnormal) flushed to zero and a subnormal input
    read as 0; exp2 keeps the subnormal results."""
    out = np.zeros(16, np.float32)
    fast_exp2_kernel.simulate[1, 16](FAST_EXP2_INPUTS, out)
    np.testing.assert_allclose(out, fast_exp2_want(FAST_EXP2_INPUTS), rtol=1e-6, atol=0)
    assert out[9] == 0.0 and np.exp2(np.float32(-126.5)) > 0   # where exp2 and fast_exp2 part
    assert "frost_fast_exp2(" in fast_exp2_kernel.source and "ex2.approx.ftz.f32" in fast_exp2_kernel.source


def test_fast_exp2_takes_f32():
    with pytest.raises(KernelError, match="fast_exp2"):
        @kernel
        def twice(x: Array[f64], out: Array[f64]):
            out[tx] = fast_exp2(x[tx])
        twice.source


def test_control_flow():
    @kernel
    def control(out: Array[i32]):
        i = tx
        acc = 0
        for k in range(10, 0, -3):          # 10, 7, 4, 1
            acc += k
        j = 0
        while True:
            j += 1
            if j == 3:
                continue
            if j > 5:
                break
            acc += 100
        for a, b in grid(3, 4):
            if a == 2:
                break
            acc += a * b
        for u in static_range(4):
            acc += u
        if i == 0:
            out[i] = acc
        elif i == 1:
            out[i] = -1
        else:
            out[i] = i * 2 if i < 4 else 0
    compiles(control)
    out = np.zeros(5, np.int32)
    control.simulate[1, 5](out)
    assert list(out) == [22 + 400 + 6 + 6, -1, 4, 6, 0]


def test_two_d_views_and_shape():
    @kernel
    def transpose(a: Array[f32, 2], b: Array[f32, 2]):
        r = by * 8 + ty
        c = bx * 8 + tx
        if r < a.shape[0] and c < a.shape[1]:
            b[c, r] = a[r, c] * 2.0
    compiles(transpose)
    a = np.arange(12 * 20, dtype=np.float32).reshape(12, 20)
    b = np.zeros((20, 12), np.float32)
    transpose.simulate[(3, 2), (8, 8)](a, b)
    np.testing.assert_array_equal(b, a.T * 2)
    big = np.zeros((24, 20), np.float32)  # a strided view (every other row)
    transpose.simulate[(2, 3), (8, 8)](b, big[::2])
    np.testing.assert_array_equal(big[::2], a * 4)


def test_const_specialization_and_module_constants():
    @kernel
    def scale(x: Array[f32], BLOCK: Const[int], FACTOR: Const[int]):
        i = bx * BLOCK + tx
        acc = 0.0
        for k in static_range(FACTOR):
            acc += x[i]
        x[i] = acc
    assert "static" not in scale.source_for(BLOCK=32, FACTOR=3)
    assert scale.compile(ARCH, BLOCK=32, FACTOR=3) != scale.compile(ARCH, BLOCK=32, FACTOR=4)
    x = np.arange(64, dtype=np.float32)
    scale.simulate[2, 32](x, 32, 3)
    np.testing.assert_array_equal(x, np.arange(64) * 3)
    scale.simulate[2, 32](x, BLOCK=32, FACTOR=2)
    np.testing.assert_array_equal(x, np.arange(64) * 6)


def test_device_function_returning_tuple_and_generic():
    @frost.kernel.device
    def divmod2(a: i32, b: i32) -> (i32, i32):
        return a // b, a % b

    @frost.kernel.device
    def twice(v):
        return v + v

    @frost.kernel
    def use(out: Array[i32], fo: Array[f32]):
        q, r = divmod2(tx + 5, 3)
        out[tx] = q * 10 + r
        fo[tx] = twice(f32(tx) * 0.25)
    src = use.source
    assert "divmod2_" in src and "struct" in src
    compiles(use)
    out, fo = np.zeros(8, np.int32), np.zeros(8, np.float32)
    use.simulate[1, 8](out, fo)
    v = np.arange(8) + 5
    np.testing.assert_array_equal(out, (v // 3) * 10 + v % 3)
    np.testing.assert_array_equal(fo, np.arange(8) * 0.5)


def test_bf16_storage_and_casts():
    @kernel
    def cvt(x: Array[bf16], y: Array[f32], z: Array[bf16]):
        y[tx] = x[tx] * 2.0
        z[tx] = bf16(y[tx] + 0.001)
    compiles(cvt)
    x = np.linspace(-3, 3, 8).astype(ml_dtypes.bfloat16)
    y, z = np.zeros(8, np.float32), np.zeros(8, ml_dtypes.bfloat16)
    cvt.simulate[1, 8](x, y, z)
    np.testing.assert_array_equal(y, x.astype(np.float32) * 2)
    np.testing.assert_array_equal(z, (y + np.float32(0.001)).astype(ml_dtypes.bfloat16))



def test_a_cast_may_name_its_type_through_a_factorys_variable():
    def make(T):
        @kernel
        def rounded(x: Array[f32], y: Array[f32]):
            y[tx] = f32(T(x[tx])) - x[tx]   # what rounding to T loses
        return rounded
    x = (np.linspace(-3, 3, 8) + 1e-3).astype(np.float32)
    for T, want in ((bf16, x.astype(ml_dtypes.bfloat16).astype(np.float32) - x), (f32, np.zeros(8, np.float32))):
        kern = make(T)
        compiles(kern)
        y = np.full(8, np.nan, np.float32)
        kern.simulate[1, 8](x, y)
        np.testing.assert_array_equal(y, want)
    assert "frost_to_bf16(x[tx])" in make(bf16).source   # the generated C++ rounds, as the simulator did

def test_inf_nan_and_bool():
    @kernel
    def special(out: Array[f32], flags: Array[i32]):
        m = -inf
        m = max(m, 3.0)
        out[0] = m
        out[1] = nan
        ok = m > 2.0 and not (m > 5.0)
        flags[0] = i32(ok)
    compiles(special)
    out, flags = np.zeros(2, np.float32), np.zeros(1, np.int32)
    special.simulate[1, 1](out, flags)
    assert out[0] == 3.0 and np.isnan(out[1]) and flags[0] == 1


def test_source_has_line_directives():
    @kernel
    def k(x: Array[f32]):
        x[tx] = 1.0
    assert f'#line {k.fn.__code__.co_firstlineno + 2} "{__file__}"' in k.source
    assert 'extern "C" __global__ void k(' in k.source


# -- errors -------------------------------------------------------------------------------------------------
def test_conflicting_assignment_names_file_and_line():
    def bad(x: Array[f32]):
        v = 1
        v = x[0]  # noqa: F841  (the kernel is only compiled, for its error)
    with pytest.raises(KernelError, match=r"test_kernel_language.py:\d+: .*local 'v' has type i32 .* assigned a f32"):
        kernel(bad).source


def test_unknown_name_and_bad_index_errors():
    def bad(x: Array[f32]):
        x[0] = y
    with pytest.raises(KernelError, match=r"unknown name 'y'.*\n    y"):
        kernel(bad).source

    def bad2(x: Array[f32]):
        x[1.5] = 0.0
    with pytest.raises(KernelError, match="an index must be an integer, got float literal"):
        kernel(bad2).source

    def bad3(x: Array[f32], n: i32):
        for i in static_range(n):
            x[i] = 0.0
    with pytest.raises(KernelError, match="static_range.. needs compile-time constant bounds"):
        kernel(bad3).source

    def bad4(x: Array[f32]):
        for i in range(4):
            i = 2  # noqa: F841  (the kernel is only compiled, for its error)
    with pytest.raises(KernelError, match="cannot assign to loop variable 'i'"):
        kernel(bad4).source

    def bad5(x):
        pass
    with pytest.raises(KernelError, match="needs a type annotation"):
        kernel(bad5)


def test_nvrtc_error_points_at_python_line(monkeypatch):
    from frost.kernel import compile as kc
    src = '#line 42 "model.py"\nextern "C" __global__ void broken() { undefined_thing(); }\n'
    with pytest.raises(KernelError, match=r"model.py\(42\): error"):
        kc.compile_cubin(src, "broken", ARCH)


def test_out_of_bounds_names_thread_array_and_line():
    @kernel
    def oob(x: Array[f32]):
        x[bx * 32 + tx + 1] = 1.0
    line = oob.fn.__code__.co_firstlineno + 2
    with pytest.raises(SimulationError, match=rf"block \(0, 0, 0\) thread \(31, 0, 0\) at "
                                              rf".*test_kernel_language.py:{line}: "
                                              r"index 32 is out of bounds for array 'x'"):
        oob.simulate[1, 32](np.zeros(32, np.float32))


def test_launch_argument_errors():
    @kernel
    def k(x: Array[f32], n: i32):
        x[tx] = f32(n)
    with pytest.raises(TypeError, match=r"takes 2 arguments \(x, n\), got 1"):
        k.simulate[1, 1](np.zeros(1, np.float32))
    with pytest.raises(TypeError, match="argument 'x' is Array\\[f32\\] but got an array of dtype float64"):
        k.simulate[1, 1](np.zeros(1), 3)
    with pytest.raises(TypeError, match="argument 'n' is a scalar i32, got an array"):
        k.simulate[1, 1](np.zeros(1, np.float32), np.zeros(3))


def test_disk_cache_second_compile_skips_nvrtc(tmp_path, monkeypatch):
    from frost.kernel import compile as kc
    monkeypatch.setenv("FROST_CACHE_DIR", str(tmp_path))

    def body(x: Array[f32]):
        x[tx] = 2.0
    before = dict(kc.stats)
    a = kernel(body).compile(ARCH)
    assert kc.stats["nvrtc_compiles"] == before["nvrtc_compiles"] + 1
    b = kernel(body).compile(ARCH)  # a new Kernel object: only the disk cache can answer
    assert a == b
    assert kc.stats["nvrtc_compiles"] == before["nvrtc_compiles"] + 1
    assert kc.stats["disk_hits"] == before["disk_hits"] + 1
    assert list(tmp_path.glob("kernels/body-sm_90-*.cubin"))


def test_lineinfo_switch_puts_the_python_file_in_the_cubin(tmp_path, monkeypatch):
    from frost.kernel import compile as kc
    monkeypatch.setenv("FROST_CACHE_DIR", str(tmp_path))

    def body(x: Array[f32]):
        x[tx] = 3.0
    plain = kernel(body).compile(ARCH)
    monkeypatch.setattr(kc, "LINEINFO", True)
    profiled = kernel(body).compile(ARCH)   # another cache key: not the plain cubin from disk
    name = Path(__file__).name.encode()
    assert name not in plain
    assert name in profiled   # Nsight Compute's source page maps the kernel's instructions to this file's lines


def test_implicit_truncation_is_an_error():
    def acc_int(x: Array[f32], out: Array[f32]):
        acc = 0
        for i in range(len(x)):
            acc += x[i]
        out[0] = acc
    with pytest.raises(KernelError, match=r"local 'acc' has type i32 \(from line \d+\) but this \+= gives a f32"):
        kernel(acc_int).source

    def store(x: Array[i32]):
        x[0] = 1.5
    with pytest.raises(KernelError, match=r"storing a float literal into a i32 element truncates; cast with i32"):
        kernel(store).source

    @kernel
    def fine(x: Array[f32], b: Array[bf16], h: Array[i32]):
        for i in range(len(x)):   # an i64 loop variable ...
            b[i] = x[i] * 2.0     # f32 stored into bf16: rounds, allowed
        for i in range(2):        # ... and an i32 one of the same name in another loop
            h[i] = i32(x[i])
    fine.compile(ARCH)


@pytest.mark.parametrize("body, message", [
    ("def k(x: Array[f32]):\n    return 1", "a kernel cannot return a value"),
    ("def k(x: Array[f32]):\n    a, b = 1", "cannot unpack a value of type int literal into 2 names"),
    ("def k(x: Array[f32]):\n    x[0] = x", "cannot convert Array\\[f32\\] to f32"),
    ("def k(x: Array[f32]):\n    y = x\n", "cannot give the array Array\\[f32\\] a second name"),
    ("def k(x: Array[f32]):\n    x[0, 1] = 1.0", "2 indices for a 1-dimensional array"),
    ("def k(x: Array[f32]):\n    for i in x:\n        pass", "a kernel loops over range"),
    ("def k(x: Array[f32]):\n    s = shared(f32, n)", "unknown name 'n'"),
    ("def k(x: Array[f32]):\n    x[0] = block_sum(x[0], shared(f32, 32))",
     "shared.. declares an array: assign it to a name first"),
    ("def k(x: Array[f32]):\n    a, b = local(f32, 4), 1", "local.. declares an array: assign it to a name first"),
    ("def k(x: Array[f32]):\n    x[0] = 1.0 << 2", "bitwise operator needs integers"),
    ("def k(x: Array[f32]):\n    x[0] = foo(1)", "unknown function 'foo'"),
    ("def k(x: Array[f32]):\n    with x:\n        pass", "With statements are not part of the kernel language"),
    ("def k(x: Array[f32]):\n    x[0] = sqrt(1.0, 2.0)", "sqrt.. takes 1 arguments, got 2"),
    ("def k(x: Array[f32], B: Const[int]):\n    x[0] = 1.0", "compile-time constant 'B' needs a value"),
])
def test_error_messages(tmp_path, body, message):
    import importlib.util
    path = tmp_path / "kmod.py"
    path.write_text("from frost.kernel import *\n\n" + body + "\n")
    spec = importlib.util.spec_from_file_location("kmod", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    with pytest.raises((KernelError, TypeError), match=message) as info:
        kernel(mod.k).source
    if info.type is KernelError:
        assert f"{path}:" in str(info.value)  # the Python file and line


def test_device_function_errors():
    @frost.kernel.device
    def one(a: f32) -> f32:
        return a

    @frost.kernel.device
    def rec(a: f32) -> f32:
        return rec(a)

    def wrong_count(x: Array[f32]):
        x[0] = one(1.0, 2.0)

    def recursive(x: Array[f32]):
        x[0] = rec(1.0)

    def array_for_scalar(x: Array[f32]):
        x[0] = one(x)
    with pytest.raises(KernelError, match=r"one\(\) takes 1 arguments, got 2"):
        kernel(wrong_count).source
    with pytest.raises(KernelError, match="calls itself; recursion is not supported"):
        kernel(recursive).source
    with pytest.raises(KernelError, match="parameter 'a' is f32, got Array"):
        kernel(array_for_scalar).source


def test_debug_env_prints_the_source(monkeypatch, capsys):
    monkeypatch.setenv("FROST_KERNEL_DEBUG", "1")

    @kernel
    def shown(x: Array[f32]):
        x[tx] = 3.0
    src = shown.source
    assert src in capsys.readouterr().err


def test_float_for_an_integer_parameter_is_an_error():
    @kernel
    def k(x: Array[f32], n: i32):
        x[0] = f32(n)
    with pytest.raises(TypeError, match="argument 'n' is i32, got the float 2.5"):
        k.simulate[1, 1](np.zeros(1, np.float32), 2.5)
    x = np.zeros(1, np.float32)
    k.simulate[1, 1](x, np.int64(7))
    assert x[0] == 7


def test_calling_a_kernel_without_a_launch_configuration_explains():
    @kernel
    def k(x: Array[f32]):
        x[tx] = 1.0
    with pytest.raises(TypeError, match=r"launch it as k\[grid, block\]\(...\)"):
        k(np.zeros(1, np.float32))


def _doubler(T):
    """A kernel factory: the element type comes from the factory's argument, used only in annotations."""
    @kernel
    def twice(x: Array[T], y: Array[T], n: i32):
        i = bx * bdx + tx
        if i < n:
            y[i] = f32(x[i]) * 2.0
    return twice


@pytest.mark.parametrize("T, np_dtype", [(f32, np.float32), (bf16, ml_dtypes.bfloat16)])
def test_kernel_factories_type_parameters_from_their_arguments(T, np_dtype):
    k = _doubler(T)
    source = compiles(k) and k.source
    assert ("twice(frost_bf16* x" in source) == (T is bf16)
    x = np.arange(40).astype(np_dtype)
    y = np.zeros(40, np_dtype)
    k.simulate[2, 32](x, y, 40)
    np.testing.assert_array_equal(y.astype(np.float32), 2 * np.arange(40, dtype=np.float32))


def test_names_of_a_tree_are_walked_once_and_are_the_trees():
    """cgen keeps the set of names a function uses on its tree: every specialization asks for the same set (a large
    kernel's specializations walked its tree each time)."""
    import ast
    from frost.kernel import cgen

    @kernel
    def uses(x: Array[f32], n: i32):
        if tx < n:
            x[tx] = f32(bx)
    tree = uses.src.tree
    names = cgen._names_in(tree)
    assert names == {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)} >= {"tx", "bx", "n", "x"}
    assert cgen._names_in(tree) is names
    source = uses.source  # the index names it uses are declared, the others not
    assert "const int tx = " in source and "const int bx = " in source and "const int by = " not in source


def test_kernel_sources_are_parsed_under_the_parse_lock(monkeypatch):
    """CPython 3.11 cannot convert parse trees in two threads at once (gh-106905): the kernel language's ast.parse
    and compile(tree) hold frost.kernel.frontend.PARSE_LOCK, which frost.io's .npy header reads take too."""
    from frost.kernel import frontend
    held = []
    parse, compile_ = frontend.ast.parse, compile
    monkeypatch.setattr(frontend.ast, "parse",
                        lambda *a, **k: held.append(("parse", frontend.PARSE_LOCK.locked())) or parse(*a, **k))
    monkeypatch.setattr(frontend, "compile",
                        lambda *a, **k: held.append(("compile", frontend.PARSE_LOCK.locked())) or compile_(*a, **k),
                        raising=False)

    @kernel
    def scale(x: "Array[f32]", n: i32):   # a quoted annotation: parsed, then compiled from its tree
        i = bx * bdx + tx
        if i < n:
            x[i] = x[i] * 2.0
    x = np.arange(5, dtype=np.float32)
    scale.simulate[1, 8](x, 5)
    np.testing.assert_array_equal(x, np.arange(5) * 2.0)
    assert {"parse", "compile"} <= {what for what, _ in held} and all(locked for _, locked in held)
    assert frost.io.PARSE_LOCK is frontend.PARSE_LOCK
