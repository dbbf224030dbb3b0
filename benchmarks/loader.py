"""Images per second decoding CIFAR-10 PNGs: Frost's DataLoader (threads) vs PyTorch's (processes).

    python benchmarks/loader.py                      # 10,000 PNGs, 1/2/4/8/16 workers, median of 3
    python benchmarks/loader.py --n 2000 --repeats 3 --threads 1,2,4

Makes a PNG folder in the seed's layout (`train/<index>_<class>.png`) from the shared CIFAR-10 npz
parts (random images when they are absent), then reads one epoch of it with each worker count:
both loaders use the same dataset object (frost.data.ImageList: Pillow decode -> uint8 HWC array per
item), the same batch size and no shuffling. Frost's workers are threads filling ping-pong buffers;
PyTorch's are processes (started anew each epoch, as without persistent_workers, unless
--torch-persistent) with its default collate. A run counts from iter() to the last batch. Prints a table and writes JSON to
benchmarks/results/loader.json.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
import warnings
from functools import partial
from pathlib import Path

import numpy as np
from PIL import Image

import frost
from frost.data import DataLoader, ImageList
from frost.data.cifar import CLASSES, seed_png_files
from frost.parallel import finish, spawn, split

HERE = Path(__file__).resolve().parent
SHARED = HERE.parent / ".." / "shared" / "data" / "cifar10"


def source_images(n: int) -> tuple[np.ndarray, np.ndarray, str]:
    """n CIFAR-10 training images and labels from the shared parts, or random ones."""
    if (SHARED / "train_x_a.npz").is_file():
        parts, have = [], 0
        for s in "abcde":
            if have >= n:
                break
            parts.append(np.load(SHARED / f"train_x_{s}.npz")["x"])
            have += len(parts[-1])
        x = np.concatenate(parts)[:n]
        if len(x) < n:
            raise SystemExit(f"loader: --n {n} is more than the {len(x)} shared training images")
        return x, np.load(SHARED / "train_y.npy")[:n].astype(np.int64), "shared CIFAR-10 train parts"
    rng = np.random.default_rng(0)
    return (rng.integers(0, 256, (n, 32, 32, 3), dtype=np.uint8), rng.integers(0, 10, n), "random images")


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


def epoch_frost(ds, batch: int, workers: int) -> int:
    seen = 0
    for x, _ in DataLoader(ds, batch_size=batch, num_workers=workers):
        seen += x.shape[0]
    return seen


_torch_loaders: dict = {}


def epoch_torch(ds, batch: int, workers: int, persistent: bool = False) -> int:
    import torch.utils.data
    warnings.filterwarnings("ignore", message="This DataLoader will create")  # more workers than cores
    loader = _torch_loaders.get(workers) if persistent else None
    if loader is None:
        loader = torch.utils.data.DataLoader(ds, batch_size=batch, num_workers=workers,
                                             persistent_workers=persistent and workers > 0)
        if persistent:
            _torch_loaders[workers] = loader
    seen = 0
    for x, _ in loader:
        seen += x.shape[0]
    return seen


def images_per_second(epoch, ds, batch: int, workers: int, repeats: int) -> tuple[float, list[float]]:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        seen = epoch(ds, batch, workers)
        times.append(time.perf_counter() - t0)
        if seen != len(ds):
            raise RuntimeError(f"loader: an epoch gave {seen} images, expected {len(ds)}")
    return len(ds) / statistics.median(times), times


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, default=10_000, help="images in the PNG folder")
    p.add_argument("--threads", default="1,2,4,8,16", help="worker counts, comma-separated")
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--dir", type=Path, default=None, help="where the PNG folder goes (default: a temp dir)")
    p.add_argument("--no-torch", action="store_true")
    p.add_argument("--torch-persistent", action="store_true",
                   help="keep PyTorch's worker processes across epochs (their start-up is then not timed)")
    p.add_argument("--out", type=Path, default=HERE / "results" / "loader.json")
    args = p.parse_args(argv)

    folder = args.dir or Path(tempfile.gettempdir()) / f"frost-cifar10-png-{args.n}"
    origin = make_png_folder(folder, args.n)
    files, labels = seed_png_files(folder / "train")
    ds = ImageList(files, labels)
    workers = [int(w) for w in args.threads.split(",")]
    print(f"{len(ds)} PNGs from {origin} in {folder}; batch {args.batch}; median of {args.repeats}; "
          f"{os.cpu_count()} CPUs; Python {platform.python_version()}")
    epoch_frost(ds, args.batch, 1)  # warm the page cache
    inline, inline_times = images_per_second(epoch_frost, ds, args.batch, 0, args.repeats)
    print(f"frost, loading in the calling thread: {inline:,.0f} images/s")
    print(f"{'workers':>7} {'frost img/s':>12} {'torch img/s':>12} {'frost/torch':>11}")
    rows = []
    torch_epoch = partial(epoch_torch, persistent=args.torch_persistent)
    for w in workers:
        f_rate, f_times = images_per_second(epoch_frost, ds, args.batch, w, args.repeats)
        t_rate, t_times = None, []
        if not args.no_torch:
            if args.torch_persistent:
                torch_epoch(ds, args.batch, w)  # start the workers outside the timing
            t_rate, t_times = images_per_second(torch_epoch, ds, args.batch, w, args.repeats)
        rows.append({"workers": w, "frost_images_per_s": f_rate, "torch_images_per_s": t_rate,
                     "frost_epoch_s": f_times, "torch_epoch_s": t_times})
        ratio = f"{f_rate / t_rate:.2f}" if t_rate else "-"
        t_cell = f"{t_rate:,.0f}" if t_rate else "-"
        print(f"{w:>7} {f_rate:>12,.0f} {t_cell:>12} {ratio:>11}", flush=True)
    versions = {"python": platform.python_version(), "numpy": np.__version__, "pillow": Image.__version__,
                "frost": frost.__version__}
    if not args.no_torch:
        import torch
        versions["torch"] = torch.__version__
    result = {"benchmark": "loader", "images": len(ds), "source": origin, "batch_size": args.batch,
              "repeats": args.repeats, "torch_persistent_workers": args.torch_persistent, "cpus": os.cpu_count(), "platform": platform.platform(),
              "gil_enabled": getattr(sys, "_is_gil_enabled", lambda: True)(),
              "frost_inline_images_per_s": inline, "frost_inline_epoch_s": inline_times,
              "rows": rows, "versions": versions, "command": " ".join(["python", "benchmarks/loader.py", *sys.argv[1:]])}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(result, indent=2))
    tmp.replace(args.out)
    print(f"wrote {args.out}")
    return result


if __name__ == "__main__":
    main()
