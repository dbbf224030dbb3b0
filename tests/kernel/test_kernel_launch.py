"""The GPU launch path (argument conversion, module loading, shared-memory opt-in), checked on the CPU against a
stand-in for CuPy that records what would be launched (conftest.py's fake_cupy)."""
import numpy as np
import pytest

import frost
from fake_cupy import FakeArray
from frost.kernel import Array, Const, bf16, dynamic_shared, f32, i32, kernel, tx


def test_arguments_become_pointers_sizes_and_typed_scalars(fake_cupy):
    @kernel
    def k(x: Array[f32], m: Array[f32, 2], n: i32, s: f32, h: bf16, B: Const[int]):
        x[tx] = m[0, tx] * s + f32(n) + h + B
    x = FakeArray(np.zeros(10, np.float32))
    base = np.zeros((6, 8), np.float32)
    m = FakeArray(base[::2, 1:])
    k[(2, 3), 32](x, m, 7, 0.5, 1.5, B=4)
    k[1, 32](x, m, 7, 0.5, 1.5, B=4)
    (first, second) = fake_cupy.launches
    assert len(fake_cupy.loads) == 1  # the module is loaded once
    assert first["grid"] == (2, 3, 1) and first["block"] == (32, 1, 1) and first["stream"] == "current-stream"
    args = first["args"]
    assert args[0] == np.uint64(x.data.ptr) and args[1] == 10 and args[1].dtype == np.int64
    assert args[2] == np.uint64(m.data.ptr) and list(args[3:7]) == [3, 7, 16, 1]
    assert args[7] == 7 and args[7].dtype == np.int32 and args[8].dtype == np.float32
    assert args[9].dtype == np.uint16 and args[9] == 0x3FC0  # bf16 1.5 as bits
    assert len(args) == 10  # B is compiled in, not passed


def test_large_dynamic_shared_memory_is_opted_in_and_streams_pass_through(fake_cupy):
    @kernel
    def k(x: Array[f32]):
        s = dynamic_shared(f32)
        x[tx] = s[tx]
    x = FakeArray(np.zeros(4, np.float32))
    k[1, 4, 100_000, "my-stream"](x)
    (launch,) = fake_cupy.launches
    assert launch["smem"] == 100_000 and launch["opt_in"] == 100_000 and launch["stream"] == "my-stream"


def test_warm_kernels_compile_in_the_background_from_the_first_launch(fake_cupy, monkeypatch):
    """@kernel.warm: the process's first launch on a device queues the marked kernels' compiles (once); their own
    first launch then takes the prefetched cubin instead of compiling on the caller."""
    from frost.kernel import api, compile as kcompile

    @kernel
    def first(x: Array[f32]):
        x[tx] = 1.0

    @kernel.warm
    @kernel
    def later(x: Array[f32]):
        x[tx] = 2.0

    assert api._warm == [later] and not later.specialize()._pending
    x = FakeArray(np.zeros(4, np.float32))
    first[1, 4](x)
    assert api._warmed_devices == {0: 1} and "sm_90" in later.specialize()._pending  # queued, not compiled here
    first[1, 4](x)
    later[1, 4](x)
    assert kcompile.waits[-1] == (later.specialize().checked.cname, kcompile.waits[-1][1], True)
    assert [launch["name"] for launch in fake_cupy.launches] == ["first", "first", "later"]

    @kernel.warm
    @kernel
    def imported_after(x: Array[f32]):
        x[tx] = 3.0

    @kernel
    def third(x: Array[f32]):
        x[tx] = 4.0
    assert not imported_after._specs  # marking compiles nothing (its module may still be loading)
    third[1, 4](x)  # marked after the first launch: queued at the next first launch
    assert api._warmed_devices == {0: 2} and "sm_90" in imported_after.specialize()._pending


