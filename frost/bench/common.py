"""Shared pieces of the benchmarks: the seed protocol, data arrays, statistics, environment facts, tables, JSON.

Frost's `frost bench` and the PyTorch opponent in benchmarks/ both use these, so their JSON files share one
schema that benchmarks/report.py reads.
"""
from __future__ import annotations

import argparse
import contextlib
import hashlib
import inspect
import io
import json
import math
import os
import platform
import shlex
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Iterable, Sequence

import numpy as np
from tqdm import tqdm

import frost
from frost.accel import conv_fprop_mma, conv_wgrad
from frost.backend import cudnn
from frost.data import CIFAR10
from frost.kernel import compile as kcompile
from frost import distributed as dist
from frost.backend import cuda as cuda_backend

SCHEMA = "frost-bench/1"

# The seed benchmark's protocol; both frameworks read it from here.
PROTOCOL = {
    "batch_size": 32,
    "steps": 20000,
    "lr": 1e-4,
    "betas": [0.9, 0.98],
    "eps": 1e-8,
    "weight_decay": 0.01,
    "scale": "uint8 / 255 (no normalization, no augmentation)",
    "shuffle": "each epoch, drop_last",
}

# The seed's test loader used batch 32 with drop_last: 312 full batches = 9,984 images.
SEED_TEST_IMAGES = 9984


def startup_counters() -> dict:
    """Where a Frost start-up goes: NVRTC compiles (seconds summed over threads; launch_wait_seconds: wall time
    launches waited for a cubin, compiled then or on the background threads; specialize_seconds: checking and
    generating kernels' C++, in the threads that asked for them), cuDNN graphs (building them,
    choosing their plans) and our convolution kernels' choices against cuDNN (weight gradients, forward: compiles
    and timings), all seconds of wall time except nvrtc_seconds."""
    return {"nvrtc_compiles": kcompile.stats["nvrtc_compiles"], "nvrtc_seconds": kcompile.stats["nvrtc_seconds"],
            "launch_waits": kcompile.stats["launch_waits"],
            "launch_wait_seconds": kcompile.stats["launch_wait_seconds"],
            "specialize_seconds": kcompile.stats["specialize_seconds"],
            "cudnn_graphs": cudnn.stats["graphs"], "cudnn_graph_seconds": cudnn.stats["graph_seconds"],
            "cudnn_tune_seconds": cudnn.stats["tune_seconds"],
            "cudnn_runtime_compiled_skipped": cudnn.stats["runtime_compiled_skipped"],
            "wgrad_choices": conv_wgrad.stats["choices"], "wgrad_choose_seconds": conv_wgrad.stats["choose_seconds"],
            "fprop_choices": conv_fprop_mma.stats["choices"],
            "fprop_choose_seconds": conv_fprop_mma.stats["choose_seconds"]}


def startup_delta(before: dict) -> dict:
    """What startup_counters() counted since `before` was taken."""
    return {k: round(v - before[k], 3) for k, v in startup_counters().items()}


