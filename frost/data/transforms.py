"""CPU image transforms on uint8 HWC images or NHWC batches, with random draws made explicit.

Every random transform separates *drawing* its parameters (from an explicit numpy Generator)
from *applying* them (a pure function of the image and the draws). The GPU kernel (frost/accel/augment.py, through
gather_augmented) takes the same draw arrays and reproduces `augment(...)` bit for bit:

    oy, ox = RandomCrop(32, padding=4).draw(n, rng)
    flips = RandomHorizontalFlip().draw(n, rng)
    x = augment(batch_uint8, oy, ox, flips, size=32, padding=4, mean=MEAN, std=STD)

The float math is fixed so that it can be matched exactly: in float32,
`y = float32(x) / 255`, then `(y - mean) / std` per channel (mean, std as float32).
"""
from __future__ import annotations

import math
from typing import Any, Callable, Sequence

import numpy as np
from PIL import Image

from frost import backend, dispatch
from frost.backend import cpu, cuda
from frost.dtype import to_dtype
from frost.tensor import Tensor

__all__ = ["ToFloat", "Normalize", "RandomCrop", "RandomHorizontalFlip", "Compose", "Resize", "CenterCrop",
           "RandomResizedCrop", "resized_crop", "resized_crops",
           "crop", "hflip", "to_float", "normalize", "augment", "gather_scaled", "gather_augmented",
           "draw_augment_gpu"]


def _generator(rng: np.random.Generator | None) -> np.random.Generator:
    if rng is not None:
        return rng
    return cpu.generator()  # seeded by frost.manual_seed; inside a DataLoader, the batch's own generator


def _as_batch(x: np.ndarray, what: str) -> tuple[np.ndarray, bool]:
    """x as NHWC, and whether it was a single HWC image."""
    if x.ndim == 3:
        return x[None], True
    if x.ndim == 4:
        return x, False
    raise ValueError(f"{what}: expected an HWC image or an NHWC batch, got shape {x.shape}")


# ---------------------------------------------------------------- pure functions of the draws
def crop(batch: np.ndarray, offsets_y: np.ndarray, offsets_x: np.ndarray, size: int | tuple[int, int],
         padding: int = 0) -> np.ndarray:
    """Zero-pad each NHWC image by `padding` and cut a size window at (offsets_y[i], offsets_x[i])."""
    x, single = _as_batch(np.asarray(batch), "crop")
    th, tw = (size, size) if isinstance(size, int) else size
    n, h, w = x.shape[:3]
    oy, ox = np.asarray(offsets_y, np.int64).reshape(-1), np.asarray(offsets_x, np.int64).reshape(-1)
    if len(oy) != n or len(ox) != n:
        raise ValueError(f"crop: {n} images but {len(oy)} y offsets and {len(ox)} x offsets")
    if (oy < 0).any() or (ox < 0).any() or (oy > h + 2 * padding - th).any() or (ox > w + 2 * padding - tw).any():
        raise ValueError(f"crop: offsets out of range for {h}x{w} images padded by {padding} and a {th}x{tw} window")
    if padding:
        x = np.pad(x, ((0, 0), (padding, padding), (padding, padding), (0, 0)))
    rows = oy[:, None] + np.arange(th)
    cols = ox[:, None] + np.arange(tw)
    out = x[np.arange(n)[:, None, None], rows[:, :, None], cols[:, None, :]]
    return out[0] if single else out


def hflip(batch: np.ndarray, flips: np.ndarray) -> np.ndarray:
    """Mirror left-right the NHWC images i where flips[i] is true."""
    x, single = _as_batch(np.asarray(batch), "hflip")
    flips = np.asarray(flips, bool).reshape(-1)
    if len(flips) != len(x):
        raise ValueError(f"hflip: {len(x)} images but {len(flips)} flip flags")
    out = np.where(flips[:, None, None, None], x[:, :, ::-1], x)
    return out[0] if single else out


def to_float(x: np.ndarray) -> np.ndarray:
    """uint8 in 0..255 to float32 in [0, 1] (exactly float32(x) / 255)."""
    x = np.asarray(x)
    if x.dtype != np.uint8:
        raise TypeError(f"to_float: expected uint8 pixels, got {x.dtype}")
    return x.astype(np.float32) / np.float32(255)


