"""Images per second decoding CIFAR-10 PNGs: Frost's DataLoader (threads and processes) vs PyTorch's (processes).

    python benchmarks/loader.py                      # 10,000 PNGs, 1/2/4/8/16 workers, median of 3
    python benchmarks/loader.py --jpeg --persistent  # 10,000 JPEGs (224 x 224) with RandomResizedCrop and flips
    python benchmarks/loader.py --n 2000 --repeats 3 --threads 1,2,4
    python benchmarks/loader.py --persistent         # worker processes kept across epochs, Frost's and PyTorch's
    python benchmarks/loader.py --strategies         # raw decode strategies in N plain threads

Makes a PNG folder in the seed's layout (`train/<index>_<class>.png`) from the shared CIFAR-10 npz
parts (FROST_CIFAR10_PARTS=DIR names another folder of them; the embedded sample's 2,000 real images, cycled,
when they are absent), then reads one epoch of it with each worker count:
both loaders use the same dataset object (frost.data.ImageList: frost.data.png's decoder -> uint8 HWC
array per item; Frost's loader calls its get_batch once per batch, PyTorch's __getitem__ per sample),
the same batch size and no shuffling; PyTorch also gets a row with plain Pillow decoding
(Image.open + np.array, what ImageList did before) unless --no-torch-pillow. Frost runs twice: with
worker threads filling ping-pong buffers (the per-image Python work holds the GIL, so they stop
scaling), and with worker processes (worker_type="process", forkserver) writing into shared-memory
ping-pong buffers. PyTorch's workers are processes with its default collate.

Timing: each path and worker count gets one loader, which reads --repeats + 1 epochs; an epoch counts
from iter() to the last batch. The first epoch (the workers' start-up, the page cache, lazy set-up) is
reported apart; images/s is over the median of the epochs after it, so the scaling compares steady
state. Without --persistent the worker processes (Frost's and PyTorch's) start anew each epoch, so
every timed epoch includes their start-up, as a loader without persistent_workers does in training;
with --persistent both keep them (persistent_workers=True) and only the first epoch starts them.
Frost's worker threads start in microseconds either way. Prints a table and the first epochs' times,
then each CPU path's scaling (steady images/s at N workers over images/s at the first count); --out
FILE.json also writes the result as JSON.

With a GPU (skip with --no-gpu) two more rows deliver the batches ON THE GPU, timed to a device
synchronize at the end of each epoch:
  frost (GPU decode)  frost.data.DevicePNGList + DataLoader(device="cuda"): workers only read the files and
                      cut out the zlib streams; each batch is copied to the GPU and decoded there
                      (frost/accel/png_inflate.py: one thread per image inflates, then unfilters)
  torch + .cuda()     PyTorch's loader as above (CPU decode in processes, pin_memory=True), then
                      x.cuda(non_blocking=True) per batch
The other rows deliver uint8 batches in host memory.

--jpeg reads an ImageNet-style folder instead: CIFAR-10 images upscaled to 224 x 224 (Pillow's bicubic) and saved as
JPEGs (quality 90) in root/<class>/<index>.jpg, read by frost.data.ImageFolder with RandomResizedCrop(224) and
RandomHorizontalFlip (Pillow's decode and antialiased bilinear resize in the workers, as torchvision's ImageFolder
and transforms on PIL images do); PyTorch's loader reads the same dataset object, so those rows differ only in the
loader. Where torchvision is installed two more rows read the folder torchvision's way: `torchvision` (torchvision.io
decode and transforms.v2 on tensors in PyTorch's worker processes) and `torchvision GPU` (the workers read the
files, the main process decodes each batch with torchvision.io.decode_jpeg(device="cuda"), nvJPEG, and crops each
image there). Frost's GPU row is frost.data.DeviceJPEGList (nvImageCodec's batched decode, --decoder picks its back
ends, then one batched crop-and-resize: Pillow's resize bit for bit).

--strategies times raw decoding without any loader: N plain threads (each a strided share of the
files) run one strategy over all the files, for N in --threads; images/s for
  pillow       Image.open + np.array (+ convert("RGB") where needed)
  frost        frost.data.png.read_png: one read + chunk parse + Pillow's C zip decoder (the new path)
  frost_bytes  frost.data.png.decode_png on bytes already in memory (no file I/O)
  read         the file read only (frost.data.png.read_file)
  read_zlib    read + chunk parse + zlib.decompress of the IDAT data (inflate only, no unfiltering)
so one run shows where each stops scaling (the GIL).
"""
from __future__ import annotations

