"""`frost bench resnet-cifar10`: the seed ResNet trained on CIFAR-10 with AdamW at batch 32, timed over seeds.

The protocol is the seed benchmark's: images scaled to [0, 1] (no normalization, no augmentation),
batch 32 shuffled each epoch with drop_last, AdamW(lr=1e-4, betas=(0.9, 0.98), eps=1e-8,
weight_decay=0.01), then test accuracy over all 10,000 test images and over the first 9,984 (the seed's
test loader dropped the last partial batch). Train time is the wall clock of the training steps after the
warm-up steps; start-up is data loading, model build and the warm-up (or capture) steps.

The data: --data DIR, else the cache (~/.cache/frost/cifar10, or $FROST_CACHE/cifar10), downloaded there when
empty. Without it (no network, or no GPU to run the full protocol on) the run uses the small CIFAR-10 sample
shipped inside the package (2,000 training and 500 test images), and its defaults become a short run (one seed,
200 steps, about a minute on a 2-core CPU): a smoke run that shows the whole pipeline, not a result. On a CPU that
nobody asked for (no GPU, no --device), the full data with the full protocol's steps is refused: it takes hours.
"""
from __future__ import annotations

import argparse
import contextlib
import itertools
import os
import time
import zipfile
from pathlib import Path

import numpy as np

import frost
import frost.backends
import frost.nn.functional as F
from frost import backend
from frost.autocast import autocast
from frost.data import DataLoader, DevicePNGList, ImageList
from frost.data.cifar import seed_png_files
from frost.models.resnet import cifar_resnet
from frost.optim import AdamW
from frost.tensor import Tensor
from frost.backend import cuda as cuda_backend
from frost.bench import common
from frost.data import cifar
from frost.data.transforms import gather_scaled
from frost.io import expand_path, read_npy, read_npz
from frost.nn.parallel import DistributedDataParallel

LOADER_WAIT_THRESHOLD_S = 2e-4  # a fetch slower than this counts as a step that waited for data
# the loader pipeline's default worker processes: on a 16-core H100 host, CIFAR-like PNGs, 4,000 steps (59f070b):
# 4 / 8 / 12 processes 0.590 / 0.559 / 0.557 ms a step against the resident pipeline's 0.545; 3 threads with the GPU
# decoding 0.880 (85 % of the steps waited for data)
LOADER_WORKERS = 8
FULL_SEEDS = [0, 1, 2]
# the embedded sample's short run: one seed, and the steps that take about a minute on a 2-core CPU (0.27 s a step
# on an idle 2-core AMD EPYC, plus a few seconds of start-up and the evaluation of its 500 test images)
SAMPLE_STEPS = 200
SAMPLE_SEEDS = [0]
CPU_STEP_S = 0.27  # a step on that 2-core CPU, for the warning before a run of hours
DOWNLOAD_TIMEOUT_S = 10  # offline, the download fails within this (connection and each read)


def add_memory_format_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument("--memory-format", choices=["nchw", "channels_last"], default=None,
                   help="activations and convolution weights in NCHW or channels-last (NHWC) memory "
                        "(default: channels_last on cuda, where cuDNN's tensor-core kernels want it; nchw on cpu)")


