"""GPU tests of frost.nn: moving modules to CUDA, and the seed ResNet on the GPU against the CPU."""
import numpy as np
import pytest

import frost
from frost import nn
from frost.models import cifar_resnet

pytestmark = pytest.mark.cuda


def test_module_to_cuda_keeps_parameters_and_moves_grads_and_buffers():
    m = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4))
    params = list(m.parameters())
    m(frost.randn(3, 4)).sum().backward()
    m.to("cuda")
    assert [id(p) for p in m.parameters()] == [id(p) for p in params]
    assert all(p.device.type == "cuda" and p.grad.device.type == "cuda" for p in params)
    assert all(b.device.type == "cuda" for b in m.buffers())
    assert m[1].num_batches_tracked.dtype == frost.int64
    m.cpu()
    assert all(p.device.type == "cpu" for p in params)


def test_load_state_dict_from_host_arrays_into_a_cuda_model():
    m = nn.Linear(3, 2).to("cuda")
    m.load_state_dict({"weight": np.ones((2, 3), dtype=np.float32), "bias": np.zeros(2, dtype=np.float32)})
    assert m.weight.device.type == "cuda"
    np.testing.assert_array_equal(m.weight.detach().numpy(), np.ones((2, 3)))


def test_resnet_on_cuda_matches_cpu(monkeypatch):
    import frost.backends
    monkeypatch.setattr(frost.backends, "allow_tf32", False)  # full float32, so that tolerances can be tight
    frost.manual_seed(0)
    cpu = cifar_resnet()
    gpu = cifar_resnet()
    gpu.load_state_dict(cpu.state_dict())
    gpu.to("cuda")
    x = np.random.default_rng(0).standard_normal((8, 3, 32, 32)).astype(np.float32)
    labels = np.arange(8) % 10
    losses = []
    for model, device in ((cpu, "cpu"), (gpu, "cuda")):
        out = model(frost.tensor(x, device=device))
        loss = nn.functional.cross_entropy(out, frost.tensor(labels, device=device))
        loss.backward()
        losses.append(loss.item())
    np.testing.assert_allclose(losses[1], losses[0], rtol=1e-3)
    gpu_params = dict(gpu.named_parameters())
    for name, p in cpu.named_parameters():
        np.testing.assert_allclose(gpu_params[name].grad.numpy(), p.grad.numpy(), rtol=2e-2, atol=2e-3,
                                   err_msg=name)
    for name, b in cpu.named_buffers():
        np.testing.assert_allclose(dict(gpu.named_buffers())[name].numpy(), b.numpy(), rtol=1e-3, atol=1e-4)


def test_clip_grad_norm_on_cuda_matches_cpu():
    grads = [np.random.default_rng(i).standard_normal((5, 3)).astype(np.float32) for i in range(3)]
    norms = []
    for device in ("cpu", "cuda"):
        ps = [nn.Parameter(frost.zeros(5, 3, device=device)) for _ in grads]
        for p, g in zip(ps, grads):
            p.grad = frost.tensor(g, device=device)
        norms.append(frost.nn.utils.clip_grad_norm_(ps, 1.0))
        assert norms[-1].device.type == device
    np.testing.assert_allclose(norms[1].item(), norms[0].item(), rtol=1e-5)