import argparse
import importlib
import os
import platform
import statistics
import struct
import sys
import tempfile
import threading
import time
import warnings
import zlib
from pathlib import Path

import numpy as np
from PIL import Image

import frost
from frost.bench import common
from frost.data import DataLoader, DeviceJPEGList, DevicePNGList, ImageFolder, ImageList
from frost.data.transforms import Compose, RandomHorizontalFlip, RandomResizedCrop
from frost.data.cifar import CLASSES, load_sample, seed_png_files
from frost.data.jpeg_device import DECODERS
from frost.data.png import PNG_SIGNATURE, read_file, read_png, decode_png
from frost.io import read_npy, read_npz_array
from frost.parallel import finish, spawn, split

HERE = Path(__file__).resolve().parent
# the CIFAR-10 npz parts (train_x_a.npz ..., train_y.npy): the shared copy beside the repository, or FROST_CIFAR10_PARTS
SHARED = Path(os.environ.get("FROST_CIFAR10_PARTS", HERE.parent / ".." / "shared" / "data" / "cifar10"))


def source_images(n: int) -> tuple[np.ndarray, np.ndarray, str]:
    """n CIFAR-10 training images and labels from the shared parts, else the embedded sample's (real images, so that
    their PNGs and JPEGs compress and decode as CIFAR-10's do; random pixels would not)."""
    if (SHARED / "train_x_a.npz").is_file():
        parts, have = [], 0
        for s in "abcde":
            if have >= n:
                break
            parts.append(read_npz_array(SHARED / f"train_x_{s}.npz", "x"))
            have += len(parts[-1])
        x = np.concatenate(parts)[:n]
        if len(x) < n:
            raise SystemExit(f"loader: --n {n} is more than the {len(x)} shared training images")
        return x, read_npy(SHARED / "train_y.npy")[:n].astype(np.int64), "shared CIFAR-10 train parts"
    x, y = load_sample()   # real CIFAR-10 images (2,000 of them, embedded in the package), cycled
    reps = -(-n // len(x))
    return (np.concatenate([x] * reps)[:n], np.concatenate([y] * reps)[:n].astype(np.int64),
            f"the package's embedded CIFAR-10 sample ({len(x)} training images, cycled)")


def make_png_folder(folder: Path, n: int) -> str:
    """folder/train/<index>_<class>.png for n images (reused when already complete)."""
    train = folder / "train"
    marker = folder / "SOURCE"
    if train.is_dir() and len(list(train.glob("*.png"))) == n and marker.is_file():
        return marker.read_text()
    train.mkdir(parents=True, exist_ok=True)
    for old in train.glob("*.png"):
        old.unlink()
    x, y, origin = source_images(n)

    def write(positions: range) -> None:
        for i in positions:
            Image.fromarray(x[i]).save(train / f"{i}_{CLASSES[y[i]]}.png")

    with finish():  # zlib compression releases the GIL
        spawn(write, split(range(n), os.cpu_count() or 1))
    marker.write_text(origin)
    return origin


JPEG_SIZE, JPEG_QUALITY = 224, 90
JPEG_TRANSFORM = (f"RandomResizedCrop({JPEG_SIZE}), RandomHorizontalFlip(): Pillow's decode and antialiased bilinear "
                  "resize of a random window, per image in the workers")


def make_jpeg_folder(folder: Path, n: int) -> str:
    """folder/<class>/<index>.jpg for n CIFAR-10 images upscaled to JPEG_SIZE (Pillow's bicubic), JPEG quality
    JPEG_QUALITY (reused when already complete)."""
    marker = folder / "SOURCE"
    if marker.is_file() and sum(1 for _ in folder.glob("*/*.jpg")) == n:
        return marker.read_text()
    for old in folder.glob("*/*.jpg"):
        old.unlink()
    for stale in (d for d in folder.glob("*") if d.is_dir() and not any(d.iterdir())):
        stale.rmdir()
    x, y, origin = source_images(n)
    for c in sorted(set(y.tolist())):  # the classes that occur: ImageFolder refuses an empty class folder
        (folder / CLASSES[c]).mkdir(parents=True, exist_ok=True)

    def write(positions: range) -> None:
        for i in positions:
            image = Image.fromarray(x[i]).resize((JPEG_SIZE, JPEG_SIZE), Image.BICUBIC)
            image.save(folder / CLASSES[y[i]] / f"{i}.jpg", quality=JPEG_QUALITY)

    with finish():  # Pillow's resize and JPEG encoder release the GIL
        spawn(write, split(range(n), os.cpu_count() or 1))
    origin = f"{origin}, upscaled to {JPEG_SIZE} x {JPEG_SIZE} (bicubic), JPEG quality {JPEG_QUALITY}"
    marker.write_text(origin)
    return origin


def jpeg_dataset(folder: Path) -> ImageFolder:
    """The JPEG folder with the ImageNet-style training transform (JPEG_TRANSFORM)."""
    return ImageFolder(folder, transform=Compose([RandomResizedCrop(JPEG_SIZE), RandomHorizontalFlip()]))


def pillow_decode(path) -> np.ndarray:
    """Plain Pillow: what ImageList decoded with before frost.data.png."""
    with Image.open(path) as img:
        if img.mode != "RGB":
            img = img.convert("RGB")
        return np.array(img)


class PillowImageList(ImageList):
    """ImageList decoding with plain Pillow (the PyTorch-with-Pillow row)."""

    def __getitem__(self, index: int):
        return pillow_decode(self.paths[index]), self.targets[index]


class TorchvisionJPEGs:
    """The JPEG folder for PyTorch's loader, torchvision's way: torchvision.io reads and decodes (libjpeg-turbo on
    the CPU) and transforms.v2 crops, resizes (antialiased bilinear) and flips uint8 CHW tensors in the workers.
    With gpu=True the workers only read the files; the batch is decoded on the GPU in the main process
    (torchvision.io.decode_jpeg(list, device="cuda"): nvJPEG, batched) and each image cropped there."""

    def __init__(self, paths, targets, gpu: bool = False) -> None:
        self.paths, self.targets, self.gpu = list(paths), np.asarray(targets), gpu

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int):
        import torchvision
        data = torchvision.io.read_file(self.paths[i])
        if self.gpu:
            return data, int(self.targets[i])
        image = torchvision.io.decode_jpeg(data, mode=torchvision.io.ImageReadMode.RGB)
        return torchvision_transform()(image), int(self.targets[i])


