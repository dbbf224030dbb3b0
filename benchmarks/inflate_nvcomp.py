"""The GPU PNG decoder's inflate against NVIDIA nvCOMP's batched Deflate decompression, on CIFAR-10-like PNGs.

    python benchmarks/inflate_nvcomp.py --out results/inflate_nvcomp.json [--batches 256,1024,4096] [--repeats 50]

Both sides inflate the same PNG zlib streams of 32x32 RGB images into the filtered scanlines (3,104 bytes an image)
on the GPU, from device buffers to device buffers: Frost's `inflate_kernel` (frost/accel/png_inflate.py, one thread per
image, checks the zlib header and the Adler-32, a status per image) and `nvcompBatchedDeflateDecompressAsync` (the
raw deflate data between the 2-byte header and the checksum, which nvCOMP neither reads nor checks). The PNGs are
Pillow's encoding of images built from the package's embedded sample of real CIFAR-10 images (as
benchmarks/synthetic_cifar.py --like-cifar builds them), so they compress as CIFAR-10's do. Before timing, both
outputs are compared with zlib's for every image. Times: CUDA events around 10 launches back to back, per launch,
median over --repeats.

nvCOMP comes from the `nvidia-libnvcomp-cu13` wheel (libnvcomp.so.6, called through ctypes; nothing is compiled).
"""
from __future__ import annotations

import argparse
import ctypes
import io
import json
import os
import sys
import zlib
from pathlib import Path

import numpy as np
from PIL import Image

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from synthetic_cifar import images_like_cifar  # noqa: E402

from frost.accel.png_inflate import _inflate_block, inflate_kernel  # noqa: E402
from frost.data.png_device import png_stream, raw_size  # noqa: E402

NVCOMP_BACKEND = {"default": 0, "hardware": 1, "cuda": 2}
# launches timed between one pair of events (at 689b8d8 one launch each, so the times held the host's launch work)
LAUNCHES_PER_SAMPLE = 10


class DecompressOpts(ctypes.Structure):
    _fields_ = [("backend", ctypes.c_int), ("sort_before_hw_decompress", ctypes.c_int),
                ("reserved", ctypes.c_char * 56)]


class Alignments(ctypes.Structure):
    _fields_ = [("input", ctypes.c_size_t), ("output", ctypes.c_size_t), ("temp", ctypes.c_size_t)]


def png_files(n: int, seed: int = 0) -> list[bytes]:
    """n PNG files (Pillow's encoder, its defaults) of 32x32 RGB images built from real CIFAR-10 images."""
    images = images_like_cifar(np.random.default_rng(seed), n)
    out = []
    for image in images:
        buf = io.BytesIO()
        Image.fromarray(image).save(buf, format="PNG")
        out.append(buf.getvalue())
    return out


def packed_streams(files: list[bytes], skip: int = 0, trim: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(B, stride) uint8 rows holding each file's zlib stream without its first `skip` and last `trim` bytes (2 and 4:
    the raw deflate data), each row starting a multiple of 16 bytes in; (B,) int64 lengths."""
    streams = [png_stream(f, f"image {i}")[0] for i, f in enumerate(files)]
    streams = [s[skip:len(s) - trim] for s in streams]
    stride = -(-max(len(s) for s in streams) // 16) * 16
    packed = np.zeros((len(streams), stride), np.uint8)
    for row, s in zip(packed, streams):
        row[:len(s)] = np.frombuffer(s, np.uint8)
    return packed, np.array([len(s) for s in streams], np.int64)


def expected_scanlines(files: list[bytes]) -> np.ndarray:
    """zlib's inflate of every stream: the reference both GPU inflaters must give."""
    return np.stack([np.frombuffer(zlib.decompress(png_stream(f, "")[0]), np.uint8) for f in files])