def test_warm_refuses_kernels_it_cannot_compile_ahead():
    @kernel
    def with_const(x: Array[f32], B: Const[int]):
        x[tx] = f32(B)
    with pytest.raises(TypeError, match=r"kernel.warm: with_const has compile-time constants \['B'\]"):
        kernel.warm(with_const)
    with pytest.raises(TypeError, match="kernel.warm marks a @kernel"):
        kernel.warm(lambda x: x)


def test_a_training_steps_fixed_kernels_are_warm():
    import frost.accel.augment, frost.accel.conv_wgrad, frost.accel.philox, frost.optim.flat  # noqa: F401,E401
    from frost.kernel import api
    names = {k.__name__ for k in api._warm}
    assert {"cross_entropy_forward", "cross_entropy_backward", "adam_flat_kernel", "advance_step", "philox_set_state",
            "philox_bits_kernel", "philox_advance", "conv_wgrad_finalize", "gather_scaled"} <= names


def test_wrong_arguments_are_named(fake_cupy):
    @kernel
    def k(x: Array[f32], n: i32):
        x[tx] = f32(n)
    with pytest.raises(TypeError, match=r"k\(\) takes 2 arguments \(x, n\), got 3"):
        k[1, 1](FakeArray(np.zeros(1, np.float32)), 1, 2)
    with pytest.raises(TypeError, match="argument 'x' is Array\\[f32\\] but got an array of dtype int32"):
        k[1, 1](FakeArray(np.zeros(1, np.int32)), 1)
    with pytest.raises(TypeError, match="argument 'x' .* must be a CUDA tensor or CuPy array, got ndarray"):
        k[1, 1](np.zeros(1, np.float32), 1)
    with pytest.raises(TypeError, match="argument 'n' is a scalar i32, got str"):
        k[1, 1](FakeArray(np.zeros(1, np.float32)), "3")
    with pytest.raises(TypeError, match="missing n"):
        k[1, 1](FakeArray(np.zeros(1, np.float32)))
    with pytest.raises(ValueError, match="block must be 1 to 3 positive sizes"):
        k[1, 0]


def test_cuda_source_arguments(fake_cupy):
    k = frost.cuda_source('extern "C" __global__ void scale(float* __restrict__ x, const float a, int n) {}', "scale")
    x = FakeArray(np.zeros(3, np.float32))
    k[1, 32](x, 2, 3)
    (launch,) = fake_cupy.launches
    assert launch["args"][0] is x and launch["args"][1].dtype == np.float32 and launch["args"][2].dtype == np.int32
    with pytest.raises(TypeError, match=r"scale\(\) takes 3 arguments \(x, a, n\), got 2"):
        k[1, 32](x, 2.0)
    with pytest.raises(TypeError, match="argument 'n' \\(int\\) must be a scalar"):
        k[1, 32](x, 2.0, x)


def test_vector_access_arguments_must_be_16_byte_aligned(fake_cupy):
    from frost.kernel import load4, store4

    @frost.kernel.device
    def copy_one(dst: Array[f32], src: Array[f32], i: i32):
        a, b, c, d = load4(src, i)
        store4(dst, i, a, b, c, d)

    @kernel
    def k(x: Array[f32], y: Array[f32], z: Array[f32]):
        copy_one(y, x, tx * 4)   # x and y reach load4/store4 through a device function
        z[tx] = 1.0              # z is accessed one element at a time
    base = np.zeros(64, np.float32)
    assert base.ctypes.data % 16 == 0
    k[1, 4](FakeArray(base[:16]), FakeArray(base[16:32]), FakeArray(base[33:37]))  # z may be misaligned
    assert len(fake_cupy.launches) == 1
    with pytest.raises(ValueError, match=r"k: argument 'x' is accessed 16 bytes at a time \(vector loads and "
                                         r"stores\) but starts 4 bytes past a 16-byte boundary"):
        k[1, 4](FakeArray(base[1:17]), FakeArray(base[16:32]), FakeArray(base[32:36]))
    with pytest.raises(ValueError, match=r"argument 'y' .* starts 8 bytes past"):
        k[1, 4](FakeArray(base[:16]), FakeArray(base[18:34]), FakeArray(base[32:36]))
