"""TMA tensor maps (frost.kernel.tensor_map, TensorMap[T, rank], cp_async_bulk_tensor): the copy engine brings a
box of a strided global array into shared memory, swizzled as wgmma reads it and zero-filled past the array's edges.
The oracle is NumPy: the box sliced out of the array, padded with zeros, each element placed where
frost.kernel.lib.swizzle puts it (the layout the flash-attention kernels write by hand)."""
import ml_dtypes
import numpy as np
import pytest

from frost.kernel import tma
from frost.kernel import (Array, Const, KernelError, SimulationError, TensorMap, bf16, cp_async_bulk_tensor, device,
                          dynamic_shared, f32, i32, i64, kernel, mbarrier_arrive_expect_tx, mbarrier_init,
                          mbarrier_wait, shared, syncthreads, tensor_map, tx)


@kernel
def box_copy(tmap: TensorMap[bf16, 3], out: Array[bf16], h: i32, row: i32, col: i32, at: i32, N: Const[int],
             NBYTES: Const[int]):
    """One box of tmap at (h, row, col) into shared memory at element `at`, then the N elements there to out as
    they lie (swizzled)."""
    buf = dynamic_shared(bf16, (2048,))
    full = shared(i64, 1)
    if tx == 0:
        mbarrier_init(full, 0, 1)
    syncthreads()
    if tx == 0:
        mbarrier_arrive_expect_tx(full, 0, NBYTES)
        cp_async_bulk_tensor(buf, at, tmap, (h, row, col), full, 0)
    mbarrier_wait(full, 0, 0)
    for i in range(tx, N, 128):
        out[i] = buf[at + i]


