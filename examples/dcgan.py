"""Train a DCGAN (frost.models.dcgan) on 32x32 CIFAR-10 images and save an 8x8 grid of generated samples.

    python examples/dcgan.py --sample --steps 300 --ngf 32 --ndf 32 --out samples.png   # CPU, no download
    python examples/dcgan.py --data DIR --steps 20000 --device cuda --jit --out samples.png

Data: CIFAR-10 from --data DIR (any layout frost.data.CIFAR10 reads); without --data, from ~/.cache/frost/cifar10
when it is there, else (or with --sample) the 2,000 training images shipped inside the package
(frost.data.CIFAR10.sample(), no download). Training is the paper's: Adam (lr 2e-4, betas (0.5, 0.999)) for each
network; the discriminator learns real images as 1 and generated ones as 0 (BCE with logits), then the generator
learns to make the discriminator say 1 (the non-saturating loss). --jit captures each of the two steps into a CUDA
graph (frost.jit) after two eager calls; it needs --device cuda.

examples/dcgan_samples.png was made on 2026-12-04 on this machine (2-core CPU) with
`python examples/dcgan.py --sample --steps 300 --ngf 32 --ndf 32 --out examples/dcgan_samples.png` (8 minutes of
CPU time, 19 minutes of wall time beside other jobs; losses at step 300: D 0.338, G 3.198): blurred blobs of sky,
earth and foliage colours with a faint checkerboard from the transposed convolutions, not yet objects.
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Callable

import numpy as np
from PIL import Image

import frost
import frost.nn.functional as F
from frost.data import CIFAR10, DataLoader
from frost.data.cifar import find_layout
from frost.io import expand_path
from frost.models.dcgan import Discriminator, Generator, weights_init
from frost.optim import Optimizer
from frost.tensor import Tensor

DEFAULT_DATA = "~/.cache/frost/cifar10"
GRID = 8  # the saved grid is GRID x GRID samples
GRID_PAD = 2


def load_images(data: str | None, sample: bool) -> CIFAR10:
    """CIFAR-10's training set from `data`; without it, from DEFAULT_DATA if present, else (or with `sample`) the
    package's sample."""
    if sample:
        return CIFAR10.sample(train=True)
    if data is not None:
        return CIFAR10(data, train=True)
    if find_layout(Path(expand_path(DEFAULT_DATA))) is not None:
        return CIFAR10(DEFAULT_DATA, train=True)
    print(f"no CIFAR-10 in {DEFAULT_DATA}: training on the package's sample (2,000 images; pass --data DIR for "
          f"the full set)")
    return CIFAR10.sample(train=True)


def make_steps(netG: Generator, netD: Discriminator, optG: Optimizer,
               optD: Optimizer) -> tuple[Callable[[Tensor, Tensor], Tensor], Callable[[Tensor], Tensor]]:
    """The discriminator's and the generator's training steps, each taking tensors only and returning its loss as
    a tensor (no host reads), so that frost.jit can capture them."""
    def d_step(real: Tensor, noise: Tensor) -> Tensor:
        ones = frost.ones(real.shape[0], device=real.device)
        fake = netG(noise).detach()  # the generator is not trained here
        loss = F.binary_cross_entropy_with_logits(netD(real), ones) \
            + F.binary_cross_entropy_with_logits(netD(fake), frost.zeros_like(ones))
        optD.zero_grad()
        loss.backward()
        optD.step()
        return loss

    def g_step(noise: Tensor) -> Tensor:
        netD.requires_grad_(False)  # gradients flow through D to G, but D's own are not needed
        try:
            loss = F.binary_cross_entropy_with_logits(netD(netG(noise)),
                                                      frost.ones(noise.shape[0], device=noise.device))
            optG.zero_grad()
            loss.backward()
            optG.step()
        finally:
            netD.requires_grad_(True)
        return loss

    return d_step, g_step


