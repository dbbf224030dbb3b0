"""Hopper warpgroup MMA (wgmma, sm_90a): descriptor encoding, compilation to sm_90a cubins, the simulator's
collective semantics against NumPy, misuse errors, and (with `-m cuda`) the same kernels on the GPU."""
import ml_dtypes
import numpy as np
import pytest

from frost.kernel import (K_MAJOR, MN_MAJOR, Array, Const, KernelError, SimulationError, bf16, cp_async_bulk, device,
                          dynamic_shared, f32, fence_proxy_async, i32, i64, kernel, lane, local,
                          mbarrier_arrive_expect_tx, mbarrier_init, mbarrier_wait, shared, static_range, swizzle,
                          syncthreads, tx, wgmma_bf16, wgmma_bf16_rs, wgmma_commit, wgmma_desc,
                          wgmma_descriptors_from_bases, wgmma_discard, wgmma_fence, wgmma_wait)
from frost.kernel.simulate import (decode_wgmma_desc, encode_wgmma_desc, wgmma_fragment_index,
                                   wgmma_mn_operand_addresses, wgmma_operand_addresses)

from examples_loader import load_example


GEMM = load_example("gemm_wgmma")
wgmma_tile = GEMM.wgmma_tile
wrong_blocks = GEMM.wrong_blocks


def _operands(n, seed=0):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((64, 64)).astype(ml_dtypes.bfloat16)
    b = rng.standard_normal((n, 64)).astype(ml_dtypes.bfloat16)
    return a, b, a.astype(np.float64) @ b.astype(np.float64).T


# -- descriptors ---------------------------------------------------------------------------------------------
def test_descriptor_encoding_matches_the_ptx_isa_fields():
    # PTX ISA example "K-Major, no-swizzling and tf32 type": LBO = 64 * 4 bytes (encoded 16), SBO = 32 * 4 (8)
    d = encode_wgmma_desc(0x400, 256, 128, 0)
    assert d == (0x400 >> 4) | (16 << 16) | (8 << 32)
    assert decode_wgmma_desc(d) == dict(start=0x400, lbo=256, sbo=128, base_offset=0, swizzle=0)
    # K-major 128B swizzle, as CUTLASS's make_gmma_desc writes it: LBO unused (1), SBO = 1024 bytes (64), mode 1
    assert encode_wgmma_desc(0x2000, 16, 1024, 128) == 0x200 | (1 << 16) | (64 << 32) | (1 << 62)
    assert encode_wgmma_desc(0x2020, 16, 512, 64) >> 62 == 2 and encode_wgmma_desc(0, 16, 256, 32) >> 62 == 3
    assert encode_wgmma_desc(0x3FFF0, 16, 1024, 128) & 0x3FFF == 0x3FFF   # 18-bit addresses, >> 4
    assert encode_wgmma_desc(0x40010, 16, 1024, 128) & 0x3FFF == 1        # bits above 18 are dropped


def test_wgmma_desc_builtin_in_a_kernel():
    @kernel
    def descs(out: Array[i64]):
        s = dynamic_shared(bf16, (2, 64, 64))
        t = dynamic_shared(bf16, (8, 32), 2 * 64 * 64 * 2)
        if tx == 0:
            out[0] = wgmma_desc(s[1], (8, 16), 128)
            out[1] = wgmma_desc(t, (0, 8), 64)
            out[2] = wgmma_desc(s[0], (0, 0), 0, 256, 128)
    out = np.zeros(3, np.int64)
    descs.simulate[1, 32, 2 * 64 * 64 * 2 + 8 * 32 * 2](out)   # dynamic shared memory starts at address 0
    bits = out.view(np.uint64)
    assert bits[0] == encode_wgmma_desc(64 * 64 * 2 + 8 * 128 + 32, 16, 1024, 128)
    assert bits[1] == encode_wgmma_desc(2 * 64 * 64 * 2 + 16, 16, 512, 64)   # mode 2 sets bit 63: negative as i64
    assert bits[2] == (16 << 16) | (8 << 32)
    src = descs.source
    # a tile of a shared array: its address, or with wgmma_descriptors_from_bases() its array's descriptor + offset
    assert "frost_wgmma_desc_in(s, &s[1][8][16], 16u, 1024u, 1u)" in src and "__align__(1024)" in src
    assert "#define FROST_WGMMA_DESC_FROM_BASES" not in src


@device
def write_descs(out, s, t, u, panel: i32):
    """Tiles' descriptors: constant and run-time offsets into two dynamic shared arrays and a static one."""
    if tx == 0:
        out[0] = wgmma_desc(s[0], (0, 0), 128)
        out[1] = wgmma_desc(s[panel], (8, 16), 128)
        out[2] = wgmma_desc(t, (0, 8), 64)
        out[3] = wgmma_desc(s[panel], (40, 48), 128)
        out[4] = wgmma_desc(s[0], (panel * 16, 0), 0, 256, 128)
        out[5] = wgmma_desc(u[panel + 2], (16, 32), 128)


@kernel
def descs_from_addresses(out: Array[i64], panel: i32):
    s = dynamic_shared(bf16, (2, 64, 64))
    t = dynamic_shared(bf16, (8, 32), 2 * 64 * 64 * 2)
    u = shared(bf16, (4, 32, 64))   # with the dynamic arrays under 48 KiB: no opt-in
    write_descs(out, s, t, u, panel)


@kernel
def descs_from_bases(out: Array[i64], panel: i32):
    wgmma_descriptors_from_bases()
    s = dynamic_shared(bf16, (2, 64, 64))
    t = dynamic_shared(bf16, (8, 32), 2 * 64 * 64 * 2)
    u = shared(bf16, (4, 32, 64))   # with the dynamic arrays under 48 KiB: no opt-in
    write_descs(out, s, t, u, panel)


DESCS_SMEM = 2 * 64 * 64 * 2 + 8 * 32 * 2


