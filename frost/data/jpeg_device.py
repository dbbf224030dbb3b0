"""JPEG batches decoded, cropped and resized on the GPU: an ImageNet-style training loader in one line.

    loader = DataLoader(DeviceJPEGList.folder("~/imagenet/train", size=224), batch_size=256, shuffle=True,
                        num_workers=8, worker_type="process", device="cuda")
    for images, labels in loader:     # (256, 224, 224, 3) uint8 and (256,) int64, on the GPU
        ...

Why: a JPEG's Huffman decode, inverse DCT and colour conversion, then Pillow's antialiased resize, take a CPU
core over a millisecond for one 224 x 224 image (several for an ImageNet photo); on a GPU they are a batch's work:
7,120 images/s of 224 x 224 JPEGs against 2,717 with Pillow in 8 worker processes and torchvision's 4,932 (an H100,
benchmarks/RESULTS.md). Worker processes suit it: the workers' per-file Python work (the header, the draws) then
leaves the GIL to the loop that decodes. The workers here only read the files,
parse each frame header for the image's size and draw the random window and flip from it (RandomResizedCrop's
rule, under the batch's generator: the same draws as the CPU pipeline ImageList + RandomResizedCrop +
RandomHorizontalFlip makes). The loader keeps the file bytes on the host (`host_fields`: nvImageCodec reads
host bitstreams) and calls `finish_on_device`, which decodes the batch (`decode_jpeg_batch`: the acceleration
layer's nvImageCodec decoder, frost/accel/jpeg_decode.py) and resizes every window in two launches
(`resized_crops`: Pillow's resize bit for bit, frost/accel/resized_crop.py). The decoded pixels are the GPU
decoder's, which may differ from libjpeg's by a level or two (its IDCT and chroma upsampling round otherwise).

Without the layer or nvImageCodec the batch is decoded by Pillow on the host and uploaded: the same results as
the CPU pipeline, slowly. On the CPU the loader reads `for_device`'s plain ImageList with those transforms.
"""
from __future__ import annotations

import io
import os
from typing import Any, Callable, Sequence

import numpy as np
from PIL import Image

from frost import dispatch
from frost.backend import cuda
from frost.data.folder import ImageFolder, ImageList
from frost.data import png_device
from frost.data.jpeg import ends_whole, is_jpeg, jpeg_frame
from frost.data.png import decode_with_pillow
from frost.data.png_device import _read, _read_gate
from frost.data.transforms import Compose, RandomHorizontalFlip, RandomResizedCrop, resized_crops

__all__ = ["DeviceJPEGList", "decode_jpeg_batch", "MAX_BATCH_PIXELS", "DECODERS"]

DECODERS = ("hybrid", "hardware", "auto")   # nvImageCodec's back ends to use (frost/accel/jpeg_decode.py)

# The most decoded bytes (height x width x 3, summed over a batch) one batch may ask the GPU for: the resize kernels
# address the batch with int32 offsets. 256 ImageNet photos (about 500 x 375) take 144 MB; 256 files of 300 bytes
# each claiming 20,000 x 20,000 pixels are refused.
MAX_BATCH_PIXELS = (2 << 30) - 1


def decode_jpeg_batch(like: Any, files: Sequence, decoder: str = "hybrid") -> list:
    """Decode JPEG files (bytes-like, on the host) to uint8 RGB arrays (H, W, 3) on `like`'s device; None in the
    place of a file that cannot be decoded.

    CuPy `like`: the acceleration layer's decoder on the current stream (`decoder` picks nvImageCodec's back ends:
    "hybrid", "hardware" or "auto", see frost/accel/jpeg_decode.py), else Pillow on the host and an upload. NumPy
    `like`: Pillow."""
    _check_decoder(decoder, "decode_jpeg_batch")
    fast = dispatch.lookup("decode_jpeg", like, files, decoder=decoder)
    if fast is not None:
        return fast(like, files, decoder=decoder)
    return [_on_host(like, f)[0] for f in files]