def normalize(x: np.ndarray, mean: Sequence[float], std: Sequence[float]) -> np.ndarray:
    """(x - mean) / std over the last (channel) axis, in float32. x must be floating (torchvision's rule: uint8
    pixels would be normalized as 0..255 instead of 0..1; convert with to_float first)."""
    x = np.asarray(x)
    if not np.issubdtype(x.dtype, np.floating):
        raise TypeError(f"normalize: x must be a floating-point array (pixels in [0, 1]), got {x.dtype} of shape "
                        f"{x.shape}; convert with to_float (ToFloat) first")
    mean32, std32 = np.asarray(mean, np.float32), np.asarray(std, np.float32)
    if not std32.all():
        raise ValueError(f"normalize: std {list(np.atleast_1d(std32))} has a zero, which would divide by zero")
    if mean32.shape not in ((), (x.shape[-1],)) or std32.shape != mean32.shape:
        raise ValueError(f"normalize: mean {mean32.shape} and std {std32.shape} do not fit {x.shape[-1]} channels")
    return ((x - mean32) / std32).astype(np.float32, copy=False)


def augment(batch: np.ndarray, offsets_y: np.ndarray, offsets_x: np.ndarray, flips: np.ndarray, size: int,
            padding: int, mean: Sequence[float], std: Sequence[float]) -> np.ndarray:
    """The fused reference: pad-crop, flip, to float, normalize a uint8 NHWC batch (the GPU kernel's oracle)."""
    return normalize(to_float(hflip(crop(batch, offsets_y, offsets_x, size, padding), flips)), mean, std)


# ---------------------------------------------------------------- transform objects
class ToFloat:
    """uint8 -> float32 in [0, 1]."""

    def __call__(self, x: np.ndarray) -> np.ndarray:
        return to_float(x)


class Normalize:
    """(x - mean) / std per channel (channels last)."""

    def __init__(self, mean: Sequence[float], std: Sequence[float]) -> None:
        self.mean, self.std = mean, std

    def __call__(self, x: np.ndarray) -> np.ndarray:
        return normalize(x, self.mean, self.std)


class RandomCrop:
    """Zero-pad by `padding`, then cut a random size x size window (one draw per image)."""

    def __init__(self, size: int | tuple[int, int], padding: int = 0, rng: np.random.Generator | None = None) -> None:
        self.size = (size, size) if isinstance(size, int) else tuple(size)
        self.padding, self.rng = padding, rng

    def draw(self, n: int, rng: np.random.Generator | None = None, image_hw: tuple[int, int] | None = None):
        """Offsets (y, x) for n images of image_hw (default: the crop size, as in CIFAR's 32 -> pad 4 -> 32)."""
        h, w = image_hw or self.size
        if h + 2 * self.padding < self.size[0] or w + 2 * self.padding < self.size[1]:
            raise ValueError(f"RandomCrop: the crop {self.size} is larger than the image ({h}, {w}) padded by "
                             f"{self.padding}")
        rng = _generator(rng or self.rng)
        oy = rng.integers(0, h + 2 * self.padding - self.size[0] + 1, size=n)
        ox = rng.integers(0, w + 2 * self.padding - self.size[1] + 1, size=n)
        return oy, ox

    def __call__(self, x: np.ndarray) -> np.ndarray:
        batch, _ = _as_batch(np.asarray(x), "RandomCrop")
        oy, ox = self.draw(len(batch), image_hw=batch.shape[1:3])
        return crop(x, oy, ox, self.size, self.padding)


class RandomHorizontalFlip:
    """Mirror each image left-right with probability p."""

    def __init__(self, p: float = 0.5, rng: np.random.Generator | None = None) -> None:
        self.p, self.rng = p, rng

    def draw(self, n: int, rng: np.random.Generator | None = None) -> np.ndarray:
        return _generator(rng or self.rng).random(n) < self.p

    def __call__(self, x: np.ndarray) -> np.ndarray:
        batch, _ = _as_batch(np.asarray(x), "RandomHorizontalFlip")
        return hflip(x, self.draw(len(batch)))


# ---------------------------------------------------------------- sizes (ImageNet-style folders of JPEGs)
def _pair(size: int | Sequence[int], what: str) -> tuple[int, int]:
    pair = (size, size) if isinstance(size, int) else tuple(int(v) for v in size)
    if len(pair) != 2 or min(pair) < 1:
        raise ValueError(f"{what}: size must be a positive int or (height, width), got {size!r}")
    return pair


