"""Const[bool] compile-time constants, and kernels made by factories whose type variables only annotations name.

This module has `from __future__ import annotations` on purpose: every annotation below is a string, as in the
modules (flash attention's) that found both gaps."""
from __future__ import annotations

import numpy as np
import pytest

from frost.kernel import Array, Const, KernelError, bf16, device, dynamic_shared, f32, f64, i32, kernel, tx
from frost.kernel.frontend import enclosing_scope

DEBUG_OFFSET = False  # a module-level bool a kernel reads as a constant


@device
def pick(a, b, FIRST: Const[bool]):
    if FIRST:
        return a
    return b


@kernel
def flagged(x: Array[f32], n: i32, NEGATE: Const[bool], WIDTH: Const[int]):
    WIDE: Const[bool] = WIDTH > 4 and not NEGATE
    i = tx
    if i < n:
        v = x[i]
        if NEGATE:
            v = -v
        if WIDE:
            v = v * 2.0
        if DEBUG_OFFSET:
            v += 1000.0
        shifted = NEGATE or i > 2
        if shifted:
            v += 100.0
        x[i] = pick(v, 0.5, NEGATE)


def flagged_reference(x: np.ndarray, negate: bool, width: int) -> np.ndarray:
    """What `flagged` computes, in NumPy."""
    v = -x if negate else x.copy()
    if width > 4 and not negate:
        v = v * 2
    v = np.where(negate | (np.arange(x.size) > 2), v + 100, v)
    return v if negate else np.full_like(x, 0.5)


@pytest.mark.parametrize("negate, width", [(True, 2), (True, 8), (False, 2), (False, 8)])
def test_const_bool_parameters_and_named_constants_fold_in_the_simulator(negate, width):
    x = np.arange(8, dtype=np.float32)
    expected = flagged_reference(x, negate, width)
    flagged.simulate[1, 8](x, 8, negate, width)
    np.testing.assert_array_equal(x, expected)


def test_const_bool_is_a_cpp_literal_in_the_generated_source():
    source = flagged.source_for(NEGATE=True, WIDTH=8)
    assert "if (true) {" in source                       # `if NEGATE:`, and `if FIRST:` in pick
    assert "(true || (i > 2))" in source                 # NEGATE as a value
    assert "NEGATE" not in source and "WIDE" not in source and "DEBUG_OFFSET" not in source
    assert "if (false) {" in flagged.source_for(NEGATE=False, WIDTH=2)


def test_const_bool_takes_one_specialization_for_true_and_1():
    assert flagged.specialize(NEGATE=True, WIDTH=4) is flagged.specialize(NEGATE=1, WIDTH=4)
    assert flagged.specialize(NEGATE=np.bool_(False), WIDTH=4) is flagged.specialize(NEGATE=0, WIDTH=4)


@pytest.mark.parametrize("bad", [2, 0.5, "yes"])
def test_const_bool_refuses_a_value_that_is_no_flag(bad):
    with pytest.raises(TypeError, match=r"flagged: compile-time constant 'NEGATE' is a Const\[bool\]: pass True or "
                                        r"False, got"):
        flagged.specialize(NEGATE=bad, WIDTH=4)


def test_a_remembered_specialization_still_refuses_bad_constants():
    spec = flagged.specialize(NEGATE=True, WIDTH=4)   # remembered by the constants as given
    assert flagged.specialize(WIDTH=4, NEGATE=True) is spec and flagged.specialize(NEGATE=1, WIDTH=4) is spec
    for _ in range(2):   # a refused value is never remembered
        with pytest.raises(TypeError, match=r"compile-time constant 'NEGATE' is a Const\[bool\]"):
            flagged.specialize(NEGATE=2, WIDTH=4)
        with pytest.raises(TypeError, match=r"\['COLOR'\] are not Const parameters"):
            flagged.specialize(NEGATE=True, WIDTH=4, COLOR=1)
        with pytest.raises(TypeError, match="unhashable"):
            flagged.specialize(NEGATE=True, WIDTH=[4])


def test_a_device_function_const_bool_refuses_a_number_naming_the_function():
    @kernel
    def passes_two(x: Array[f32]):
        x[tx] = pick(x[tx], 0.0, 2)

    with pytest.raises(KernelError, match=r"pick\(\): parameter 'FIRST' is a Const\[bool\]: pass True or False"):
        passes_two.source


def test_a_named_const_bool_needs_a_compile_time_condition():
    @kernel
    def runtime_flag(x: Array[f32], n: i32):
        BIG: Const[bool] = n > 4
        if BIG:
            x[tx] = 0.0

    with pytest.raises(KernelError, match="'BIG' is a Const; its value must be a compile-time constant"):
        runtime_flag.source