def _check_decoder(decoder: str, who: str) -> None:
    if decoder not in DECODERS:
        raise ValueError(f"{who}: decoder must be one of {DECODERS}, got {decoder!r}")


def _on_host(like: Any, data) -> tuple[Any, str | None]:
    """(Pillow's decode of one file uploaded to `like`'s device, None) or (None, Pillow's reason for refusing it)."""
    try:
        image = decode_with_pillow(bytes(data))
    except Exception as e:  # noqa: BLE001 - the caller names the file with the reason
        return None, f"{type(e).__name__}: {e}"
    return (image if isinstance(like, np.ndarray) else cuda.cupy().asarray(image)), None


def _why(data) -> str:
    """Pillow's reason for refusing a file the GPU decoder refused (only asked on failure)."""
    try:
        decode_with_pillow(bytes(data))
    except Exception as e:  # noqa: BLE001 - any reason is better than none
        return f"{type(e).__name__}: {e}"
    return "the GPU decoder refused it though Pillow reads it (an unsupported JPEG coding?)"


def _chunk(total: int, n: int) -> int:
    """Row length of a (n, chunk) buffer holding `total` bytes back to back: a power of two, so that the loader's
    buffers keep their shape from batch to batch (a new shape costs a new pinned allocation)."""
    need = max(64, -(-total // n))
    return 1 << (need - 1).bit_length()


class DeviceJPEGList(ImageList):
    """JPEG files with integer labels, decoded and augmented on the GPU by a DataLoader with device="cuda":
    each image's random window (RandomResizedCrop(size, scale, ratio)) resized to `size` and mirrored with
    probability `flip`, as uint8 (B, height, width, 3) batches.

    get_batch (in the workers) gives the files' bytes back to back (packed (B, chunk) uint8, offsets, lengths),
    each image's (height, width), its (top, left, height, width) window, whether the GPU decodes it (else Pillow
    does: another format named .jpg, a 12-bit JPEG), the flips, the indices and the labels;
    all but the labels stay on the host (`host_fields`) for finish_on_device. Items read one at a time (`ds[i]`)
    and a DataLoader on the CPU decode with Pillow and apply the same transforms."""

    def __init__(self, paths: Sequence[str | os.PathLike], targets: Sequence[int], size: int | Sequence[int] = 224,
                 scale: Sequence[float] = (0.08, 1.0), ratio: Sequence[float] = (3 / 4, 4 / 3),
                 flip: float = 0.5, decoder: str = "hybrid") -> None:
        self.crop, self.flip = RandomResizedCrop(size, scale, ratio), RandomHorizontalFlip(flip)
        _check_decoder(decoder, "DeviceJPEGList")
        self.decoder = decoder   # nvImageCodec's back ends (decode_jpeg_batch)
        super().__init__(paths, targets, transform=Compose([self.crop, self.flip]))
        self.size = self.crop.size
        self.host_fields = (0, 1, 2, 3, 4, 5, 6, 7)   # everything but the labels

    @classmethod
    def folder(cls, root: str | os.PathLike, size: int | Sequence[int] = 224, scale: Sequence[float] = (0.08, 1.0),
               ratio: Sequence[float] = (3 / 4, 4 / 3), flip: float = 0.5,
               decoder: str = "hybrid") -> "DeviceJPEGList":
        """root/<class>/<image>.jpg as frost.data.ImageFolder lists it (classes and class_to_idx kept)."""
        listing = ImageFolder(root)
        dataset = cls(listing.paths, listing.targets, size, scale, ratio, flip, decoder)
        dataset.root, dataset.classes, dataset.class_to_idx = listing.root, listing.classes, listing.class_to_idx
        return dataset

    def for_device(self, device) -> ImageList:
        """The dataset a DataLoader on `device` reads: itself on a GPU, else an ImageList of the same files and
        transforms (Pillow in the workers)."""
        on_gpu = getattr(device, "type", str(device).split(":")[0]) == "cuda"
        return self if on_gpu else ImageList(self.paths, self.targets, transform=self.transform)

    def get_batch(self, indices: np.ndarray) -> tuple[np.ndarray, ...]:
        """(packed (B, chunk) uint8, offsets (B,) int64, lengths (B,) int64, sizes (B, 2) int32, windows (B, 4)
        int32, on_gpu (B,) uint8, flips (B,) uint8, indices (B,) int64, labels (B,) int64). on_gpu is 0 for a file
        the GPU decoder does not take (another format named .jpg, a 12-bit JPEG): Pillow decodes it on the host."""
        indices = np.asarray(indices, dtype=np.int64)
        if len(indices) == 0:
            raise ValueError("DeviceJPEGList.get_batch: no indices")
        paths, n = self.paths, len(indices)
        with _read_gate:
            files = [_read(paths[i]) for i in indices.tolist()]
        sizes, windows = np.empty((n, 2), np.int32), np.empty((n, 4), np.int32)
        on_gpu, flips = np.empty(n, np.uint8), np.empty(n, np.uint8)
        for k, (i, data) in enumerate(zip(indices.tolist(), files)):
            height, width, on_gpu[k] = self._size_of(data, paths[i])
            sizes[k] = height, width
            windows[k] = self.crop.draw(height, width)   # the CPU pipeline's draws, in its order
            flips[k] = self.flip.draw(1)[0]
        self._check_batch(sizes, indices)
        lengths = np.array([len(f) for f in files], np.int64)
        if lengths.sum() > png_device.MAX_BATCH_BYTES:
            raise ValueError(f"DeviceJPEGList: a batch of {n} files holds {int(lengths.sum())} bytes, more than "
                             f"frost.data.png_device.MAX_BATCH_BYTES ({png_device.MAX_BATCH_BYTES}); use a smaller "
                             f"batch")
        offsets = np.concatenate([[0], np.cumsum(lengths[:-1])]).astype(np.int64)
        packed = np.zeros(n * _chunk(int(lengths.sum()), n), np.uint8)
        for start, data in zip(offsets.tolist(), files):
            packed[start:start + len(data)] = np.frombuffer(data, np.uint8)
        return (packed.reshape(n, -1), offsets, lengths, sizes, windows, on_gpu, flips, indices,
                self.targets[indices])

    def _size_of(self, data: bytes, name: str) -> tuple[int, int, bool]:
        """(height, width, whether the GPU decoder takes the file), or ValueError naming it."""
        if is_jpeg(data):
            try:
                frame = jpeg_frame(data, name)
            except ValueError as e:
                raise ValueError(f"DeviceJPEGList: {e}") from e
            if not ends_whole(data, frame):
                raise ValueError(f"DeviceJPEGList: {name} is truncated (no end-of-image marker after its scan)")
            height, width, on_gpu = frame.height, frame.width, frame.precision == 8 and frame.components in (1, 3)
        else:   # another format in a JPEG folder (ImageNet's training set holds a PNG named .JPEG)
            height, width, on_gpu = *_pillow_size(data, name), False
        if height * width > png_device.MAX_PIXELS:
            raise ValueError(f"DeviceJPEGList: {name} claims {width} x {height} pixels, more than the decoder's "
                             f"limit of {png_device.MAX_PIXELS} (frost.data.png_device.MAX_PIXELS; a decompression "
                             f"bomb?)")
        return height, width, on_gpu

    def _check_batch(self, sizes: np.ndarray, indices: np.ndarray) -> None:
        pixels = sizes.astype(np.int64).prod(axis=1) * 3
        if pixels.sum() > MAX_BATCH_PIXELS:
            biggest = self.paths[int(indices[int(pixels.argmax())])]
            raise ValueError(f"DeviceJPEGList: a batch of {len(indices)} images decodes to {int(pixels.sum())} "
                             f"bytes, more than frost.data.jpeg_device.MAX_BATCH_PIXELS ({MAX_BATCH_PIXELS}); the "
                             f"largest is {biggest}: use a smaller batch")

    def finish_on_device(self, fields: list, defer: Callable[[Callable[[], None]], None] | None = None) -> list:
        """Called by the DataLoader on each batch (host fields, device labels): decode, crop, resize and flip on
        the labels' device -> [images (B, h, w, 3) uint8, labels].

        The work runs on the current stream. A file that cannot be decoded raises RuntimeError naming it: at once
        without `defer`; with it (the threaded DataLoader) its image is left black and the loader raises when the
        caller asks for the next batch, as for DevicePNGList. The decoded images must outlive the resize's
        kernels: with `defer` the loader holds them until this batch's work is done, without it the stream is
        synchronized here."""
        packed, offsets, lengths, sizes, windows, on_gpu, flips, indices, labels = fields
        flat = np.asarray(packed).reshape(-1)
        files = [flat[o:o + n] for o, n in zip(np.asarray(offsets).tolist(), np.asarray(lengths).tolist())]
        gpu = np.flatnonzero(np.asarray(on_gpu)).tolist()
        raw, why = [None] * len(files), {}
        for k, image in zip(gpu, decode_jpeg_batch(labels, [files[k] for k in gpu], self.decoder)):
            raw[k] = image
        for k in sorted(set(range(len(files))) - set(gpu)):
            raw[k], why[k] = _on_host(labels, files[k])
        failed = [k for k, image in enumerate(raw) if image is None]
        names = [self.paths[int(i)] for i in np.asarray(indices)[failed]]
        reasons = [why.get(k) or _why(files[k]) for k in failed]   # Pillow asked again only for the GPU's refusals
        images = [self._checked(image, k, sizes, indices, labels) for k, image in enumerate(raw)]
        out = resized_crops(images, np.asarray(windows), self.size, np.asarray(flips))

        more = f" (and {len(failed) - 1} more file(s) of the batch: {', '.join(names[1:4])})" if failed[1:] else ""

        def check() -> None:
            raw.clear(), images.clear()   # the batch's work is done: its decoded images may go
            if failed:
                raise RuntimeError(f"DeviceJPEGList: cannot decode {names[0]}: {reasons[0]}{more}")
        if defer is not None:
            defer(check)
        else:
            if not isinstance(labels, np.ndarray):
                cuda.cupy().cuda.get_current_stream().synchronize()
            check()
        return [out, labels]

    def _checked(self, image: Any, k: int, sizes, indices, like) -> Any:
        """Image k as C-order (H, W, 3) uint8; black where it failed to decode (reported by the caller)."""
        height, width = (int(v) for v in sizes[k])
        xp = np if isinstance(like, np.ndarray) else cuda.cupy()
        if image is None:
            return xp.zeros((height, width, 3), np.uint8)
        if image.ndim == 2:
            image = image[:, :, None]
        if image.shape[2] == 1:
            image = image.repeat(3, axis=2)
        if image.shape != (height, width, 3) or image.dtype != np.uint8:
            raise RuntimeError(f"DeviceJPEGList: {self.paths[int(indices[k])]} decoded to {tuple(image.shape)} "
                               f"{image.dtype}, but its header says {height} x {width} pixels of 8 bits")
        return image if image.flags.c_contiguous else image.copy()


def _pillow_size(data: bytes, name: str) -> tuple[int, int]:
    """(height, width) from Pillow's reading of a header (it decodes nothing), or ValueError naming the file."""
    try:
        with Image.open(io.BytesIO(data)) as image:
            return image.height, image.width
    except Exception as e:  # noqa: BLE001 - any reason Pillow gives, with the file's name
        raise ValueError(f"DeviceJPEGList: {name} is neither a JPEG file nor an image Pillow reads: "
                         f"{type(e).__name__}: {e}") from e