def _image(x: np.ndarray, what: str) -> np.ndarray:
    x = np.asarray(x)
    if x.ndim != 3 or x.dtype != np.uint8 or x.shape[2] not in (1, 3, 4):
        raise ValueError(f"{what}: expected a uint8 HWC image with 1, 3 or 4 channels, got {x.dtype} {x.shape}")
    return x


def resized_crop(image: np.ndarray, top: int, left: int, height: int, width: int, size: tuple[int, int]) -> np.ndarray:
    """The (top, left, height, width) window of a uint8 HWC image resized to size (h, w), bilinear with
    antialiasing (Pillow's filter, as torchvision's on PIL images)."""
    image = _image(image, "resized_crop")
    squeeze = image.shape[2] == 1
    pil = Image.fromarray(image[:, :, 0] if squeeze else image)
    out = np.asarray(pil.resize((size[1], size[0]), Image.BILINEAR, box=(left, top, left + width, top + height)))
    return out[:, :, None] if squeeze else out


def resized_crops(images: Sequence, boxes: Sequence, size: tuple[int, int], flips: Sequence) -> Any:
    """(N, h, w, C) uint8: image i's (top, left, height, width) window boxes[i] resized to size, mirrored where
    flips[i]; for images on the GPU one batch by the acceleration layer's kernels ("resized_crops"), the same bits."""
    if len(images) == 0 or len(boxes) != len(images) or len(flips) != len(images):
        raise ValueError(f"resized_crops: {len(images)} images, {len(boxes)} boxes and {len(flips)} flips; expected "
                         f"one box and one flip per image, at least one image")
    size = _pair(size, "resized_crops")
    for i, (image, (top, left, height, width)) in enumerate(zip(images, boxes)):  # the kernels read what they ask
        (h, w), low = image.shape[:2], min(top, left, height - 1, width - 1)
        if low < 0 or top + height > h or left + width > w:
            raise ValueError(f"resized_crops: the window (top, left, height, width) {tuple(boxes[i])} of image {i} is "
                             f"not inside its {h} x {w} pixels")
    fast = dispatch.lookup("resized_crops", images[0], images, boxes, size, flips)
    if fast is not None:
        return fast(images[0], images, boxes, size, flips)
    if not isinstance(images[0], np.ndarray):   # GPU images the kernels do not take (or no layer): via the host
        host = resized_crops([backend.to_device(a, backend.CPU) for a in images], boxes, size, flips)
        return backend.to_device(host, backend.device_of(images[0]))
    return hflip(np.stack([resized_crop(image, *box, size) for image, box in zip(images, boxes)]), np.asarray(flips))


class Resize:
    """An int: the shorter side to `size`, keeping the aspect ratio (torchvision's rule: the longer side is
    int(size * long / short)); (h, w): exactly that size. Bilinear with antialiasing."""

    def __init__(self, size: int | Sequence[int]) -> None:
        self.size = size if isinstance(size, int) else _pair(size, "Resize")
        if isinstance(size, int) and size < 1:
            raise ValueError(f"Resize: size must be positive, got {size}")

    def target(self, height: int, width: int) -> tuple[int, int]:
        if not isinstance(self.size, int):
            return self.size
        if height <= width:
            return self.size, int(self.size * width / height)
        return int(self.size * height / width), self.size

    def __call__(self, x: np.ndarray) -> np.ndarray:
        h, w = _image(x, "Resize").shape[:2]
        return resized_crop(x, 0, 0, h, w, self.target(h, w))


class CenterCrop:
    """The central size window (torchvision's rounding of the offsets); an image smaller than it is refused."""

    def __init__(self, size: int | Sequence[int]) -> None:
        self.size = _pair(size, "CenterCrop")

    def __call__(self, x: np.ndarray) -> np.ndarray:
        h, w = _image(x, "CenterCrop").shape[:2]
        ch, cw = self.size
        if ch > h or cw > w:
            raise ValueError(f"CenterCrop: the crop {self.size} is larger than the image ({h}, {w})")
        top, left = int(round((h - ch) / 2.0)), int(round((w - cw) / 2.0))
        return np.ascontiguousarray(x[top:top + ch, left:left + cw])


