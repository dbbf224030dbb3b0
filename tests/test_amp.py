"""frost.amp: GradScaler against scales worked out by hand and against torch.amp.GradScaler on the CPU; autocast's
PyTorch call forms."""
import math

import numpy as np
import pytest

import frost
from frost.amp import GradScaler, next_scale

torch = pytest.importorskip("torch")

# a step's gradient of w is x (loss = sum(w * x)): these x overflow at steps 2 and 5
_XS = [[1.0, 2.0], [0.5, -1.0], [math.inf, 1.0], [1.0, 1.0], [2.0, 0.25], [math.nan, 0.0], [1.0, -3.0],
       [0.5, 0.5], [4.0, 1.0], [1.0, 1.0]]


def _frost_run(scaler: GradScaler, xs, explicit_unscale: bool = False):
    w = frost.tensor([1.0, -2.0], dtype=frost.float64, requires_grad=True)
    optimizer = frost.optim.SGD([w], lr=0.1)
    scales, weights = [], []
    for x in xs:
        optimizer.zero_grad()
        scaler.scale((w * frost.tensor(x, dtype=frost.float64)).sum()).backward()
        if explicit_unscale:
            scaler.unscale_(optimizer)
        scaler.step(optimizer)
        scaler.update()
        scales.append(scaler.get_scale())
        weights.append(w.detach().numpy().copy())
    return scales, np.array(weights)


def _torch_run(scaler, xs):
    w = torch.tensor([1.0, -2.0], dtype=torch.float64, requires_grad=True)
    optimizer = torch.optim.SGD([w], lr=0.1)
    scales, weights = [], []
    for x in xs:
        optimizer.zero_grad()
        scaler.scale((w * torch.tensor(x, dtype=torch.float64)).sum()).backward()
        scaler.step(optimizer)
        scaler.update()
        scales.append(scaler.get_scale())
        weights.append(w.detach().numpy().copy())
    return scales, np.array(weights)


def test_scales_follow_the_hand_worked_sequence():
    # init 8, growth 2 after 3 good steps in a row, backoff 0.5 on an overflow (steps 2 and 5)
    scaler = GradScaler("cpu", init_scale=8.0, growth_factor=2.0, backoff_factor=0.5, growth_interval=3)
    scales, _ = _frost_run(scaler, _XS)
    assert scales == [8.0, 8.0, 4.0, 4.0, 4.0, 2.0, 2.0, 2.0, 4.0, 4.0]
    assert scaler.state_dict() == {"scale": 4.0, "growth_factor": 2.0, "backoff_factor": 0.5, "growth_interval": 3,
                                   "_growth_tracker": 1}


@pytest.mark.parametrize("explicit_unscale", [False, True])
def test_scales_and_weights_match_torch_grad_scaler(explicit_unscale):
    options = dict(init_scale=2.0 ** 10, growth_factor=4.0, backoff_factor=0.25, growth_interval=2)
    scales, weights = _frost_run(GradScaler("cpu", **options), _XS, explicit_unscale)
    expected_scales, expected_weights = _torch_run(torch.amp.GradScaler("cpu", **options), _XS)
    assert scales == expected_scales
    np.testing.assert_allclose(weights, expected_weights, rtol=1e-12)


def test_state_dict_matches_torch_and_round_trips():
    options = dict(init_scale=16.0, growth_interval=2)
    frost_scaler, torch_scaler = GradScaler("cpu", **options), torch.amp.GradScaler("cpu", **options)
    _frost_run(frost_scaler, _XS[:5])
    _torch_run(torch_scaler, _XS[:5])
    assert frost_scaler.state_dict() == torch_scaler.state_dict()
    restored = GradScaler("cpu")
    restored.load_state_dict(torch_scaler.state_dict())
    assert restored.state_dict() == frost_scaler.state_dict()
    assert _frost_run(restored, _XS[5:])[0] == _torch_run(torch_scaler, _XS[5:])[0]