def resolve_memory_format(args: argparse.Namespace, device: str) -> bool:
    """Fill in --memory-format's default for the device; whether the model is channels-last."""
    if args.memory_format is None:
        args.memory_format = "channels_last" if device == "cuda" else "nchw"
    return args.memory_format == "channels_last"


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_data_arguments(p)
    p.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    p.add_argument("--pipeline", choices=["resident", "loader"], default="resident",
                   help="resident: the uint8 dataset held on the device; loader: frost.data.DataLoader workers "
                        "reading the seed's PNG files")
    p.add_argument("--workers", type=int, default=min(LOADER_WORKERS, usable_cpus()),
                   help="DataLoader workers (loader pipeline; default: 8, or the CPUs this process may use when "
                        "fewer)")
    p.add_argument("--worker-type", choices=["thread", "process"], default=None,
                   help="loader pipeline: DataLoader worker processes handing batches over in shared memory (they "
                        "decode where the GIL does not serialize them; the default with --decode cpu), or threads "
                        "(the default and the only choice with --decode device)")
    p.add_argument("--prefetch-to-device", type=int, default=4,
                   help="loader pipeline on cuda: batches copied (and decoded) on the GPU ahead of the step, "
                        "counting the one in use (DataLoader's prefetch_to_device)")
    p.add_argument("--decode", choices=["cpu", "device"], default="cpu",
                   help="loader pipeline: where PNGs are decoded (cpu: the workers decode; device: the workers read "
                        "the files and the GPU inflates and unfilters them, frost.data.DevicePNGList; on the CPU "
                        "both decode on the CPU)")
    add_memory_format_argument(p)
    p.add_argument("--jit", choices=["on", "off"], default="on",
                   help="capture the step into a CUDA graph with frost.jit (cuda only; default on)")
    p.add_argument("--warmup-steps", type=int, default=None,
                   help="training steps counted as start-up, not train time (default: 1, or 3 with jit)")
    p.add_argument("--eval-batch", type=int, default=500, help="batch size for the test-set evaluation")
    p.add_argument("--tf32", choices=["on", "off"], default="on",
                   help="float32 convolutions and matmuls on TF32 tensor cores (frost.backends.allow_tf32; cuda)")
    p.add_argument("--streams", type=Path, default=None,
                   help="train from given random streams: the initial weights and per-epoch orders that "
                        "benchmarks/torch_resnet_cifar10.py --save-streams DIR wrote for the same seeds (PyTorch's: "
                        "then only the two frameworks' arithmetic differs), or this command's --save-streams "
                        "(resident pipeline)")
    p.add_argument("--save-streams", type=Path, default=None, metavar="DIR",
                   help="write each seed's initial weights and per-epoch orders, as a run of it draws them, in "
                        "the files --streams reads, and train nothing (a weights file from one framework and the "
                        "orders file from the other tell which of the two moves an accuracy)")
    p.add_argument("--log-every", type=int, default=None,
                   help="loss-curve sample interval in steps (default: steps // 200, at least 1)")
    p.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    common.add_data_parallel_argument(p)


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity, a container's cpuset; not a CPU-time quota), where
    os.cpu_count() gives the host's."""
    affinity = getattr(os, "sched_getaffinity", None)
    return len(affinity(0)) if affinity is not None else os.cpu_count() or 1


def resolve_worker_type(args: argparse.Namespace, device: str) -> None:
    """--worker-type's default for the decode that runs: processes decode on the CPU; the GPU decode (--decode
    device on cuda) needs threads (its dataset learns the image size in the worker and decodes in the caller, which
    processes do not share). On the CPU every decode is the workers'."""
    gpu_decode = args.decode == "device" and device == "cuda"
    if args.worker_type is None:
        args.worker_type = "thread" if gpu_decode else "process"
    if args.pipeline == "loader" and args.worker_type == "process" and gpu_decode:
        raise SystemExit("frost bench: --decode device needs --worker-type thread (worker processes would learn the "
                         "PNG size where the GPU decode, in this process, cannot see it); or use --decode cpu")


def add_data_arguments(p: argparse.ArgumentParser) -> None:
    """--data, --sample, --steps, --seeds and --device, as every training benchmark takes them (--steps and --seeds
    default to None: their defaults depend on the data, see settle_defaults)."""
    p.add_argument("--data", type=Path, default=None,
                   help="CIFAR-10 folder in any layout frost.data.CIFAR10 reads (default: the cache, "
                        f"{common.default_data_dir()}, downloaded when empty; the embedded sample when that fails)")
    p.add_argument("--sample", action="store_true",
                   help="train on the CIFAR-10 sample inside the package (2,000 train / 500 test images), a short run")
    p.add_argument("--steps", type=int, default=None,
                   help=f"training steps (default {common.PROTOCOL['steps']}; {SAMPLE_STEPS} on the sample)")
    p.add_argument("--seeds", type=common.parse_seeds, default=None,
                   help="comma-separated (default 0,1,2; 0 on the sample)")
    p.add_argument("--device", choices=["cpu", "cuda"], default=None, help="default: cuda when available")


# ---------------------------------------------------------------- set-up


def resolve_device(name: str | None) -> str:
    """The device to run on (--device, else cuda when a GPU is visible), announced with the reason."""
    device, why = choose_device(name)
    note(f"device: {device} ({why})")
    return device


def choose_device(name: str | None) -> tuple[str, str]:
    """(device, why): --device's, else cuda when a GPU is visible, else cpu; --device cuda without a GPU is
    refused."""
    if name == "cpu":
        return "cpu", "--device cpu"
    missing = cuda_backend.unavailable_reason()
    if missing is None:
        return "cuda", device_name("cuda")
    if name == "cuda":
        raise SystemExit(f"frost bench: --device cuda, but {missing} (a GPU needs pip install 'frost-dl[cuda]' and "
                         f"an NVIDIA driver)")
    return "cpu", f"no GPU: {missing}"


