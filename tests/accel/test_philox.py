"""Tests for frost/accel/philox.py: Random123 known answers, kernels (simulated, NVRTC, GPU) against the NumPy twin,
statistics of the twin, and on the GPU the generator behind frost's CUDA draws, including CUDA-graph replay."""
import math

import numpy as np
import pytest

import frost
from frost.kernel import Array, kernel, tx, u32
from frost.accel import philox as P
from frost.accel.philox import philox_block

# Random123's kat_vectors for philox4x32-10: (counter, key, output)
KATS = [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
     (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
]
SEED = 0x0123456789ABCDEF
NEAR_WRAP = 0xFFFFFFFE + (5 << 32)  # an offset whose low word wraps during a draw: the carry into the high word


@kernel
def philox_kat_kernel(ctr: Array[u32], key: Array[u32], out: Array[u32]):
    i = tx
    c = 4 * i
    w0, w1, w2, w3 = philox_block(ctr[c], ctr[c + 1], ctr[c + 2], ctr[c + 3], key[2 * i], key[2 * i + 1])
    out[4 * i] = w0
    out[4 * i + 1] = w1
    out[4 * i + 2] = w2
    out[4 * i + 3] = w3


def _kat_arrays():
    ctr = np.array([c for c, _, _ in KATS], np.uint32)
    key = np.array([k for _, k, _ in KATS], np.uint32)
    want = np.array([w for _, _, w in KATS], np.uint32)
    return ctr, key, want


def _state(seed: int, offset: int) -> np.ndarray:
    return np.array([*P.seed_key(seed), offset & 0xFFFFFFFF, offset >> 32], np.uint32)


# ---------------------------------------------------------------- the NumPy twin
def test_twin_matches_random123_known_answers():
    ctr, key, want = _kat_arrays()
    got = P.philox4x32(ctr.T, key.T)
    np.testing.assert_array_equal(got.T, want)
    assert P.philox4x32(ctr[0], key[0]).dtype == np.uint32


def test_twin_stream_layout_offsets_and_seed_split():
    # value i of a draw at offset o is word i % 4 of counter o + i // 4, so draws at later offsets continue it
    a = P.bits_numpy(SEED, NEAR_WRAP, 13)
    np.testing.assert_array_equal(a[8:], P.bits_numpy(SEED, NEAR_WRAP + 2, 5))
    lo, hi = P.seed_key(SEED)
    assert (lo, hi) == (0x89ABCDEF, 0x01234567)
    block = P.philox4x32([[(NEAR_WRAP + 1) & 0xFFFFFFFF], [(NEAR_WRAP + 1) >> 32], [0], [0]], [lo, hi])
    np.testing.assert_array_equal(a[4:8], block[:, 0])
    assert P.counters_for(13) == 4 and P.counters_for(16) == 4 and P.counters_for(0) == 0
    assert not np.array_equal(P.bits_numpy(1, 0, 8), P.bits_numpy(2, 0, 8))
    assert P.seed_key(-1) == (0xFFFFFFFF, 0xFFFFFFFF)  # seeds are taken mod 2^64


def test_twin_uniform_is_24_bit_and_in_range():
    bits = P.bits_numpy(3, 0, 1000)
    u = P.uniform_numpy(3, 0, 1000)
    assert u.dtype == np.float32
    np.testing.assert_array_equal(u, (bits >> 8) / 2.0 ** 24)
    u64 = P.uniform64_numpy(3, 0, 1000)
    assert u64.dtype == np.float64 and 0 <= u64.min() and u64.max() < 1
    w = bits.astype(np.uint64)
    np.testing.assert_array_equal(u64[:500], ((w[0::2] >> 5) * 2.0 ** 26 + (w[1::2] >> 6)) / 2.0 ** 53)


def test_twin_uniform_and_normal_statistics_over_1e5_samples():
    n = 100_000
    u = P.uniform_numpy(7, 0, n).astype(np.float64)
    assert 0.0 <= u.min() and u.max() < 1.0
    # standard errors: mean 0.0009, variance 0.0003; four of them as tolerance
    assert abs(u.mean() - 0.5) < 0.004 and abs(u.var() - 1 / 12) < 0.0012
    assert np.all(np.abs(np.histogram(u, 10, (0, 1))[0] - n / 10) < 4 * math.sqrt(n / 10))
    z = P.normal_numpy(7, 0, n)
    assert z.dtype == np.float32 and np.isfinite(z).all()
    z = z.astype(np.float64)
    assert abs(z.mean()) < 0.013 and abs(z.var() - 1) < 0.018
    assert abs(np.mean(z ** 3)) < 0.04 and abs(np.mean(z ** 4) - 3) < 0.12
    for x in (-2.0, -1.0, 0.0, 0.5, 1.5):  # the empirical CDF against Phi(x)
        assert abs((z < x).mean() - 0.5 * (1 + math.erf(x / math.sqrt(2)))) < 0.006
    # the pairs of one block are the cos and sin of one Box-Muller draw: independent, so uncorrelated
    assert abs(np.corrcoef(z[0::2], z[1::2])[0, 1]) < 0.02


def test_twin_normal_is_box_muller_of_word_pairs():
    w = P.bits_numpy(9, 4, 8).astype(np.float64)
    z = P.normal_numpy(9, 4, 7)
    r = np.sqrt(-2 * np.log((w[0] + 1) / 2 ** 32))
    t = 2 * np.pi * w[1] / 2 ** 32
    assert z.dtype == np.float32 and len(z) == 7
    np.testing.assert_array_equal(z[:2], np.float32([r * np.cos(t), r * np.sin(t)]))


def test_twin_integers_are_in_range_and_uniform():
    n = 60_000
    v = P.integers_numpy(11, 0, -3, 3, n)
    assert v.dtype == np.int64 and v.min() == -3 and v.max() == 2
    counts = np.bincount(v + 3)
    assert np.all(np.abs(counts - n / 6) < 4 * math.sqrt(n / 6))
    bits = P.bits_numpy(11, 0, n)
    np.testing.assert_array_equal(v, (bits.astype(np.uint64) * 6 >> 32).astype(np.int64) - 3)  # multiply-shift
    big = P.integers_numpy(11, 0, 0, 3 << 40, 1000)  # a range beyond 2^32 uses 64 bits per value
    assert big.min() >= 0 and big.max() < 3 << 40 and big.max() > 1 << 40
    full = P.integers_numpy(11, 0, 0, 1 << 32, 4)
    np.testing.assert_array_equal(full, bits[:4].astype(np.int64))


# ---------------------------------------------------------------- kernels: simulator and NVRTC
def test_kernel_block_matches_known_answers_in_the_simulator():
    ctr, key, want = _kat_arrays()
    out = np.zeros(12, np.uint32)
    philox_kat_kernel.simulate[1, 3](ctr.reshape(-1), key.reshape(-1), out)
    np.testing.assert_array_equal(out.reshape(3, 4), want)


@pytest.mark.parametrize("n", [1, 6, 70])
def test_draw_kernels_match_the_twin_bit_for_bit_in_the_simulator(n):
    blocks = P.counters_for(n)
    grid = -(-blocks // 8)
    for k, twin, dtype in ((P.philox_bits_kernel, P.bits_numpy, np.uint32),
                           (P.philox_uniform_kernel, P.uniform_numpy, np.float32),
                           (P.philox_normal_kernel, P.normal_numpy, np.float32)):
        state = _state(SEED, NEAR_WRAP)
        out = np.full(n, 7, dtype)
        k.simulate[grid, 8](state, out, n, blocks)
        np.testing.assert_array_equal(out, twin(SEED, NEAR_WRAP, n), err_msg=str(k))
        np.testing.assert_array_equal(state, _state(SEED, NEAR_WRAP))  # draws read the state, never write it


def test_advance_and_set_state_kernels_in_the_simulator():
    state = _state(SEED, NEAR_WRAP)
    P.philox_advance.simulate[1, 32](state, 5)
    np.testing.assert_array_equal(state, _state(SEED, NEAR_WRAP + 5))  # the low word wrapped and carried
    P.philox_advance.simulate[1, 32](state, 0xFFFFFFFF)
    np.testing.assert_array_equal(state, _state(SEED, NEAR_WRAP + 5 + 0xFFFFFFFF))
    P.philox_set_state.simulate[1, 32](state, 1, 2, 3, 4)
    np.testing.assert_array_equal(state, [1, 2, 3, 4])


def test_reserve_kernel_snapshots_then_advances_in_one_launch():
    state, snapshot = _state(SEED, NEAR_WRAP), np.zeros(4, np.uint32)
    P.philox_reserve.simulate[1, 32](state, snapshot, 7, 0)
    np.testing.assert_array_equal(snapshot, _state(SEED, NEAR_WRAP))
    np.testing.assert_array_equal(state, _state(SEED, NEAR_WRAP + 7))   # the low word wrapped and carried
    P.philox_reserve.simulate[1, 32](state, snapshot, 1, 0x5A5A0001)
    expected = _state(SEED, NEAR_WRAP + 7)
    expected[1] ^= np.uint32(0x5A5A0001)   # a stream apart: the key's high word, in the copy only
    np.testing.assert_array_equal(snapshot, expected)
    np.testing.assert_array_equal(state, _state(SEED, NEAR_WRAP + 8))


def test_successive_simulated_draws_continue_the_stream():
    state = _state(5, 0)
    first, second = np.zeros(10, np.uint32), np.zeros(7, np.uint32)
    for out in (first, second):
        blocks = P.counters_for(len(out))
        P.philox_bits_kernel.simulate[1, 32](state, out, len(out), blocks)
        P.philox_advance.simulate[1, 32](state, blocks)
    np.testing.assert_array_equal(first, P.bits_numpy(5, 0, 10))
    np.testing.assert_array_equal(second, P.bits_numpy(5, 3, 7))  # 10 values used 3 counters
    np.testing.assert_array_equal(state, _state(5, 5))


@pytest.mark.parametrize("k", [P.philox_bits_kernel, P.philox_uniform_kernel, P.philox_normal_kernel,
                               P.philox_advance, P.philox_reserve, P.philox_set_state, philox_kat_kernel])
def test_kernels_compile_for_sm90_with_nvrtc(k, tmp_path, monkeypatch):
    monkeypatch.setenv("FROST_CACHE_DIR", str(tmp_path))
    assert k.compile("sm_90")[:4] == b"\x7fELF"
    assert "__umulhi" in k.source or k in (P.philox_advance, P.philox_reserve, P.philox_set_state)


# ---------------------------------------------------------------- on the GPU (the lead runs these)
def _host(a):
    return frost.backend.cuda.to_host(a.data if isinstance(a, frost.Tensor) else a)


@pytest.mark.cuda
def test_gpu_kernels_match_the_known_answers_and_the_twin_bit_for_bit():
    import cupy as cp
    ctr, key, want = _kat_arrays()
    out = cp.zeros(12, cp.uint32)
    philox_kat_kernel[1, 3](cp.asarray(ctr.reshape(-1)), cp.asarray(key.reshape(-1)), out)
    np.testing.assert_array_equal(_host(out).reshape(3, 4), want)
    g = P.PhiloxGenerator(SEED)
    g.set_state((SEED, NEAR_WRAP))
    n = 1_000_003
    np.testing.assert_array_equal(_host(g.bits(n)), P.bits_numpy(SEED, NEAR_WRAP, n))
    offset = NEAR_WRAP + P.counters_for(n)
    np.testing.assert_array_equal(_host(g.random((1000, 1000))).reshape(-1), P.uniform_numpy(SEED, offset, 10 ** 6))
    offset += P.counters_for(10 ** 6)
    z = _host(g.standard_normal(n))
    want_z = P.normal_numpy(SEED, offset, n)
    # computed in float64 and rounded: equal unless a float64 libm differs across a float32 rounding boundary
    np.testing.assert_array_max_ulp(z, want_z, maxulp=1)
    assert (z != want_z).sum() <= 2
    offset += P.counters_for(n)
    np.testing.assert_array_equal(_host(g.random(999, dtype="float64")), P.uniform64_numpy(SEED, offset, 999))
    offset += P.counters_for(2 * 999)
    np.testing.assert_array_equal(_host(g.integers(-5, 12, size=(33, 3))).reshape(-1),
                                  P.integers_numpy(SEED, offset, -5, 12, 99))
    offset += P.counters_for(99)
    assert g.get_state() == (SEED, offset)


@pytest.mark.cuda
def test_gpu_state_save_restore_and_manual_seed():
    frost.manual_seed(21)
    g = frost.backend.cuda.generator()
    assert isinstance(g, P.PhiloxGenerator) and g.get_state() == (21, 0)
    a = frost.rand(5, 7, device="cuda")
    np.testing.assert_array_equal(_host(a).reshape(-1), P.uniform_numpy(21, 0, 35))
    saved = g.get_state()
    assert saved == (21, P.counters_for(35))
    b = _host(frost.randn(100, device="cuda"))
    np.testing.assert_array_max_ulp(b, P.normal_numpy(21, saved[1], 100), maxulp=1)
    g.set_state(saved)
    np.testing.assert_array_equal(_host(frost.randn(100, device="cuda")), b)
    c = _host(frost.randint(0, 10, (64,), device="cuda"))
    frost.manual_seed(21)
    np.testing.assert_array_equal(_host(frost.rand(5, 7, device="cuda")), _host(a))
    frost.randn(100, device="cuda")
    np.testing.assert_array_equal(_host(frost.randint(0, 10, (64,), device="cuda")), c)
    perm = _host(frost.randperm(1000, device="cuda"))
    np.testing.assert_array_equal(np.sort(perm), np.arange(1000))


@pytest.mark.cuda
def test_gpu_reserve_hands_out_the_state_and_moves_past_the_counters():
    frost.manual_seed(5)
    g = frost.backend.cuda.generator()
    frost.rand(6, device="cuda")                     # two counters used
    snapshot = g.reserve(10)
    np.testing.assert_array_equal(_host(snapshot), [5, 0, 2, 0])
    assert g.get_state() == (5, 12)
    np.testing.assert_array_equal(_host(frost.rand(4, device="cuda")), P.uniform_numpy(5, 12, 4))


@pytest.mark.cuda
def test_gpu_dropout_mask_is_the_twin_uniform_compared_with_p():
    from frost.ops.random import dropout
    frost.manual_seed(4)
    out = _host(dropout(frost.ones(64, 100, device="cuda"), 0.3))
    keep = P.uniform_numpy(4, 0, 6400).reshape(64, 100) >= np.float32(0.3)
    np.testing.assert_array_equal(out, np.where(keep, np.float32(1 / 0.7), 0))


@pytest.mark.cuda
def test_jit_replays_draw_new_dropout_masks_in_the_eager_sequence():
    from frost.ops.random import dropout

    def step(x):
        return dropout(x * 1.0, 0.5)
    x = frost.ones(64, 64, device="cuda")
    jitted_step = frost.jit(step)

    def masks(f) -> list:
        frost.manual_seed(11)
        return [_host(f(x)).copy() for _ in range(6)]  # jit: 2 eager, 1 capture (+ replay), 3 replays

    eager, jitted = masks(step), masks(jitted_step)
    assert len(jitted_step.captures) == 1 and next(iter(jitted_step.captures.values())).graph is not None
    for i, (a, b) in enumerate(zip(eager, jitted)):
        np.testing.assert_array_equal(b, a, err_msg=f"call {i}")
        keep = P.uniform_numpy(11, i * P.counters_for(4096), 4096).reshape(64, 64) >= np.float32(0.5)
        np.testing.assert_array_equal(a != 0, keep, err_msg=f"call {i}")
    assert all(not np.array_equal(jitted[i], jitted[i + 1]) for i in range(5))
    # reseeding between replays resets, in place, the state that the captured graph reads
    frost.manual_seed(11)
    np.testing.assert_array_equal(_host(jitted_step(x)), eager[0])


@pytest.mark.cuda
def test_gpu_augmentation_draws_come_from_the_generator():
    from frost.data.transforms import draw_augment_gpu
    frost.manual_seed(3)
    oy, ox, flips = draw_augment_gpu(50, 32, 4)
    np.testing.assert_array_equal(_host(oy), P.integers_numpy(3, 0, 0, 9, 50))
    np.testing.assert_array_equal(_host(ox), P.integers_numpy(3, P.counters_for(50), 0, 9, 50))
    np.testing.assert_array_equal(_host(flips), P.uniform_numpy(3, 2 * P.counters_for(50), 50) < np.float32(0.5))


def test_sort_keys_order_as_the_unsigned_64_bit_draws(tmp_path, monkeypatch):
    """philox_sort_keys (simulated) against its NumPy twin: each key is the draw minus 2^63 exactly, so sorting the
    int64 keys gives the order of the unsigned draws, ties included (the words' top bits at both ends are in the
    sample)."""
    rng = np.random.default_rng(3)
    words = rng.integers(0, 1 << 32, 2 * 300, dtype=np.uint64).astype(np.uint32)
    words[:12] = [0, 0, 0, 1, 0x7FFFFFFF, 0xFFFFFFFF, 0x80000000, 0, 0xFFFFFFFF, 0xFFFFFFFF, 0x80000000, 0]
    words[12:14] = words[6:8]  # a tie
    n = words.size // 2
    keys = np.zeros(n, np.int64)
    P.philox_sort_keys.simulate[-(-n // 256), 256](words, keys, n)
    np.testing.assert_array_equal(keys, P.sort_keys_numpy(words))
    assert keys[:6].tolist() == [-(1 << 63), 1 - (1 << 63), -1, 0, (1 << 63) - 1, 0]  # the draw minus 2^63
    draws = (words[0::2].astype(np.uint64) << np.uint64(32)) | words[1::2]
    np.testing.assert_array_equal(np.argsort(keys, kind="stable"), np.argsort(draws, kind="stable"))
    monkeypatch.setenv("FROST_CACHE_DIR", str(tmp_path))
    assert P.philox_sort_keys.compile("sm_90")[:4] == b"\x7fELF"


@pytest.mark.cuda
def test_gpu_permutations_are_the_twins_sorted_draws_epoch_after_epoch():
    # frost bench's epoch orders: each randperm sorts 2n fresh words (the offset advances by ceil(2n / 4) blocks)
    n = 5000
    frost.manual_seed(7)
    got = [_host(frost.randperm(n, device="cuda")) for _ in range(3)]
    for epoch, perm in enumerate(got):
        words = P.bits_numpy(7, epoch * P.counters_for(2 * n), 2 * n).astype(np.uint64)
        np.testing.assert_array_equal(perm, np.argsort((words[0::2] << np.uint64(32)) | words[1::2], kind="stable"))
    assert not np.array_equal(got[0], got[1])
    assert abs(np.corrcoef(got[0], np.arange(n))[0, 1]) < 0.05   # no trace of the identity order
