"""Image files as datasets: ImageList (paths + labels, decoded per item) and ImageFolder (a folder per class)."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from frost.data.dataset import Dataset, _as_array
from frost.data.png import decode_bytes, read_file
from frost.io import expand_path

IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg")


def decode_image(path: str | os.PathLike) -> np.ndarray:
    """Decode a PNG or JPEG file to a writable uint8 RGB array (H, W, 3); a broken file raises naming it.

    PNGs (found by signature) take frost.data.png's thread-friendly path, other files Pillow's."""
    name = os.fspath(path)
    try:
        return decode_bytes(read_file(name))
    except Exception as e:  # noqa: BLE001 - file, struct, zlib and Pillow errors all name the file
        raise RuntimeError(f"decode_image: cannot decode {name}: {type(e).__name__}: {e}") from e


class ImageList(Dataset):
    """Image files with integer labels, decoded when an item is asked for: (image HWC uint8, label)."""

    def __init__(self, paths: Sequence[str | os.PathLike], targets: Sequence[int],
                 transform: Callable | None = None) -> None:
        if len(paths) != len(targets):
            raise ValueError(f"ImageList: {len(paths)} paths but {len(targets)} targets")
        self.paths = [os.fspath(p) for p in paths]
        self.targets = np.asarray(targets, dtype=np.int64)
        self.transform = transform

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int) -> tuple[np.ndarray, np.int64]:
        image = decode_image(self.paths[index])
        if self.transform is not None:
            image = self.transform(image)
        return image, self.targets[index]

    def get_batch(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Images and labels at `indices` as arrays (the DataLoader's per-batch path: no per-sample loader work).

        Every image of a batch (after the transform) must have the first one's shape; for varying sizes give
        the DataLoader a collate_fn (it then calls __getitem__ per sample)."""
        paths, transform = self.paths, self.transform
        indices = np.asarray(indices)
        if len(indices) == 0:
            raise ValueError("ImageList.get_batch: no indices")
        first = None
        for k, i in enumerate(indices.tolist()):
            image = decode_image(paths[i])
            if transform is not None:
                image = _as_array(transform(image))
            if first is None:
                first = i
                images = np.empty((len(indices), *image.shape), image.dtype)
            elif image.shape != images.shape[1:]:
                raise ValueError(f"ImageList: {paths[i]} gives an image of shape {image.shape} but {paths[first]} "
                                 f"one of {images.shape[1:]} in the same batch; resize in a transform or give the "
                                 f"DataLoader a collate_fn")
            images[k] = image
        return images, self.targets[indices]


def _images_under(folder: Path) -> list[str]:
    """The image files anywhere under folder, walked as torchvision's ImageFolder walks it (sorted folders,
    symbolic links followed, sorted names): files only, a folder named like an image is not one."""
    return [os.path.join(parent, name) for parent, _, names in sorted(os.walk(folder, followlinks=True))
            for name in sorted(names) if os.path.splitext(name)[1].lower() in IMAGE_EXTENSIONS]


class ImageFolder(ImageList):
    """root/<class>/<image>.png|jpg|jpeg: classes are the sorted folder names, labels their positions. `~` and
    $VARS in root are expanded (the listed files' names are taken as they are: a name may hold a `$`)."""

    def __init__(self, root: str | os.PathLike, transform: Callable | None = None) -> None:
        root = Path(expand_path(root))
        if not root.is_dir():
            raise FileNotFoundError(f"ImageFolder: {root} is not a folder")
        self.root = root
        self.classes = sorted(d.name for d in root.iterdir() if d.is_dir())
        if not self.classes:
            raise FileNotFoundError(f"ImageFolder: {root} has no class folders")
        self.class_to_idx = {c: i for i, c in enumerate(self.classes)}
        self.samples = [(path, self.class_to_idx[c]) for c in self.classes for path in _images_under(root / c)]
        empty = sorted(set(self.classes) - {self.classes[t] for _, t in self.samples})
        if empty:  # torchvision refuses too: a class without images would never be seen
            raise FileNotFoundError(f"ImageFolder: class folder(s) {empty} under {root} hold no "
                                    f"{'/'.join(IMAGE_EXTENSIONS)} files")
        super().__init__([p for p, _ in self.samples], [t for _, t in self.samples], transform)