def has_torchvision() -> bool:
    try:
        import torchvision  # noqa: F401
    except ImportError:
        return False
    return True


def torchvision_transform():
    from torchvision.transforms import v2
    return v2.Compose([v2.RandomResizedCrop(JPEG_SIZE, antialias=True), v2.RandomHorizontalFlip()])


def bytes_collate(batch):
    """A batch of (file bytes, label): the files' bytes in one tensor with their lengths (one shared buffer a batch,
    as Frost's workers hand over), for decode_jpeg's batched GPU decode."""
    import torch
    return ((torch.cat([data for data, _ in batch]), torch.tensor([len(data) for data, _ in batch])),
            torch.tensor([label for _, label in batch]))


def torchvision_gpu_batch(packed):
    """Decode a batch of JPEG files on the GPU in one call, then crop, resize and flip each image there."""
    import torch
    import torchvision
    data, lengths = packed
    datas = list(torch.split(data, lengths.tolist()))
    images = torchvision.io.decode_jpeg(datas, mode=torchvision.io.ImageReadMode.RGB, device="cuda")
    transform = torchvision_transform()
    return torch.stack([transform(image) for image in images])


def frost_loader(ds, batch: int, workers: int, worker_type: str = "thread", context: str | None = None,
                 persistent: bool = False, device: str | None = None) -> DataLoader:
    """Frost's loader for one path; worker processes are kept across epochs when `persistent`."""
    options = {}
    if worker_type == "process":
        options = {"multiprocessing_context": context, "persistent_workers": persistent and workers > 0}
    return DataLoader(ds, batch_size=batch, num_workers=workers, worker_type=worker_type, device=device, **options)