def test_descriptors_from_bases_is_the_kernels_choice():
    plain, from_bases = descs_from_addresses.source, descs_from_bases.source
    assert "#define FROST_WGMMA_DESC_FROM_BASES 1" in from_bases and "#define FROST_WGMMA_DESC_FROM_BASES" not in plain
    for src in (plain, from_bases):   # the call sites are the same: the definition chooses
        assert "frost_wgmma_desc_in(u, &u[(panel + 2)][16][32], 16u, 1024u, 1u)" in src
    want = np.zeros(6, np.int64)
    descs_from_bases.simulate[1, 32, DESCS_SMEM](want, 1)
    assert decode_wgmma_desc(int(want.view(np.uint64)[1]))["start"] == 64 * 64 * 2 + 8 * 128 + 32
    assert {"registers"} <= set(descs_from_bases.inspect("sm_90"))   # compiles for sm_90a


def test_descriptors_from_bases_must_be_a_statement_of_the_kernel():
    with pytest.raises(KernelError, match=r"wgmma_descriptors_from_bases\(\) must be a statement in the body of a "
                                          r"kernel"):
        @kernel
        def nested(out: Array[i64]):
            if tx == 0:
                wgmma_descriptors_from_bases()
        nested.source  # noqa: B018


def test_128b_swizzle_addresses_are_frost_swizzle():
    # the descriptor's view of a K-major SW128 tile (rows of 128 bytes) equals the tile the language's swizzle()
    # writes: element (r, k) at row r, column swizzle(r, k, 64)
    desc = encode_wgmma_desc(1024 * 3 + 32, 16, 1024, 128)   # k offset 16 elements = 32 bytes into the rows
    addr = wgmma_operand_addresses(desc, 64)
    r, k = np.meshgrid(np.arange(64), np.arange(16), indexing="ij")
    want = 1024 * 3 + (r * 64 + ((16 + k) // 8 ^ r % 8) * 8 + k % 8) * 2
    np.testing.assert_array_equal(addr, want)
    ref = np.array([[swizzle_py(int(i), 16 + int(j)) for j in range(16)] for i in range(64)])
    np.testing.assert_array_equal(addr, 1024 * 3 + (np.arange(64)[:, None] * 64 + ref) * 2)


def swizzle_py(row, col, cols=64):
    return ((col // 8) ^ (row % 8)) * 8 + col % 8


def test_accumulator_fragment_layout():
    rows, cols = wgmma_fragment_index(64)
    assert rows.shape == (128, 32)
    cover = np.zeros((64, 64), int)
    np.add.at(cover, (rows, cols), 1)
    assert (cover == 1).all()   # every element of D held by exactly one (thread, register)
    # thread 37 = warp 1, lane 5 (g = 1, t = 1): d0 = (16 + 1, 2), d1 = (17, 3), d2 = (25, 2), d5 = (17, 11)
    assert (rows[37, 0], cols[37, 0]) == (17, 2) and (rows[37, 1], cols[37, 1]) == (17, 3)
    assert (rows[37, 2], cols[37, 2]) == (25, 2) and (rows[37, 5], cols[37, 5]) == (17, 11)


# -- compilation ---------------------------------------------------------------------------------------------
def test_wgmma_kernels_compile_to_sm_90a():
    src = wgmma_tile.source_for(N=64, ZERO_INIT=1)
    for text in ("wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16", "wgmma.fence.sync.aligned",
                 "wgmma.commit_group.sync.aligned", "wgmma.wait_group.sync.aligned 0",
                 "fence.proxy.async.shared::cta", "setp.ne.b32 p"):
        assert text in src
    cubin = wgmma_tile.compile("sm_90", N=64, ZERO_INIT=1)   # on an sm_90 device, wgmma kernels build for sm_90a
    assert cubin[:4] == b"\x7fELF"
    info = wgmma_tile.inspect("sm_90", N=256, ZERO_INIT=0)
    assert "for 'sm_90a'" in info["log"] and info["spill_stores"] == 0
    assert "serialized" not in info["log"]
    with pytest.raises(KernelError, match="wgmma.*need a Hopper GPU \\(sm_90a\\); cannot compile for sm_80"):
        wgmma_tile.compile("sm_80", N=64, ZERO_INIT=1)


def test_gemm_example_compiles_unserialized():
    mod = GEMM
    for cfg in (mod.DEFAULT, dict(BN=128, WGS=2, STAGES=3, MIN_BLOCKS=2)):
        info = mod.gemm_wgmma.inspect("sm_90", **cfg)
        assert "for 'sm_90a'" in info["log"]
        assert info["spill_stores"] == 0 and "serialized" not in info["log"], info["log"]


@device
def _tile_product(acc, sa, sb):
    """acc = sa @ sb^T (64 x 64 each, 128B-swizzled): the wgmmas issued in a device function, waited for by the
    caller."""
    wgmma_fence()
    for kk in static_range(4):
        wgmma_bf16(acc, wgmma_desc(sa, (0, kk * 16), 128), wgmma_desc(sb, (0, kk * 16), 128), 64, kk)
    wgmma_commit()


@kernel
def _product_in_a_device_function(a: Array[bf16, 2], b: Array[bf16, 2], c: Array[f32, 2]):
    sa = dynamic_shared(bf16, (64, 64))
    sb = dynamic_shared(bf16, (64, 64), 64 * 64 * 2)
    for u in static_range(64 * 64 // 128):
        e = tx + u * 128
        sa[e // 64, swizzle(e // 64, e % 64, 64)] = a[e // 64, e % 64]
        sb[e // 64, swizzle(e // 64, e % 64, 64)] = b[e // 64, e % 64]
    fence_proxy_async()
    syncthreads()
    acc = local(f32, 32)
    _tile_product(acc, sa, sb)
    wgmma_wait(0)
    for i in static_range(32):
        c[tx // 32 * 16 + lane // 4 + 8 * (i % 4 // 2), 8 * (i // 4) + 2 * (lane % 4) + i % 2] = acc[i]


def test_the_caller_fences_accumulators_a_device_function_hands_to_wgmma():
    """wgmma_wait in the kernel must fence `acc` (an empty asm that reads and writes each register), or the compiler
    may read the accumulator before the wgmma has written it: the device function's accumulator is the caller's."""
    src = _product_in_a_device_function.source
    wait = src.index("wgmma.wait_group.sync.aligned 0")
    fences = src[wait:].split("\n", 1)[0]
    assert fences.count('asm volatile("" : "+f"(acc[') == 32, fences
    a, b, want = _operands(64)
    got = np.full((64, 64), np.nan, np.float32)
    _product_in_a_device_function.simulate[1, 128, 2 * 64 * 64 * 2](a, b, got)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)
    assert "serialized" not in _product_in_a_device_function.inspect("sm_90")["log"]


# -- the simulator -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("n, zero_init", [(64, 1), (128, 0), (256, 1)])
def test_single_wgmma_tile_matches_numpy(n, zero_init):
    a, b, want = _operands(n)
    c = np.zeros((64, n), np.float32)
    wgmma_tile.simulate[1, 128, (64 + n) * 64 * 2](a, b, c, N=n, ZERO_INIT=zero_init)
    np.testing.assert_allclose(c, want, rtol=1e-5, atol=1e-4, err_msg=wrong_blocks(c, want))
    err, report = GEMM.check_tile(n, zero_init, simulate=True)   # what the benchmark prints first on the GPU
    assert err < 1e-4 and "X" not in report.split("X wrong")[1], report


@pytest.mark.parametrize("m, n, k, tiles", [
    (128, 64, 64, dict(BN=64, WGS=2, STAGES=3)),
    (128, 64, 256, dict(BN=64, WGS=2, STAGES=4)),
    (128, 128, 192, dict(BN=64, WGS=1, STAGES=3, GROUP=1)),
])
def test_gemm_example_simulated_matches_numpy(m, n, k, tiles):
    mod = GEMM
    rng = np.random.default_rng(1)
    a = rng.standard_normal((m, k)).astype(ml_dtypes.bfloat16)
    bt = rng.standard_normal((n, k)).astype(ml_dtypes.bfloat16)
    c = np.full((m, n), np.nan, np.float32)
    mod.gemm(a, bt, c, simulate=True, **tiles)
    want = a.astype(np.float64) @ bt.astype(np.float64).T
    np.testing.assert_allclose(c, want, rtol=1e-4, atol=1e-3, err_msg=wrong_blocks(c, want))


def test_gemm_example_main_runs():
    GEMM.main()


@device
def fill(s: Array[bf16, 2], v: f32):
    """Every element of a 64 x 64 shared tile set to v by the 128 threads of one warpgroup."""
    for u in static_range(32):
        s[(tx + u * 128) // 64, (tx + u * 128) % 64] = v


# -- misuse --------------------------------------------------------------------------------------------------
def test_wrong_accumulator_size_and_unsupported_n():
    @kernel
    def small_acc(x: Array[f32]):
        s = shared(bf16, (64, 64))
        acc = local(f32, 16)
        d = wgmma_desc(s, (0, 0), 128)
        wgmma_bf16(acc, d, d, 64)
    with pytest.raises(KernelError, match=r"N=64 needs an accumulator of N/2 = 32 f32 per thread"):
        small_acc.source

    @kernel
    def odd_n(x: Array[f32]):
        s = shared(bf16, (64, 64))
        acc = local(f32, 50)
        d = wgmma_desc(s, (0, 0), 128)
        wgmma_bf16(acc, d, d, 100)
    with pytest.raises(KernelError, match=r"N=100 is not a wgmma shape"):
        odd_n.source

    @kernel
    def not_a_desc(x: Array[f32]):
        acc = local(f32, 32)
        wgmma_bf16(acc, 1, 2, 64)
    with pytest.raises(KernelError, match=r"descriptors made by wgmma_desc\(\)"):
        not_a_desc.source


def test_descriptor_of_a_non_shared_array_or_wrong_layout():
    @kernel
    def from_global(x: Array[bf16, 2], out: Array[i64]):
        out[0] = wgmma_desc(x, (0, 0), 128)
    with pytest.raises(KernelError, match=r"wgmma_desc\(\) describes a tile in shared memory"):
        from_global.source

    @kernel
    def from_local(out: Array[i64]):
        r = local(bf16, (8, 64))
        out[0] = wgmma_desc(r, (0, 0), 128)
    with pytest.raises(KernelError, match=r"describes a tile in shared memory"):
        from_local.source

    @kernel
    def wrong_pitch(out: Array[i64]):
        s = shared(bf16, (64, 32))
        out[0] = wgmma_desc(s, (0, 0), 128)
    with pytest.raises(KernelError, match=r"rows are SWIZZLE=128 bytes long.*64-byte rows.*pass LBO, SBO"):
        wrong_pitch.source

    @kernel
    def bad_swizzle(out: Array[i64]):
        s = shared(bf16, (64, 64))
        out[0] = wgmma_desc(s, (0, 0), 96)
    with pytest.raises(KernelError, match=r"SWIZZLE must be 128, 64, 32 or 0"):
        bad_swizzle.source


@kernel
def no_fence(c: Array[f32]):
    s = dynamic_shared(bf16, (64, 64))
    fill(s, 1.0)
    syncthreads()
    acc = local(f32, 4)
    d = wgmma_desc(s, (0, 0), 128)
    wgmma_bf16(acc, d, d, 8, 0)
    wgmma_commit()
    wgmma_wait(0)
    c[tx] = acc[0]


@device
def ones_product(s: Array[bf16, 2], acc):
    """s filled with ones, then, once every thread's part is in, acc = s[0:64, 0:16] @ s[0:8, 0:16]^T issued as one
    wgmma group (the caller waits)."""
    fill(s, 1.0)
    syncthreads()
    wgmma_fence()
    d = wgmma_desc(s, (0, 0), 128)
    wgmma_bf16(acc, d, d, 8, 0)
    wgmma_commit()


@kernel
def no_wait(c: Array[f32]):
    s = dynamic_shared(bf16, (64, 64))
    acc = local(f32, 4)
    ones_product(s, acc)


def test_simulator_checks_fence_wait_and_warpgroup():
    c = np.zeros(128, np.float32)
    with pytest.raises(SimulationError, match=r"wgmma_bf16 without a wgmma_fence\(\) before it"):
        no_fence.simulate[1, 128, 64 * 64 * 2](c)
    with pytest.raises(SimulationError, match=r"ended with wgmma operations in flight.*wgmma_wait\(0\)"):
        no_wait.simulate[1, 128, 64 * 64 * 2](c)
    with pytest.raises(SimulationError, match=r"needs a full warpgroup of 128 threads"):
        no_wait.simulate[1, 64, 64 * 64 * 2](c)


def test_accumulator_is_written_at_wgmma_wait():
    # like cp.async, a wgmma's result lands when wgmma_wait retires it: reading acc earlier reads the old value
    @kernel
    def early(c: Array[f32], before: Array[f32]):
        s = dynamic_shared(bf16, (64, 64))
        fill(s, 1.0)
        syncthreads()
        acc = local(f32, 4)
        for i in static_range(4):
            acc[i] = 0.5
        wgmma_fence()
        d = wgmma_desc(s, (0, 0), 128)
        wgmma_bf16(acc, d, d, 8)
        wgmma_commit()
        before[tx] = acc[0]
        wgmma_wait(0)
        c[tx] = acc[0]
    c, before = np.zeros(128, np.float32), np.zeros(128, np.float32)
    early.simulate[1, 128, 64 * 64 * 2](c, before)
    np.testing.assert_array_equal(before, 0.5)
    np.testing.assert_array_equal(c, 16.5)   # a row of ones times a column of ones over k = 16, plus 0.5


# -- on the GPU (the lead runs `pytest -m cuda`) -------------------------------------------------------------
@pytest.fixture
def cp():
    import cupy
    return cupy


def _bits(cp, x):
    return cp.asarray(np.ascontiguousarray(x).view(np.uint16))


@pytest.mark.cuda
@pytest.mark.parametrize("kern", [descs_from_addresses, descs_from_bases], ids=["addresses", "bases"])
def test_gpu_wgmma_descriptors_equal_the_simulators(cp, kern):
    """Tiles' descriptors as the GPU computes them, from each tile's address or as its array's descriptor plus the
    tile's offset / 16, against the simulator's, whose shared memory starts at address 0: equal once the GPU's start
    of each array is subtracted (the static array lies elsewhere on the GPU: compared by its offset only)."""
    want = np.zeros(6, np.int64)
    kern.simulate[1, 32, DESCS_SMEM](want, 1)
    got = cp.zeros(6, cp.int64)
    kern[1, 32, DESCS_SMEM](got, 1)
    got = got.get()
    start = got[0] & 0x3FFF   # the GPU's dynamic shared memory start / 16
    np.testing.assert_array_equal(got[:5] - start, want[:5])
    static_at = (got[5] & 0x3FFF) - (want[5] & 0x3FFF)   # where the static array starts, / 16
    assert got[5] - static_at == want[5]   # the same offset, sizes and swizzle


@pytest.mark.cuda
@pytest.mark.parametrize("n, zero_init", [(64, 1), (128, 0), (256, 1)])
def test_gpu_single_wgmma_tile(n, zero_init):
    err, report = GEMM.check_tile(n, zero_init)
    print(f"single wgmma tile m64n{n}k64 (zero_init={zero_init}): {report}")
    assert err < 1e-3, report


@pytest.mark.cuda
@pytest.mark.parametrize("size, tiles", [(512, dict(BN=64, WGS=2, STAGES=3)), (512, {}),
                                         (512, dict(BN=128, WGS=2, STAGES=3, MIN_BLOCKS=2)),
                                         (4096, {})])
def test_gpu_gemm_matches_cublas(cp, size, tiles):
    mod = GEMM
    rng = np.random.default_rng(2)
    a = rng.standard_normal((size, size)).astype(ml_dtypes.bfloat16)
    bt = rng.standard_normal((size, size)).astype(ml_dtypes.bfloat16)
    c = cp.full((size, size), cp.nan, cp.float32)
    mod.gemm(_bits(cp, a), _bits(cp, bt), c, **tiles)
    want = cp.asarray(a.astype(np.float32)) @ cp.asarray(bt.astype(np.float32)).T   # cuBLAS, f32
    got = c
    err = float(cp.abs(got - want).max() / cp.abs(want).max())
    corner = wrong_blocks(cp.asnumpy(got[:128, :256]), cp.asnumpy(want[:128, :256]), 16, 16, tol=1e-2)
    print(f"wgmma GEMM {size}^3 {tiles or mod.DEFAULT}: max relative error {err:.3g}\n{corner}")
    assert err < 1e-3, corner


def test_a_store_into_an_operand_before_wgmma_wait_is_an_error():
    # overwriting an operand tile before wgmma_wait is a race on the GPU (the hardware may read it until the wgmma
    # completes): the simulator refuses the store, where it used to compute with the new tile
    @kernel
    def overwrite(c: Array[f32]):
        s = dynamic_shared(bf16, (64, 64))
        acc = local(f32, 4)
        ones_product(s, acc)
        syncthreads()
        fill(s, 2.0)
        syncthreads()
        wgmma_wait(0)
        c[tx] = acc[0]
    with pytest.raises(SimulationError, match=r"a store to .* writes shared address 0x0 \(2 bytes\), an operand of a "
                                              r"wgmma no thread has retired yet"):
        overwrite.simulate[1, 128, 64 * 64 * 2](np.zeros(128, np.float32))


@kernel
def copy_into_operand(g: Array[bf16], c: Array[f32], EARLY: Const[bool]):
    """A bulk copy refills the tile a wgmma reads: after every thread's wgmma_wait and a barrier, or (EARLY) before."""
    s = dynamic_shared(bf16, (64, 64))
    flat = dynamic_shared(bf16, (64 * 64,))
    bar = shared(i64, 1)
    acc = local(f32, 4)
    if tx == 0:
        mbarrier_init(bar, 0, 1)
    ones_product(s, acc)   # its barrier publishes the mbarrier too
    if not EARLY:
        wgmma_wait(0)
        syncthreads()
    if tx == 0:
        mbarrier_arrive_expect_tx(bar, 0, 64 * 64 * 2)
        cp_async_bulk(flat, 0, g, 0, 64 * 64 * 2, bar, 0)
    mbarrier_wait(bar, 0, 0)
    wgmma_wait(0)
    c[tx] = acc[0]


def test_a_copy_into_an_operand_before_wgmma_wait_is_an_error():
    g = np.full(64 * 64, 2.0, ml_dtypes.bfloat16)
    c = np.zeros(128, np.float32)
    copy_into_operand.simulate[1, 128, 64 * 64 * 2](g, c, EARLY=False)
    np.testing.assert_array_equal(c, 16.0)   # the product of the first tile: 16 products of 1 * 1
    with pytest.raises(SimulationError, match=r"cp_async_bulk into .* an operand of a wgmma no thread has retired"):
        copy_into_operand.simulate[1, 128, 64 * 64 * 2](g, c, EARLY=True)


# -- A from registers (wgmma_bf16_rs) -------------------------------------------------------------------------
def _chained():
    """The chained-products kernel (made here: its Const has no default, which module-level kernels need)."""
    @kernel
    def chained_products(a: Array[bf16], b: Array[bf16], c: Array[bf16], out: Array[f32], sout: Array[f32],
                         CLOBBER: Const[bool]):
        """S = A B^T (64 x 64, both K-major in shared memory), then O = S C^T with S kept in registers: S's C
        fragments are the A fragments of the second wgmma (bf16), as FlashAttention-3 feeds P into P V. CLOBBER:
        the fragments are overwritten before the wait (undefined on the GPU). sout: S as accumulated."""
        _chained_body(a, b, c, out, sout, CLOBBER)
    return chained_products


@device
def _chained_body(a, b, c, out, sout, CLOBBER: Const[bool]):
    sa = dynamic_shared(bf16, (64, 64))
    sb = dynamic_shared(bf16, (64, 64), 64 * 64 * 2)
    sc = dynamic_shared(bf16, (64, 64), 2 * 64 * 64 * 2)
    for u in range(tx, 64 * 64, 128):
        r = u // 64
        k = u % 64
        sa[r, swizzle(r, k, 64)] = a[u]
        sb[r, swizzle(r, k, 64)] = b[u]
        sc[r, swizzle(r, k, 64)] = c[u]
    fence_proxy_async()
    syncthreads()
    s = local(f32, (8, 4))
    o = local(f32, (8, 4))
    frags = local(bf16, (4, 8))
    _scores_as_fragments(sa, sb, s, frags)
    wgmma_fence()
    for kk in static_range(4):
        wgmma_bf16_rs(o, frags[kk], wgmma_desc(sc, (0, kk * 16), 128), 64, kk)
    wgmma_commit()
    if CLOBBER:
        for kk in static_range(4):
            for i in static_range(8):
                frags[kk, i] = 0.0
    wgmma_wait(0)
    _store_accumulator(out, o, 64)
    _store_accumulator(sout, s, 64)


@device
def _store_accumulator(out, acc, N: Const[int]):
    """The accumulator of an m64nN wgmma (C fragments: acc[j, q] is row 16 w + lane // 4 + 8 (q // 2), column 8 j +
    2 (lane % 4) + q % 2 for warp w) into the row-major 64 x N out."""
    w = tx // 32
    for j in static_range(N // 8):
        for q in static_range(4):
            out[(16 * w + lane // 4 + 8 * (q // 2)) * N + 8 * j + 2 * (lane % 4) + q % 2] = acc[j, q]


@device
def _scores_as_fragments(sa, sb, s, frags):
    """S = A B^T (64 x 64, both K-major swizzled tiles) into s, then as bf16 A fragments: C tiles 2kk and 2kk + 1 are
    the A fragment of columns 16kk ... 16kk + 15."""
    wgmma_fence()
    for kk in static_range(4):
        wgmma_bf16(s, wgmma_desc(sa, (0, kk * 16), 128), wgmma_desc(sb, (0, kk * 16), 128), 64, kk)
    wgmma_commit()
    wgmma_wait(0)
    for kk in static_range(4):
        for i in static_range(8):
            frags[kk, i] = s[2 * kk + i // 4, i % 4]


def _chained_want(seed=3):
    rng = np.random.default_rng(seed)
    a, b, c = (rng.standard_normal((64, 64)).astype(ml_dtypes.bfloat16) for _ in range(3))
    return a, b, c, a.astype(np.float64) @ b.astype(np.float64).T


def _second_product(s, c):
    """S (as the first wgmma accumulated it, f32) rounded to bf16 times C^T: the chained product's reference. Built
    from the kernel's own S, since an S that float32 accumulation leaves next to a bf16 rounding boundary may round
    either way (a GPU run found one such element, changing a row of O by 0.17)."""
    return s.reshape(64, 64).astype(ml_dtypes.bfloat16).astype(np.float64) @ c.astype(np.float64).T


def test_wgmma_with_a_from_registers_chains_two_products():
    a, b, c, want_s = _chained_want()
    out, sout = np.zeros(64 * 64, np.float32), np.zeros(64 * 64, np.float32)
    chained = _chained()
    chained.simulate[1, 128, 3 * 64 * 64 * 2](a.reshape(-1), b.reshape(-1), c.reshape(-1), out, sout, CLOBBER=False)
    np.testing.assert_allclose(sout.reshape(64, 64), want_s, rtol=1e-6, atol=1e-5)
    np.testing.assert_allclose(out.reshape(64, 64), _second_product(want_s.astype(np.float32), c), rtol=1e-5,
                               atol=1e-4)
    with pytest.raises(SimulationError, match=r"chained_products: block \(0, 0, 0\) thread \(0, 0, 0\) at .*: "
                                              r"wgmma_bf16_rs: A fragment 'frags\[0\]' changed before wgmma_wait"):
        chained.simulate[1, 128, 3 * 64 * 64 * 2](a.reshape(-1), b.reshape(-1), c.reshape(-1), out, sout,
                                                  CLOBBER=True)


def test_wgmma_with_a_from_registers_compiles_for_sm_90a():
    chained = _chained()
    source = chained.source_for(CLOBBER=False)
    assert "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16" in source and "p, 1, 1, 0;" in source
    info = chained.inspect("sm_90", CLOBBER=False)
    assert "for 'sm_90a'" in info["log"] and info["spill_stores"] == 0 and "C7515" not in info["log"]
    assert "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16" in info["ptx"]
    with pytest.raises(KernelError, match=r"wgmma_bf16_rs\(\) takes A as a local bf16 fragment of 8 values"):
        @kernel
        def bad(out: Array[f32]):
            acc = local(f32, (8, 4))
            frag = local(f32, 8)
            wgmma_bf16_rs(acc, frag, 0, 64)
        bad.simulate[1, 128](np.zeros(1, np.float32))


@pytest.mark.cuda
def test_gpu_wgmma_with_a_from_registers_chains_two_products():
    import cupy as cp
    a, b, c, want_s = _chained_want()
    out, sout = cp.zeros(64 * 64, cp.float32), cp.zeros(64 * 64, cp.float32)
    _chained()[1, 128, 3 * 64 * 64 * 2](*(cp.asarray(x.reshape(-1)) for x in (a, b, c)), out, sout, CLOBBER=False)
    s = cp.asnumpy(sout)
    np.testing.assert_allclose(s.reshape(64, 64), want_s, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(cp.asnumpy(out).reshape(64, 64), _second_product(s, c), rtol=1e-5, atol=1e-4)


# -- B in MN-major layout (imm-trans-b): a row-major [K, N] tile, as attention's V, without a transpose ---------
def test_mn_major_addresses_read_row_major_panels():
    """An MN-major SW128 operand B[N, 16] over 64-column panels of a row-major [K, N] tile (panel p holds columns
    64p ... 64p + 63, row k at k * 128 bytes, swizzled as the language's swizzle() writes it): element (n, k) is
    tile row k0 + k, column n; LBO is the panel stride, SBO 8 rows."""
    rows, k0, base = 64, 32, 4096
    desc = encode_wgmma_desc(base + k0 * 128, rows * 128, 1024, 128)
    addr = wgmma_mn_operand_addresses(desc, 128)
    n, k = np.meshgrid(np.arange(128), np.arange(16), indexing="ij")
    want = base + (n // 64) * rows * 128 + (k0 + k) * 128 + np.vectorize(swizzle_py)(k0 + k, n % 64) * 2
    np.testing.assert_array_equal(addr, want)
    desc0 = encode_wgmma_desc(base, 256, 128, 0)   # no swizzle: 8 x 16-byte core matrices, SBO along N, LBO along K
    addr0 = wgmma_mn_operand_addresses(desc0, 16)
    assert addr0[9, 3] == base + 1 * 128 + 2 + 3 * 16 and addr0[2, 12] == base + 4 + 4 * 16 + 256


@device
def _load_a_b_v(a, b, v, sa, sb, sv, A_TRANSPOSED: Const[int]):
    """The row-major 64 x 64 A and B and 64 x 128 V into swizzled 128-byte-row tiles (A transposed: sa[k, m] = A[m,
    k]; V as two 64-column panels), visible to wgmma."""
    for u in range(tx, 64 * 64, 128):
        r = u // 64
        k = u % 64
        if A_TRANSPOSED:
            sa[k, swizzle(k, r, 64)] = a[u]
        else:
            sa[r, swizzle(r, k, 64)] = a[u]
        sb[r, swizzle(r, k, 64)] = b[u]
    for u in range(tx, 64 * 128, 128):
        r = u // 128
        col = u % 128
        sv[col // 64, r, swizzle(r, col % 64, 64)] = v[u]
    fence_proxy_async()
    syncthreads()


def _mn_major():
    """A kernel of the two MN-major forms (made here, as _chained)."""
    @kernel
    def mn_major_products(a: Array[bf16], b: Array[bf16], v: Array[bf16], o: Array[f32], o2: Array[f32],
                          so: Array[f32]):
        """S = A B^T (64 x 64), then O = S V and O2 = A V (64 x 128) with V a row-major [64, 128] tile read
        MN-major: O's A from registers (S's fragments, as P V), O2's from shared memory; so: S."""
        sa = dynamic_shared(bf16, (64, 64))
        sb = dynamic_shared(bf16, (64, 64), 64 * 64 * 2)
        sv = dynamic_shared(bf16, (2, 64, 64), 2 * 64 * 64 * 2)   # V's two 64-column panels
        _load_a_b_v(a, b, v, sa, sb, sv, 0)
        s = local(f32, (8, 4))
        acc = local(f32, (16, 4))
        acc2 = local(f32, (16, 4))
        frags = local(bf16, (4, 8))
        _scores_as_fragments(sa, sb, s, frags)
        wgmma_fence()
        for kk in static_range(4):   # keys kk * 16 ... + 15: rows of V, LBO = one panel (64 rows of 128 bytes)
            vd = wgmma_desc(sv[0], (kk * 16, 0), 128, 64 * 128, 1024)
            wgmma_bf16_rs(acc, frags[kk], vd, 128, kk, MN_MAJOR)
            wgmma_bf16(acc2, wgmma_desc(sa, (0, kk * 16), 128), vd, 128, kk, MN_MAJOR)
        wgmma_commit()
        wgmma_wait(0)
        _store_accumulator(o, acc, 128)
        _store_accumulator(o2, acc2, 128)
        _store_accumulator(so, s, 64)
    return mn_major_products


def _mn_major_want(seed=4):
    """A, B, V and the float64 S = A B^T and A V (S V is checked from the kernel's own S: _second_product's note)."""
    rng = np.random.default_rng(seed)
    a, b = (rng.standard_normal((64, 64)).astype(ml_dtypes.bfloat16) for _ in range(2))
    v = rng.standard_normal((64, 128)).astype(ml_dtypes.bfloat16)
    f64 = [x.astype(np.float64) for x in (a, b, v)]
    return a, b, v, f64[0] @ f64[1].T, f64[0] @ f64[2]


def _check_mn_major(o, o2, so, v, want_s, want2):
    np.testing.assert_allclose(so.reshape(64, 64), want_s, rtol=1e-5, atol=1e-4)
    s = so.reshape(64, 64).astype(ml_dtypes.bfloat16).astype(np.float64)
    np.testing.assert_allclose(o.reshape(64, 128), s @ v.astype(np.float64), rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(o2.reshape(64, 128), want2, rtol=1e-5, atol=1e-4)


MN_SMEM = 4 * 64 * 64 * 2


def test_wgmma_reads_b_mn_major():
    a, b, v, want_s, want2 = _mn_major_want()
    o, o2, so = np.zeros(64 * 128, np.float32), np.zeros(64 * 128, np.float32), np.zeros(64 * 64, np.float32)
    _mn_major().simulate[1, 128, MN_SMEM](a.reshape(-1), b.reshape(-1), v.reshape(-1), o, o2, so)
    _check_mn_major(o, o2, so, v, want_s, want2)


def test_mn_major_compiles_with_imm_trans_b():
    kern = _mn_major()
    source = kern.source
    assert "p, 1, 1, 1;" in source and "p, 1, 1, 0, 1;" in source   # register A: trans-b; descriptor A: 0, trans-b
    info = kern.inspect("sm_90")
    assert info["spill_stores"] == 0 and "C7515" not in info["log"]
    # scale_d survives a sixth argument: K_MAJOR given is the five-argument form, byte for byte
    @kernel
    def five(d: i64):
        acc = local(f32, (8, 4))
        wgmma_bf16(acc, d, d, 64, 0)

    @kernel
    def six(d: i64):
        acc = local(f32, (8, 4))
        wgmma_bf16(acc, d, d, 64, 0, K_MAJOR)
    def code(k):
        return [line for line in k.source.replace("six", "five").splitlines() if not line.startswith("#line")]
    assert '"r"((int)(0))' in five.source and code(six) == code(five)
    with pytest.raises(KernelError, match=r"B_MAJOR is K_MAJOR \(0\) or MN_MAJOR \(1\), got 2"):
        @kernel
        def bad(out: Array[f32]):
            acc = local(f32, (8, 4))
            wgmma_bf16(acc, 0, 0, 64, 1, 2)
        bad.source


@pytest.mark.cuda
def test_gpu_wgmma_reads_b_mn_major():
    import cupy as cp
    a, b, v, want_s, want2 = _mn_major_want()
    o, o2, so = cp.zeros(64 * 128, cp.float32), cp.zeros(64 * 128, cp.float32), cp.zeros(64 * 64, cp.float32)
    _mn_major()[1, 128, MN_SMEM](*(cp.asarray(x.reshape(-1)) for x in (a, b, v)), o, o2, so)
    _check_mn_major(*(cp.asnumpy(x) for x in (o, o2, so)), v, want_s, want2)


# -- A in MN-major layout (imm-trans-a): a tile stored transposed, as the backward's dS^T serving as dS ------------
def _a_mn_major():
    """A kernel of MN-major A with either B (made here, as _chained)."""
    @kernel
    def a_mn_major_products(a: Array[bf16], b: Array[bf16], v: Array[bf16], o: Array[f32], o2: Array[f32]):
        """O = A B^T (64 x 64) with A held transposed (a row-major [K, M] tile: sat[k, m] = A[m, k]) read MN-major and
        B K-major; O2 = A V (64 x 128) with both read MN-major (V a row-major [64, 128] tile)."""
        sat = dynamic_shared(bf16, (64, 64))
        sb = dynamic_shared(bf16, (64, 64), 64 * 64 * 2)
        sv = dynamic_shared(bf16, (2, 64, 64), 2 * 64 * 64 * 2)
        _load_a_b_v(a, b, v, sat, sb, sv, 1)
        acc = local(f32, (8, 4))
        acc2 = local(f32, (16, 4))
        wgmma_fence()
        for kk in static_range(4):   # rows kk * 16 ... + 15 of the transposed tile: one panel, 8 rows 1024 bytes on
            ad = wgmma_desc(sat, (kk * 16, 0), 128, 64 * 128, 1024)
            wgmma_bf16(acc, ad, wgmma_desc(sb, (0, kk * 16), 128), 64, kk, K_MAJOR, MN_MAJOR)
            wgmma_bf16(acc2, ad, wgmma_desc(sv[0], (kk * 16, 0), 128, 64 * 128, 1024), 128, kk, MN_MAJOR, MN_MAJOR)
        wgmma_commit()
        wgmma_wait(0)
        _store_accumulator(o, acc, 64)
        _store_accumulator(o2, acc2, 128)
    return a_mn_major_products


def _check_a_mn_major(o, o2, a, b, v):
    f64 = [x.astype(np.float64) for x in (a, b, v)]
    np.testing.assert_allclose(o.reshape(64, 64), f64[0] @ f64[1].T, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(o2.reshape(64, 128), f64[0] @ f64[2], rtol=1e-5, atol=1e-4)


def test_wgmma_reads_a_mn_major():
    a, b, v, _, _ = _mn_major_want(seed=7)
    o, o2 = np.zeros(64 * 64, np.float32), np.zeros(64 * 128, np.float32)
    _a_mn_major().simulate[1, 128, MN_SMEM](a.reshape(-1), b.reshape(-1), v.reshape(-1), o, o2)
    _check_a_mn_major(o, o2, a, b, v)


def test_a_mn_major_compiles_with_imm_trans_a():
    kern = _a_mn_major()
    assert "p, 1, 1, 1, 0;" in kern.source and "p, 1, 1, 1, 1;" in kern.source   # imm-trans-a, then imm-trans-b
    info = kern.inspect("sm_90")
    assert info["spill_stores"] == 0 and "C7515" not in info["log"]
    with pytest.raises(KernelError, match=r"A_MAJOR is K_MAJOR \(0\) or MN_MAJOR \(1\), got 3"):
        @kernel
        def bad(out: Array[f32]):
            acc = local(f32, (8, 4))
            wgmma_bf16(acc, 0, 0, 64, 1, 0, 3)
        bad.source
    with pytest.raises(KernelError, match=r"wgmma_bf16_rs\(acc, a_frag, desc_b, N\[, scale_d\[, B_MAJOR\]\]\) takes "
                                          r"4 to 6 arguments"):
        @kernel
        def bad_rs(out: Array[f32]):
            acc = local(f32, (8, 4))
            frag = local(bf16, 8)
            wgmma_bf16_rs(acc, frag, 0, 64, 1, 0, 1)
        bad_rs.source


@pytest.mark.cuda
def test_gpu_wgmma_reads_a_mn_major():
    import cupy as cp
    a, b, v, _, _ = _mn_major_want(seed=7)
    o, o2 = cp.zeros(64 * 64, cp.float32), cp.zeros(64 * 128, cp.float32)
    _a_mn_major()[1, 128, MN_SMEM](*(cp.asarray(x.reshape(-1)) for x in (a, b, v)), o, o2)
    _check_a_mn_major(cp.asnumpy(o), cp.asnumpy(o2), a, b, v)


def _waits(NAMED: Const[int]):
    @kernel
    def named_waits(a: Array[bf16], b: Array[bf16], v: Array[bf16], o: Array[f32], NAMED: Const[int]):
        """S = A B^T, then a wait that names S (NAMED=1) or another accumulator (NAMED=0), then S read."""
        sa = dynamic_shared(bf16, (64, 64))
        sb = dynamic_shared(bf16, (64, 64), 64 * 64 * 2)
        sv = dynamic_shared(bf16, (2, 64, 64), 2 * 64 * 64 * 2)
        _load_a_b_v(a, b, v, sa, sb, sv, 0)
        s = local(f32, (8, 4))
        other = local(f32, (8, 4))
        wgmma_discard(s, other)
        wgmma_fence()
        wgmma_bf16(other, wgmma_desc(sa, (0, 0), 128), wgmma_desc(sb, (0, 0), 128), 64, 0)
        wgmma_commit()
        wgmma_wait(0, other)
        wgmma_fence()
        for kk in static_range(4):
            wgmma_bf16(s, wgmma_desc(sa, (0, kk * 16), 128), wgmma_desc(sb, (0, kk * 16), 128), 64, kk)
        wgmma_commit()
        if NAMED:
            wgmma_wait(0, s)
        else:
            wgmma_wait(0, other)
        _store_accumulator(o, s, 64)
    return named_waits


def test_wgmma_wait_fences_the_accumulators_it_names_and_must_name_those_it_retires():
    a, b, v, want_s, _ = _mn_major_want(seed=9)
    o = np.zeros(64 * 64, np.float32)
    kern = _waits(1)
    kern.simulate[1, 128, MN_SMEM](a.reshape(-1), b.reshape(-1), v.reshape(-1), o, NAMED=1)
    np.testing.assert_allclose(o.reshape(64, 64), want_s, rtol=1e-5, atol=1e-4)
    source = kern.source_for(NAMED=1)
    waits = [line for line in source.splitlines() if "wgmma.wait_group" in line]
    assert waits and all(w.count('"+f"') == 32 for w in waits)   # one accumulator each, not both
    assert source.count('asm volatile("" : "=f"') == 64   # wgmma_discard: an empty asm writing each register
    with pytest.raises(SimulationError, match=r"wgmma_wait: it retires a wgmma into 's', which it does not name"):
        kern.simulate[1, 128, MN_SMEM](a.reshape(-1), b.reshape(-1), v.reshape(-1), o, NAMED=0)


def test_wgmma_wait_names_only_accumulators_and_a_discard_needs_a_fence_after_it():
    with pytest.raises(KernelError, match=r"wgmma_wait\(\): 'x' is not the accumulator of a wgmma issued before it"):
        @kernel
        def not_an_accumulator(out: Array[f32]):
            x = local(f32, (8, 4))
            wgmma_wait(0, x)
        not_an_accumulator.source

    @kernel
    def discard_after_fence(d: i64):
        acc = local(f32, (8, 4))
        wgmma_fence()
        wgmma_discard(acc)
        wgmma_bf16(acc, d, d, 64, 0)
        wgmma_commit()
        wgmma_wait(0)
    with pytest.raises(SimulationError, match=r"wgmma_bf16 without a wgmma_fence\(\) before it"):
        discard_after_fence.simulate[1, 128](0)