def default_data_dir() -> Path:
    """Where `--data` points when not given: $FROST_CACHE/cifar10 or ~/.cache/frost/cifar10."""
    root = os.environ.get("FROST_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "frost")
    return Path(root) / "cifar10"


def parse_seeds(text: str) -> list[int]:
    """'0,1,2' -> [0, 1, 2]; '3' -> [3]."""
    try:
        seeds = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers like 0,1,2, got {text!r}") from None
    if not seeds:
        raise argparse.ArgumentTypeError("no seed given")
    return seeds


# ---------------------------------------------------------------- data


def load_cifar10_arrays(root, train: bool, download: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """CIFAR-10 as (images uint8 (N, 32, 32, 3) HWC RGB, labels int64 (N,)), read by frost.data.CIFAR10.

    Any layout the dataset class reads works (binary, python pickles, PNG folders, npz parts); root None reads
    the sample shipped inside the package (CIFAR10.sample).
    """
    ds = CIFAR10.sample(train) if root is None else _make_cifar10(CIFAR10, root, train, download)
    images, labels = _arrays_of(ds)
    images = np.ascontiguousarray(images, dtype=np.uint8)
    if images.ndim == 4 and images.shape[1] == 3 and images.shape[-1] != 3:
        images = np.ascontiguousarray(images.transpose(0, 2, 3, 1))
    if images.ndim != 4 or images.shape[1:] != (32, 32, 3):
        raise RuntimeError(f"CIFAR10 at {root}: expected images of shape (N, 32, 32, 3), got {images.shape}")
    return images, np.asarray(labels, dtype=np.int64).reshape(-1)


def _make_cifar10(cls, root, train: bool, download: bool):
    try:
        params = inspect.signature(cls).parameters
    except (TypeError, ValueError):
        params = {}
    if "download" in params:
        return cls(str(root), train=train, download=download)
    return cls(str(root), train=train)


def _arrays_of(ds) -> tuple[np.ndarray, np.ndarray]:
    """The whole dataset as arrays: from its attributes when it keeps them, else item by item."""
    for xs, ys in (("data", "targets"), ("images", "labels"), ("x", "y")):
        if hasattr(ds, xs) and hasattr(ds, ys):
            return _host(getattr(ds, xs)), _host(getattr(ds, ys))
    pairs = [ds[i] for i in range(len(ds))]
    return np.stack([_host(p[0]) for p in pairs]), np.array([int(_host(p[1])) for p in pairs])


def _host(a) -> np.ndarray:
    if hasattr(a, "numpy") and not isinstance(a, np.ndarray):
        return np.asarray(a.numpy())
    return np.asarray(a)


# ---------------------------------------------------------------- statistics


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (ddof=1; 0.0 for a single value)."""
    vals = [float(v) for v in values]
    if not vals:
        return float("nan"), float("nan")
    m = sum(vals) / len(vals)
    if len(vals) < 2:
        return m, 0.0
    return m, math.sqrt(sum((v - m) ** 2 for v in vals) / (len(vals) - 1))


SUMMARY_KEYS = ("acc_10k", "acc_9984", "train_time_s", "startup_s", "ms_per_step")


def summarize(runs: Iterable[dict]) -> dict:
    """{key: {"mean", "std", "n"}} over the per-seed runs, for every key in SUMMARY_KEYS they hold."""
    runs = list(runs)
    out = {}
    for key in SUMMARY_KEYS:
        vals = [r[key] for r in runs if r.get(key) is not None]
        if vals:
            m, s = mean_std(vals)
            out[key] = {"mean": m, "std": s, "n": len(vals)}
    return out


# ---------------------------------------------------------------- environment


def git_commit(start: Path | None = None) -> str | None:
    """$FROST_COMMIT when set (whoever copied the tree to a benchmark machine knows its commit better than a git
    folder that may have come along stale), else the checkout's commit hash with '-dirty' when tracked files
    changed, else None."""
    if os.environ.get("FROST_COMMIT"):
        return os.environ["FROST_COMMIT"]
    cwd = str(start or Path(__file__).resolve().parent)
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, timeout=10)
        if head.returncode != 0:
            return None
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=cwd,
                               capture_output=True, text=True, timeout=10)
        return head.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return None


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def versions(extra: dict | None = None) -> dict:
    """Python, NumPy and (where importable without cost) CuPy/torch versions."""
    out = {"python": platform.python_version(), "numpy": np.__version__}
    out["frost"] = frost.__version__
    for name in ("cupy", "torch"):
        mod = sys.modules.get(name)
        if mod is not None:
            out[name] = getattr(mod, "__version__", "?")
    out.update(extra or {})
    return out


def command_line() -> str:
    """The command as typed (argv joined), for the results table."""
    argv = list(sys.argv)
    repo = Path(__file__).resolve().parents[2]
    if argv and argv[0].endswith(("frost", "cli.py", "__main__.py")):
        argv[0] = "frost"
    elif argv and argv[0].endswith(".py"):
        script = Path(argv[0]).resolve()
        if script.is_relative_to(repo):  # as typed from the repository root, without this machine's paths
            argv[0:1] = ["python", str(script.relative_to(repo))]
    return " ".join(shlex.quote(a) for a in argv)


# ---------------------------------------------------------------- output


class Stopwatch:
    """Wall-clock timing that waits for the device first (pass a synchronize function for GPUs)."""

    def __init__(self, synchronize=None) -> None:
        self.synchronize = synchronize or (lambda: None)

    def now(self) -> float:
        self.synchronize()
        return time.perf_counter()


NVTX_STEPS = "FROST_NVTX_STEPS"  # set to 1: each timed training step inside an NVTX range named "step"


def step_range(timed: bool):
    """An NVTX range named "step" around a timed step when FROST_NVTX_STEPS=1, so that a profiler keeps only the
    steady steps (`ncu --nvtx --nvtx-include step/`; benchmarks/kernel_profile.py sums them); else nothing. NVTX is
    process-wide: CuPy's binding marks PyTorch's kernels too."""
    if not timed or os.environ.get(NVTX_STEPS) != "1":
        return contextlib.nullcontext()
    return _nvtx_range("step")


@contextlib.contextmanager
def _nvtx_range(name: str):
    nvtx = cuda_backend.cupy().cuda.nvtx
    nvtx.RangePush(name)
    try:
        yield
    finally:
        nvtx.RangePop()


def seconds_per_call(fn: Callable[[], object], synchronize: Callable[[], object], iters: int, warmup: int) -> float:
    """The mean wall time of `iters` calls of fn after `warmup` untimed ones, the device synchronized before each
    clock read only: the calls queue back to back, as in a training loop."""
    _check_iters("seconds_per_call", iters)
    for _ in range(warmup):
        fn()
    watch = Stopwatch(synchronize)
    t0 = watch.now()
    for _ in range(iters):
        fn()
    return (watch.now() - t0) / iters


def steady_seconds_per_call(fn: Callable[[], object], synchronize: Callable[[], object], iters: int,
                            warmup: int, repeats: int = 3) -> float:
    """The time one more call adds to a queue of back-to-back calls: (T(2 iters) - T(iters)) / iters, T the wall time
    of that many calls between two device synchronizations, after `warmup` untimed ones. The difference leaves out
    what a timed loop pays once (the first call's host time, before the device has work, and the synchronization),
    which seconds_per_call spreads over its calls: with 5 calls of 1 ms on the device and 0.3 ms of host time each,
    6 %. A kernel's time where the host keeps ahead of the device; the host's time a call where it does not. The
    median of `repeats` such differences: one pause of the host (a collection, another process) inside the shorter
    run made a single difference negative (-12.1 ms for a 0.25 ms kernel, H100, 2026-12-07)."""
    _check_iters("steady_seconds_per_call", iters)
    for _ in range(warmup):
        fn()
    watch = Stopwatch(synchronize)

    def timed(n: int) -> float:
        t0 = watch.now()
        for _ in range(n):
            fn()
        return watch.now() - t0

    def difference() -> float:
        once = timed(iters)
        return (timed(2 * iters) - once) / iters
    return statistics.median(difference() for _ in range(repeats))


def _check_iters(what: str, iters: int) -> None:
    if iters < 1:
        raise ValueError(f"{what}: iters (the timed calls, --iters) must be at least 1, got {iters}")


def require_cuda(script: str) -> None:
    """Stop a script that times CUDA kernels, in words, where there is no GPU to run them on."""
    if not cuda_backend.is_available():
        raise SystemExit(f"{script} times CUDA kernels: it needs an NVIDIA GPU with CuPy (frost.cuda.is_available() "
                         f"is False here)")


def format_table(rows: list[list[str]], header: list[str]) -> str:
    """A plain-text table with aligned columns."""
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]
    line = lambda cells: "  ".join(str(c).rjust(w) if i else str(c).ljust(w)  # noqa: E731
                                   for i, (c, w) in enumerate(zip(cells, widths)))
    sep = "  ".join("-" * w for w in widths)
    return "\n".join([line(header), sep] + [line(r) for r in rows])


def results_table(result: dict) -> str:
    """Per seed: accuracy over 10k and 9,984 images, train time, start-up; then mean +- std."""
    def cell(value, scale: float, fmt: str) -> str:
        return "-" if value is None else f"{scale * value:{fmt}}"

    columns = [("acc_10k", 100, ".2f"), ("acc_9984", 100, ".2f"), ("train_time_s", 1, ".2f"),
               ("ms_per_step", 1, ".3f"), ("startup_s", 1, ".2f")]
    header = ["seed", "acc 10k %", "acc 9984 %", "train s", "ms/step", "start-up s"]
    rows = [[str(r["seed"])] + [cell(r.get(k), scale, fmt) for k, scale, fmt in columns] for r in result["runs"]]
    s = result["summary"]
    if len(result["runs"]) > 1:
        rows.append(["mean +- std"] + [
            f"{cell(s[k]['mean'], scale, fmt)} +- {cell(s[k]['std'], scale, fmt)}" if k in s else "-"
            for k, scale, fmt in columns])
    title = (f"{result['framework']} {result['mode']} {result['precision']} on {result['device_name']} "
             f"({result['protocol']['steps']} steps, batch {result['protocol']['batch_size']})")
    return title + "\n" + format_table(rows, header)


def write_json(path, result: dict) -> None:
    """Write the result atomically (a temporary file, then a rename); no temporary file is left when that fails."""
    path = Path(path)
    if path.parent and not path.parent.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.write_text(json.dumps(result, indent=1) + "\n")
        os.replace(tmp, path)
    except BaseException:  # an interrupt too: a stray PATH.tmp next to the results would only confuse
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        raise


def keep_result(out, result: dict) -> None:
    """A benchmark script's result as JSON at `out` (its --out); without one nothing is written (the tables it
    printed are the report) and a line says how to keep the result."""
    if out is None:
        print("(the result was not written: pass --out FILE.json to keep it)")
        return
    write_json(out, result)
    print(f"written to {out}")


def check_output_path(option: str, path) -> None:
    """Refuse an output path that cannot become a file (an existing folder, or a parent that is a file or cannot
    be written into) before anything runs, rather than losing a trained run to an error when writing it."""
    if path is None:
        return
    path = Path(path)
    if path.is_dir():
        raise SystemExit(f"frost bench: {option} {path} is a folder; give a file path, e.g. {path / 'result.json'}")
    folder = _nearest_existing(path.parent)
    if not folder.is_dir():
        raise SystemExit(f"frost bench: {option} {path}: {folder} is a file, not a folder; choose another path")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise SystemExit(f"frost bench: {option} {path}: cannot write into {folder}; choose another path")


def _nearest_existing(path: Path) -> Path:
    """`path` or its nearest ancestor that exists (the folder that the missing ones would be created in)."""
    path = path.absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def new_result(framework: str, mode: str, precision: str, device: str, device_name: str,
               steps: int, seeds: list[int], extra_versions: dict | None = None) -> dict:
    """The skeleton of a result file; `runs` and `summary` are filled as seeds finish."""
    return {
        "schema": SCHEMA,
        "benchmark": "resnet-cifar10",
        "framework": framework,
        "mode": mode,
        "precision": precision,
        "device": device,
        "device_name": device_name,
        "host": platform.node(),
        "cpu": cpu_name(),
        "commit": git_commit(),
        "command": command_line(),
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "versions": versions(extra_versions),
        "protocol": dict(PROTOCOL, steps=steps),
        "seeds": seeds,
        "runs": [],
        "summary": {},
    }


# ---------------------------------------------------------------- the seed's PNG layout

CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")


def is_png_folder(root) -> bool:
    """True when `root` holds the PNG layout: train/<index>_<class>.png and test/<index>_<class>.png."""
    root = Path(root)
    return any((root / "train").glob("*.png")) and any((root / "test").glob("*.png"))


def write_png_folder(dest, splits: dict, digest: str | None = None) -> Path:
    """Write {"train": (images, labels), "test": (...)} as dest/<split>/<index>_<class>.png (lossless), replacing
    what those split folders held.

    A file COMPLETE, written last, marks a finished folder and records `digest` (default: arrays_digest(splits)),
    which png_folder_for compares to reuse the folder only for the same data.
    """
    from concurrent.futures import ThreadPoolExecutor
    from PIL import Image
    dest = Path(dest)
    digest = digest or arrays_digest(splits)
    (dest / "COMPLETE").unlink(missing_ok=True)  # first: a rewrite interrupted halfway is not complete
    for split, (images, labels) in splits.items():
        shutil.rmtree(dest / split, ignore_errors=True)  # an older copy's extra images must not stay
        (dest / split).mkdir(parents=True, exist_ok=True)

        def save(i: int, images=images, labels=labels, split=split) -> None:
            name = dest / split / f"{i}_{CLASSES[int(labels[i])]}.png"
            Image.fromarray(np.asarray(images[i], dtype=np.uint8)).save(name)

        with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
            list(pool.map(save, range(len(images))))
    (dest / "COMPLETE").write_text(f"written by frost.bench.common.write_png_folder\ndigest {digest}\n")
    return dest


def arrays_digest(splits: dict) -> str:
    """A SHA-256 of every split's arrays (names, dtypes, shapes and all bytes). Hashing all the bytes costs about
    0.1 s for CIFAR-10's 50,000 images, cheap next to loading them, and no changed pixel goes unnoticed."""
    h = hashlib.sha256()
    for split in sorted(splits):
        for a in splits[split]:
            a = np.ascontiguousarray(a)
            h.update(f"{split} {a.dtype.str} {a.shape}\n".encode())
            h.update(memoryview(a).cast("B"))
    return h.hexdigest()


def png_copy_digest(dest) -> str | None:
    """The digest a complete PNG copy at `dest` was written from; None when there is none (or it predates
    digests)."""
    try:
        lines = (Path(dest) / "COMPLETE").read_text().splitlines()
    except OSError:
        return None
    return next((line.split(" ", 1)[1] for line in lines if line.startswith("digest ")), None)


def png_folder_for(data_root, x_train, y_train, x_test, y_test) -> Path:
    """The seed's PNG layout of this data: `data_root` itself when it is one, else a copy in the cache (named
    after data_root's path), written from the given arrays, and written again when they are not the ones it
    was written from (the data at that path was re-generated or re-downloaded)."""
    data_root = Path(data_root)
    if is_png_folder(data_root):
        return data_root
    tag = hashlib.sha1(str(data_root.resolve()).encode()).hexdigest()[:10]
    dest = default_data_dir().parent / f"cifar10-png-{tag}"
    splits = {"train": (x_train, y_train), "test": (x_test, y_test)}
    digest = arrays_digest(splits)
    if png_copy_digest(dest) != digest:
        print(f"writing the PNG layout of {data_root} to {dest} (once for this data)")
        write_png_folder(dest, splits, digest)
    return dest


def read_png_index(root, split: str) -> list[tuple[Path, int]]:
    """(path, label) of every PNG in root/<split>, in index order."""
    files = []
    for path in (Path(root) / split).glob("*.png"):
        index, _, name = path.stem.partition("_")
        files.append((int(index), path, CLASSES.index(name)))
    files.sort()
    return [(p, label) for _, p, label in files]


def progress_logger(bar, curve: list, warmup: int, batch_size: int):
    """log(i, loss, t_begin): record step i's loss on the curve and show loss and images/s on the progress bar
    (the rate counts the steps after the warm-up ones, from t_begin)."""
    def log(i: int, loss, t_begin: float) -> None:
        value = float(loss.item())
        curve.append([i + 1, value])
        elapsed = time.perf_counter() - t_begin
        done = i + 1 - warmup
        rate = done * batch_size / elapsed if elapsed > 0 and done > 0 else 0.0
        advance(bar, i + 1, loss=f"{value:.4f}", img_s=f"{rate:,.0f}")
    return log


def advance(bar, step: int, **postfix: str) -> None:
    """Move a progress bar to `step`, with new postfix values first, so that a plain progress line (stderr not a
    terminal) shows this step's values."""
    if postfix:
        bar.set_postfix(**postfix, refresh=False)
    bar.update(step - bar.n)


PROGRESS_LINE_EVERY_S = 10.0


def progress_bar(total: int, desc: str, disable: bool = False, stream=None):
    """Training progress on stderr: tqdm's bar on a terminal; elsewhere (a log file, a pipe) plain lines, one every
    PROGRESS_LINE_EVERY_S seconds and one at the end, instead of a carriage-return update at every refresh."""
    stream = sys.stderr if stream is None else stream
    if stream.isatty():
        return tqdm(total=total, desc=desc, unit="step", disable=disable, dynamic_ncols=True, file=stream)
    return PlainProgress(total, desc, disable, stream)


class PlainProgress:
    """tqdm's update / set_postfix / close for a stream that is not a terminal: whole lines like
    `seed 0: step 120/400 (30%), loss 2.0153, img_s 1,210, 12 s`, at most one every `every_s` seconds, plus the
    first and the last."""

    def __init__(self, total: int, desc: str, disable: bool = False, stream=None,
                 every_s: float = PROGRESS_LINE_EVERY_S) -> None:
        self.total, self.desc, self.disable, self.every_s = total, desc, disable, every_s
        self.stream = sys.stderr if stream is None else stream
        self.n, self.postfix, self.printed_n = 0, {}, None
        self.t_start = self.t_printed = time.perf_counter()

    def set_postfix(self, refresh: bool = True, **values) -> None:
        self.postfix = values

    def update(self, n: int = 1) -> None:
        self.n += n
        now = time.perf_counter()
        if self.printed_n is None or self.n >= self.total or now - self.t_printed >= self.every_s:
            self.print_line(now)

    def close(self) -> None:
        if self.printed_n != self.n:  # a run stopped early: its last step
            self.print_line(time.perf_counter())

    def print_line(self, now: float) -> None:
        self.printed_n, self.t_printed = self.n, now
        if self.disable:
            return
        share = f" ({100 * self.n / self.total:.0f}%)" if self.total else ""
        values = "".join(f", {k} {v}" for k, v in self.postfix.items())
        print(f"{self.desc}: step {self.n}/{self.total}{share}{values}, {now - self.t_start:.0f} s",
              file=self.stream, flush=True)


# ---------------------------------------------------------------- --nproc-per-node: one benchmark, N processes

DATA_PARALLEL_VARIABLE = "FROST_BENCH_DATA_PARALLEL"  # set in the processes that --nproc-per-node starts


def add_data_parallel_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument("--nproc-per-node", type=int, default=None,
                   help="data-parallel processes (frost run; DistributedDataParallel): each trains one batch of a "
                        "global batch N times larger; rank 0 reports. 1 runs the data-parallel path in one "
                        "process (its cost against no DDP: the gradient averaging is skipped)")
    p.add_argument("--scaling-baseline", type=Path, default=None, metavar="JSON",
                   help="with --nproc-per-node and --out: the result (--out) of the same benchmark in one process; "
                        "adds the throughput ratio and the scaling efficiency (ratio / N) to the result")


def check_data_parallel_arguments(args: argparse.Namespace) -> None:
    """--scaling-baseline compares an N-process run with one process's: it needs --nproc-per-node."""
    if getattr(args, "scaling_baseline", None) is not None and args.nproc_per_node is None:
        raise SystemExit("frost bench: --scaling-baseline needs --nproc-per-node N (the run it compares with one "
                         "process's)")


def processes(args: argparse.Namespace) -> int:
    """The number of training processes: --nproc-per-node, 1 without it."""
    return getattr(args, "nproc_per_node", None) or 1


def is_data_parallel() -> bool:
    """Whether this process is a rank of a --nproc-per-node run (its model is wrapped in DistributedDataParallel)."""
    return dist.is_initialized()


def data_parallel_rank() -> tuple[int, int]:
    """(rank, world size) inside a --nproc-per-node run, (0, 1) otherwise."""
    if not dist.is_initialized():
        return 0, 1
    return dist.get_rank(), dist.get_world_size()


def run_data_parallel(args: argparse.Namespace, run_here: Callable[..., dict]) -> dict:
    """--nproc-per-node N: from the command, this same command in N processes through frost run, returning rank
    0's JSON (--out); inside one of them, `run_here(args, ...)` as a rank: rank 0 finds (or downloads) the data
    first, then calls data_ready() (a barrier the others wait at), shows progress and reports; the others train
    silently (report=False)."""
    if not os.environ.get(DATA_PARALLEL_VARIABLE):
        baseline = read_baseline(args)
        result = _relaunch(args)
        return result if baseline is None else add_scaling(args, baseline)
    dist.init_process_group()
    try:
        if dist.get_rank() == 0:
            return run_here(args, data_ready=dist.barrier)
        args.quiet, args.out = True, None
        dist.barrier()
        with contextlib.redirect_stdout(io.StringIO()):
            return run_here(args, report=False)
    finally:
        dist.destroy_process_group()


THROUGHPUT_KEYS = ("images_per_s", "tokens_per_s")  # each benchmark's throughput per run, whichever it reports


def mean_throughput(result: dict, where: str) -> tuple[str, float]:
    """(key, mean over runs) of the throughput a benchmark result reports; `where` names it in errors."""
    runs = result.get("runs") or []
    for key in THROUGHPUT_KEYS:
        values = [run[key] for run in runs if run.get(key)]
        if values:
            return key, sum(values) / len(values)
    raise SystemExit(f"frost bench: {where} has no runs with a throughput ({' or '.join(THROUGHPUT_KEYS)})")


def scaling(result: dict, baseline: dict, world_size: int, where: str = "the baseline") -> dict:
    """The N-process result's throughput against one process's: the ratio and the efficiency (ratio / N)."""
    key, many = mean_throughput(result, "the data-parallel result")
    base_key, one = mean_throughput(baseline, where)
    if base_key != key or baseline.get("benchmark") != result.get("benchmark") or _processes_of(baseline) != 1:
        raise SystemExit(f"frost bench: {where} is not a one-process result of the same benchmark "
                         f"({baseline.get('benchmark')!r} on {_processes_of(baseline)} processes)")
    return {"throughput_key": key, "world_size": world_size, "throughput": many, "baseline_throughput": one,
            "ratio": many / one, "efficiency": many / (one * world_size)}


def _processes_of(result: dict) -> int:
    """The processes a result was trained on (resnet-cifar10 says world_size, gpt its protocol's processes)."""
    return result.get("world_size") or result.get("protocol", {}).get("processes") or 1


def read_baseline(args: argparse.Namespace) -> dict | None:
    """--scaling-baseline's result, read before the run so that a wrong path fails at once."""
    if getattr(args, "scaling_baseline", None) is None:
        return None
    if not args.out:
        raise SystemExit("frost bench: --scaling-baseline needs --out (the result it is added to)")
    try:
        return json.loads(Path(args.scaling_baseline).read_text())
    except (OSError, ValueError) as e:
        raise SystemExit(f"frost bench: --scaling-baseline {args.scaling_baseline}: {e}") from None


def add_scaling(args: argparse.Namespace, baseline: dict) -> dict:
    """--scaling-baseline: the scaling of the run just written to --out, added to it and printed."""
    result = json.loads(Path(args.out).read_text())
    result["scaling"] = scaling(result, baseline, args.nproc_per_node, str(args.scaling_baseline))
    write_json(args.out, result)
    s = result["scaling"]
    print(f"scaling over {s['world_size']} processes: {s['ratio']:.2f}x one process's {s['throughput_key']}, "
          f"efficiency {100 * s['efficiency']:.1f} %")
    return result


def _relaunch(args: argparse.Namespace) -> dict:
    command = [sys.executable, "-m", "frost.distributed.run", "--nproc-per-node", str(args.nproc_per_node),
               "-m", "frost", *args.command_line]
    done = subprocess.run(command, env=dict(os.environ, **{DATA_PARALLEL_VARIABLE: "1"}))
    if done.returncode != 0:
        raise SystemExit(f"frost bench: the {args.nproc_per_node} data-parallel processes failed (status "
                         f"{done.returncode}; their output is above)")
    return json.loads(Path(args.out).read_text()) if args.out else {}