def sample_grid(images: np.ndarray) -> np.ndarray:
    """(GRID * GRID, 3, 32, 32) images in [-1, 1] -> one uint8 (H, W, 3) picture, GRID_PAD black pixels apart."""
    n, _, h, w = images.shape
    if n != GRID * GRID:
        raise ValueError(f"sample_grid: expected {GRID * GRID} images, got {n}")
    pixels = np.clip(np.rint((images + 1) * 127.5), 0, 255).astype(np.uint8).transpose(0, 2, 3, 1)
    side_h, side_w = GRID * (h + GRID_PAD) + GRID_PAD, GRID * (w + GRID_PAD) + GRID_PAD
    grid = np.zeros((side_h, side_w, 3), dtype=np.uint8)
    for k, image in enumerate(pixels):
        top, left = GRID_PAD + (k // GRID) * (h + GRID_PAD), GRID_PAD + (k % GRID) * (w + GRID_PAD)
        grid[top:top + h, left:left + w] = image
    return grid


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", default=None, help=f"CIFAR-10 directory (default: {DEFAULT_DATA} or the sample)")
    p.add_argument("--sample", action="store_true", help="train on the package's sample even if CIFAR-10 is at hand")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--nz", type=int, default=100, help="noise dimensions")
    p.add_argument("--ngf", type=int, default=64, help="generator width")
    p.add_argument("--ndf", type=int, default=64, help="discriminator width")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--jit", action="store_true", help="capture both steps into CUDA graphs (needs --device cuda)")
    p.add_argument("--out", default=None, help="save an 8x8 grid of samples to this .png after training")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.jit and args.device != "cuda":
        p.error("--jit captures the steps into CUDA graphs, which only exist on a GPU: use it with --device cuda "
                "(on the CPU the steps already run eagerly)")
    if args.sample and args.data is not None:
        p.error("--sample and --data name two different training sets: pass one of them")
    if args.steps < 1 or args.batch_size < 1:
        p.error(f"--steps and --batch-size must be positive, got {args.steps} and {args.batch_size}")
    if args.out is not None and Path(args.out).suffix.lower() != ".png":
        p.error(f"--out must name a .png file, got {args.out!r}")
    return args


def main(argv: list[str] | None = None) -> dict[str, float]:
    args = parse_args(argv)
    frost.manual_seed(args.seed)
    dataset = load_images(args.data, args.sample)
    loader = DataLoader(dataset, batch_size=args.batch_size, shuffle=True, drop_last=True, seed=args.seed)
    netG = Generator(args.nz, args.ngf).to(args.device)
    netD = Discriminator(args.ndf).to(args.device)
    netG.apply(weights_init)
    netD.apply(weights_init)
    optG = frost.optim.Adam(netG.parameters(), lr=2e-4, betas=(0.5, 0.999))
    optD = frost.optim.Adam(netD.parameters(), lr=2e-4, betas=(0.5, 0.999))
    d_step, g_step = make_steps(netG, netD, optG, optD)
    if args.jit:
        d_step, g_step = frost.jit(d_step), frost.jit(g_step)
    fixed_noise = frost.randn(GRID * GRID, args.nz, device=args.device)

    start, step = time.perf_counter(), 0
    while step < args.steps:
        for images, _ in loader:  # uint8 NHWC -> float NCHW in [-1, 1], Tanh's range
            real = images.to(args.device).permute(0, 3, 1, 2).float() / 127.5 - 1
            loss_d = d_step(real, frost.randn(args.batch_size, args.nz, device=args.device))
            loss_g = g_step(frost.randn(args.batch_size, args.nz, device=args.device))
            step += 1
            if step % 50 == 0 or step == args.steps:
                print(f"step {step}: loss_D {loss_d.item():.4f} loss_G {loss_g.item():.4f}")
            if step == args.steps:
                break
    losses = {"loss_D": loss_d.item(), "loss_G": loss_g.item()}
    print(f"trained {args.steps} steps in {time.perf_counter() - start:.1f} s: loss_D {losses['loss_D']:.4f} "
          f"loss_G {losses['loss_G']:.4f}")
    if args.out is not None:
        # in training mode, as PyTorch's DCGAN example samples: BatchNorm normalizes with the 64 samples' statistics
        with frost.no_grad():
            samples = netG(fixed_noise).cpu().numpy()
        Image.fromarray(sample_grid(samples)).save(args.out, optimize=True)
        print(f"saved {GRID}x{GRID} samples to {args.out}")
    return losses


if __name__ == "__main__":
    main()