def torch_loader(ds, batch: int, workers: int, persistent: bool = False, pin_memory: bool = False,
                 context: str | None = None, collate_fn=None, worker_init_fn=None):
    """PyTorch's loader (worker processes, default collate; `context` None: PyTorch's default start method)."""
    import torch.utils.data
    warnings.filterwarnings("ignore", message="This DataLoader will create")  # more workers than cores
    return torch.utils.data.DataLoader(ds, batch_size=batch, num_workers=workers, pin_memory=pin_memory,
                                       persistent_workers=persistent and workers > 0, collate_fn=collate_fn,
                                       multiprocessing_context=context if workers > 0 else None,
                                       worker_init_fn=worker_init_fn, timeout=120 if workers > 0 else 0)


def torch_worker_init(worker_id: int) -> None:
    """(torchvision_gpu's workers) Tensors go back to the main process through shared-memory files, not one file
    descriptor each: 256 file byte tensors a batch from 16 workers, two batches ahead, held 8,192 descriptors, over
    the usual limit of 1,024 ("Bad file descriptor" in the workers' feeder threads, an H100 host)."""
    import torch.multiprocessing
    torch.multiprocessing.set_sharing_strategy("file_system")


def torch_context(frost_gpu: bool) -> str | None:
    """The start method of PyTorch's workers: its default (fork) unless Frost's GPU rows run in this process, whose
    CuPy streams, events and memory a forked worker would inherit and whose finalizers then fail in it
    (cudaErrorInitializationError tracebacks, seen on the H200); forkserver then, as Frost's process workers use."""
    return "forkserver" if frost_gpu else None


def one_epoch(loader, to_gpu=None, sync=None) -> int:
    """Read one epoch (each batch moved with to_gpu when given, then sync()); the number of images seen."""
    seen = 0
    for x, _ in loader:
        seen += (to_gpu(x) if to_gpu is not None else x).shape[0]
    if sync is not None:
        sync()
    return seen


def timed_epochs(loader, images: int, repeats: int, to_gpu=None, sync=None) -> dict:
    """repeats + 1 epochs of one loader: the first (start-up, caches) reported apart, images/s over the median of
    the others (steady state)."""
    times = []
    for _ in range(repeats + 1):
        t0 = time.perf_counter()
        seen = one_epoch(loader, to_gpu, sync)
        times.append(time.perf_counter() - t0)
        if seen != images:
            raise RuntimeError(f"loader: an epoch gave {seen} images, expected {images}")
    return {"rate": images / statistics.median(times[1:]), "first_s": times[0], "epoch_s": times[1:]}


def cuda_sync():
    from frost.backend import cuda
    cuda.cupy().cuda.Device().synchronize()


def torch_to_gpu(x):
    return x.cuda(non_blocking=True)


def torch_sync():
    import torch
    torch.cuda.synchronize()


