"""DCGAN for 32x32 images in one file (Radford, Metz & Chintala, "Unsupervised Representation Learning with Deep
Convolutional Generative Adversarial Networks", ICLR 2016), after PyTorch's examples/dcgan, sized for CIFAR-10.

The generator turns a (batch, nz, 1, 1) noise tensor into (batch, nc, 32, 32) images in [-1, 1]: a 4x4
transposed convolution, then three stride-2 ones that double the side (4 -> 8 -> 16 -> 32), BatchNorm and ReLU
between them and Tanh at the end. The discriminator mirrors it with stride-2 convolutions and LeakyReLU(0.2)
(no BatchNorm on its first layer, as in the paper) and ends in one logit per image, for
BCE-with-logits. Convolutions have no bias: the BatchNorm after them has one. `weights_init` is the paper's
initialization (convolutions N(0, 0.02), BatchNorm weights N(1, 0.02) and biases 0), applied with `model.apply`.
"""
from __future__ import annotations

from frost import nn
from frost.nn import init
from frost.tensor import Tensor

__all__ = ["Generator", "Discriminator", "weights_init"]

_INIT_STD = 0.02  # the paper's "zero-centered Normal distribution with standard deviation 0.02"


def _check_sizes(layer: str, **sizes: int) -> None:
    for name, value in sizes.items():
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise ValueError(f"{layer}: {name} must be a positive int, got {value!r}")


class Generator(nn.Module):
    """Noise (batch, nz, 1, 1) (or (batch, nz)) -> images (batch, nc, 32, 32) in [-1, 1]; ngf is the width of its
    last hidden layer (the others have 2 and 4 times as many channels)."""

    def __init__(self, nz: int = 100, ngf: int = 64, nc: int = 3) -> None:
        super().__init__()
        _check_sizes("Generator", nz=nz, ngf=ngf, nc=nc)
        self.nz = nz
        self.main = nn.Sequential(
            nn.ConvTranspose2d(nz, ngf * 4, 4, 1, 0, bias=False),       # 1 -> 4
            nn.BatchNorm2d(ngf * 4), nn.ReLU(),
            nn.ConvTranspose2d(ngf * 4, ngf * 2, 4, 2, 1, bias=False),  # 4 -> 8
            nn.BatchNorm2d(ngf * 2), nn.ReLU(),
            nn.ConvTranspose2d(ngf * 2, ngf, 4, 2, 1, bias=False),      # 8 -> 16
            nn.BatchNorm2d(ngf), nn.ReLU(),
            nn.ConvTranspose2d(ngf, nc, 4, 2, 1, bias=False),           # 16 -> 32
            nn.Tanh(),
        )

    def forward(self, z: Tensor) -> Tensor:
        if z.ndim == 2:
            z = z.reshape(z.shape[0], z.shape[1], 1, 1)
        if z.ndim != 4 or z.shape[1:] != (self.nz, 1, 1):
            raise ValueError(f"Generator: expected noise of shape (batch, {self.nz}, 1, 1) or (batch, {self.nz}), "
                             f"got {z.shape}")
        return self.main(z)


class Discriminator(nn.Module):
    """Images (batch, nc, 32, 32) -> one logit per image, (batch,): positive means "real"."""

    def __init__(self, ndf: int = 64, nc: int = 3) -> None:
        super().__init__()
        _check_sizes("Discriminator", ndf=ndf, nc=nc)
        self.nc = nc
        self.main = nn.Sequential(
            nn.Conv2d(nc, ndf, 4, 2, 1, bias=False),            # 32 -> 16
            nn.LeakyReLU(0.2),
            nn.Conv2d(ndf, ndf * 2, 4, 2, 1, bias=False),       # 16 -> 8
            nn.BatchNorm2d(ndf * 2), nn.LeakyReLU(0.2),
            nn.Conv2d(ndf * 2, ndf * 4, 4, 2, 1, bias=False),   # 8 -> 4
            nn.BatchNorm2d(ndf * 4), nn.LeakyReLU(0.2),
            nn.Conv2d(ndf * 4, 1, 4, 1, 0, bias=False),         # 4 -> 1
        )

    def forward(self, x: Tensor) -> Tensor:
        if x.ndim != 4 or x.shape[1:] != (self.nc, 32, 32):
            raise ValueError(f"Discriminator: expected images of shape (batch, {self.nc}, 32, 32), got {x.shape}")
        return self.main(x).reshape(x.shape[0])


def weights_init(module: nn.Module) -> None:
    """The DCGAN paper's initialization for one module: use as `model.apply(weights_init)`."""
    if isinstance(module, (nn.Conv2d, nn.ConvTranspose2d)):
        init.normal_(module.weight, 0.0, _INIT_STD)
        if module.bias is not None:
            init.zeros_(module.bias)
    elif isinstance(module, nn.BatchNorm2d):
        init.normal_(module.weight, 1.0, _INIT_STD)
        init.zeros_(module.bias)