def find_nvcomp() -> Path | None:
    """libnvcomp.so.6 of the nvidia-libnvcomp-cu13 wheel on sys.path (or NVCOMP_LIBRARY), None when absent."""
    if os.environ.get("NVCOMP_LIBRARY"):
        return Path(os.environ["NVCOMP_LIBRARY"])
    for entry in sys.path:
        lib = Path(entry or ".") / "nvidia" / "libnvcomp" / "lib64" / "libnvcomp.so.6"
        if lib.exists():
            return lib
    return None


class NvcompInflate:
    """nvcompBatchedDeflateDecompressAsync over (B, stride) device rows of raw deflate data into (B, raw) rows."""

    def __init__(self, lib_path: Path, backend: str = "default") -> None:
        self.lib = ctypes.CDLL(str(lib_path))
        self.opts = DecompressOpts(NVCOMP_BACKEND[backend], 0)
        align = Alignments()
        self._check(self.lib.nvcompBatchedDeflateDecompressGetRequiredAlignments(self.opts, ctypes.byref(align)),
                    "GetRequiredAlignments")
        self.alignments = {"input": align.input, "output": align.output, "temp": align.temp}

    @staticmethod
    def _check(status: int, what: str) -> None:
        if status != 0:
            raise RuntimeError(f"nvCOMP {what} failed with status {status}")

    def prepare(self, cp, packed, lengths, raw_bytes: int):
        """The device arrays of pointers, sizes, outputs, statuses and temp for one batch (made once, outside the
        timing, as a loader would keep them)."""
        n, stride = packed.shape
        out = cp.zeros((n, raw_bytes), cp.uint8)
        for name, array, row in (("input", packed, stride), ("output", out, raw_bytes)):
            if row % self.alignments[name] or array.data.ptr % self.alignments[name]:
                raise RuntimeError(f"nvCOMP needs {name} buffers aligned to {self.alignments[name]} bytes")
        temp_bytes = ctypes.c_size_t()
        self._check(self.lib.nvcompBatchedDeflateDecompressGetTempSize(
            ctypes.c_size_t(n), ctypes.c_size_t(raw_bytes), self.opts, ctypes.byref(temp_bytes),
            ctypes.c_size_t(n * raw_bytes), ctypes.c_void_p(cp.cuda.get_current_stream().ptr)), "GetTempSize")
        return {
            "in_ptrs": cp.asarray(packed.data.ptr + stride * np.arange(n, dtype=np.uint64), dtype=cp.uint64),
            "in_bytes": cp.asarray(lengths, dtype=cp.uint64),
            "out_capacity": cp.full(n, raw_bytes, dtype=cp.uint64),
            "out_bytes": cp.zeros(n, cp.uint64),
            "out_ptrs": cp.asarray(out.data.ptr + raw_bytes * np.arange(n, dtype=np.uint64), dtype=cp.uint64),
            "statuses": cp.zeros(n, cp.int32),
            "temp": cp.empty(max(1, temp_bytes.value), cp.uint8),
            "out": out, "n": n, "packed": packed,  # in_ptrs point into it: it must outlive every launch
        }

    def __call__(self, cp, b: dict) -> None:
        ptr = ctypes.c_void_p
        self._check(self.lib.nvcompBatchedDeflateDecompressAsync(
            ptr(b["in_ptrs"].data.ptr), ptr(b["in_bytes"].data.ptr), ptr(b["out_capacity"].data.ptr),
            ptr(b["out_bytes"].data.ptr), ctypes.c_size_t(b["n"]), ptr(b["temp"].data.ptr),
            ctypes.c_size_t(b["temp"].nbytes), ptr(b["out_ptrs"].data.ptr), self.opts, ptr(b["statuses"].data.ptr),
            ptr(cp.cuda.get_current_stream().ptr)), "BatchedDeflateDecompressAsync")