def test_next_scale_never_grows_to_infinity():
    assert next_scale(3e38, 0, False, 2.0, 0.5, 1) == (3e38, 0)
    assert next_scale(8.0, 5, True, 2.0, 0.5, 10) == (4.0, 0)
    assert next_scale(8.0, 8, False, 2.0, 0.5, 10) == (8.0, 9)
    assert next_scale(8.0, 9, False, 2.0, 0.5, 10) == (16.0, 0)


def test_unscale_divides_the_gradients_and_step_skips_an_overflow():
    w = frost.tensor([1.0, 2.0, 3.0], requires_grad=True)
    optimizer = frost.optim.SGD([w], lr=1.0)
    scaler = GradScaler(init_scale=4.0)
    scaler.scale((w * frost.tensor([1.0, 2.0, 3.0])).sum()).backward()
    np.testing.assert_array_equal(w.grad.numpy(), [4.0, 8.0, 12.0])
    scaler.unscale_(optimizer)
    np.testing.assert_array_equal(w.grad.numpy(), [1.0, 2.0, 3.0])
    assert scaler.step(optimizer) is None  # SGD.step returns None too: compare the weights
    np.testing.assert_array_equal(w.detach().numpy(), [0.0, 0.0, 0.0])
    scaler.update()
    optimizer.zero_grad()
    scaler.scale((w * frost.tensor([1.0, math.inf, 1.0])).sum()).backward()
    scaler.step(optimizer)
    np.testing.assert_array_equal(w.detach().numpy(), [0.0, 0.0, 0.0])  # skipped
    scaler.update()
    assert scaler.get_scale() == 2.0


def test_a_bfloat16_gradient_is_checked_in_float32():
    w = frost.tensor([1.0, 2.0], dtype=frost.bfloat16, requires_grad=True)
    optimizer = frost.optim.SGD([w], lr=1.0)
    scaler = GradScaler(init_scale=2.0)
    scaler.scale((w * frost.tensor([1.0, 3e38], dtype=frost.bfloat16)).sum()).backward()  # 6e38 overflows bf16
    scaler.step(optimizer)
    scaler.update()
    assert scaler.get_scale() == 1.0
    np.testing.assert_array_equal(w.detach().float().numpy(), [1.0, 2.0])


def test_scale_of_lists_and_update_with_a_new_scale():
    scaler = GradScaler(init_scale=3.0)
    a, b = scaler.scale([frost.tensor(1.0), (frost.tensor(2.0),)])
    assert a.item() == 3.0 and b[0].item() == 6.0
    scaler.update(new_scale=frost.tensor(5.0))
    assert scaler.get_scale() == 5.0


def test_a_disabled_scaler_passes_everything_through():
    w = frost.tensor([1.0], requires_grad=True)
    optimizer = frost.optim.SGD([w], lr=1.0)
    scaler = GradScaler(enabled=False)
    loss = (w * 2.0).sum()
    assert scaler.scale(loss) is loss
    loss.backward()
    scaler.unscale_(optimizer)
    scaler.step(optimizer)
    scaler.update()
    assert w.item() == -1.0 and scaler.get_scale() == 1.0 and scaler.state_dict() == {} and not scaler.is_enabled()


def test_misuse_is_named():
    w = frost.tensor([1.0], requires_grad=True)
    optimizer = frost.optim.SGD([w], lr=1.0)
    scaler = GradScaler()
    with pytest.raises(RuntimeError, match="GradScaler.step: the optimizer has no gradients"):
        scaler.step(optimizer)
    scaler = GradScaler()
    with pytest.raises(RuntimeError, match="GradScaler.update: no gradients were unscaled"):
        scaler.update()
    scaler.scale(w.sum()).backward()
    scaler.unscale_(optimizer)
    with pytest.raises(RuntimeError, match="GradScaler.unscale_: already called on this optimizer"):
        scaler.unscale_(optimizer)
    scaler.step(optimizer)
    with pytest.raises(RuntimeError, match="GradScaler.step: already called"):
        scaler.step(optimizer)
    with pytest.raises(RuntimeError, match="GradScaler.unscale_: called after step"):
        scaler.unscale_(optimizer)
    with pytest.raises(RuntimeError, match="closure"):
        scaler.step(optimizer, closure=lambda: None)
    with pytest.raises(TypeError, match="GradScaler.scale: expected a tensor"):
        scaler.scale({"loss": w})
    with pytest.raises(ValueError, match="new_scale must be a finite number > 0, got -1.0"):
        scaler.update(new_scale=-1.0)


