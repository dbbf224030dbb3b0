"""Pooling ops against PyTorch's: outputs, input gradients (overlapping windows, padding, ceil mode) and errors."""
import ml_dtypes
import numpy as np
import pytest
import torch
import torch.nn.functional as TF

import frost
import frost.nn.functional as F
from frost.ops import pool

RNG = np.random.default_rng(99)


def _compare(frost_fn, torch_fn, x_np, *args, rtol=1e-10, atol=1e-10, **kwargs):
    """Run both ops forward and backward with the same random upstream gradient and compare everything."""
    tx = torch.tensor(x_np, requires_grad=True)
    t_out = torch_fn(tx, *args, **kwargs)
    g = RNG.standard_normal(t_out.shape).astype(x_np.dtype)
    t_out.backward(torch.tensor(g))
    fx = frost.Tensor(x_np, requires_grad=True)
    f_out = frost_fn(fx, *args, **kwargs)
    assert f_out.shape == tuple(t_out.shape)
    assert f_out.dtype == frost.Tensor(x_np).dtype
    np.testing.assert_allclose(f_out.detach().numpy(), t_out.detach().numpy(), rtol=rtol, atol=atol, err_msg="output")
    f_out.backward(frost.Tensor(g))
    assert fx.grad.shape == x_np.shape
    np.testing.assert_allclose(fx.grad.numpy(), tx.grad.numpy(), rtol=rtol, atol=atol, err_msg="input grad")


MAX_CASES = [
    ((2, 3, 8, 8), dict(kernel_size=2)),
    ((2, 3, 9, 9), dict(kernel_size=3, stride=2)),                        # overlapping windows
    ((2, 3, 9, 9), dict(kernel_size=3, stride=2, padding=1)),
    ((2, 3, 10, 7), dict(kernel_size=3, stride=2, ceil_mode=True)),
    ((2, 3, 10, 7), dict(kernel_size=3, stride=2, padding=1, ceil_mode=True)),
    ((1, 2, 11, 12), dict(kernel_size=(3, 2), stride=(1, 2), padding=(1, 0))),
    ((2, 2, 12, 12), dict(kernel_size=3, stride=1, dilation=2)),
    ((2, 2, 12, 12), dict(kernel_size=3, stride=2, padding=1, dilation=2, ceil_mode=True)),
    ((2, 3, 5, 5), dict(kernel_size=5)),
    ((2, 3, 8, 8), dict(kernel_size=2, stride=1)),
]


@pytest.mark.parametrize("shape,kwargs", MAX_CASES)
def test_max_pool2d_matches_torch(shape, kwargs):
    x = RNG.standard_normal(shape)
    _compare(pool.max_pool2d, TF.max_pool2d, x, **kwargs)


def test_max_pool2d_ties_send_gradient_to_the_first_maximum():
    x = np.zeros((1, 1, 4, 4))
    x[0, 0, 1:3, 1:3] = 1.0                                              # a tie inside every overlapping window
    _compare(pool.max_pool2d, TF.max_pool2d, x, kernel_size=2, stride=1)


def test_max_pool2d_return_indices_and_float32():
    x = RNG.standard_normal((2, 3, 9, 10)).astype(np.float32)
    out, idx = pool.max_pool2d(frost.Tensor(x), 3, 2, 1, return_indices=True)
    t_out, t_idx = TF.max_pool2d(torch.tensor(x), 3, 2, 1, return_indices=True)
    assert out.dtype == frost.float32 and idx.dtype == frost.int64
    np.testing.assert_array_equal(out.numpy(), t_out.numpy())
    np.testing.assert_array_equal(idx.numpy(), t_idx.numpy())
    _compare(pool.max_pool2d, TF.max_pool2d, x, 3, 2, 1, rtol=1e-6, atol=1e-6)


