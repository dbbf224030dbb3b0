"""CIFAR-10-shaped parts in the layout `frost bench resnet-cifar10 --data DIR` reads (train_x_a..e.npz, train_y.npy,
test_x.npz, test_y.npy: uint8 HWC images, uint8 labels): for timing a step where the pixels do not matter, or an
older tree that lacks --sample. Usage: python benchmarks/synthetic_cifar.py DIR [--like-cifar] [--seed N]

Random pixels by default. --like-cifar builds the 60,000 images from the package's embedded sample of real CIFAR-10
images instead (each shifted by a random offset and flipped at random): their PNG files compress, and so decode, like
CIFAR-10's, which random pixels' do not (a loader benchmark then times real inflate work, not stored blocks)."""
import argparse
from pathlib import Path

import numpy as np

PARTS = "abcde"
PART_SIZE = 10000


def random_images(rng: np.random.Generator, n: int) -> np.ndarray:
    return rng.integers(0, 256, (n, 32, 32, 3), dtype=np.uint8)


def images_like_cifar(rng: np.random.Generator, n: int) -> np.ndarray:
    """n images drawn from the embedded sample's real ones, each rolled by up to 31 pixels each way and flipped."""
    # imported here: random mode must also run beside an older Frost tree (benchmarks/seed_regression.sh)
    from frost.data.cifar import load_sample
    real = load_sample(train=True)[0]
    out = real[rng.integers(0, len(real), n)]
    shifts = rng.integers(0, 32, (n, 2))
    for i, (dy, dx) in enumerate(shifts):
        out[i] = np.roll(out[i], (dy, dx), axis=(0, 1))
    flip = rng.random(n) < 0.5
    out[flip] = out[flip, :, ::-1]
    return out


def write(folder: Path, seed: int = 0, like_cifar: bool = False) -> None:
    rng = np.random.default_rng(seed)
    make = images_like_cifar if like_cifar else random_images
    folder.mkdir(parents=True, exist_ok=True)
    for part in PARTS:
        np.savez(folder / f"train_x_{part}.npz", x=make(rng, PART_SIZE))
    np.save(folder / "train_y.npy", rng.integers(0, 10, len(PARTS) * PART_SIZE).astype(np.uint8))
    np.savez(folder / "test_x.npz", x=make(rng, PART_SIZE))
    np.save(folder / "test_y.npy", rng.integers(0, 10, PART_SIZE).astype(np.uint8))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("folder", type=Path)
    p.add_argument("--like-cifar", action="store_true", help="images from the embedded sample's real ones")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    write(args.folder, args.seed, args.like_cifar)


if __name__ == "__main__":
    main()
