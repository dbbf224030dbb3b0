"""Programmatic dependent launch: the generated wait, the argument buffer, the launch routing (CPU) and
producer -> consumer chains on the GPU, plain and captured in a CUDA graph, with a grid barrier among them."""
import ctypes
import threading

import ml_dtypes
import numpy as np
import pytest

import frost
from fake_cupy import FakeArray
from frost.kernel import Array, TensorMap, bdx, bf16, bx, f32, gdx, grid_sync, i32, kernel, pdl, tx, u32
from frost.kernel.tma import TensorMap as TensorMap_


@kernel
def slow_fill(x: Array[f32], value: f32, spin: i32):
    """x[i] = value, written late: each thread first spins (a kernel the next one could overtake)."""
    i = bx * bdx + tx
    acc = 0.0
    for k in range(spin):
        acc = acc * 0.5 + f32(k % 3)
    if i < len(x):
        x[i] = value + acc * 0.0


@kernel
def add_next(x: Array[f32], y: Array[f32]):
    """y[i] = x[i] + x[(i + 1) % n]: reads what the kernel before wrote, some of it in other blocks."""
    i = bx * bdx + tx
    if i < len(x):
        y[i] = x[i] + x[(i + 1) % len(x)]


@kernel
def barrier_shift(x: Array[f32], y: Array[f32], counter: Array[u32]):
    """y[i] = 2 * x[next block's first element], after a grid barrier: all blocks must be resident."""
    i = bx * bdx + tx
    x[i] += 1.0
    grid_sync(counter)
    y[i] = 2.0 * x[((bx + 1) % gdx) * bdx]


def test_every_kernel_first_waits_for_the_one_before():
    source = add_next.source
    body = source[source.index("extern \"C\" __global__ void add_next"):]
    assert body.splitlines()[1].strip() == "frost_wait_for_previous_grid();"  # before any memory access
    start = source.index("void frost_wait_for_previous_grid()")
    helper = source[start:start + 900]
    helper = helper[:helper.index("\n}")]
    code = "\n".join(line for line in helper.splitlines() if not line.strip().startswith("//"))
    assert 'asm volatile("griddepcontrol.wait;" ::: "memory");' in code and "__CUDA_ARCH__ >= 900" in code
    assert "launch_dependents" not in code  # no early trigger: measured slower (frost/kernel/pdl.py)


def test_device_functions_do_not_wait():
    @frost.kernel.device
    def twice(v: f32) -> f32:
        return v * 2.0

    @kernel
    def k(x: Array[f32]):
        x[tx] = twice(x[tx])
    assert k.source.count("frost_wait_for_previous_grid();") == 1


def test_each_parameter_pointer_reads_its_argument_at_its_alignment():
    import ctypes
    args = [np.uint64(0x1122334455667788), np.int32(-3), np.uint16(0x3FC0), np.int64(7), np.float32(1.5)]
    values, params = pdl.kernel_params(args)
    offsets = [p - params[0] for p in params]
    assert offsets == [0, 8, 12, 16, 24]
    for a, p in zip(args, params):
        assert p % a.itemsize == 0 and ctypes.string_at(p, a.nbytes) == a.tobytes()  # what the driver copies
    values, params = pdl.kernel_params([])
    assert len(params) == 0


@pytest.mark.parametrize("args", [
    [np.uint64(7), np.int64(-2), np.int32(3), np.float32(0.25)],
    [np.int32(-1), np.uint64(2**62 + 5), np.uint16(0x3FC0), np.float16(1.5), np.bool_(True), np.uint8(60)],
    [np.float64(-2.5), np.uint32(1000000000), np.int64(9)],
    [np.uint64(1), ml_dtypes.bfloat16(1.5), np.int32(4)],   # no struct code for bfloat16: NumPy packs it
])
def test_the_packed_arguments_sit_where_a_numpy_record_puts_them(args):
    record = np.dtype([(f"a{i}", a.dtype) for i, a in enumerate(args)], align=True)
    for scale in (1, 3):   # the second launch of a signature refills the first one's record
        args = [a * a.dtype.type(scale) if a.dtype.kind in "iuf" else a for a in args]
        values, params = pdl.kernel_params(args)
        assert [p - params[0] for p in params] == [record.fields[f"a{i}"][1] for i in range(len(args))]
        assert [ctypes.string_at(p, a.nbytes) for p, a in zip(params, args)] == [a.tobytes() for a in args]


def test_the_launch_config_has_cuda_h_s_layout():
    # CUlaunchConfig: gridDimX..Z, blockDimX..Z, sharedMemBytes (unsigned ints), hStream, attrs, numAttrs
    c = pdl._LaunchConfig(2, 3, 4, 128, 1, 1, 1024, 0x1000, pdl._SERIALIZATION_POINTER, 1)
    words = np.frombuffer(ctypes.string_at(ctypes.addressof(c), 28), np.uint32)
    assert words.tolist() == [2, 3, 4, 128, 1, 1, 1024] and ctypes.sizeof(c) == 56
    assert (pdl._LaunchConfig.stream.offset, pdl._LaunchConfig.attrs.offset, pdl._LaunchConfig.num_attrs.offset) == \
        (32, 40, 48)
    assert ctypes.sizeof(pdl._LaunchAttribute) == 72 and pdl._SERIALIZATION.id == 6 and pdl._SERIALIZATION.value[0] == 1