def note(line: str) -> None:
    """A line about the run's set-up, printed at once (before minutes of training)."""
    print(line, flush=True)


def device_name(device: str) -> str:
    if device == "cuda":
        if hasattr(cuda_backend, "device_name"):
            return cuda_backend.device_name(0)
        props = cuda_backend.cupy().cuda.runtime.getDeviceProperties(0)
        return props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
    return common.cpu_name()


def synchronizer(device: str):
    if device == "cuda":
        return cuda_backend.synchronize
    return None


def _autocast(precision: str):
    """A context manager for the forward pass: nothing for fp32, frost.autocast(bfloat16) for bf16."""
    if precision == "fp32":
        return contextlib.nullcontext()
    return autocast(frost.bfloat16)


def jit_wrapper(enabled: bool, device: str):
    """frost.jit when asked for and on cuda; else None (eager)."""
    return frost.jit if enabled and device == "cuda" else None


def ensure_data(root: Path) -> Path:
    """--data's folder (`~` and $VARS expanded), refused when it does not exist."""
    folder = Path(expand_path(root))
    if not folder.exists():
        raise SystemExit(f"frost bench: --data {root} does not exist")
    return folder


def choose_data(args: argparse.Namespace, device: str) -> Path | None:
    """Where the data comes from: --data, the cache, a download into the cache, or None: the embedded sample
    (with --sample, or when the download fails, or when the full data could only serve a run of hours on an
    implicit CPU, which settle_defaults would refuse: then nothing is downloaded)."""
    if args.sample:
        return None
    if args.data is not None:
        return ensure_data(args.data)
    cache = common.default_data_dir()
    if cifar.find_layout(cache) is not None:
        return cache
    if runs_for_hours(args, device):
        note(f"no CIFAR-10 in {cache}, and no GPU for the full benchmark")
        return None
    note(f"downloading CIFAR-10 (170 MB) from {cifar.BINARY_URL} into {cache}")
    try:
        cifar.download_binary(cache, timeout=DOWNLOAD_TIMEOUT_S)
    except RuntimeError as e:
        note(f"no CIFAR-10 in {cache}, and the download failed ({download_failure(e)})")
        return None
    return cache


def download_failure(error: RuntimeError) -> str:
    """The cause of a failed download in a few words (the socket's error, or the MD5 mismatch)."""
    cause = error.__cause__
    reason = getattr(cause, "reason", cause)  # a URLError's reason is the socket error
    return str(reason) if reason is not None else str(error)


def runs_for_hours(args: argparse.Namespace, device: str) -> bool:
    """True for the full protocol's step count on a CPU nobody asked for (no GPU, no --device, no --steps)."""
    return device == "cpu" and args.device is None and args.steps is None


def settle_defaults(args: argparse.Namespace, root: Path | None, device: str, runs_per_seed: int = 1) -> None:
    """Fill in --steps and --seeds: the full protocol's on the full data (refused on an implicit CPU, where it takes
    hours), a short run's on the embedded sample (root None)."""
    if root is None:
        args.short_run = args.steps is None and args.seeds is None
        args.steps = SAMPLE_STEPS if args.steps is None else args.steps
        args.seeds = SAMPLE_SEEDS if args.seeds is None else args.seeds
        return
    args.short_run = False
    seeds = FULL_SEEDS if args.seeds is None else args.seeds
    if runs_for_hours(args, device):
        steps = common.PROTOCOL["steps"]
        hours = steps * len(seeds) * runs_per_seed * CPU_STEP_S / 3600
        hours = round(hours, 1) if hours < 10 else round(hours)
        raise SystemExit(f"frost bench: the full protocol ({steps:,} steps x {len(seeds)} seed(s)) on the CPU takes "
                         f"about {hours:g} hours on a 2-core CPU; pass --device cpu to run it anyway, --steps N "
                         f"for a shorter run, or --sample for a one-minute run on the embedded sample")
    args.steps = common.PROTOCOL["steps"] if args.steps is None else args.steps
    args.seeds = seeds


def announce_sample(args: argparse.Namespace, n_train: int, n_test: int) -> None:
    """Say that the run uses the embedded sample, and what it runs."""
    short = "a short run, " if args.short_run else ""
    seeds = f"{len(args.seeds)} seed" + ("s" if len(args.seeds) > 1 else "")
    note(f"using the embedded CIFAR-10 sample ({n_train:,} train / {n_test:,} test images): {short}{args.steps:,} "
         f"steps, {seeds}; pass --data DIR for the full benchmark")