class RandomResizedCrop:
    """A random window of a random area fraction in `scale` and aspect ratio (w / h) in `ratio` (log-uniform),
    resized to size, by torchvision's RandomResizedCrop rule as its get_params reads (ten tries, then the central
    crop clamped to `ratio`); the draws come from Frost's generator, so the windows are not torchvision's."""

    def __init__(self, size: int | Sequence[int], scale: Sequence[float] = (0.08, 1.0),
                 ratio: Sequence[float] = (3 / 4, 4 / 3), rng: np.random.Generator | None = None) -> None:
        self.size = _pair(size, "RandomResizedCrop")
        if not (0 < scale[0] <= scale[1]) or not (0 < ratio[0] <= ratio[1]):
            raise ValueError(f"RandomResizedCrop: scale and ratio must be increasing positive pairs, got {scale!r} "
                             f"and {ratio!r}")
        self.scale, self.ratio, self.rng = tuple(scale), tuple(ratio), rng

    def draw(self, height: int, width: int, rng: np.random.Generator | None = None) -> tuple[int, int, int, int]:
        """(top, left, height, width) of the window for one image of height x width."""
        rng = _generator(rng or self.rng)
        area = height * width
        log_ratio = (math.log(self.ratio[0]), math.log(self.ratio[1]))
        for _ in range(10):
            target_area = area * rng.uniform(self.scale[0], self.scale[1])
            aspect = math.exp(rng.uniform(log_ratio[0], log_ratio[1]))
            w = int(round(math.sqrt(target_area * aspect)))
            h = int(round(math.sqrt(target_area / aspect)))
            if 0 < w <= width and 0 < h <= height:
                return int(rng.integers(0, height - h + 1)), int(rng.integers(0, width - w + 1)), h, w
        return self._central(height, width)

    def _central(self, height: int, width: int) -> tuple[int, int, int, int]:
        in_ratio = width / height
        w, h = width, height
        if in_ratio < self.ratio[0]:
            h = int(round(w / self.ratio[0]))
        elif in_ratio > self.ratio[1]:
            w = int(round(h * self.ratio[1]))
        return (height - h) // 2, (width - w) // 2, h, w

    def __call__(self, x: np.ndarray) -> np.ndarray:
        h, w = _image(x, "RandomResizedCrop").shape[:2]
        return resized_crop(x, *self.draw(h, w), self.size)


class Compose:
    """Apply transforms in order."""

    def __init__(self, transforms: Sequence[Callable]) -> None:
        self.transforms = list(transforms)

    def __call__(self, x):
        for t in self.transforms:
            x = t(x)
        return x

    def __repr__(self) -> str:
        return "Compose(" + ", ".join(type(t).__name__ for t in self.transforms) + ")"


# ---------------------------------------------------------------- batches of a dataset held on a device
# The resident dataset (frost.data.resident) gathers its batches with these. On the GPU the acceleration layer does
# each in one launch with no host work (frost/accel/augment.py), so a captured step can gather its own batch; the
# reference here copies to the host and back.

def gather_scaled(images, index, dtype: str = "float32") -> Any:
    """images[index] as float32(x) / 255 (to_float's math), stored as float32 or rounded to nearest bfloat16, on the
    images' device: images uint8 of any layout (rows are gathered whole), index 1-D integers on the same device (a
    list too; not checked against len(images) on a GPU: that would read the device)."""
    images = _raw(images)
    index = _batch_array(index, images)
    if dtype not in ("float32", "bfloat16"):
        raise ValueError(f"gather_scaled: dtype must be float32 or bfloat16, got {dtype!r}")
    if str(images.dtype) != "uint8" or index.dtype.kind not in "iu" or index.ndim != 1:
        raise TypeError(f"gather_scaled: images must be uint8 and index 1-D integers, got images {images.dtype} "
                        f"{tuple(images.shape)}, index {index.dtype} {tuple(index.shape)}")
    fast = dispatch.lookup("gather_scaled", images, index, dtype=dtype)
    if fast is not None:
        return fast(images, index, dtype)
    x = to_float(_on_host(images[index]))
    return backend.to_device(x.astype(to_dtype(dtype).np, copy=False), backend.device_of(images))