@kernel
def rows_by_flag(out: Array[f32], SMALL: Const[int]):
    ROWS: Const[int] = 16 if SMALL else 64   # a conditional expression on constants is a constant
    s = dynamic_shared(f32, (ROWS, 2))
    if tx < ROWS:
        s[tx, 0] = 1.0
    out[tx] = f32(ROWS) + (0.5 if SMALL == 1 else 0.25)


def test_a_conditional_expression_on_constants_folds():
    out = np.zeros(64, np.float32)
    rows_by_flag.simulate[1, 64, 16 * 8](out, SMALL=1)   # 16 rows fit 128 bytes: the shape folded
    assert (out == 16.5).all()
    rows_by_flag.simulate[1, 64, 64 * 8](out, SMALL=0)
    assert (out == 64.25).all()
    assert "out[tx] = (16.0f + 0.5f);" in rows_by_flag.source_for(SMALL=1)


def test_const_of_another_type_is_still_refused():
    with pytest.raises(TypeError, match=r"Const\[...\] takes int, float or bool, got f32"):
        Const[f32]


# ---------------------------------------------------------------- kernels made by factories
def make_copy(T):
    """A kernel over element type T that names T only in annotations (no closure cell for T)."""
    @device
    def load(a: Array[T], i: i32) -> T:
        return a[i]

    @kernel
    def copy_scaled(x: Array[T], y: Array[T], n: i32):
        i = tx
        if i < n:
            acc: f64 = 0
            acc += load(x, i)
            y[i] = acc * 2
    return copy_scaled


@pytest.mark.parametrize("element, dtype", [(f32, np.float32), (bf16, bf16.np)])
def test_a_factory_kernel_sees_the_type_variable_only_its_annotations_name(element, dtype):
    copy = make_copy(element)
    assert [t for _, t in copy.params][:2] == [Array[element], Array[element]]
    x = np.arange(-3, 5).astype(dtype)
    y = np.zeros(8, dtype)
    copy.simulate[1, 8](x, y, 8)
    np.testing.assert_array_equal(y.astype(np.float64), x.astype(np.float64) * 2)
    assert ("frost_bf16* x" if element is bf16 else "float* x") in copy.source


def test_a_local_annotation_in_a_factory_kernel_sees_the_type_variable():
    def make_sum(T):
        @kernel
        def total(x: Array[f32], out: Array[f32], n: i32):
            acc: T = 0
            for i in range(n):
                acc += x[i]
            out[0] = acc
        return total

    x = np.full(10, 0.1, np.float32)
    out = np.zeros(1, np.float32)
    make_sum(f64).simulate[1, 1](x, out, 10)
    assert out[0] == np.float32(np.sum(x.astype(np.float64)))
    assert "double acc;" in make_sum(f64).source


def test_a_name_no_scope_defines_is_still_an_error_naming_it():
    def make_bad():
        @kernel
        def bad(x: Array[Missing]):  # noqa: F821 - the point of the test
            x[tx] = 0.0
        return bad

    with pytest.raises(KernelError, match="cannot read the type annotation: name 'Missing' is not defined"):
        make_bad()


def test_enclosing_scope_keeps_kernel_values_and_leaves_out_the_factory_arrays():
    def factory():
        T, N, big = f32, 4, np.zeros(1000)

        def fn(x: Array[T], k: Const[int] = N):
            pass
        return enclosing_scope(fn), big

    scope, _ = factory()
    assert scope == {"T": f32, "N": 4}
    assert enclosing_scope(make_copy) == {}  # defined at module level: its globals are all it needs


# ---------------------------------------------------------------- on the GPU
@pytest.fixture
def cp():
    return pytest.importorskip("cupy")


@pytest.mark.cuda
@pytest.mark.parametrize("negate, width", [(True, 8), (False, 8), (False, 2)])
def test_const_bool_on_the_gpu_matches_numpy(cp, negate, width):
    x = np.arange(8, dtype=np.float32)
    x_gpu = cp.asarray(x)
    flagged[1, 8](x_gpu, 8, negate, width)
    np.testing.assert_array_equal(cp.asnumpy(x_gpu), flagged_reference(x, negate, width))


@pytest.mark.cuda
def test_a_bf16_factory_kernel_on_the_gpu_matches_numpy(cp):
    x = np.arange(-3, 5).astype(bf16.np)
    y = cp.zeros(8, bf16.np)
    make_copy(bf16)[1, 8](cp.asarray(x), y, 8)
    np.testing.assert_array_equal(cp.asnumpy(y).astype(np.float64), x.astype(np.float64) * 2)