def load_data(root: Path | None, device: str, pipeline: str, channels_last: bool = False) -> dict:
    """Test arrays (uint8 NCHW, int64 labels) and, for the resident pipeline, the training arrays, on the device
    (the training images as uint8 NHWC with channels_last: a gathered batch is then channels-last as it is), from
    `root` or (None) the embedded sample.

    The loader pipeline reads the seed's PNG layout: `root` when it is one, else a PNG copy written once.
    """
    x_train, y_train = common.load_cifar10_arrays(root, train=True)
    x_test, y_test = common.load_cifar10_arrays(root, train=False)
    check_split_sizes(root, len(x_train), len(x_test))
    data = {"n_train": len(x_train), "n_test": len(x_test),
            "x_test": np.ascontiguousarray(x_test.transpose(0, 3, 1, 2)), "y_test": y_test}
    if pipeline == "resident":
        data["x_train"] = np.ascontiguousarray(x_train if channels_last else x_train.transpose(0, 3, 1, 2))
        data["y_train"], data["x_train_nhwc"] = y_train, channels_last
    else:
        t0 = time.perf_counter()
        data["png_root"] = common.png_folder_for(root or cifar.SAMPLE_FILE, x_train, y_train, x_test, y_test)
        data["png_folder_s"] = time.perf_counter() - t0  # the one-time PNG copy, when this data had none yet
    if device == "cuda":
        dev = backend.Device("cuda")
        for k in ("x_train", "y_train", "x_test", "y_test"):
            if k in data:
                data[k] = backend.to_device(data[k], dev)
    return data


def check_split_sizes(root: Path, n_train: int, n_test: int) -> None:
    """Refuse data that cannot make one training batch or has no test image now, not after training (where the
    batches or the evaluation would fail, or the loader wait forever for a full batch)."""
    batch_size = common.PROTOCOL["batch_size"]
    if n_train < batch_size:
        raise SystemExit(f"frost bench: --data {root} holds {n_train} training images, fewer than one batch of "
                         f"{batch_size}; point --data at a CIFAR-10 folder with its training batches")
    if n_test == 0:
        raise SystemExit(f"frost bench: --data {root} holds no test images (its test split is empty); point --data "
                         f"at a CIFAR-10 folder with its test batch")


def check_sizes(args: argparse.Namespace) -> None:
    """Refuse step and evaluation sizes that cannot work, before any data is loaded."""
    if args.steps is not None and args.steps < 1:
        raise SystemExit("frost bench: --steps must be at least 1")
    if args.eval_batch < 1:
        raise SystemExit(f"frost bench: --eval-batch must be at least 1, got {args.eval_batch}")


def resident_batches(n: int, batch_size: int, device: str, orders=None):
    """Endless batch index tensors into the device-resident data: a fresh permutation each epoch (frost's
    generator, or the rows of `orders`, an (epochs, n) array of given permutations).

    Only the indices travel; the gather and the scaling to [0, 1] happen inside the step (see
    `make_step`), so with frost.jit they are part of the captured graph.
    """
    per_epoch = n // batch_size
    if per_epoch == 0:
        raise SystemExit(f"frost bench: {n} training images are fewer than one batch of {batch_size}")
    if orders is not None and orders.shape[1:] != (n,):
        raise SystemExit(f"frost bench: the given orders are permutations of {orders.shape[1:]} images; the "
                         f"training set has {n}")
    for epoch in itertools.count():
        if orders is None:
            perm = frost.randperm(n, device=device).data  # frost's generator, seeded by frost.manual_seed
        elif epoch < len(orders):
            perm = frost.tensor(orders[epoch].astype(np.int64), device=device).data
        else:
            raise SystemExit(f"frost bench: the given orders cover {len(orders)} epochs; the run needs more")
        for b in range(per_epoch):
            yield (Tensor(perm[b * batch_size:(b + 1) * batch_size]),)


