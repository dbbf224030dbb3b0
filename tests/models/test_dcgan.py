"""frost.models.dcgan: shapes, the paper's initialization, a training step, and both networks against PyTorch twins
with the same weights (float64, training and eval mode, input gradients too)."""
import numpy as np
import pytest
import torch
from torch import nn as tnn

import frost
import frost.nn.functional as F
from frost.models.dcgan import Discriminator, Generator, weights_init

from .twins import assert_same_parameter_grads, with_weights_of

NZ, NGF, NDF = 16, 8, 8


class Twin(tnn.Module):
    """A network held as `main`, as frost.models.dcgan's (so that the state dicts' names agree)."""

    def __init__(self, *layers: tnn.Module) -> None:
        super().__init__()
        self.main = tnn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.main(x)


def torch_generator(nz: int, ngf: int, nc: int = 3) -> tnn.Module:
    """PyTorch's examples/dcgan generator, for 32x32 (three stride-2 layers after the 4x4 one)."""
    return Twin(
        tnn.ConvTranspose2d(nz, ngf * 4, 4, 1, 0, bias=False), tnn.BatchNorm2d(ngf * 4), tnn.ReLU(),
        tnn.ConvTranspose2d(ngf * 4, ngf * 2, 4, 2, 1, bias=False), tnn.BatchNorm2d(ngf * 2), tnn.ReLU(),
        tnn.ConvTranspose2d(ngf * 2, ngf, 4, 2, 1, bias=False), tnn.BatchNorm2d(ngf), tnn.ReLU(),
        tnn.ConvTranspose2d(ngf, nc, 4, 2, 1, bias=False), tnn.Tanh())


def torch_discriminator(ndf: int, nc: int = 3) -> tnn.Module:
    return Twin(
        tnn.Conv2d(nc, ndf, 4, 2, 1, bias=False), tnn.LeakyReLU(0.2),
        tnn.Conv2d(ndf, ndf * 2, 4, 2, 1, bias=False), tnn.BatchNorm2d(ndf * 2), tnn.LeakyReLU(0.2),
        tnn.Conv2d(ndf * 2, ndf * 4, 4, 2, 1, bias=False), tnn.BatchNorm2d(ndf * 4), tnn.LeakyReLU(0.2),
        tnn.Conv2d(ndf * 4, 1, 4, 1, 0, bias=False))


def initialized(seed: int = 0) -> tuple[Generator, Discriminator]:
    frost.manual_seed(seed)
    netG, netD = Generator(NZ, NGF), Discriminator(NDF)
    netG.apply(weights_init)
    netD.apply(weights_init)
    return netG.double(), netD.double()


def test_shapes_and_output_range():
    netG, netD = initialized()
    images = netG(frost.randn(5, NZ, 1, 1, dtype=frost.float64))
    assert images.shape == (5, 3, 32, 32)
    assert float(images.abs().max()) <= 1.0  # Tanh
    assert netG(frost.randn(5, NZ, dtype=frost.float64)).shape == (5, 3, 32, 32)  # (batch, nz) noise too
    assert netD(images).shape == (5,)


def test_bad_shapes_and_sizes_are_refused_with_the_layer_named():
    netG, netD = initialized()
    with pytest.raises(ValueError, match=r"Generator: expected noise of shape \(batch, 16, 1, 1\)"):
        netG(frost.randn(2, NZ + 1, 1, 1, dtype=frost.float64))
    with pytest.raises(ValueError, match=r"Discriminator: expected images of shape \(batch, 3, 32, 32\)"):
        netD(frost.randn(2, 3, 64, 64, dtype=frost.float64))
    with pytest.raises(ValueError, match="Generator: ngf must be a positive int"):
        Generator(ngf=0)
    with pytest.raises(ValueError, match="Discriminator: nc must be a positive int"):
        Discriminator(nc=1.5)


def test_weights_init_gives_the_papers_statistics():
    frost.manual_seed(1)
    netG, netD = Generator(), Discriminator()  # full size: enough weights for tight statistics
    netG.apply(weights_init)
    netD.apply(weights_init)
    for net in (netG, netD):
        for name, p in net.named_parameters():
            values = p.detach().numpy()
            if values.ndim == 4:  # convolutions: N(0, 0.02)
                assert abs(values.mean()) < 0.002 and abs(values.std() - 0.02) < 0.001, name
            elif name.endswith("weight"):  # BatchNorm: N(1, 0.02)
                assert abs(values.mean() - 1) < 0.01 and 0.01 < values.std() < 0.03, name
            else:
                assert not values.any(), name
    largest = netD.main[5].weight.detach().numpy()  # 128 * 256 * 16 values: the std to 1 %
    assert abs(largest.std() - 0.02) < 2e-4 and abs(largest.mean()) < 1e-4


