"""Vector loads and stores (load2/4/8, store2/4/8, ldg4) and read-only loads (ldg): codegen, simulation, errors."""
import ml_dtypes
import numpy as np
import pytest

from frost.kernel import (Array, KernelError, SimulationError, bf16, bx, f16, f32, i32, kernel, ldg, ldg4, load2, load4,
                          load8, local, shared, static_range, store2, store4, store8, syncthreads, tx, u32)

ARCH = "sm_90"


@kernel
def saxpy4(x: Array[f32], y: Array[f32], out: Array[f32], a: f32, n: i32):
    """out = a * x + y, four floats per thread; the last n % 4 elements one at a time."""
    i = (bx * 64 + tx) * 4
    if i + 4 <= n:
        x0, x1, x2, x3 = ldg4(x, i)
        y0, y1, y2, y3 = load4(y, i)
        store4(out, i, a * x0 + y0, a * x1 + y1, a * x2 + y2, a * x3 + y3)
    else:
        for k in range(i, min(i + 4, n)):
            out[k] = a * ldg(x, k) + y[k]


@kernel
def mix_ints(a: Array[i32], b: Array[u32], out_a: Array[i32], out_b: Array[u32]):
    i = tx * 4
    p, q, r, s = load4(a, i)
    store4(out_a, i, s, r, q, p)       # reversed
    e, f, g, h = load4(b, i)
    store4(out_b, i, e ^ f, f * 3, g >> 1, h + 1)


@kernel
def through_shared(x: Array[f32], out: Array[f32]):
    buf = shared(f32, (2, 64))
    i = tx * 4
    a, b, c, d = load4(x, i)
    store4(buf[1], i, d, c, b, a)
    syncthreads()
    e, f, g, h = load4(buf[1], 60 - i)
    store4(out, i, e, f, g, h)


def _vec(n, seed=0):
    return np.random.default_rng(seed).standard_normal(n).astype(np.float32)