def median_us(cp, launch, repeats: int, per_sample: int = LAUNCHES_PER_SAMPLE) -> float:
    """Median GPU time of one launch (CUDA events around `per_sample` launches back to back, so that the GPU stays
    busy and the host's launch work is hidden), after two untimed ones."""
    for _ in range(2):
        launch()
    times = []
    for _ in range(repeats):
        start, end = cp.cuda.Event(), cp.cuda.Event()
        start.record()
        for _ in range(per_sample):
            launch()
        end.record()
        end.synchronize()
        times.append(cp.cuda.get_elapsed_time(start, end) * 1000 / per_sample)
    return float(np.median(times))


def run_batch(cp, files: list[bytes], nvcomp: NvcompInflate | None, repeats: int) -> dict:
    n, raw_bytes = len(files), raw_size(32, 32, 3)
    expected = expected_scanlines(files)
    packed, lengths = packed_streams(files)
    d_packed, d_lengths = cp.asarray(packed), cp.asarray(lengths.astype(np.int32))
    raw, status = cp.zeros((n, raw_bytes), cp.uint8), cp.zeros(n, cp.int32)
    per = _inflate_block(n)

    def frost_inflate():
        inflate_kernel[-(-n // per), per](d_packed, d_lengths, raw, status, n)

    row = {"batch": n, "mean_stream_bytes": float(lengths.mean()), "frost_us": median_us(cp, frost_inflate, repeats)}
    if not (np.array_equal(cp.asnumpy(raw), expected) and not cp.asnumpy(status).any()):
        raise SystemExit("inflate_nvcomp: Frost's inflate_kernel does not give zlib's scanlines")
    if nvcomp is not None:
        body, body_lengths = packed_streams(files, skip=2, trim=4)
        buffers = nvcomp.prepare(cp, cp.asarray(body), body_lengths, raw_bytes)
        row["nvcomp_us"] = median_us(cp, lambda: nvcomp(cp, buffers), repeats)
        if cp.asnumpy(buffers["statuses"]).any() or not np.array_equal(cp.asnumpy(buffers["out"]), expected):
            raise SystemExit("inflate_nvcomp: nvCOMP does not give zlib's scanlines")
        row["frost_over_nvcomp"] = row["frost_us"] / row["nvcomp_us"]
    for side in ("frost", "nvcomp"):
        if f"{side}_us" in row:
            row[f"{side}_images_per_s"] = n / row[f"{side}_us"] * 1e6
    return row


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--batches", default="256,1024,4096", help="images per batch, comma-separated")
    p.add_argument("--repeats", type=int, default=20, help="samples of LAUNCHES_PER_SAMPLE launches each")
    p.add_argument("--backend", choices=sorted(NVCOMP_BACKEND), default="default", help="nvCOMP's decompress backend")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    import cupy as cp  # the GPU side only: the stream preparation above runs (and is tested) without it
    lib = find_nvcomp()
    nvcomp = NvcompInflate(lib, args.backend) if lib is not None else None
    if nvcomp is None:
        print("nvCOMP not found (pip install nvidia-libnvcomp-cu13, or NVCOMP_LIBRARY=path): Frost's side only")
    batches = [int(b) for b in args.batches.split(",")]
    files = png_files(max(batches))
    rows = [run_batch(cp, files[:b], nvcomp, args.repeats) for b in batches]
    print(f"{'batch':>6} {'stream B':>9} {'frost us':>9} {'nvcomp us':>10} {'frost img/s':>12} {'nvcomp img/s':>13}")
    for r in rows:
        nan = float("nan")
        print(f"{r['batch']:>6} {r['mean_stream_bytes']:>9.0f} {r['frost_us']:>9.1f} {r.get('nvcomp_us', nan):>10.1f} "
              f"{r['frost_images_per_s']:>12,.0f} {r.get('nvcomp_images_per_s', nan):>13,.0f}")
    result = {"benchmark": "inflate_nvcomp", "rows": rows, "repeats": args.repeats, "backend": args.backend,
              "nvcomp_library": str(lib) if lib else None, "device": cp.cuda.runtime.getDeviceProperties(0)["name"]
              .decode(), "alignments": nvcomp.alignments if nvcomp else None, "command": " ".join(sys.argv)}
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