def loader_batches(png_root: Path, batch_size: int, workers: int, seed: int, device: str, stats: dict,
                   decode: str = "cpu", prefetch_to_device: int = 4, worker_type: str = "process"):
    """Endless batches (uint8 NHWC images, int64 labels on the device) from frost.data.DataLoader over the seed's PNG
    files: worker threads or processes decode them, or threads read them for the GPU to decode (decode="device", on
    cuda). The scaling to [0, 1] is the step's (see on_loader_batches)."""
    files, labels = seed_png_files(Path(png_root) / "train")
    dataset = (DevicePNGList if decode == "device" else ImageList)(files, labels)
    loader = DataLoader(dataset, batch_size=batch_size, shuffle=True, drop_last=True, num_workers=workers, seed=seed,
                        device=device, prefetch_to_device=prefetch_to_device, worker_type=worker_type,
                        persistent_workers=worker_type == "process" and workers > 0)
    while True:
        it = iter(loader)
        while True:
            t0 = time.perf_counter()
            try:
                images, labels = next(it)
            except StopIteration:
                break
            waited = time.perf_counter() - t0
            stats["wait_s"] += waited
            stats["waited_steps"] += waited > LOADER_WAIT_THRESHOLD_S
            stats["fetches"] += 1
            yield _on_device(images, device), _as_labels(labels, device)


def _on_device(t, device: str):
    t = t if isinstance(t, Tensor) else Tensor(np.asarray(t))
    return t if str(t.device).split(":")[0] == device else t.to(device)


def _as_labels(y, device: str):
    t = _on_device(y, device)
    return t if t.dtype == frost.int64 else t.to(frost.int64)


def load_streams(folder: Path, seed: int) -> tuple[dict, np.ndarray]:
    """The initial weights and per-epoch orders a run of `seed` used (the --save-streams of
    benchmarks/torch_resnet_cifar10.py or of frost bench wrote them): NumPy files, read without pickle."""
    weights_file, orders_file = streams_files(folder, seed)
    for f in (weights_file, orders_file):
        if not f.is_file():
            raise SystemExit(f"frost bench: --streams: {f} is missing (write it with "
                             f"benchmarks/torch_resnet_cifar10.py --save-streams {folder} --seeds {seed})")
    try:
        weights, orders = read_npz(weights_file), read_npy(orders_file)
    except (ValueError, zipfile.BadZipFile) as e:
        raise SystemExit(f"frost bench: --streams: cannot read {weights_file} or {orders_file}: {e}")
    if orders.ndim != 2 or orders.dtype.kind not in "iu":
        raise SystemExit(f"frost bench: --streams: {orders_file} must hold an (epochs, images) integer array, got "
                         f"{orders.dtype} {orders.shape}")
    return weights, orders


def save_streams(folder: Path, seeds: list[int], n_train: int, steps: int, device: str) -> None:
    """Each seed's initial weights and the epoch orders its resident run draws (build_model, then one
    frost.randperm per epoch, as train_one_seed and resident_batches call them), as NumPy files."""
    for seed in seeds:
        weights = {k: np.asarray(v.numpy()) for k, v in build_model(seed, device).state_dict().items()}
        orders = [np.asarray(frost.randperm(n_train, device=device).numpy()) for _ in range(epochs_of(steps, n_train))]
        write_streams(folder, seed, weights, np.stack(orders))