def gather_augmented(images, index, offsets_y, offsets_x, flips, size: int, padding: int, mean: Sequence[float],
                     std: Sequence[float]) -> Any:
    """`augment` of images[index] as NCHW float32 on the images' device: images a uint8 NHWC dataset; index, the
    offsets and the flip flags 1-D, one per image of the batch (arrays, tensors or lists), on the same device. The
    offsets are not checked (on a GPU that would read the device): a window outside the padded image reads zeros
    there, on either device."""
    images = _raw(images)
    index, offsets_y, offsets_x, flips = (_batch_array(a, images) for a in (index, offsets_y, offsets_x, flips))
    _check_augment_batch(images, index, offsets_y, offsets_x, flips, size, padding, mean, std)
    fast = dispatch.lookup("gather_augmented", images, index, offsets_y, offsets_x, flips, size, padding, mean, std)
    if fast is not None:
        return fast(images, index, offsets_y, offsets_x, flips, size, padding, mean, std)
    _, h, w, _ = images.shape
    # padded by `size` more, the offsets clipped into the larger frame: any window reads zeros outside the image
    oy = np.clip(_on_host(offsets_y).astype(np.int64) + size, 0, h + 2 * padding + size)
    ox = np.clip(_on_host(offsets_x).astype(np.int64) + size, 0, w + 2 * padding + size)
    x = augment(_on_host(images[index]), oy, ox, _on_host(flips).astype(bool), size, padding + size, mean, std)
    return backend.to_device(np.ascontiguousarray(x.transpose(0, 3, 1, 2)), backend.device_of(images))


def _check_augment_batch(images, index, offsets_y, offsets_x, flips, size, padding, mean, std) -> None:
    """gather_augmented's arguments, checked on the host before a kernel reads by them."""
    if str(images.dtype) != "uint8" or images.ndim != 4:
        raise TypeError(f"gather_augmented: images must be a uint8 (N, H, W, C) array, got {images.dtype} "
                        f"{tuple(images.shape)}")
    named = {"index": index, "offsets_y": offsets_y, "offsets_x": offsets_x, "flips": flips}
    shapes = {name: tuple(a.shape) for name, a in named.items()}
    if len(set(shapes.values())) != 1 or len(shapes["index"]) != 1:
        raise ValueError(f"gather_augmented: index, offsets_y, offsets_x and flips must be 1-D of one length, got "
                         f"shapes {shapes}")
    kinds = {"index": "iu", "offsets_y": "iu", "offsets_x": "iu", "flips": "iub"}
    wrong = {name: str(a.dtype) for name, a in named.items() if a.dtype.kind not in kinds[name]}
    if wrong:
        raise TypeError(f"gather_augmented: index and offsets must be integers, flips integers or bools; got {wrong}")
    _, h, w, c = images.shape
    if len(mean) != c or len(std) != c:
        raise ValueError(f"gather_augmented: mean and std need {c} values (the images' channels), got {len(mean)} "
                         f"and {len(std)}")
    if not all(std):
        raise ValueError(f"gather_augmented: std {list(std)} has a zero, which would divide by zero")
    if not 0 < size <= min(h, w) + 2 * padding or padding < 0:
        raise ValueError(f"gather_augmented: a {size}x{size} window does not fit {h}x{w} images padded by {padding}")


def draw_augment_gpu(n: int, size: int, padding: int, image_hw: tuple[int, int] | None = None,
                     flip_p: float = 0.5) -> tuple[Any, Any, Any]:
    """Crop offsets (y, x) and flip flags (int32 CuPy arrays) for n images, drawn on the device by Frost's CUDA
    generator (Philox, frost/accel/philox.py): a step captured by frost.jit draws new ones on every replay."""
    g = cuda.generator()
    h, w = image_hw or (size, size)
    oy = g.integers(0, h + 2 * padding - size + 1, size=n, dtype="int32")
    ox = g.integers(0, w + 2 * padding - size + 1, size=n, dtype="int32")
    return oy, ox, g.bernoulli_mask(n, flip_p).astype("int32")


def _raw(a):
    return a.data if isinstance(a, Tensor) else a


def _batch_array(a, images):
    """a (an array, a tensor, or a list or tuple: copied to the images' device) as an array."""
    a = _raw(a)
    return backend.to_device(np.asarray(a), backend.device_of(images)) if isinstance(a, (list, tuple)) else a


def _on_host(a) -> np.ndarray:
    """an array (NumPy or CuPy) as a NumPy array."""
    return backend.to_device(a, backend.CPU)