def gpu_rows_available(args) -> tuple[bool, bool]:
    """(frost's GPU row, torch's .cuda() row) can run."""
    if args.no_gpu:
        return False, False
    from frost.backend import cuda
    frost_gpu = cuda.is_available()
    torch_gpu = False
    if not args.no_torch:
        import torch
        torch_gpu = torch.cuda.is_available()
    return frost_gpu, torch_gpu


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, default=10_000, help="images in the PNG folder")
    p.add_argument("--threads", default="1,2,4,8,16", help="worker counts, comma-separated")
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--dir", type=Path, default=None, help="where the PNG folder goes (default: a temp dir)")
    p.add_argument("--no-torch", action="store_true")
    p.add_argument("--persistent", "--torch-persistent", dest="persistent", action="store_true",
                   help="persistent_workers=True for Frost's worker processes and PyTorch's: started in the first "
                        "epoch only, so the timed epochs exclude their start-up")
    p.add_argument("--frost-context", default=None, choices=["fork", "forkserver", "spawn"],
                   help="start method of Frost's worker processes (default: the loader's, forkserver)")
    p.add_argument("--no-torch-pillow", action="store_true", help="skip the PyTorch row with plain Pillow decoding")
    p.add_argument("--no-gpu", action="store_true", help="skip the rows that deliver batches on the GPU")
    p.add_argument("--strategies", action="store_true", help="time raw decode strategies in plain threads instead")
    p.add_argument("--jpeg", action="store_true",
                   help="an ImageFolder of 224 x 224 JPEGs with RandomResizedCrop and flips instead of the PNGs")
    p.add_argument("--decoder", default="hybrid", choices=DECODERS,
                   help="--jpeg: nvImageCodec's back ends for Frost's GPU row (frost/accel/jpeg_decode.py)")
    p.add_argument("--no-torchvision", action="store_true", help="--jpeg: skip the torchvision rows")
    p.add_argument("--only", default=None, help=f"comma-separated paths to run, of {', '.join(PATHS)} (default: all; "
                                                 f"with --only the calling-thread baseline is skipped)")
    p.add_argument("--out", type=Path, default=None, help="write the result as JSON here (default: not written)")
    args = p.parse_args(argv)
    unknown = sorted(set(args.only.split(",")) - set(PATHS)) if args.only else []
    if unknown:
        p.error(f"--only: unknown path(s) {', '.join(unknown)}; the paths are {', '.join(PATHS)}")

    kind = "jpeg" if args.jpeg else "png"
    folder = args.dir or Path(tempfile.gettempdir()) / f"frost-cifar10-{kind}-{args.n}"
    if args.jpeg:
        origin = make_jpeg_folder(folder, args.n)
        ds = pillow_ds = jpeg_dataset(folder)
        args.no_torch_pillow = True   # Pillow is the decoder already
    else:
        origin = make_png_folder(folder, args.n)
        files, labels = seed_png_files(folder / "train")
        if args.strategies:
            return run_strategies(args, files, origin, folder)
        ds, pillow_ds = ImageList(files, labels), PillowImageList(files, labels)
    workers = [int(w) for w in args.threads.split(",")]
    print(f"{len(ds)} {kind.upper()}s from {origin} in {folder}; batch {args.batch}; {os.cpu_count()} CPUs; "
          f"Python {platform.python_version()}")
    print(f"images/s: median of {args.repeats} epochs after the first, read by one loader (steady state); the "
          f"first epoch's seconds are printed apart. " + (
              "--persistent: worker processes (Frost's and PyTorch's) start in the first epoch only" if args.persistent
              else "Worker processes (Frost's and PyTorch's) start anew each epoch: every epoch includes their "
                   "start-up (--persistent keeps them)"))
    one_epoch(frost_loader(ds, args.batch, 4, "process", args.frost_context))  # the page cache, the fork server
    inline = ({"rate": None, "epoch_s": [], "first_s": None} if args.only else
              timed_epochs(frost_loader(ds, args.batch, 0), len(ds), args.repeats))
    print(f"frost, loading in the calling thread: {_cell(inline['rate'])} images/s")
    frost_gpu, torch_gpu = gpu_rows_available(args)
    gpu_ds = None if not frost_gpu else (DeviceJPEGList(ds.paths, ds.targets, size=JPEG_SIZE, decoder=args.decoder)
                                         if args.jpeg else DevicePNGList(ds.paths, ds.targets))
    if frost_gpu:  # load the kernels (and nvImageCodec)
        one_epoch(frost_loader(gpu_ds, args.batch, 4, "process" if args.jpeg else "thread", args.frost_context,
                               device="cuda"), sync=cuda_sync)
    print("delivered: frost threads/processes, torch, torch+Pillow: uint8 batches in host memory; "
          "frost GPU-decode, torch+.cuda(): uint8 batches on the GPU (synchronized each epoch)")
    print(f"{'workers':>7} {'frost threads':>13} {'frost procs':>11} {'torch img/s':>12} {'procs/torch':>11} "
          f"{'torch+Pillow img/s':>19} {'frost GPU-decode':>16} {'torch+.cuda()':>13} {'GPU ratio':>9} "
          f"{'torchvision':>11} {'torchvision GPU':>15}")
    rows = [measure_row(args, ds, pillow_ds, gpu_ds, w, frost_gpu, torch_gpu) for w in workers]
    scaling = scaling_of(rows)
    print_scaling(scaling)
    versions = _versions()
    if not args.no_torch:
        import torch
        versions["torch"] = torch.__version__
    result = {"benchmark": "loader", "images": len(ds), "format": kind, "source": origin, "batch_size": args.batch,
              "transform": JPEG_TRANSFORM if args.jpeg else "none (the decoded 32 x 32 images)",
              "repeats": args.repeats, "persistent_workers": args.persistent,
              "timing": "images/s over the median of the epochs after the first, one loader per path and worker "
                        "count; *_first_epoch_s: the first epoch (workers' start-up, caches)",
              "frost_process_context": args.frost_context or "forkserver",
              "torch_context": torch_context(frost_gpu) or "PyTorch's default (fork)", "cpus": os.cpu_count(),
              "platform": platform.platform(),
              "gil_enabled": getattr(sys, "_is_gil_enabled", lambda: True)(),
              "frost_inline_images_per_s": inline["rate"], "frost_inline_epoch_s": inline["epoch_s"],
              "frost_inline_first_epoch_s": inline["first_s"],
              "delivers": {"frost": "uint8 batches in host memory (CPU decode in threads)",
                           "frost_process": "uint8 batches in host memory (CPU decode in processes, shared memory)",
                           "torch": "uint8 batches in host memory (CPU decode in processes)",
                           "torch_pillow": "uint8 batches in host memory (plain Pillow decode in processes)",
                           "frost_gpu_decode": ("uint8 batches on the GPU (worker processes read the files and "
                                                "draw the windows; nvImageCodec decodes, Frost's kernels resize)"
                                                if args.jpeg else
                                                "uint8 batches on the GPU (threads read files, the GPU decodes)"),
                           "torch_cuda": "uint8 batches on the GPU (CPU decode in processes, pinned, .cuda())",
                           "torchvision": "--jpeg: uint8 CHW batches in host memory (torchvision.io decode and "
                                          "transforms.v2 in processes)",
                           "torchvision_gpu": "--jpeg: uint8 CHW batches on the GPU (processes read the files, "
                                              "torchvision.io.decode_jpeg(device='cuda') per batch, transforms.v2 "
                                              "per image on the GPU)"},
              "jpeg_decoder": args.decoder if args.jpeg else None,
              "rows": rows, "scaling": scaling, "versions": versions, "command": _command()}
    common.keep_result(args.out, result)
    return result