def test_bad_settings_and_float16_gradients_are_refused():
    with pytest.raises(ValueError, match=r"GradScaler: growth_factor must be > 1, got 0.5; backoff_factor must be "
                                         r"in \(0, 1\), got 2"):
        GradScaler(growth_factor=0.5, backoff_factor=2)
    with pytest.raises(ValueError, match="growth_interval must be an integer > 0, got 0"):
        GradScaler(growth_interval=0)
    with pytest.raises(ValueError, match="the scale must be a finite number > 0, got inf"):
        GradScaler(init_scale=math.inf)
    with pytest.raises(KeyError, match="missing"):
        GradScaler().load_state_dict({"scale": 2.0})
    w = frost.tensor([1.0], dtype=frost.float16, requires_grad=True)
    optimizer = frost.optim.SGD([w], lr=1.0)
    scaler = GradScaler()
    (w * 2.0).sum().backward()
    with pytest.raises(ValueError, match=r"GradScaler.unscale_: a parameter of shape \(1,\) has a float16 gradient"):
        scaler.unscale_(optimizer)


def test_amp_autocast_takes_torch_call_forms():
    a = frost.randn(4, 8)
    b = frost.randn(8, 3)
    with frost.amp.autocast("cpu"):
        assert (a @ b).dtype == frost.bfloat16
    with frost.amp.autocast("cuda", dtype=frost.float16):
        assert (a @ b).dtype == frost.float16
    with frost.autocast(device_type="cuda", dtype=frost.bfloat16, cache_enabled=False):
        assert (a @ b).dtype == frost.bfloat16
    with frost.autocast("cuda", enabled=False):
        assert (a @ b).dtype == frost.float32
    with frost.autocast(frost.bfloat16):  # frost's own form keeps working
        assert (a @ b).dtype == frost.bfloat16
    assert frost.autocast("cuda").dtype == frost.float16  # PyTorch's default per device type
    assert frost.autocast("cpu").dtype == frost.bfloat16
    with pytest.raises(ValueError, match="autocast: device_type must be 'cuda' or 'cpu', got 'tpu'"):
        frost.autocast("tpu", dtype=frost.float16)
    with pytest.raises(ValueError, match="autocast: 'mps' is neither a device type"):
        frost.autocast("mps")
    with pytest.raises(ValueError, match="autocast: dtype must be bfloat16 or float16, got frost.float32"):
        frost.autocast("cuda", dtype=frost.float32)


@pytest.mark.cuda
def test_scaler_on_the_gpu_matches_the_cpu():
    def run(device):
        w = frost.tensor([1.0, -2.0], device=device, requires_grad=True)
        optimizer = frost.optim.SGD([w], lr=0.1)
        scaler = GradScaler(init_scale=8.0, growth_interval=2)
        for x in _XS:
            optimizer.zero_grad()
            scaler.scale((w * frost.tensor(x, device=device)).sum()).backward()
            scaler.step(optimizer)
            scaler.update()
        return scaler.get_scale(), w.detach().cpu().numpy()

    gpu_scale, gpu_w = run("cuda")
    cpu_scale, cpu_w = run("cpu")
    assert gpu_scale == cpu_scale
    np.testing.assert_allclose(gpu_w, cpu_w, rtol=1e-6)
