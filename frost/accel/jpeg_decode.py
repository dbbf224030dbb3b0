"""JPEG batches decoded on the GPU by NVIDIA's nvImageCodec: `decode_jpeg`'s fast path (frost.data.jpeg_device).

nvImageCodec (`nvidia-nvimgcodec-cu13[all]`, the `jpeg` extra) decodes a list of host bitstreams in one call: on the
GPU's hardware JPEG engines where it has them (A100, H100, H200), or with the Huffman decode on its CPU threads and
the rest in CUDA kernels (the default here, faster for ImageNet-sized images: see BACKENDS), with a CPU decoder
(libjpeg-turbo) as the last resort. The images land in device memory it allocates, ready in the order of the stream
passed; a file it cannot decode comes back as None, which the dataset turns into an error naming the file.

Chosen over an own decoder: NVIDIA's decoders agree with libjpeg-turbo (Pillow's) to a level or two and are
maintained against every JPEG coding; an own one would start from nothing. Pillow's behaviour is kept where they
differ by default: EXIF orientation is not applied.

Registered only where the package imports; otherwise frost.data.jpeg_device decodes with Pillow on the host.
"""
from __future__ import annotations

import functools
import importlib
from typing import Any, Sequence

from frost import dispatch
from frost.backend import cuda


@functools.cache
def nvimgcodec() -> Any | None:
    """The nvImageCodec module, or None where it is not installed (or cannot load its libraries)."""
    try:
        return importlib.import_module("nvidia.nvimgcodec")
    except (ImportError, OSError):
        return None


# nvImageCodec's back ends per choice, fallbacks last: "hybrid" decodes the Huffman data on the CPU threads and the
# rest in CUDA (4.5 ms for 256 JPEGs of 224 x 224 on an H100, 2026-12-06), "hardware" the GPU's JPEG engines (17 ms
# for the same batch: they pay per image), "auto" lets the library choose (it chose the engines).
BACKENDS = {"hybrid": ("HYBRID_CPU_GPU", "CPU_ONLY"), "hardware": ("HW_GPU_ONLY", "HYBRID_CPU_GPU", "CPU_ONLY"),
            "auto": None}


@functools.cache
def _decoder(device: int, choice: str) -> tuple[Any, Any]:
    """One decoder per GPU and choice (its CPU threads, CUDA streams and hardware-engine state are made once), and
    the decode parameters."""
    nv = nvimgcodec()
    kinds = BACKENDS[choice]
    backends = None if kinds is None else [nv.Backend(getattr(nv.BackendKind, kind)) for kind in kinds]
    return nv.Decoder(device_id=device, backends=backends), nv.DecodeParams(apply_exif_orientation=False)


def available(like, files, decoder: str = "hybrid") -> bool:
    return nvimgcodec() is not None


def _code_stream(nv, data) -> Any | None:
    """nvImageCodec's view of one file (it parses the headers here), or None where it refuses it."""
    try:
        return nv.CodeStream(data)
    except Exception:  # noqa: BLE001 - a file it cannot parse is a failed image, reported by the caller
        return None


@dispatch.register("decode_jpeg", device="cuda", applies=available)
def decode_jpeg_nvimgcodec(like, files: Sequence, decoder: str = "hybrid") -> list:
    """Decode host bitstreams to (H, W, 3) uint8 CuPy arrays on the current stream; None for a refused file.
    The call returns once the batch is decoded (its GIL released meanwhile); `decoder` is checked by the op."""
    nv, cp = nvimgcodec(), cuda.cupy()
    decoder, params = _decoder(cp.cuda.runtime.getDevice(), decoder)
    streams = [_code_stream(nv, f) for f in files]
    good = [k for k, s in enumerate(streams) if s is not None]
    out: list = [None] * len(files)
    if good:
        decoded = decoder.decode([streams[k] for k in good], params=params,
                                 cuda_stream=cp.cuda.get_current_stream().ptr)
        for k, image in zip(good, decoded):
            out[k] = None if image is None else cp.asarray(image)   # holds the Image (its memory) alive
    return out