def measure_row(args, ds, pillow_ds, gpu_ds, w: int, frost_gpu: bool, torch_gpu: bool) -> dict:
    """One worker count: every path's steady images/s (None where skipped), printed as a table row, then the
    first epochs' seconds."""
    n, repeats, persistent = len(ds), args.repeats, args.persistent
    context = torch_context(frost_gpu)
    runs = {"frost": lambda: timed_epochs(frost_loader(ds, args.batch, w), n, repeats),
            "frost_process": lambda: timed_epochs(frost_loader(ds, args.batch, w, "process", args.frost_context,
                                                               persistent), n, repeats)}
    if not args.no_torch:
        runs["torch"] = lambda: timed_epochs(torch_loader(ds, args.batch, w, persistent, context=context), n,
                                             repeats)
    if not args.no_torch and not args.no_torch_pillow:
        runs["torch_pillow"] = lambda: timed_epochs(torch_loader(pillow_ds, args.batch, w, persistent,
                                                                 context=context), n, repeats)
    if frost_gpu:
        # DeviceJPEGList's workers do Python work per file (header, crop draws): processes; DevicePNGList's only read
        gpu_workers = ("process", args.frost_context, persistent) if args.jpeg else ("thread",)
        runs["frost_gpu_decode"] = lambda: timed_epochs(frost_loader(gpu_ds, args.batch, w, *gpu_workers,
                                                                     device="cuda"), n, repeats, sync=cuda_sync)
    if args.jpeg and not args.no_torch and not args.no_torchvision and has_torchvision():
        tv = TorchvisionJPEGs(ds.paths, ds.targets)
        runs["torchvision"] = lambda: timed_epochs(torch_loader(tv, args.batch, w, persistent, context=context), n,
                                                   repeats)
        if torch_gpu:
            tv_gpu = TorchvisionJPEGs(ds.paths, ds.targets, gpu=True)
            runs["torchvision_gpu"] = lambda: timed_epochs(
                torch_loader(tv_gpu, args.batch, w, persistent, context=context, collate_fn=bytes_collate,
                             worker_init_fn=torch_worker_init), n,
                repeats, to_gpu=torchvision_gpu_batch, sync=torch_sync)
    if torch_gpu:
        runs["torch_cuda"] = lambda: timed_epochs(torch_loader(ds, args.batch, w, persistent, pin_memory=True,
                                                               context=context), n, repeats, to_gpu=torch_to_gpu,
                                                  sync=torch_sync)
    errors: dict = {}
    if args.only:
        runs = {name: run for name, run in runs.items() if name in args.only.split(",")}
    got = {name: attempt(name, run, errors) for name, run in runs.items()}  # each loader is dropped after its run
    row = {"workers": w, "errors": errors}
    for name in PATHS:
        run = got.get(name)
        row[f"{name}_images_per_s"] = run["rate"] if run else None
        row[f"{name}_epoch_s"] = run["epoch_s"] if run else []
        row[f"{name}_first_epoch_s"] = run["first_s"] if run else None
    rate = {name: row[f"{name}_images_per_s"] for name in PATHS}
    print(f"{w:>7} {_cell(rate['frost']):>13} {_cell(rate['frost_process']):>11} {_cell(rate['torch']):>12} "
          f"{_ratio(rate['frost_process'], rate['torch']):>11} {_cell(rate['torch_pillow']):>19} "
          f"{_cell(rate['frost_gpu_decode']):>16} {_cell(rate['torch_cuda']):>13} "
          f"{_ratio(rate['frost_gpu_decode'], rate['torch_cuda']):>9} {_cell(rate['torchvision']):>11} "
          f"{_cell(rate['torchvision_gpu']):>15}", flush=True)
    print("        first epoch, s: " + ", ".join(f"{name} {run['first_s']:.2f}" for name, run in got.items() if run),
          flush=True)
    return row