def test_each_thread_packs_into_its_own_record():
    seen = {}

    def pack(i):
        seen[i] = pdl.kernel_params([np.int64(i), np.float32(i)])   # holds the record: its address stays taken
    threads = [threading.Thread(target=pack, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert seen[0][1][0] != seen[1][1][0]


def test_switched_off_it_is_not_used():
    saved = pdl.enabled
    try:
        pdl.enabled = False
        assert not pdl.usable(0)
    finally:
        pdl.enabled = saved


def test_frost_kernels_go_through_it_and_cuda_source_does_not(fake_cupy, monkeypatch):
    pdl_launches = []
    monkeypatch.setattr(pdl, "usable", lambda device_id: True)
    monkeypatch.setattr(pdl, "launch", lambda name, fn, grid, block, smem, stream, args, serialize=True:
                        pdl_launches.append((name, grid, block, smem, stream, list(args))))
    x = FakeArray(np.zeros(8, np.float32))
    add_next[2, 4](x, x)
    assert [launch[:5] for launch in pdl_launches] == [("add_next", (2, 1, 1), (4, 1, 1), 0, "current-stream")]
    assert pdl_launches[0][5][:2] == [np.uint64(x.data.ptr), 8]
    assert fake_cupy.launches == []
    frost.cuda_source('extern "C" __global__ void nop(float* x) {}', "nop")[1, 1](x)
    assert len(fake_cupy.launches) == 1 and len(pdl_launches) == 1


@frost.kernel
def takes_a_map(tmap: TensorMap[bf16, 2], n: i32):
    pass


def test_a_tensor_map_goes_by_value_through_cuLaunchKernelEx_even_without_pdl(fake_cupy, monkeypatch):
    """CuPy's launch cannot pass a 128-byte record: a kernel with a tensor map goes through cuLaunchKernelEx, with
    the programmatic-serialization attribute only where PDL is usable."""
    launches = []
    monkeypatch.setattr(pdl, "usable", lambda device_id: False)
    monkeypatch.setattr(pdl, "launch", lambda name, fn, grid, block, smem, stream, args, serialize=True:
                        launches.append((name, serialize, list(args))))
    encoded = bytes(range(128))
    tmap = TensorMap_(np.zeros((4, 64), ml_dtypes.bfloat16), (4, 64), 128, bf16, encoded)
    takes_a_map[1, 32](tmap, 3)
    assert [(name, serialize) for name, serialize, _ in launches] == [("takes_a_map", False)]
    record, n = launches[0][2]
    assert record.dtype == np.dtype("V128") and bytes(record) == encoded and n == 3
    values, params = pdl.kernel_params(launches[0][2])
    assert bytes(values.tobytes()[:128]) == encoded and len(params) == 2
    assert fake_cupy.launches == []


# ---------------------------------------------------------------- GPU

@pytest.mark.cuda
def test_gpu_uses_it_on_hopper():
    import cupy as cp
    major = cp.cuda.runtime.getDeviceProperties(cp.cuda.runtime.getDevice())["major"]
    assert pdl.usable(cp.cuda.runtime.getDevice()) == (major >= 9)


@pytest.mark.cuda
@pytest.mark.parametrize("captured", [False, True])
def test_gpu_chain_values_round_by_round(captured):
    import cupy as cp
    n, rounds = 1 << 18, 30
    x = cp.zeros(n, cp.float32)
    seen = cp.zeros((rounds, n), cp.float32)
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        if captured:
            stream.begin_capture()
        for r in range(rounds):
            slow_fill[(n + 255) // 256, 256](x, float(r), 3000)
            add_next[(n + 127) // 128, 128](x, seen[r])  # reads x[i + 1]: a neighbour's, maybe another block's
            x *= 0.0  # a CuPy kernel between rounds: a plain launch on both sides
        if captured:
            stream.end_capture().launch(stream)
    stream.synchronize()
    want = 2.0 * np.arange(rounds, dtype=np.float32)[:, None]
    np.testing.assert_array_equal(cp.asnumpy(seen), np.broadcast_to(want, (rounds, n)))


@pytest.mark.cuda
def test_gpu_grid_barrier_kernel_between_programmatic_launches():
    import cupy as cp
    from frost.kernel import grid_sync_counter
    sms = cp.cuda.runtime.getDeviceProperties(cp.cuda.runtime.getDevice())["multiProcessorCount"]
    blocks, threads = sms, 256
    n = blocks * threads
    x, y, z = cp.zeros(n, cp.float32), cp.zeros(n, cp.float32), cp.zeros(n, cp.float32)
    counter = grid_sync_counter(cp)
    for r in range(10):
        slow_fill[blocks, threads](x, float(r), 2000)
        barrier_shift[blocks, threads](x, y, counter)  # x + 1, then 2 * (next block's first x + 1)
        add_next[blocks, threads](y, z)
    cp.cuda.Device().synchronize()
    np.testing.assert_array_equal(cp.asnumpy(y), np.full(n, 2.0 * 10, np.float32))
    np.testing.assert_array_equal(cp.asnumpy(z), np.full(n, 4.0 * 10, np.float32))
