"""Memory formats: channels-last arrays, tensors and modules (frost/layout.py and its users)."""
import numpy as np
import pytest
import torch

import frost
from frost import layout, nn
from frost.autograd import sum_of_gradients


def _nhwc(shape, seed=0):
    n, c, h, w = shape
    return np.random.default_rng(seed).standard_normal((n, h, w, c)).astype(np.float32).transpose(0, 3, 1, 2)


def test_is_channels_last_tells_the_two_dense_formats_apart():
    a = np.zeros((2, 3, 4, 5), np.float32)
    assert not layout.is_channels_last(a)
    b = layout.as_channels_last(a)
    assert layout.is_channels_last(b) and b.shape == a.shape and b.strides == (240, 4, 60, 12)
    assert layout.as_channels_last(b) is b
    assert not layout.is_channels_last(a[:, :, ::2])               # strided, neither format
    assert not layout.is_channels_last(np.zeros((2, 3), np.float32))
    with pytest.raises(ValueError, match=r"channels_last: expected a 4-D \(N, C, H, W\) array, got shape \(2, 3\)"):
        layout.as_channels_last(np.zeros((2, 3)))


def test_dense_like_and_empty_like_format_follow_the_reference():
    ref = _nhwc((2, 3, 4, 5))
    a = np.arange(120, dtype=np.float32).reshape(2, 3, 4, 5)
    b = layout.dense_like(a, ref)
    assert layout.is_channels_last(b) and np.array_equal(a, b)
    assert layout.dense_like(a, a) is a
    e = layout.empty_like_format((2, 6, 4, 5), ref, dtype=np.float64)
    assert layout.is_channels_last(e) and e.dtype == np.float64 and e.shape == (2, 6, 4, 5)
    assert layout.empty_like_format((2, 6), ref).shape == (2, 6)
    with pytest.raises(TypeError, match="memory_format must be frost.contiguous_format or frost.channels_last"):
        layout.in_format(a, "nhwc")


def test_tensor_memory_format_round_trip_keeps_values_and_gradients():
    x = frost.randn(2, 3, 4, 5, requires_grad=True)
    y = x.to(memory_format=frost.channels_last)
    assert y.is_contiguous(memory_format=frost.channels_last) and not y.is_contiguous()
    np.testing.assert_array_equal(y.detach().numpy(), x.detach().numpy())
    z = y.contiguous()
    assert z.is_contiguous() and np.array_equal(z.detach().numpy(), x.detach().numpy())
    assert y.contiguous(frost.channels_last) is y
    (y * frost.arange(5.0)).sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), np.broadcast_to(np.arange(5.0), (2, 3, 4, 5)))
    with pytest.raises(ValueError, match=r"contiguous: memory_format=frost.channels_last needs a 4-D"):
        frost.randn(3, 4).contiguous(frost.channels_last)


def test_module_to_channels_last_relays_4d_parameters_only():
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.Flatten(), nn.Linear(4 * 6 * 6, 2))
    before = {k: v.numpy().copy() for k, v in model.state_dict().items()}
    conv_weight = model[0].weight
    model.to(memory_format=frost.channels_last)
    assert model[0].weight is conv_weight and layout.is_channels_last(conv_weight.data)
    assert model[3].weight.data.flags.c_contiguous
    for k, v in model.state_dict().items():
        np.testing.assert_array_equal(v.numpy(), before[k])