def placed(x: np.ndarray, box: tuple, coords: tuple, swizzle: int) -> np.ndarray:
    """The oracle: x's box at coords (zeros outside x) with element (r, c) of each row of 16-bit values at
    r * cols + the column lib.swizzle gives (128 bytes: chunk XOR row % 8; 64: chunk XOR (row // 2) % 4, ...)."""
    h, r0, c0 = coords
    rows, cols = box[1], box[2]
    out = np.zeros(rows * cols, x.dtype)
    line_rows = 128 // (cols * 2)   # rows of the box in one 128-byte line
    for r in range(rows):
        for c in range(cols):
            inside = 0 <= h < x.shape[0] and 0 <= r0 + r < x.shape[1] and 0 <= c0 + c < x.shape[2]
            chunk = c // 8
            if swizzle:
                chunk ^= (r // line_rows) % (swizzle // 16)
            out[r * cols + chunk * 8 + c % 8] = x[h, r0 + r, c0 + c] if inside else 0
    return out


def run_copy(xp, x, box, coords, swizzle, at=0):
    n = int(np.prod(box))
    out = xp.full(n, np.nan, ml_dtypes.bfloat16)
    tmap = tensor_map(x, box, swizzle)
    launch = box_copy.simulate if xp is np else box_copy
    launch[1, 128, 4096 + 1024](tmap, out, *coords, at, N=n, NBYTES=tmap.box_bytes)
    return out if xp is np else xp.asnumpy(out)


CASES = [((1, 16, 64), (1, 3, 0), 128),     # inside: one 128-byte line a row, chunks XOR row % 8
         ((1, 16, 64), (2, 20, 64), 128),   # the last rows past the sequence's end: zeros
         ((1, 8, 64), (0, -3, 0), 128),     # rows before the start: zeros too
         ((1, 16, 32), (1, 5, 32), 64),     # 64-byte swizzle: two rows a line
         ((1, 8, 64), (1, 0, 64), 0),       # no swizzle
         ((1, 4, 64), (3, 0, 0), 128)]      # a head past the last: all zeros


def sample(shape=(3, 30, 128)) -> np.ndarray:
    return np.random.default_rng(0).standard_normal(shape).astype(ml_dtypes.bfloat16)


@pytest.mark.parametrize("box,coords,swizzle", CASES)
def test_a_box_lands_swizzled_and_zero_filled(box, coords, swizzle):
    x = sample()
    np.testing.assert_array_equal(run_copy(np, x, box, coords, swizzle), placed(x, box, coords, swizzle))


def test_a_strided_array_is_read_where_it_lies():
    """Heads as the middle dimension in memory (B, L, H, D order seen as (H, L, D)): no copy first."""
    x = sample((30, 3, 64)).transpose(1, 0, 2)
    got = run_copy(np, x, (1, 16, 64), (2, 7, 0), 128, at=1024)
    np.testing.assert_array_equal(got, placed(np.ascontiguousarray(x), (1, 16, 64), (2, 7, 0), 128))


def test_a_swizzled_box_must_start_on_a_1024_byte_boundary():
    with pytest.raises(SimulationError, match=r"cp_async_bulk_tensor: dynamic_shared\[64\] is not on a 1024-"
                                              r"byte boundary of shared memory \(the 128-byte swizzle repeats "
                                              r"every 1024 bytes\)"):
        run_copy(np, sample(), (1, 8, 64), (0, 0, 0), 128, at=64)


def test_reading_before_the_wait_sees_the_old_data_and_races():
    @kernel
    def eager(tmap: TensorMap[bf16, 3], out: Array[bf16]):
        buf = dynamic_shared(bf16, (512,))
        full = shared(i64, 1)
        if tx == 0:
            mbarrier_init(full, 0, 1)
            buf[0] = 0.0
        syncthreads()
        if tx == 0:
            mbarrier_arrive_expect_tx(full, 0, 1024)
            cp_async_bulk_tensor(buf, 0, tmap, (0, 0, 0), full, 0)
        if tx == 32:
            out[0] = buf[0]
        mbarrier_wait(full, 0, 0)
    with pytest.raises(SimulationError, match=r"eager: .*data race on shared array 'dynamic_shared' at index 0: this "
                                              r"thread reads it, and the cp_async_bulk_tensor .* landed on it"):
        eager.simulate[1, 64, 1024](tensor_map(sample(), (1, 8, 64)), np.zeros(1, ml_dtypes.bfloat16))


@pytest.mark.parametrize("make,message", [
    (lambda x: tensor_map(x, (1, 8, 50)), r"the innermost a multiple of 16 bytes"),
    (lambda x: tensor_map(x, (1, 8, 128)), r"at most the swizzle's 128, got box \(1, 8, 128\) \(256 bytes"),
    (lambda x: tensor_map(x, (1, 300, 64), 0), r"box sides are 1 to 256 elements"),
    (lambda x: tensor_map(x, (8, 64)), r"1 to 5 dimensions and a box side for each, got box \(8, 64\)"),
    (lambda x: tensor_map(x[..., ::2], (1, 8, 64)), r"the last dimension must be contiguous"),
    (lambda x: tensor_map(x, (1, 8, 64), 96), r"swizzle is 0, 32, 64 or 128 bytes, got 96"),
    (lambda x: tensor_map(x.astype(np.float16).view(np.int16), (1, 8, 64)), r"takes u8, u32, .* elements, got int16"),
])
def test_what_the_copy_engine_cannot_take_is_refused_by_name(make, message):
    with pytest.raises(ValueError, match=r"tensor_map: an array of shape .*" + message):
        make(sample())


def test_the_map_must_match_its_parameter():
    x = sample()
    with pytest.raises(TypeError, match=r"box_copy: argument 'tmap' is TensorMap\[bf16, 3\] but got a tensor map of "
                                        r"f32 of rank 2"):
        box_copy.simulate[1, 128, 5120](tensor_map(np.zeros((8, 64), np.float32), (8, 32)),
                                        np.zeros(16, ml_dtypes.bfloat16), 0, 0, 0, 0, N=16, NBYTES=64)
    with pytest.raises(TypeError, match=r"argument 'tmap' is TensorMap\[bf16, 3\]: make it with "
                                        r"frost.kernel.tensor_map\(array, box\), got ndarray"):
        box_copy.simulate[1, 128, 5120](x, np.zeros(16, ml_dtypes.bfloat16), 0, 0, 0, 0, N=16, NBYTES=64)


def test_the_builtin_checks_its_arguments():
    @kernel
    def two_coords(tmap: TensorMap[bf16, 3]):
        buf = dynamic_shared(bf16, (512,))
        full = shared(i64, 1)
        cp_async_bulk_tensor(buf, 0, tmap, (0, 0), full, 0)

    @kernel
    def into_floats(tmap: TensorMap[bf16, 3]):
        buf = dynamic_shared(f32, (512,))
        full = shared(i64, 1)
        cp_async_bulk_tensor(buf, 0, tmap, (0, 0, 0), full, 0)
    with pytest.raises(KernelError, match=r"coords is a tuple of 3 indices \(one per dimension of the "
                                          r"TensorMap\[bf16, 3\], outermost first\)"):
        two_coords.source_for()
    with pytest.raises(KernelError, match=r"cp_async_bulk_tensor\(\) from TensorMap\[bf16, 3\] into .*f32.*: the "
                                          r"element sizes differ"):
        into_floats.source_for()


def test_it_becomes_a_grid_constant_map_and_ptx_tensor_copy_for_sm_90a():
    source = box_copy.source_for(N=1024, NBYTES=2048)
    assert "const __grid_constant__ frost_tensor_map tmap" in source
    assert "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes" in source
    assert "extern __shared__ __align__(1024)" in source
    pytest.importorskip("cuda.bindings")
    info = box_copy.inspect("sm_90", N=1024, NBYTES=2048)
    assert "for 'sm_90a'" in info["log"] and "cp.async.bulk.tensor.3d" in info["ptx"]


@device
def issue_box(tmap, tile, full):
    """The copy from a device function: the map passes on by reference."""
    if tx == 0:
        mbarrier_arrive_expect_tx(full, 0, 1024)
        cp_async_bulk_tensor(tile, 0, tmap, (0, 0, 0), full, 0)


@kernel
def box_from_a_device_function(tmap: TensorMap[bf16, 3], out: Array[bf16]):
    tile = dynamic_shared(bf16, (512,))
    full = shared(i64, 1)
    if tx == 0:
        mbarrier_init(full, 0, 1)
    syncthreads()
    issue_box(tmap, tile, full)
    mbarrier_wait(full, 0, 0)
    out[tx] = tile[tx]


def test_a_copy_in_a_device_function_aligns_its_kernels_shared_memory_too():
    """The box's 1024-byte boundary is the kernel's dynamic shared memory's: a copy issued by a device function (no
    wgmma in the kernel) must set it as one in the kernel body does."""
    source = box_from_a_device_function.source_for()
    assert "extern __shared__ __align__(1024)" in source and "const frost_tensor_map& tmap" in source
    x = sample()
    out = np.zeros(512, ml_dtypes.bfloat16)
    box_from_a_device_function.simulate[1, 512, 1024](tensor_map(x, (1, 8, 64)), out)
    np.testing.assert_array_equal(out, placed(x, (1, 8, 64), (0, 0, 0), 128))
    pytest.importorskip("cuda.bindings")
    assert "cp.async.bulk.tensor.3d" in box_from_a_device_function.inspect("sm_90")["ptx"]


@pytest.mark.cuda
@pytest.mark.parametrize("box,coords,swizzle", CASES)
def test_gpu_a_box_lands_as_the_simulator_lands_it(box, coords, swizzle):
    cp = pytest.importorskip("cupy")
    if cp.cuda.Device().compute_capability < "90":
        pytest.skip("tensor maps need a Hopper GPU")
    x = sample()
    for at in (0, 1024):
        got = run_copy(cp, cp.asarray(x), box, coords, swizzle, at)
        np.testing.assert_array_equal(got, placed(x, box, coords, swizzle))
    strided = cp.asarray(sample((30, 3, 64))).transpose(1, 0, 2)
    got = run_copy(cp, strided, (1, 16, 64), (2, 7, 0), 128)
    np.testing.assert_array_equal(got, placed(cp.asnumpy(strided), (1, 16, 64), (2, 7, 0), 128))


class _DeviceArray:
    """What tensor_map reads of a CuPy array (shape, strides, dtype, device address), without a GPU."""

    def __init__(self, shape, address):
        self.shape, self.dtype, self.ndim = shape, np.dtype(ml_dtypes.bfloat16), len(shape)
        self.strides = tuple(int(np.prod(shape[i + 1:])) * 2 for i in range(len(shape)))
        self.__cuda_array_interface__ = {"data": (address, False), "shape": shape}


def test_an_encoded_map_is_remembered_for_the_same_memory_layout_and_box(monkeypatch):
    calls = []

    def encode(what, a, box, swizzle, elem):
        calls.append((a.__cuda_array_interface__["data"][0], box))
        return bytes([len(calls)]) * 128

    monkeypatch.setattr(tma, "_encode_new", encode)
    monkeypatch.setattr(tma, "_encoded", {})
    first = tensor_map(_DeviceArray((4, 64, 64), 1 << 20), (1, 64, 64))
    again = tensor_map(_DeviceArray((4, 64, 64), 1 << 20), (1, 64, 64))
    assert again.encoded == first.encoded and len(calls) == 1
    tensor_map(_DeviceArray((4, 64, 64), 2 << 20), (1, 64, 64))      # other memory
    tensor_map(_DeviceArray((4, 64, 64), 1 << 20), (1, 32, 64))      # another box
    tensor_map(_DeviceArray((8, 32, 64), 1 << 20), (1, 32, 64))      # another shape
    assert len(calls) == 4
    monkeypatch.setattr(tma, "_ENCODED_KEPT", 2)
    tensor_map(_DeviceArray((4, 64, 64), 3 << 20), (1, 64, 64))
    assert len(tma._encoded) == 2 and (1 << 20, (4, 64, 64)) not in {k[:2] for k in tma._encoded}


@pytest.mark.cuda
def test_gpu_a_remembered_map_is_the_drivers_encoding():
    cp = pytest.importorskip("cupy")
    if cp.cuda.Device().compute_capability < "90":
        pytest.skip("tensor maps need a Hopper GPU")
    x = cp.asarray(sample((30, 3, 64))).transpose(1, 0, 2)
    remembered = tensor_map(x, (1, 16, 64)).encoded
    assert remembered == tensor_map(x, (1, 16, 64)).encoded
    assert remembered == tma._encode_new("x", x, (1, 16, 64), 128, bf16)