def attempt(name: str, run, errors: dict) -> dict | None:
    """One path's run, or None where it fails (the error printed and kept in the row's JSON): the other paths' rows
    still come."""
    try:
        return run()
    except Exception as e:  # noqa: BLE001 - a benchmark row, reported and skipped
        errors[name] = f"{type(e).__name__}: {e}"
        print(f"        {name} failed: {errors[name]}", flush=True)
        return None


PATHS = ("frost", "frost_process", "torch", "torch_pillow", "frost_gpu_decode", "torch_cuda", "torchvision",
         "torchvision_gpu")


def _cell(rate: float | None) -> str:
    return f"{rate:,.0f}" if rate else "-"


def _ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}" if a and b else "-"


SCALED = {"frost_threads": "frost_images_per_s", "frost_processes": "frost_process_images_per_s",
          "torch": "torch_images_per_s", "torch_pillow": "torch_pillow_images_per_s"}


def scaling_of(rows: list[dict]) -> dict:
    """Per CPU path: {workers: images/s at that count over images/s at the smallest count measured}."""
    out = {}
    for name, field in SCALED.items():
        base = rows[0][field] if rows else None
        if base:
            out[name] = {str(r["workers"]): r[field] / base for r in rows if r[field]}
    return out


def print_scaling(scaling: dict) -> None:
    for name, ratios in scaling.items():
        first = next(iter(ratios), "?")
        print(f"scaling of {name} (steady-state images/s over {first} worker(s)): " +
              ", ".join(f"{w}: {r:.2f}x" for w, r in ratios.items()))