def epochs_of(steps: int, n_train: int) -> int:
    """Epochs (batch 32, drop_last) that `steps` steps start."""
    return -(-steps // (n_train // common.PROTOCOL["batch_size"]))


def write_streams(folder: Path, seed: int, weights: dict, orders: np.ndarray) -> None:
    """A seed's initial weights (name -> array) and its (epochs, n) orders, in the files load_streams reads."""
    Path(folder).mkdir(parents=True, exist_ok=True)
    weights_file, orders_file = streams_files(folder, seed)
    np.savez(weights_file, **weights)
    np.save(orders_file, orders.astype(np.int32))
    print(f"seed {seed}: {weights_file.name} ({len(weights)} arrays), {orders_file.name} {orders.shape}")


def streams_files(folder: Path, seed: int) -> tuple[Path, Path]:
    """Where a seed's initial weights (.npz) and per-epoch orders (.npy) are kept under `folder`."""
    return Path(folder) / f"seed{seed}_weights.npz", Path(folder) / f"seed{seed}_orders.npy"


# ---------------------------------------------------------------- one seed


def rank_slices(batches, rank: int, batch_size: int):
    """Process `rank`'s batch_size indices of each global batch (every process draws the same permutations)."""
    for (idx,) in batches:
        yield (type(idx)(idx.data[rank * batch_size:(rank + 1) * batch_size]),)


def build(seed: int, device: str, channels_last: bool = False, weights: dict | None = None):
    """The seed ResNet and its AdamW, initialised from `seed` (or with the given state dict of arrays)."""
    model = build_model(seed, device, channels_last, weights)
    p = common.PROTOCOL
    opt = AdamW(model.parameters(), lr=p["lr"], betas=tuple(p["betas"]), eps=p["eps"],
                weight_decay=p["weight_decay"])
    return model, opt


def build_model(seed: int, device: str, channels_last: bool = False, weights: dict | None = None):
    """The seed ResNet (10 classes) on the device, initialised from `seed` or loaded from `weights` (a state dict
    of arrays), weights channels-last if asked."""
    frost.manual_seed(seed)
    model = cifar_resnet(num_classes=10)
    if weights is not None:
        model.load_state_dict(weights)
    if device != "cpu" or channels_last:
        model = model.to(device, memory_format=frost.channels_last if channels_last else None)
    return model


def make_step(model, opt, precision: str, jit, x_all=None, y_all=None, nhwc: bool = False, loader: bool = False):
    """The training step (forward, loss, backward, AdamW) as one function, captured by frost.jit if given.

    With resident data (x_all uint8 NCHW, or NHWC with nhwc=True for a channels-last model; y_all int64 on the
    device) the step takes the batch indices and gathers the batch itself; with loader=True it takes a loader's
    batch (uint8 NHWC images, labels) and scales it itself; otherwise it takes the float batch (x, y).
    """
    step = training_step(model, opt, precision)
    dtype = "bfloat16" if precision == "bf16" else "float32"
    if x_all is not None:
        step = on_resident_data(step, x_all, y_all, nhwc, dtype)
    elif loader:
        step = on_loader_batches(step, nhwc, dtype)
    return jit(step) if jit is not None else step


def float_logits(model, x, precision: str):
    """The model's logits for batch x, in float32 (the forward runs under autocast for bf16)."""
    with _autocast(precision):
        logits = model(x)
    return logits.float() if logits.dtype.name != "float32" else logits


def training_step(model, opt, precision: str):
    """train(x, y) -> loss: forward, cross-entropy, backward and one optimizer step."""

    def train(x, y):
        loss = F.cross_entropy(float_logits(model, x, precision), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss

    return train


def on_resident_data(fn, x_all, y_all, nhwc: bool = False, dtype: str = "float32"):
    """fn(x, y) as a function of batch indices into the resident data (x_all NCHW, or NHWC with nhwc=True): the
    gather and the scaling to [0, 1] happen inside, so with frost.jit they are part of the captured graph. On the
    GPU they are one kernel, whose output is already `dtype` (bfloat16: what autocast's first convolution would
    cast the float32 images to, the same rounding)."""

    def gather_and_call(idx):
        i = idx.data
        x = scaled(x_all[i]) if isinstance(x_all, np.ndarray) else gather_scaled(x_all, i, dtype)
        if nhwc:  # the NCHW view of NHWC images is channels-last, no copy
            x = x.transpose(0, 3, 1, 2)
        return fn(Tensor(x), Tensor(y_all[i]))

    return gather_and_call


def on_loader_batches(fn, nhwc: bool = False, dtype: str = "float32"):
    """fn(x, y) as a function of a loader's batch (uint8 NHWC images, labels): the images scaled to [0, 1] inside, by
    the resident pipeline's gather over the whole batch (on the GPU the same kernel, so both pipelines train on the
    same numbers and, with frost.jit, the scaling is part of the captured graph); NCHW copies unless nhwc."""
    whole_batch: dict = {}

    def scale_and_call(images, labels):
        a = images.data
        if isinstance(a, np.ndarray):
            x = scaled(a)
        else:
            if len(a) not in whole_batch:
                whole_batch[len(a)] = images.xp.arange(len(a))
            x = gather_scaled(a, whole_batch[len(a)], dtype)
        x = x.transpose(0, 3, 1, 2)  # the NCHW view of NHWC images is channels-last
        return fn(Tensor(x if nhwc else images.xp.ascontiguousarray(x)), labels)

    return scale_and_call


def scaled(images):
    """uint8 images (an array) as float32 in [0, 1]."""
    out = images.astype("float32")
    out /= 255.0
    return out


def evaluate(model, x_test, y_test, batch: int, precision: str) -> tuple[float, float]:
    """Accuracy over all test images and over the first 9,984 (the seed's drop_last test loader)."""
    model.eval()
    preds = []
    with frost.no_grad(), _autocast(precision):
        for i in range(0, len(x_test), batch):
            preds.append(model(Tensor(scaled(x_test[i:i + batch]))).argmax(dim=1).numpy())
    model.train()
    pred = np.concatenate(preds)
    labels = np.asarray(frost.Tensor(y_test).numpy())
    correct = pred == labels
    n = min(common.SEED_TEST_IMAGES, len(correct))
    return float(correct.mean()), float(correct[:n].mean())


def train_one_seed(args, seed: int, data: dict, device: str, data_load_s: float) -> dict:
    """Train one seed: start-up (build + warm-up steps), timed steps, evaluation. Returns the run's record."""
    sw = common.Stopwatch(synchronizer(device))
    weights, orders = load_streams(args.streams, seed) if args.streams else (None, None)
    counted = common.startup_counters() if device == "cuda" else None
    t_start = sw.now()
    jit = jit_wrapper(args.jit == "on", device)
    warmup = args.warmup_steps if args.warmup_steps is not None else (3 if jit is not None else 1)
    warmup = max(0, min(warmup, args.steps))
    log_every = args.log_every or max(1, args.steps // 200)
    batch_size = common.PROTOCOL["batch_size"]

    channels_last = args.memory_format == "channels_last"
    model, opt = build(seed, device, channels_last, weights)
    rank, world = common.data_parallel_rank()
    if common.is_data_parallel():
        model = DistributedDataParallel(model)
    t_built = sw.now()
    stats = {"wait_s": 0.0, "waited_steps": 0, "fetches": 0}
    if args.pipeline == "resident":
        step = make_step(model, opt, args.precision, jit, data["x_train"], data["y_train"], data["x_train_nhwc"])
        batches = rank_slices(resident_batches(len(data["x_train"]), batch_size * world, device, orders), rank,
                              batch_size)
    else:
        step = make_step(model, opt, args.precision, jit, nhwc=channels_last, loader=True)
        batches = loader_batches(data["png_root"], batch_size, args.workers, seed, device, stats, args.decode,
                                 args.prefetch_to_device, args.worker_type)

    curve: list[list[float]] = []
    bar = common.progress_bar(args.steps, f"seed {seed}", disable=args.quiet)

    log = common.progress_logger(bar, curve, warmup, batch_size)

    warmup_step_s = []  # jit: the first steps run eagerly (plans, choices, compiles), a later one captures
    for i in range(warmup):
        t_step = sw.now()
        loss = step(*next(batches))
        if i % log_every == 0 or i == args.steps - 1:
            log(i, loss, time.perf_counter())
        warmup_step_s.append(round(sw.now() - t_step, 3))
    t_timed = sw.now()
    startup_s = t_timed - t_start
    startup_detail = common.startup_delta(counted) if counted is not None else {}
    startup_detail["build_s"] = round(t_built - t_start, 3)
    startup_detail["warmup_step_s"] = warmup_step_s
    wait_before = (stats["wait_s"], stats["waited_steps"], stats["fetches"])
    for i in range(warmup, args.steps):
        with common.step_range(timed=True):
            loss = step(*next(batches))
        if i % log_every == 0 or i == args.steps - 1:
            log(i, loss, t_timed)
    t_end = sw.now()
    bar.close()

    train_s = t_end - t_timed
    timed = args.steps - warmup
    acc_10k, acc_9984 = evaluate(model, data["x_test"], data["y_test"], args.eval_batch, args.precision)
    run = {
        "seed": seed,
        "acc_10k": acc_10k,
        "acc_9984": acc_9984,
        "train_time_s": train_s,
        "steps_timed": timed,
        "warmup_steps": warmup,
        "ms_per_step": 1000 * train_s / timed if timed else None,
        "images_per_s": timed * batch_size * world / train_s if timed and train_s > 0 else None,
        "startup_s": data_load_s + startup_s,
        "setup_s": startup_s,
        "startup_detail": startup_detail,
        "data_load_s": data_load_s,
        "final_loss": curve[-1][1] if curve else None,
        "loss_every": log_every,
        "loss_curve": curve,
        "jit": jit is not None,
    }
    if args.pipeline == "loader":
        fetches = stats["fetches"] - wait_before[2]
        run["data_wait_s"] = stats["wait_s"] - wait_before[0]
        run["waited_share"] = (stats["waited_steps"] - wait_before[1]) / fetches if fetches else None
        run["wait_threshold_s"] = LOADER_WAIT_THRESHOLD_S
    return run


# ---------------------------------------------------------------- the command


def new_frost_result(mode: str, precision: str, device: str, steps: int, seeds: list[int]) -> dict:
    """common.new_result for Frost on this device (with CuPy's version on cuda)."""
    result = common.new_result("frost", mode, precision, device, device_name(device), steps, seeds)
    if device == "cuda":
        result["versions"]["cupy"] = cuda_backend.cupy().__version__
    return result


def load_into(result: dict, args: argparse.Namespace, root: Path | None, device: str, pipeline: str,
              channels_last: bool = False) -> tuple[dict, float]:
    """The data (see load_data) from `root` (None: the embedded sample) and the seconds its loading took, both noted
    in result; the sample is announced."""
    t0 = time.perf_counter()
    data = load_data(root, device, pipeline, channels_last)
    data_load_s = time.perf_counter() - t0
    if root is None:
        announce_sample(args, data["n_train"], data["n_test"])
    source = "embedded sample" if root is None else str(args.data) if args.data else "default cache"
    result.update({"data": source, "data_load_s": data_load_s, "n_train": data["n_train"], "n_test": data["n_test"]})
    if "png_folder_s" in data:
        result["png_folder_s"] = data["png_folder_s"]  # within data_load_s: writing the PNG copy, or finding it
    return data, data_load_s


def prepare(args: argparse.Namespace, runs_per_seed: int = 1) -> tuple[str, bool, Path | None, bool]:
    """(device, channels_last, data folder or None for the sample, jit on), said and settled as every training
    benchmark does: the device and why, the memory format, the data, the step and seed defaults."""
    device = resolve_device(args.device)
    channels_last = resolve_memory_format(args, device)
    root = choose_data(args, device)
    settle_defaults(args, root, device, runs_per_seed)
    return device, channels_last, root, jit_wrapper(args.jit == "on", device) is not None


def run(args: argparse.Namespace) -> dict:
    """Run the benchmark for every seed; print the table; write JSON when --out is given. Returns the result."""
    check_sizes(args)
    common.check_output_path("--out", args.out)
    if (args.streams or args.save_streams) and args.pipeline != "resident":
        raise SystemExit("frost bench: --streams and --save-streams need --pipeline resident (the loader draws its "
                         "own order)")
    if args.precision == "bf16":
        _autocast("bf16")  # fail early with a clear message when autocast is missing
    common.check_data_parallel_arguments(args)
    if args.nproc_per_node is not None:
        if args.pipeline != "resident" or args.streams or args.save_streams:
            raise SystemExit("frost bench: --nproc-per-node needs --pipeline resident, without --streams")
        return common.run_data_parallel(args, run_here)
    return run_here(args)


def run_here(args: argparse.Namespace, report: bool = True, data_ready=lambda: None) -> dict:
    """The benchmark in this process (one rank of several with --nproc-per-node)."""
    device, channels_last, root, jit_on = prepare(args)
    resolve_worker_type(args, device)
    data_ready()
    mode = args.pipeline + ("-jit" if jit_on else "-eager")
    result = new_frost_result(mode, args.precision, device, args.steps, args.seeds)
    result.update({"pipeline": args.pipeline, "workers": args.workers if args.pipeline == "loader" else None,
                   "worker_type": args.worker_type if args.pipeline == "loader" else None,
                   "prefetch_to_device": args.prefetch_to_device if args.pipeline == "loader" else None,
                   "decode": (args.decode if device == "cuda" else "cpu") if args.pipeline == "loader" else None,
                   "jit": jit_on, "eval_batch": args.eval_batch, "memory_format": args.memory_format,
                   "tf32": args.tf32 == "on", "streams": str(args.streams) if args.streams else None,
                   "world_size": common.processes(args),
                   "global_batch": common.processes(args) * common.PROTOCOL["batch_size"]})
    data, data_load_s = load_into(result, args, root, device, args.pipeline, channels_last)
    if args.save_streams:
        save_streams(args.save_streams, args.seeds, data["n_train"], args.steps, device)
        return result

    tf32_before, frost.backends.allow_tf32 = frost.backends.allow_tf32, args.tf32 == "on"
    try:
        for seed in args.seeds:
            result["runs"].append(train_one_seed(args, seed, data, device, data_load_s))
            result["summary"] = common.summarize(result["runs"])
            if args.out:
                common.write_json(args.out, result)  # partial results survive an interrupted run
    finally:
        frost.backends.allow_tf32 = tf32_before
    if not report:
        return result
    print(common.results_table(result))
    if root is None:
        print(f"(the embedded sample: accuracy over its {data['n_test']} test images after {args.steps:,} steps, a "
              f"smoke run, not comparable with the full benchmark's)")
    if args.out:
        print(f"results written to {args.out}")
    return result