def test_max_pool2d_non_contiguous_and_unbatched():
    x = RNG.standard_normal((2, 8, 9, 3)).transpose(0, 3, 1, 2)        # NHWC storage viewed as NCHW
    _compare(pool.max_pool2d, TF.max_pool2d, x, kernel_size=3, stride=2, padding=1)
    _compare(pool.max_pool2d, TF.max_pool2d, RNG.standard_normal((3, 6, 6)), kernel_size=2)


AVG_CASES = [
    ((2, 3, 8, 8), dict(kernel_size=2)),
    ((2, 3, 9, 9), dict(kernel_size=3, stride=2)),
    ((2, 3, 9, 9), dict(kernel_size=3, stride=2, padding=1)),
    ((2, 3, 9, 9), dict(kernel_size=3, stride=2, padding=1, count_include_pad=False)),
    ((2, 3, 10, 7), dict(kernel_size=3, stride=2, padding=1, ceil_mode=True)),
    ((2, 3, 10, 7), dict(kernel_size=3, stride=2, padding=1, ceil_mode=True, count_include_pad=False)),
    ((2, 3, 10, 7), dict(kernel_size=(2, 3), stride=(3, 1), ceil_mode=True)),
    ((1, 2, 7, 7), dict(kernel_size=3, stride=1, padding=1)),
    ((1, 2, 7, 7), dict(kernel_size=3, divisor_override=2)),
]


@pytest.mark.parametrize("shape,kwargs", AVG_CASES)
def test_avg_pool2d_matches_torch(shape, kwargs):
    _compare(pool.avg_pool2d, TF.avg_pool2d, RNG.standard_normal(shape), **kwargs)


def test_avg_pool2d_non_contiguous_unbatched_float32():
    x = RNG.standard_normal((2, 8, 9, 3)).transpose(0, 3, 1, 2)
    _compare(pool.avg_pool2d, TF.avg_pool2d, x, kernel_size=3, stride=2, padding=1)
    _compare(pool.avg_pool2d, TF.avg_pool2d, RNG.standard_normal((3, 6, 6)), kernel_size=2)
    x32 = RNG.standard_normal((2, 4, 8, 8)).astype(np.float32)
    _compare(pool.avg_pool2d, TF.avg_pool2d, x32, kernel_size=3, stride=2, rtol=1e-6, atol=1e-6)


ADAPTIVE_CASES = [
    ((2, 3, 8, 8), (1, 1)),        # global pooling
    ((2, 3, 8, 8), (4, 2)),        # divisible: the reshape fast path
    ((2, 3, 7, 9), (3, 4)),        # not divisible: overlapping, unequal windows
    ((2, 3, 5, 5), (5, 5)),
    ((2, 3, 4, 6), (7, 8)),        # larger than the input
    ((2, 3, 6, 7), (None, 3)),
    ((3, 10, 10), 3),              # unbatched
]


@pytest.mark.parametrize("shape,out_size", ADAPTIVE_CASES)
def test_adaptive_avg_pool2d_matches_torch(shape, out_size):
    _compare(pool.adaptive_avg_pool2d, TF.adaptive_avg_pool2d, RNG.standard_normal(shape), out_size)


@pytest.mark.parametrize("shape,out_size", ADAPTIVE_CASES)
def test_adaptive_max_pool2d_matches_torch(shape, out_size):
    _compare(pool.adaptive_max_pool2d, TF.adaptive_max_pool2d, RNG.standard_normal(shape), out_size)


def test_adaptive_max_pool2d_indices():
    x = RNG.standard_normal((2, 3, 7, 9))
    out, idx = pool.adaptive_max_pool2d(frost.Tensor(x), (3, 4), return_indices=True)
    t_out, t_idx = TF.adaptive_max_pool2d(torch.tensor(x), (3, 4), return_indices=True)
    np.testing.assert_array_equal(idx.numpy(), t_idx.numpy())
    np.testing.assert_array_equal(out.numpy(), t_out.numpy())