@pytest.mark.parametrize("training", [True, False])
def test_generator_matches_a_torch_twin_with_the_same_weights(training):
    netG, _ = initialized()
    twin = with_weights_of(netG, torch_generator(NZ, NGF))
    netG.train(training)
    twin.train(training)
    noise = np.random.default_rng(2).standard_normal((6, NZ, 1, 1))
    z, tz = frost.tensor(noise, requires_grad=True), torch.tensor(noise, requires_grad=True)
    out, t_out = netG(z), twin(tz)
    np.testing.assert_allclose(out.detach().numpy(), t_out.detach().numpy(), rtol=1e-10, atol=1e-12)
    weights = np.random.default_rng(3).standard_normal(out.shape)
    (out * frost.tensor(weights)).sum().backward()
    (t_out * torch.tensor(weights)).sum().backward()
    np.testing.assert_allclose(z.grad.numpy(), tz.grad.numpy(), rtol=1e-9, atol=1e-11)
    assert_same_parameter_grads(netG, twin, rtol=1e-9, atol=1e-11)


def test_discriminator_matches_a_torch_twin_with_the_same_weights():
    _, netD = initialized()
    twin = with_weights_of(netD, torch_discriminator(NDF))
    images = np.random.default_rng(4).uniform(-1, 1, (6, 3, 32, 32))
    logits, t_logits = netD(frost.tensor(images)), twin(torch.tensor(images)).reshape(6)
    np.testing.assert_allclose(logits.detach().numpy(), t_logits.detach().numpy(), rtol=1e-10, atol=1e-12)
    target = (np.arange(6) % 2).astype(np.float64)
    loss = F.binary_cross_entropy_with_logits(logits, frost.tensor(target))
    t_loss = tnn.functional.binary_cross_entropy_with_logits(t_logits, torch.tensor(target))
    np.testing.assert_allclose(loss.item(), t_loss.item(), rtol=1e-12)
    loss.backward()
    t_loss.backward()
    assert_same_parameter_grads(netD, twin, rtol=1e-9, atol=1e-12)


def test_one_training_step_changes_both_networks_and_gives_finite_losses():
    netG, netD = initialized()
    optG = frost.optim.Adam(netG.parameters(), lr=2e-4, betas=(0.5, 0.999))
    optD = frost.optim.Adam(netD.parameters(), lr=2e-4, betas=(0.5, 0.999))
    before = {f"{tag}.{k}": v.numpy().copy() for tag, net in (("G", netG), ("D", netD))
              for k, v in net.state_dict().items()}
    real = frost.rand(8, 3, 32, 32, dtype=frost.float64) * 2 - 1
    ones, zeros = frost.ones(8, dtype=frost.float64), frost.zeros(8, dtype=frost.float64)
    loss_d = F.binary_cross_entropy_with_logits(netD(real), ones) \
        + F.binary_cross_entropy_with_logits(netD(netG(frost.randn(8, NZ, dtype=frost.float64)).detach()), zeros)
    optD.zero_grad()
    loss_d.backward()
    optD.step()
    loss_g = F.binary_cross_entropy_with_logits(netD(netG(frost.randn(8, NZ, dtype=frost.float64))), ones)
    optG.zero_grad()
    loss_g.backward()
    optG.step()
    assert np.isfinite(loss_d.item()) and np.isfinite(loss_g.item())
    after = {f"{tag}.{k}": v.numpy() for tag, net in (("G", netG), ("D", netD)) for k, v in net.state_dict().items()}
    for name, value in before.items():
        if name.endswith("num_batches_tracked"):
            continue
        assert not np.array_equal(value, after[name]), f"{name} did not change"


@pytest.mark.cuda
def test_generator_and_discriminator_on_cuda_match_the_cpu():
    netG, netD = initialized()
    noise = frost.randn(4, NZ, dtype=frost.float64)
    images = netG(noise)
    logits = netD(images)
    netG.to("cuda")
    netD.to("cuda")
    images_gpu = netG(noise.to("cuda"))
    np.testing.assert_allclose(images_gpu.cpu().detach().numpy(), images.detach().numpy(), rtol=1e-9, atol=1e-11)
    np.testing.assert_allclose(netD(images_gpu).cpu().detach().numpy(), logits.detach().numpy(), rtol=1e-9,
                               atol=1e-11)
