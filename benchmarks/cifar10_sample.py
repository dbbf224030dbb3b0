"""Make frost/data/cifar10_sample.npz, the small CIFAR-10 sample shipped inside the package, from the real data.

The sample is for smoke runs (`frost bench resnet-cifar10` with no data and no network), not for results:
the first 200 training images of each class in the official order (all of them in data_batch_1) and the first 50
test images of each class (test_batch), 2,000 + 500 images, kept in their official order. Their positions in the
official arrays are stored next to them (train_indices, test_indices), with the labels, and a note (about).

The images are stored as PNG's "gradient" residuals (each byte minus its left and upper neighbours plus its
upper-left one, modulo 256), which zlib packs into about 75% of the raw bytes (the raw images into 92%);
frost.data.cifar.load_sample adds them back up. Nothing in the file is pickled.

    python benchmarks/cifar10_sample.py --data DIR [--out frost/data/cifar10_sample.npz]

DIR is CIFAR-10 in any layout frost.data.CIFAR10 reads (e.g. the official binary release). The same data gives
the same file contents; the arrays' SHA-256 digests are printed.
"""
from __future__ import annotations

import argparse
import hashlib
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from frost.data.cifar import CIFAR10, SAMPLE_FILE, load_sample  # noqa: E402

TRAIN_PER_CLASS = 200
TEST_PER_CLASS = 50
ABOUT = ("A sample of CIFAR-10 (Krizhevsky, 2009) for smoke runs, not for results: the first {train} training "
         "images of each class in the official order (data_batch_1) and the first {test} test images of each class "
         "(test_batch), in their official order; train_indices and test_indices are their positions in the "
         "official arrays. Images are uint8 HWC RGB stored as PNG-style gradient residuals (each byte minus its "
         "left and upper neighbours plus its upper-left one, modulo 256); frost.data.cifar.load_sample restores "
         "them. Made by benchmarks/cifar10_sample.py.")


def first_per_class(labels: np.ndarray, per_class: int, classes: int = 10) -> np.ndarray:
    """The positions of the first `per_class` images of each class, in ascending order (the data's own order)."""
    chosen = []
    for k in range(classes):
        of_class = np.flatnonzero(labels == k)[:per_class]
        if len(of_class) < per_class:
            raise SystemExit(f"cifar10_sample: class {k} has {len(of_class)} images, fewer than {per_class}")
        chosen.append(of_class)
    return np.sort(np.concatenate(chosen))


def gradient_residuals(images: np.ndarray) -> np.ndarray:
    """uint8 (N, H, W, C) images as PNG's gradient residuals: x - left - up + upper_left, modulo 256 (the inverse
    of two cumulative sums, along the width and the height)."""
    along_width = np.diff(images, axis=2, prepend=np.zeros_like(images[:, :, :1]))
    return np.diff(along_width, axis=1, prepend=np.zeros_like(along_width[:, :1]))


def sample_arrays(train: tuple[np.ndarray, np.ndarray], test: tuple[np.ndarray, np.ndarray],
                  train_per_class: int = TRAIN_PER_CLASS, test_per_class: int = TEST_PER_CLASS) -> dict:
    """The arrays of the sample file, from the full (images, labels) of each split."""
    out = {"about": np.array(ABOUT.format(train=train_per_class, test=test_per_class))}
    for split, (images, labels), per_class in (("train", train, train_per_class), ("test", test, test_per_class)):
        chosen = first_per_class(labels, per_class)
        out[f"{split}_images_residuals"] = gradient_residuals(np.ascontiguousarray(images[chosen], dtype=np.uint8))
        out[f"{split}_labels"] = labels[chosen].astype(np.uint8)
        out[f"{split}_indices"] = chosen.astype(np.int32)
    return out


def digest(images: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(images).tobytes()).hexdigest()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", type=Path, required=True, help="the full CIFAR-10, in any layout CIFAR10 reads")
    p.add_argument("--out", type=Path, default=SAMPLE_FILE, help="the sample file to write (default: the package's)")
    args = p.parse_args(argv)
    splits = [CIFAR10(args.data, train=train) for train in (True, False)]
    arrays = sample_arrays(*[(ds.data, ds.targets) for ds in splits])
    np.savez_compressed(args.out, **arrays)
    for train in (True, False):
        images, labels = load_sample(train, args.out)
        print(f"{'train' if train else 'test'}: {len(images)} images, {np.bincount(labels).tolist()} per class, "
              f"sha256 of the images {digest(images)}")
    print(f"written to {args.out} ({args.out.stat().st_size:,} bytes)")


if __name__ == "__main__":
    main()