def test_adaptive_avg_pool2d_float32_keeps_dtype():
    x = RNG.standard_normal((2, 4, 7, 5)).astype(np.float32)
    _compare(pool.adaptive_avg_pool2d, TF.adaptive_avg_pool2d, x, (3, 2), rtol=1e-5, atol=1e-6)
    _compare(pool.adaptive_avg_pool2d, TF.adaptive_avg_pool2d, x[:, :, :6, :4], (3, 2), rtol=1e-5, atol=1e-6)


def _t(shape, dtype=np.float32):
    return frost.Tensor(np.zeros(shape, dtype=dtype))


def test_pool_errors():
    with pytest.raises(RuntimeError, match=r"max_pool2d: expected a 3-D \(C, H, W\) or 4-D .* got shape \(4, 4\)"):
        pool.max_pool2d(_t((4, 4)), 2)
    with pytest.raises(RuntimeError, match=r"avg_pool2d: padding \(2, 2\) should be at most half of the kernel "
                                           r"size \(3, 3\)"):
        pool.avg_pool2d(_t((1, 1, 8, 8)), 3, padding=2)
    with pytest.raises(RuntimeError, match=r"max_pool2d: output size \(0 x 0\) is too small for input "
                                           r"\(1, 1, 6, 6\) with kernel \(7, 7\)"):
        pool.max_pool2d(_t((1, 1, 6, 6)), 7)
    with pytest.raises(RuntimeError, match=r"max_pool2d: expected a floating-point input, got int64"):
        pool.max_pool2d(_t((1, 1, 4, 4), np.int64), 2)
    with pytest.raises(ValueError, match=r"avg_pool2d: kernel_size, stride and dilation must be positive"):
        pool.avg_pool2d(_t((1, 1, 4, 4)), 0)
    with pytest.raises(RuntimeError, match=r"adaptive_avg_pool2d: output size must be positive, got \(0, 2\)"):
        pool.adaptive_avg_pool2d(_t((1, 1, 4, 4)), (0, 2))



@pytest.mark.parametrize("shape", [(1, 3, 0, 4), (1, 3, 4, 0), (3, 0, 4), (1, 0, 4, 4), (0, 4, 4), (0, 3, 4, 4)])
@pytest.mark.parametrize("name", ["adaptive_avg_pool2d", "adaptive_max_pool2d"])
def test_adaptive_pool_on_empty_dims_follows_torch(name, shape):
    # an empty plane used to give NaNs (avg) or a NumPy argmax error (max); PyTorch refuses it but allows an
    # empty batch (and, for the average, an empty channel dim)
    x = RNG.standard_normal(shape)
    try:
        t_out = getattr(TF, name)(torch.tensor(x), 2)
    except RuntimeError as e:
        assert str(e).startswith(f"{name}(): Expected input to have non-zero size for non-batch dimensions")
        with pytest.raises(RuntimeError, match=rf"{name}\(\): Expected input to have non-zero size for non-batch "
                                               rf"dimensions, but input has sizes .* being empty; give dimension"):
            getattr(pool, name)(frost.Tensor(x), 2)
        return
    # allowed: an empty result (torch's backward refuses an empty channel dim, so only the shapes are compared)
    fx = frost.Tensor(x, requires_grad=True)
    f_out = getattr(pool, name)(fx, 2)
    assert f_out.shape == tuple(t_out.shape)
    f_out.sum().backward()
    assert fx.grad.shape == shape


@pytest.mark.parametrize("divisor", [1, 3, -2])
def test_avg_pool2d_divisor_override_values_match_torch(divisor):
    _compare(pool.avg_pool2d, TF.avg_pool2d, RNG.standard_normal((1, 2, 6, 6)), 2, divisor_override=divisor)