def _versions() -> dict:
    versions = {"python": platform.python_version(), "numpy": np.__version__, "pillow": Image.__version__,
                "frost": frost.__version__}
    for name in ("torchvision", "cupy", "nvidia.nvimgcodec"):
        try:
            versions[name] = importlib.import_module(name).__version__
        except Exception:  # noqa: BLE001 - not installed, or unable to load its libraries
            pass
    return versions


def _command() -> str:
    return " ".join(["python", "benchmarks/loader.py", *sys.argv[1:]])


# ---------------------------------------------------------------- --strategies
def idat_of(data: bytes) -> bytes:
    """The concatenated IDAT data of a PNG (a minimal parser: the read_zlib strategy)."""
    if data[:8] != PNG_SIGNATURE:
        raise ValueError("not a PNG")
    pos, parts = 8, []
    while pos < len(data):
        length, kind = struct.unpack_from(">I4s", data, pos)
        if kind == b"IDAT":
            parts.append(data[pos + 8:pos + 8 + length])
        elif kind == b"IEND":
            break
        pos += 12 + length
    return b"".join(parts)


def _read_zlib(path) -> bytes:
    return zlib.decompress(idat_of(read_file(path)))


def strategy_functions(files: list) -> dict:
    """name -> (function of one item, the items): every strategy covers the same images."""
    paths = [os.fspath(f) for f in files]
    blobs = [read_file(p) for p in paths]
    return {"pillow": (pillow_decode, paths), "frost": (read_png, paths),
            "frost_bytes": (lambda b: decode_png(b, "<memory>"), blobs),
            "read": (read_file, paths), "read_zlib": (_read_zlib, paths)}


def threaded_rate(fn, items: list, threads: int) -> float:
    """Images/s for `threads` plain threads each running fn over a strided share of items."""
    start = threading.Barrier(threads + 1)

    def work(k: int) -> None:
        start.wait()
        for item in items[k::threads]:
            fn(item)

    pool = [threading.Thread(target=work, args=(k,), daemon=True) for k in range(threads)]
    for t in pool:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    for t in pool:
        t.join()
    return len(items) / (time.perf_counter() - t0)


def run_strategies(args, files: list, origin: str, folder: Path) -> dict:
    counts = [int(w) for w in args.threads.split(",")]
    strategies = strategy_functions(files)
    reference = pillow_decode(files[0])
    if not np.array_equal(read_png(files[0]), reference):
        raise RuntimeError("loader: frost.data.png disagrees with Pillow on the first file")
    print(f"{len(files)} PNGs from {origin} in {folder}; median of {args.repeats}; {os.cpu_count()} CPUs; "
          f"Python {platform.python_version()}; images/s with N plain threads")
    print(f"{'threads':>7} " + " ".join(f"{name:>12}" for name in strategies))
    for fn, items in strategies.values():
        for item in items[:64]:
            fn(item)  # warm the page cache and lazy set-up
    rows = []
    for n in counts:
        row = {"threads": n}
        for name, (fn, items) in strategies.items():
            rates = [threaded_rate(fn, items, n) for _ in range(args.repeats)]
            row[name] = statistics.median(rates)
            row[name + "_runs"] = rates
        rows.append(row)
        print(f"{n:>7} " + " ".join(f"{row[name]:>12,.0f}" for name in strategies), flush=True)
    result = {"benchmark": "loader_strategies", "images": len(files), "source": origin, "repeats": args.repeats,
              "cpus": os.cpu_count(), "platform": platform.platform(),
              "gil_enabled": getattr(sys, "_is_gil_enabled", lambda: True)(),
              "switch_interval_s": sys.getswitchinterval(), "strategies": list(strategies), "rows": rows,
              "versions": _versions(), "command": _command()}
    common.keep_result(args.out, result)
    return result


if __name__ == "__main__":
    main()