def test_channels_last_model_trains_like_the_nchw_one_on_the_cpu():
    def run(channels_last):
        frost.manual_seed(0)
        model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.Conv2d(4, 2, 3))
        x = frost.tensor(_nhwc((2, 3, 6, 6), seed=1).copy())
        if channels_last:
            model.to(memory_format=frost.channels_last)
            x = x.contiguous(frost.channels_last)
        opt = frost.optim.AdamW(model.parameters(), lr=1e-2)
        for _ in range(3):
            opt.zero_grad()
            loss = (model(x) ** 2).mean()
            loss.backward()
            opt.step()
        return [p.detach().numpy() for p in model.parameters()]
    for a, b in zip(run(False), run(True)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_channels_last_conv_gradients_match_torch():
    x = _nhwc((2, 3, 7, 7))
    w = layout.as_channels_last(np.random.default_rng(2).standard_normal((5, 3, 3, 3)).astype(np.float32))
    fx, fw = frost.tensor(x, requires_grad=True), frost.tensor(w, requires_grad=True)
    out = frost.nn.functional.conv2d(fx, fw, stride=2, padding=1)
    (out * out).sum().backward()
    tx = torch.tensor(np.ascontiguousarray(x), dtype=torch.float64, requires_grad=True)
    tw = torch.tensor(np.ascontiguousarray(w), dtype=torch.float64, requires_grad=True)
    tout = torch.nn.functional.conv2d(tx, tw, stride=2, padding=1)
    (tout * tout).sum().backward()
    np.testing.assert_allclose(out.detach().numpy(), tout.detach().numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(fx.grad.numpy(), tx.grad.numpy(), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(fw.grad.numpy(), tw.grad.numpy(), rtol=1e-4, atol=1e-4)


def test_gradient_sums_keep_the_channels_last_format():
    a, b = _nhwc((2, 3, 4, 5), 0), _nhwc((2, 3, 4, 5), 1)
    s = sum_of_gradients(a, b)
    assert layout.is_channels_last(s) and np.array_equal(s, a + b)
    c = np.ones((2, 3), np.float32)
    np.testing.assert_array_equal(sum_of_gradients(c, c), 2 * c)


def test_resident_channels_last_batches_are_nhwc_views():
    from frost.bench.resnet_cifar10 import on_resident_data
    images = np.random.default_rng(0).integers(0, 256, (10, 32, 32, 3), dtype=np.uint8)
    labels = np.arange(10, dtype=np.int64)
    seen = {}

    def step(x, y):
        seen["x"], seen["y"] = x, y
        return x
    on_resident_data(step, images, labels, nhwc=True)(frost.tensor(np.array([3, 1], np.int64)))
    x = seen["x"].data
    assert x.shape == (2, 3, 32, 32) and layout.is_channels_last(x)
    np.testing.assert_allclose(x, images[[3, 1]].transpose(0, 3, 1, 2) / 255.0, rtol=1e-6)
    np.testing.assert_array_equal(seen["y"].numpy(), [3, 1])
    # NCHW images 3 pixels wide are not mistaken for NHWC ones (the layout is said, not guessed from the shape)
    narrow = np.random.default_rng(1).integers(0, 256, (4, 3, 5, 3), dtype=np.uint8)
    on_resident_data(step, narrow, labels[:4])(frost.tensor(np.array([2, 0], np.int64)))
    assert seen["x"].shape == (2, 3, 5, 3)
    np.testing.assert_allclose(seen["x"].data, narrow[[2, 0]] / 255.0, rtol=1e-6)


@pytest.mark.cuda
def test_gpu_channels_last_conv_keeps_the_format_and_matches_nchw(exact_gpu_math):
    x = _nhwc((4, 16, 8, 8))
    w = np.random.default_rng(3).standard_normal((32, 16, 3, 3)).astype(np.float32) * 0.1
    results = {}
    for name, fmt in (("nchw", frost.contiguous_format), ("nhwc", frost.channels_last)):
        fx = frost.tensor(np.ascontiguousarray(x), device="cuda").contiguous(fmt).requires_grad_()
        fw = frost.tensor(w, device="cuda").contiguous(fmt).requires_grad_()
        out = frost.nn.functional.conv2d(fx, fw, padding=1)
        assert out.is_contiguous(memory_format=fmt)
        (out * out).sum().backward()
        results[name] = [out.detach().numpy(), fx.grad.numpy(), fw.grad.numpy()]
    for a, b in zip(results["nchw"], results["nhwc"]):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)


def test_flat_group_keeps_channels_last_parameters_gradients_and_state_channels_last():
    from frost.optim import flat
    w = frost.Tensor(_nhwc((4, 3, 2, 2), 0).copy(), requires_grad=True)
    w.data = layout.as_channels_last(np.ascontiguousarray(w.data))
    w.grad = frost.Tensor(_nhwc((4, 3, 2, 2), 1))
    b = frost.Tensor(np.arange(4, dtype=np.float32), requires_grad=True)
    b.grad = frost.Tensor(np.ones(4, np.float32))
    values, grad_values = w.data.copy(), w.grad.data.copy()
    old = {w: {"step": frost.Tensor(np.array(2.0, np.float32)), "exp_avg": frost.Tensor(_nhwc((4, 3, 2, 2), 2))}}
    avg_values = old[w]["exp_avg"].data.copy()
    group = flat.FlatGroup([w, b], old, ("exp_avg",), 2)
    for array, buffer in ((w.data, group.params), (w.grad.data, group.grads),
                          (old[w]["exp_avg"].data, group.state["exp_avg"])):
        assert layout.is_channels_last(array) and np.shares_memory(array, buffer)
    np.testing.assert_array_equal(w.data, values)
    np.testing.assert_array_equal(w.grad.data, grad_values)
    np.testing.assert_array_equal(old[w]["exp_avg"].data, avg_values)
    # element i of every buffer belongs to the same weight entry: the flat kernels index them alike
    np.testing.assert_array_equal(group.params[:48], values.transpose(0, 2, 3, 1).reshape(-1))
    np.testing.assert_array_equal(group.state["exp_avg"][:48], avg_values.transpose(0, 2, 3, 1).reshape(-1))


def test_joined_view_joins_pieces_side_by_side_in_one_block_without_a_copy():
    block = np.arange(2 * 12, dtype=np.float32).reshape(2, 12)
    pieces = [block[:, 0:4], block[:, 4:8], block[:, 8:12]]
    joined = layout.joined_view(pieces, 1)
    assert joined is not None and np.shares_memory(joined, block)
    np.testing.assert_array_equal(joined, block)


def test_joined_view_declines_gaps_other_orders_and_other_blocks():
    block = np.arange(2 * 12, dtype=np.float32).reshape(2, 12)
    assert layout.joined_view([block[:, 0:4], block[:, 8:12]], 1) is None          # a gap
    assert layout.joined_view([block[:, 4:8], block[:, 0:4]], 1) is None           # out of order
    other = block.copy()
    assert layout.joined_view([block[:, 0:4], other[:, 4:8]], 1) is None            # two allocations
    assert layout.joined_view([block[:, 0:4], block[:, 4:8].astype(np.float64)], 1) is None
