"""Random CIFAR-10-shaped parts in the layout `frost bench resnet-cifar10 --data DIR` reads (train_x_a..e.npz,
train_y.npy, test_x.npz, test_y.npy: uint8 HWC images, uint8 labels): for timing a step where the pixels do not
matter, or an older tree that lacks --sample. Usage: python benchmarks/synthetic_cifar.py DIR"""
import sys
from pathlib import Path

import numpy as np


def write(folder: Path, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    for part in "abcde":
        np.savez(folder / f"train_x_{part}.npz", x=rng.integers(0, 256, (10000, 32, 32, 3), dtype=np.uint8))
    np.save(folder / "train_y.npy", rng.integers(0, 10, 50000).astype(np.uint8))
    np.savez(folder / "test_x.npz", x=rng.integers(0, 256, (10000, 32, 32, 3), dtype=np.uint8))
    np.save(folder / "test_y.npy", rng.integers(0, 10, 10000).astype(np.uint8))


if __name__ == "__main__":
    write(Path(sys.argv[1]))