@pytest.mark.parametrize("shape", [(1, 1, 4, 4), (1, 4, 4)])
def test_avg_pool2d_divisor_override_zero_raises_like_torch(shape):
    # 0 used to be taken for "no override" and silently divide by the window size
    x = np.arange(16.0).reshape(shape)
    with pytest.raises(RuntimeError, match="divisor must be not zero"):
        TF.avg_pool2d(torch.tensor(x), 2, divisor_override=0)
    with pytest.raises(RuntimeError, match=r"avg_pool2d: divisor must be not zero, got divisor_override=0 for input "
                                           r"\(1, (1, )?4, 4\); pass None"):
        pool.avg_pool2d(frost.Tensor(x), 2, divisor_override=0)


@pytest.mark.cuda
@pytest.mark.parametrize("fn,args", [
    (pool.max_pool2d, (3, 2, 1)), (pool.avg_pool2d, (3, 2, 1, True)),
    (pool.adaptive_avg_pool2d, ((3, 4),)), (pool.adaptive_max_pool2d, ((3, 4),))])
def test_pool_cuda_matches_cpu(fn, args):
    x = RNG.standard_normal((2, 3, 9, 10)).astype(np.float32)
    g = RNG.standard_normal(fn(frost.Tensor(x), *args).shape).astype(np.float32)
    results = []
    for device in ("cpu", "cuda"):
        fx = frost.tensor(x, device=device, requires_grad=True)
        out = fn(fx, *args)
        out.backward(frost.tensor(g, device=device))
        results.append((out.detach().cpu().numpy(), fx.grad.cpu().numpy()))
    for cpu_r, gpu_r in zip(*results):
        np.testing.assert_allclose(gpu_r, cpu_r, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("pool", ["adaptive", "avg"])
def test_bf16_windows_add_up_in_float32(pool):
    """A bf16 mean over 8x8 windows is the float64 mean rounded once to bf16 (summed in bf16 it was off by 2 %)."""
    bf16 = ml_dtypes.bfloat16
    x = (np.random.default_rng(0).standard_normal((4, 64, 8, 8)) + 3).astype(bf16)
    want = x.astype(np.float64).mean(axis=(2, 3), keepdims=True).astype(bf16)
    t = frost.tensor(x, requires_grad=True)
    out = F.adaptive_avg_pool2d(t, (1, 1)) if pool == "adaptive" else F.avg_pool2d(t, 8)
    assert out.dtype == frost.bfloat16
    np.testing.assert_array_equal(out.detach().numpy().view(np.uint16), want.view(np.uint16))
    out.backward(frost.tensor(np.ones(out.shape, bf16)))
    assert t.grad.dtype == frost.bfloat16
    np.testing.assert_array_equal(t.grad.numpy().astype(np.float32), np.full(x.shape, 1 / 64, np.float32))


def test_bf16_adaptive_windows_that_do_not_divide_stay_within_one_rounding():
    bf16 = ml_dtypes.bfloat16
    x = (np.random.default_rng(1).standard_normal((2, 8, 8, 8)) + 3).astype(bf16)
    out = F.adaptive_avg_pool2d(frost.tensor(x), (3, 3)).numpy().astype(np.float64)
    want = torch.nn.functional.adaptive_avg_pool2d(torch.tensor(x.astype(np.float64)), (3, 3)).numpy()
    np.testing.assert_allclose(out, want, rtol=2 ** -8, atol=0)


def test_max_pool_window_of_minus_infinity_picks_a_real_element_not_the_padding():
    a = np.full((1, 1, 4, 4), -np.inf)
    a[0, 0, 1, 2], a[0, 0, 3, 1] = 1.0, 2.0
    f, t = frost.tensor(a, requires_grad=True), torch.tensor(a, requires_grad=True)
    fo, fi = F.max_pool2d(f, 2, padding=1, return_indices=True)
    to, ti = TF.max_pool2d(t, 2, padding=1, return_indices=True)
    np.testing.assert_array_equal(fi.numpy(), ti.numpy())
    np.testing.assert_array_equal(fo.detach().numpy(), to.detach().numpy())
    fo.sum().backward()
    to.sum().backward()
    np.testing.assert_array_equal(f.grad.numpy(), t.grad.numpy())
