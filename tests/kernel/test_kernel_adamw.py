"""examples/kernels/adamw.py: every AdamW variant (one element per thread, 16-byte vectors, grid-stride with ILP)
agrees with its NumPy twin in the simulator, including the scalar tail, and compiles to sm_90 vector accesses."""
import numpy as np
import pytest

from examples_loader import load_example

adamw = load_example("adamw")


def _state(n, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32),
            (rng.standard_normal(n) * 0.1).astype(np.float32), (rng.random(n) * 0.1).astype(np.float32))


@pytest.mark.parametrize("variant", list(adamw.VARIANTS))
@pytest.mark.parametrize("n", [1, 7, 1024, 2051])
def test_variant_matches_numpy_twin(variant, n):
    p, g, m, v = _state(n)
    want = adamw.adamw_numpy(p.astype(np.float64), g, m, v, step=5, lr=3e-3, wd=0.1)
    g_before = g.copy()
    # one SM and one block per SM: the grid-stride variants loop several times over 2051 elements
    adamw.adamw_step(p, g, m, v, step=5, lr=3e-3, wd=0.1, simulate=True, variant=variant, sms=1, blocks_per_sm=1)
    for got, ref in zip((p, m, v), want):
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(g, g_before)


def test_vector_variants_agree_with_the_scalar_kernel_bit_for_bit():
    base = _state(2051, seed=1)
    results = {}
    for variant in adamw.VARIANTS:
        p, g, m, v = (a.copy() for a in base)
        adamw.adamw_step(p, g, m, v, step=2, simulate=True, variant=variant, sms=2, blocks_per_sm=1)
        results[variant] = (p, m, v)
    for variant, arrays in results.items():
        for got, ref in zip(arrays, results["scalar"]):
            np.testing.assert_array_equal(got, ref, err_msg=variant)


def test_variants_compile_to_16_byte_accesses():
    for name, (k, consts) in adamw.VARIANTS.items():
        info = k.inspect("sm_90", **consts)
        assert info["spill_stores"] == 0 and info["spill_loads"] == 0, name
        if name != "scalar":
            ptx = info["ptx"]
            assert ptx.count("ld.global.v4.f32") >= 3 and "ld.global.nc.v4.f32" in ptx, name
            assert ptx.count("st.global.v4.f32") >= 3, name


def test_unknown_variant_is_named():
    p, g, m, v = _state(4)
    with pytest.raises(ValueError, match=r"adamw_step: unknown variant 'vec8'"):
        adamw.adamw_step(p, g, m, v, step=1, simulate=True, variant="vec8")


def test_misaligned_arrays_are_reported_by_the_simulator():
    from frost.kernel import SimulationError
    p, g, m, v = _state(9)
    with pytest.raises(SimulationError, match=r"adamw_update4: .*load4: array 'p' \(index 0\) does not start at a "
                                              r"16-byte aligned address"):
        adamw.adamw_step(p[1:], g[1:], m[1:], v[1:], step=1, simulate=True, variant="vec4")