@pytest.mark.parametrize("n", [256, 257, 259, 1000])
def test_saxpy4_matches_numpy_with_a_scalar_tail(n):
    x, y = _vec(n, 1), _vec(n, 2)
    out = np.full(n, np.nan, np.float32)
    saxpy4.simulate[(n + 255) // 256, 64](x, y, out, 1.5, n)
    np.testing.assert_array_equal(out, np.float32(1.5) * x + y)


def test_vector_accesses_compile_to_v4_instructions():
    assert saxpy4.compile(ARCH)[:4] == b"\x7fELF"
    assert mix_ints.compile(ARCH)[:4] == b"\x7fELF"
    assert through_shared.compile(ARCH)[:4] == b"\x7fELF"
    ptx = saxpy4.ptx(ARCH)
    assert "ld.global.nc.v4.f32" in ptx and "ld.global.v4.f32" in ptx and "st.global.v4.f32" in ptx
    assert "ld.global.nc.f32" in ptx  # the scalar ldg() of the tail
    assert "ld.shared.v4.f32" in through_shared.ptx(ARCH) and "st.shared.v4.f32" in through_shared.ptx(ARCH)


def test_integer_vectors_and_shared_memory_simulated():
    a = np.arange(-32, 32, dtype=np.int32)
    b = np.arange(64, dtype=np.uint32) * np.uint32(0x9E3779B9)
    out_a, out_b = np.zeros_like(a), np.zeros_like(b)
    mix_ints.simulate[1, 16](a, b, out_a, out_b)
    np.testing.assert_array_equal(out_a, a.reshape(16, 4)[:, ::-1].reshape(-1))
    b4 = b.reshape(16, 4)
    want_b = np.stack([b4[:, 0] ^ b4[:, 1], b4[:, 1] * np.uint32(3), b4[:, 2] >> 1, b4[:, 3] + np.uint32(1)], 1)
    np.testing.assert_array_equal(out_b, want_b.reshape(-1))
    x, out = _vec(64), np.zeros(64, np.float32)
    through_shared.simulate[1, 16](x, out)
    np.testing.assert_array_equal(out, x[::-1])  # each group of 4 reversed in shared, then the groups in reverse


def test_misaligned_index_names_kernel_line_array_and_index():
    @kernel
    def off_by_two(x: Array[f32], y: Array[f32]):
        a, b, c, d = load4(x, tx * 4 + 2)
        y[tx] = a + b + c + d
    line = off_by_two.fn.__code__.co_firstlineno + 2
    with pytest.raises(SimulationError, match=rf"off_by_two: block \(0, 0, 0\) thread \(0, 0, 0\) at "
                                              rf".*test_kernel_vector.py:{line}: load4: index 2 into array 'x' "
                                              r"is not a multiple of 4"):
        off_by_two.simulate[1, 2](_vec(16), np.zeros(2, np.float32))


def test_misaligned_base_is_an_error():
    @kernel
    def copy4(x: Array[f32], y: Array[f32]):
        a, b, c, d = load4(x, tx * 4)
        store4(y, tx * 4, a, b, c, d)
    base = np.zeros(20, np.float32)
    assert base.ctypes.data % 16 == 0
    with pytest.raises(SimulationError, match=r"copy4: .*load4: array 'x' \(index 0\) does not start at a 16-byte "
                                              r"aligned address \(it is 4 bytes past one\)"):
        copy4.simulate[1, 1](base[1:17], np.zeros(4, np.float32))
    with pytest.raises(SimulationError, match=r"store4: array 'y' \(index 0\) does not start at a 16-byte aligned"):
        copy4.simulate[1, 1](base[:16], base[2:18])


def test_vector_out_of_bounds_checks_all_four_elements():
    @kernel
    def tail(x: Array[f32], y: Array[f32]):
        a, b, c, d = load4(x, tx * 4)
        store4(y, tx * 4, a, b, c, d)
    line = tail.fn.__code__.co_firstlineno + 2
    x = np.zeros(16, np.float32)
    with pytest.raises(SimulationError, match=rf"thread \(2, 0, 0\) at .*test_kernel_vector.py:{line}: load4: "
                                              r"elements 8\.\.11 are out of bounds for array 'x' of shape \(10,\)"):
        tail.simulate[1, 3](x[:10], np.zeros(12, np.float32))
    with pytest.raises(SimulationError, match=r"store4: elements 4\.\.7 are out of bounds for array 'y'"):
        tail.simulate[1, 2](x, np.zeros(7, np.float32))


@pytest.mark.parametrize("body, message", [
    ("a, b, c, d = load4(xd, tx * 4)", r"load4\(\) moves 4 elements of f32, i32, u32, bf16, f16 in one access, "
                                       r"not f64"),
    ("a, b, c, d = ldg4(xb, tx * 4)", r"ldg4\(\) moves 4 elements of f32, i32, u32 in one access, not bf16"),
    ("a, b, c, d, e, f, g, h = load8(x, 0)", r"load8\(\) moves 8 elements of bf16, f16 in one access, not f32"),
    ("store8(xb, 0, 1.0, 2.0, 3.0, 4.0)", r"store8\(array, index, a, b, c, d, e, f, g, h\) takes 10 arguments, "
                                          r"got 6"),
    ("a, b, c, d = load4(x, 1.5)", r"load4\(\) index must be an integer, got float literal"),
    ("a, b, c, d = load4(x)", r"load4\(array, index\) takes 2 arguments, got 1"),
    ("a, b, c = load4(x, 0)", r"unpacking 4 values into 3 names"),
    ("a = load4(x, 0)", r"cannot assign a tuple"),
    ("store4(x, 0, 1.0, 2.0, 3.0)", r"store4\(array, index, a, b, c, d\) takes 6 arguments, got 5"),
    ("store4(xi, 0, 1.0, 2, 3, 4)", r"storing a float literal into a i32 element truncates"),
    ("store4(n, 0, 1.0, 2.0, 3.0, 4.0)", r"store4\(\) needs a 1-D global or shared array of f32, i32, u32, bf16, "
                                         r"f16, got i32"),
    ("s = shared(f32, 8); a, b, c, d = ldg4(s, 0)", r"ldg4\(\) needs a 1-D global array"),
    ("y = ldg(xb, 0)", r"ldg\(\) needs a 1-D global array of f32, f64, i32, u32 or i64"),
])
def test_wrong_arguments_are_compile_errors(tmp_path, body, message):
    import importlib.util
    src = ("from frost.kernel import *\n"
           "@kernel\n"
           "def bad(x: Array[f32], xd: Array[f64], xb: Array[bf16], xi: Array[i32], n: i32):\n"
           f"    {body}\n")
    path = tmp_path / "bad_vector_kernel.py"
    path.write_text(src)
    spec = importlib.util.spec_from_file_location("bad_vector_kernel", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    with pytest.raises(KernelError, match=rf"bad_vector_kernel.py:4: in bad: {message}"):
        mod.bad.compile(ARCH)


def test_inspect_reports_registers_spills_and_ptx():
    info = saxpy4.inspect(ARCH)
    assert 8 <= info["registers"] <= 255 and info["spill_stores"] == 0 and info["spill_loads"] == 0
    assert info["ptx"].lstrip().startswith("//") and ".entry saxpy4" in info["ptx"]
    assert "Used" in info["log"]


def test_unpacking_into_array_elements():
    @kernel
    def regs(x: Array[f32], y: Array[f32], z: Array[bf16]):
        r = local(f32, (2, 4))
        for u in static_range(2):
            r[u, 0], r[u, 1], r[u, 2], r[u, 3] = load4(x, 4 * (2 * tx + u))
        y[8 * tx], z[tx] = r[0, 0] + r[1, 3], r[1, 1]     # a tuple value, into an f32 and a bf16 element
        store4(y, 8 * tx + 4, r[1, 0], r[1, 1], r[1, 2], r[1, 3])
    assert regs.compile(ARCH)[:4] == b"\x7fELF"
    x = _vec(16)
    y, z = np.zeros(16, np.float32), np.zeros(2, ml_dtypes.bfloat16)
    regs.simulate[1, 2](x, y, z)
    xr = x.reshape(2, 2, 4)
    np.testing.assert_array_equal(y.reshape(2, 8)[:, 0], xr[:, 0, 0] + xr[:, 1, 3])
    np.testing.assert_array_equal(y.reshape(2, 8)[:, 4:], xr[:, 1])
    np.testing.assert_array_equal(z, xr[:, 1, 1].astype(ml_dtypes.bfloat16))


def test_load2_store2_move_8_bytes():
    @kernel
    def swap_pairs(x: Array[f32], y: Array[f32]):
        a, b = load2(x, 2 * tx)
        store2(y, 2 * tx, b, a)
    assert swap_pairs.compile(ARCH)[:4] == b"\x7fELF"
    ptx = swap_pairs.ptx(ARCH)
    assert "ld.global.v2.f32" in ptx and "st.global.v2.f32" in ptx
    x, y = _vec(16), np.zeros(16, np.float32)
    swap_pairs.simulate[1, 8](x, y)
    np.testing.assert_array_equal(y, x.reshape(8, 2)[:, ::-1].reshape(-1))
    base = np.zeros(24, np.float32)
    with pytest.raises(SimulationError, match=r"load2: array 'x' \(index 0\) does not start at a 8-byte aligned"):
        swap_pairs.simulate[1, 8](base[1:17], y)
    swap_pairs.simulate[1, 8](base[2:18], y)  # 8-byte aligned is enough
    with pytest.raises(SimulationError, match=r"store2: elements 14\.\.15 are out of bounds for array 'y'"):
        swap_pairs.simulate[1, 8](x, np.zeros(14, np.float32))


@kernel
def halves(x: Array[bf16], y: Array[bf16], h: Array[f16], out_h: Array[f16]):
    """bf16: eight reversed per thread (16 bytes), then scaled pairs; f16: four at a time through shared memory."""
    i = tx * 8
    a, b, c, d, e, f, g, k = load8(x, i)
    store8(y, i, k, g, f, e, d, c, b, a)
    buf = shared(f16, 64)
    p, q, r, s = load4(h, tx * 4)
    store4(buf, 60 - tx * 4, s, r, q, p)
    syncthreads()
    u, v = load2(buf, tx * 2)
    store2(out_h, tx * 2, f16(f32(u) * 2.0), v)


def test_16_bit_vectors_simulated_bit_for_bit():
    x = np.random.default_rng(3).standard_normal(128).astype(ml_dtypes.bfloat16)
    h = np.random.default_rng(4).standard_normal(64).astype(np.float16)
    y, out_h = np.zeros_like(x), np.zeros(32, np.float16)
    halves.simulate[1, 16](x, y, h, out_h)
    np.testing.assert_array_equal(y.view(np.uint16), x.reshape(16, 8)[:, ::-1].reshape(-1).view(np.uint16))
    want = h[::-1][:32].copy()  # shared holds h reversed; thread t reads its pair from the front
    want[0::2] = (want[0::2].astype(np.float32) * 2).astype(np.float16)
    np.testing.assert_array_equal(out_h.view(np.uint16), want.view(np.uint16))


def test_16_bit_vectors_compile_to_32_bit_word_accesses():
    ptx = halves.ptx(ARCH)
    assert "ld.global.v4.u32" in ptx and "st.global.v4.u32" in ptx  # load8/store8: 16 bytes
    assert "ld.global.v2.u32" in ptx  # load4 of f16: 8 bytes
    assert "st.shared.v2.u32" in ptx and "ld.shared.u32" in ptx and "st.global.u32" in ptx
    assert "ld.global.u16" not in ptx and "st.global.u16" not in ptx


def test_16_bit_vectors_check_index_alignment_and_bounds():
    @kernel
    def copy8(x: Array[bf16], y: Array[bf16]):
        a, b, c, d, e, f, g, h = load8(x, tx * 8)
        store8(y, tx * 8, a, b, c, d, e, f, g, h)
    base = np.zeros(40, ml_dtypes.bfloat16)
    assert base.ctypes.data % 16 == 0
    with pytest.raises(SimulationError, match=r"load8: array 'x' \(index 0\) does not start at a 16-byte aligned "
                                              r"address \(it is 8 bytes past one\)"):
        copy8.simulate[1, 1](base[4:12], np.zeros(8, ml_dtypes.bfloat16))
    with pytest.raises(SimulationError, match=r"store8: elements 8\.\.15 are out of bounds for array 'y' of shape "
                                              r"\(12,\)"):
        copy8.simulate[1, 2](base[:16], base[16:28])
    assert copy8.specialize().checked.vector_params == {"x": 16, "y": 16}
