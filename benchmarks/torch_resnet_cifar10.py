"""The seed benchmark in PyTorch: the same CIFAR ResNet, data, protocol and JSON schema as `frost bench resnet-cifar10`.

Modes:
  eager           the seed's script: PNG files read by a torch DataLoader with 3 worker processes
  resident-eager  the uint8 dataset held on the device, batches gathered by a per-epoch permutation
  graphed         the whole step (batch gather, forward, backward, AdamW(fused, capturable)) captured in one
                  torch.cuda.CUDAGraph and replayed: the fastest PyTorch an expert writes (cuda only)
  compiled        torch.compile of the model, fused AdamW, resident data (cuda; cpu works but is slow)

    python benchmarks/torch_resnet_cifar10.py --mode graphed --data DIR --out results/torch_graphed.json
    python benchmarks/torch_resnet_cifar10.py --mode resident-eager --device cpu --steps 50 --seeds 0 --data DIR
    python benchmarks/torch_resnet_cifar10.py --save-streams STREAMS --data DIR   # then frost bench --streams STREAMS
    python benchmarks/torch_resnet_cifar10.py --mode graphed --nproc-per-node 2 --data DIR   # DDP on two GPUs

--nproc-per-node N (resident-eager, graphed, compiled): torch's DistributedDataParallel in N processes started by
`frost run` (benchmarks/torch_ddp.py: NCCL, or gloo on CPUs), each training its 32 images of every global batch of
32 N (every process draws the same permutations), as `frost bench resnet-cifar10 --nproc-per-node N` does. Graphed,
the whole step with its all-reduces is one CUDA graph (DDP built on a side stream, 11 eager steps before the
capture, as PyTorch's CUDA-graph notes ask). Each run of such a result says every rank's sum of weights at the end
(rank_weight_sums: equal when the ranks stayed in step).
"""
from __future__ import annotations

import argparse
import contextlib
import importlib.util
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

REPO = Path(__file__).resolve().parents[1]
REFERENCE_MODEL = REPO / "tests" / "nn" / "torch_resnet.py"
for folder in (REPO, REPO / "benchmarks"):   # frost, and torch_ddp beside this script
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))

import torch_ddp  # noqa: E402
from frost.bench import common  # noqa: E402  (data reading, statistics and the JSON schema are shared)

LOADER_WAIT_THRESHOLD_S = 2e-4
DDP_GRAPH_WARMUP = 11   # DDP in a CUDA graph: eager steps before the capture (PyTorch's CUDA-graph notes)


# ---------------------------------------------------------------- the model


def make_model(num_classes: int = 10) -> nn.Module:
    """The seed ResNet in PyTorch: tests/nn/torch_resnet.py's, the oracle Frost's model is tested against."""
    spec = importlib.util.spec_from_file_location("frost_torch_resnet_reference", REFERENCE_MODEL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.cifar_resnet(num_classes=num_classes)


# ---------------------------------------------------------------- data


class PngDataset(torch.utils.data.Dataset):
    """The seed's PNG layout: <root>/<split>/<index>_<class>.png, decoded per item with Pillow."""

    def __init__(self, root: Path, split: str) -> None:
        self.items = common.read_png_index(root, split)

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int):
        from PIL import Image
        path, label = self.items[i]
        with Image.open(path) as im:
            x = torch.from_numpy(np.asarray(im.convert("RGB"), dtype=np.uint8).copy())
        return x.permute(2, 0, 1).float().div_(255), label


def resident_batches(x, y, batch_size: int, generator: torch.Generator, rank: int = 0, world: int = 1):
    """Endless batches from device-resident uint8 NCHW images: a fresh permutation each epoch; with world > 1,
    rank's batch_size images of each global batch of batch_size x world."""
    per_epoch = len(x) // (batch_size * world)
    while True:
        perm = torch.randperm(len(x), device=x.device, generator=generator)
        for b in range(per_epoch):
            first = (b * world + rank) * batch_size
            idx = perm[first:first + batch_size]
            yield x.index_select(0, idx).float().div_(255), y.index_select(0, idx)


def loader_batches(root: Path, batch_size: int, workers: int, seed: int, device: str, stats: dict):
    """Endless batches from a torch DataLoader over the PNG files, as the seed's script (3 workers)."""
    loader = torch.utils.data.DataLoader(
        PngDataset(root, "train"), batch_size=batch_size, shuffle=True, drop_last=True, num_workers=workers,
        generator=torch.Generator().manual_seed(seed), pin_memory=device == "cuda",
        persistent_workers=workers > 0)
    while True:
        it = iter(loader)
        while True:
            t0 = time.perf_counter()
            try:
                x, y = next(it)
            except StopIteration:
                break
            waited = time.perf_counter() - t0
            stats["wait_s"] += waited
            stats["waited_steps"] += waited > LOADER_WAIT_THRESHOLD_S
            stats["fetches"] += 1
            yield x.to(device, non_blocking=True), y.to(device, non_blocking=True)


# ---------------------------------------------------------------- steps


def make_optimizer(model: nn.Module, mode: str, device: str) -> torch.optim.Optimizer:
    p = common.PROTOCOL
    kwargs = dict(lr=p["lr"], betas=tuple(p["betas"]), eps=p["eps"], weight_decay=p["weight_decay"])
    if mode == "graphed":  # fused too on the GPU: PyTorch's fastest graphed AdamW (1.77 vs 2.04 ms/step on the H200)
        kwargs["capturable"] = True
        kwargs["fused"] = device == "cuda" or None
    elif mode == "compiled" and device == "cuda":
        kwargs["fused"] = True
    return torch.optim.AdamW(model.parameters(), **kwargs)


def autocast_ctx(precision: str, device: str, cache: bool = True):
    """bf16 autocast (cache off inside CUDA-graph capture, as PyTorch's graph docs require)."""
    if precision == "bf16":
        return torch.autocast(device_type=device, dtype=torch.bfloat16, cache_enabled=cache)
    return contextlib.nullcontext()


def eager_step_fn(model, opt, precision: str, device: str, channels_last: bool):
    def step(x, y):
        if channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        with autocast_ctx(precision, device):
            logits = model(x)
        loss = F.cross_entropy(logits.float(), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss
    return step


class GraphedTrainer:
    """The whole step in one CUDA graph: the batch gather from the resident data, forward, backward, AdamW.

    The permutation lives in a device buffer refilled once per epoch; the batch offset is a device
    counter that the graph itself advances, so a step is a single graph launch.
    """

    def __init__(self, model, opt, x, y, batch_size: int, precision: str, channels_last: bool,
                 generator: torch.Generator, warmup: int, rank: int = 0, world: int = 1) -> None:
        self.model, self.opt, self.x, self.y = model, opt, x, y
        self.batch_size, self.precision, self.channels_last = batch_size, precision, channels_last
        self.generator = generator
        self.per_epoch = len(x) // (batch_size * world)
        self.step_images = batch_size * world   # the global batch: the offset's advance
        self.perm = torch.empty(len(x), dtype=torch.long, device=x.device)
        self.offset = torch.zeros((), dtype=torch.long, device=x.device)
        self.lanes = torch.arange(rank * batch_size, (rank + 1) * batch_size, device=x.device)
        self.batch_in_epoch = self.per_epoch  # forces a fresh permutation before the first step
        self.warmup = warmup
        self.graph = None
        self.loss = None

    def _body(self):
        idx = self.perm.index_select(0, self.offset + self.lanes)
        xb = self.x.index_select(0, idx).float().div_(255)
        if self.channels_last:
            xb = xb.contiguous(memory_format=torch.channels_last)
        with autocast_ctx(self.precision, "cuda", cache=False):
            logits = self.model(xb)
        loss = F.cross_entropy(logits.float(), self.y.index_select(0, idx))
        loss.backward()
        self.opt.step()
        self.offset.add_(self.step_images)
        return loss

    def _next_batch_position(self) -> None:
        if self.batch_in_epoch == self.per_epoch:
            self.perm.copy_(torch.randperm(len(self.x), device=self.x.device, generator=self.generator))
            self.offset.zero_()
            self.batch_in_epoch = 0
        self.batch_in_epoch += 1

    def warm_up_and_capture(self) -> list[torch.Tensor]:
        """`warmup` real training steps on a side stream, then the capture (which does not run the step)."""
        losses = []
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(self.warmup):
                self._next_batch_position()
                self.opt.zero_grad(set_to_none=True)
                losses.append(self._body().detach())
        torch.cuda.current_stream().wait_stream(side)
        self.opt.zero_grad(set_to_none=True)
        self.graph = torch.cuda.CUDAGraph()
        # capture must not consume a batch position; the replay that follows does
        with torch.cuda.graph(self.graph):
            self.loss = self._body()
        return losses

    def step(self):
        self._next_batch_position()
        self.graph.replay()
        return self.loss


# ---------------------------------------------------------------- one seed


def evaluate(model, x_test, y_test, batch: int, precision: str, device: str, channels_last: bool):
    model.eval()
    preds = []
    with torch.no_grad(), autocast_ctx(precision, device):
        for i in range(0, len(x_test), batch):
            xb = x_test[i:i + batch].float().div_(255)
            if channels_last:
                xb = xb.contiguous(memory_format=torch.channels_last)
            preds.append(model(xb).argmax(1))
    model.train()
    correct = (torch.cat(preds) == y_test).cpu().numpy()
    n = min(common.SEED_TEST_IMAGES, len(correct))
    return float(correct.mean()), float(correct[:n].mean())


def data_parallel(model: nn.Module, device: str) -> nn.Module:
    """model in torch's DistributedDataParallel inside a --nproc-per-node run (built on a side stream on the GPU,
    where the step may be captured), else model."""
    if not dist.is_initialized():
        return model
    if device != "cuda":
        return DistributedDataParallel(model)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        wrapped = DistributedDataParallel(model, device_ids=[torch.cuda.current_device()])
    torch.cuda.current_stream().wait_stream(side)
    return wrapped


def weight_sums(model: nn.Module) -> list[float]:
    """Every rank's sum of the model's weights (float64): equal where the ranks trained in step."""
    total = torch.tensor([sum(float(p.detach().double().sum()) for p in model.parameters())], dtype=torch.float64)
    device = "cuda" if dist.get_backend() == "nccl" else "cpu"
    gathered = [torch.zeros_like(total, device=device) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, total.to(device))
    return [float(t) for t in gathered]


def train_one_seed(args, seed: int, data: dict, device: str, data_load_s: float, rank: int = 0,
                   world: int = 1) -> dict:
    sync = torch.cuda.synchronize if device == "cuda" else None
    sw = common.Stopwatch(sync)
    t_start = sw.now()
    torch.manual_seed(seed)
    module = make_model(10).to(device)
    channels_last = args.precision == "bf16" and device == "cuda"
    if channels_last:
        module = module.to(memory_format=torch.channels_last)
    model = data_parallel(module, device)
    opt = make_optimizer(model, args.mode, device)
    t_built = sw.now()
    batch_size = common.PROTOCOL["batch_size"]
    gen = torch.Generator(device=device if args.mode != "eager" else "cpu").manual_seed(seed)
    log_every = args.log_every or max(1, args.steps // 200)
    default_warmup = {"graphed": 3, "compiled": 3}.get(args.mode, 1)
    warmup = max(0, min(args.warmup_steps if args.warmup_steps is not None else default_warmup, args.steps))
    if args.mode == "graphed" and dist.is_initialized():
        warmup = max(warmup, DDP_GRAPH_WARMUP)
    stats = {"wait_s": 0.0, "waited_steps": 0, "fetches": 0}

    curve: list[list[float]] = []
    bar = common.progress_bar(args.steps, f"seed {seed}", disable=args.quiet)

    log = common.progress_logger(bar, curve, warmup, batch_size)

    if args.mode == "graphed":
        trainer = GraphedTrainer(model, opt, data["x_train"], data["y_train"], batch_size, args.precision,
                                 channels_last, gen, max(1, warmup), rank, world)
        warm_losses = trainer.warm_up_and_capture()
        for i, loss in enumerate(warm_losses):
            if i % log_every == 0:
                log(i, loss, time.perf_counter())
        warmup = len(warm_losses)
        next_step = lambda: trainer.step()  # noqa: E731
    else:
        if args.mode == "eager":
            batches = loader_batches(data["png_root"], batch_size, args.workers, seed, device, stats)
        else:
            batches = resident_batches(data["x_train"], data["y_train"], batch_size, gen, rank, world)
        net = torch.compile(model, mode=args.compile_mode) if args.mode == "compiled" else model
        step = eager_step_fn(net, opt, args.precision, device, channels_last)
        next_step = lambda: step(*next(batches))  # noqa: E731
        for i in range(warmup):
            loss = next_step()
            if i % log_every == 0 or i == args.steps - 1:
                log(i, loss, time.perf_counter())

    t_timed = sw.now()
    setup_s = t_timed - t_start
    wait_before = dict(stats)
    for i in range(warmup, args.steps):
        loss = next_step()
        if i % log_every == 0 or i == args.steps - 1:
            log(i, loss, t_timed)
    t_end = sw.now()
    bar.close()

    train_s = t_end - t_timed
    timed = args.steps - warmup
    acc_10k, acc_9984 = evaluate(module, data["x_test"], data["y_test"], args.eval_batch, args.precision, device,
                                 channels_last)
    run = {
        "seed": seed, "acc_10k": acc_10k, "acc_9984": acc_9984,
        "train_time_s": train_s, "steps_timed": timed, "warmup_steps": warmup,
        "ms_per_step": 1000 * train_s / timed if timed else None,
        "images_per_s": timed * batch_size * world / train_s if timed and train_s > 0 else None,
        "startup_s": data_load_s + setup_s, "setup_s": setup_s, "data_load_s": data_load_s,
        "startup_detail": {"build_s": round(t_built - t_start, 3), "warmup_s": round(t_timed - t_built, 3)},
        "final_loss": curve[-1][1] if curve else None, "loss_every": log_every, "loss_curve": curve,
    }
    if dist.is_initialized():
        run["rank_weight_sums"] = weight_sums(module)
    if args.mode == "eager":
        fetches = stats["fetches"] - wait_before["fetches"]
        run["data_wait_s"] = stats["wait_s"] - wait_before["wait_s"]
        run["waited_share"] = (stats["waited_steps"] - wait_before["waited_steps"]) / fetches if fetches else None
        run["wait_threshold_s"] = LOADER_WAIT_THRESHOLD_S
    return run


# ---------------------------------------------------------------- main


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mode", choices=["eager", "resident-eager", "graphed", "compiled"], default="graphed")
    p.add_argument("--data", type=Path, default=None, help="CIFAR-10 folder (any layout frost.data.CIFAR10 reads)")
    p.add_argument("--steps", type=int, default=common.PROTOCOL["steps"])
    p.add_argument("--seeds", type=common.parse_seeds, default=[0, 1, 2])
    p.add_argument("--device", choices=["cpu", "cuda"], default=None, help="default: cuda when available")
    p.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    p.add_argument("--workers", type=int, default=3, help="DataLoader worker processes (eager mode)")
    p.add_argument("--warmup-steps", type=int, default=None,
                   help="training steps counted as start-up (default: 1; 3 for graphed and compiled)")
    p.add_argument("--compile-mode", default="max-autotune", help="torch.compile mode (compiled mode)")
    p.add_argument("--cudnn-benchmark", choices=["on", "off", "auto"], default="auto",
                   help="torch.backends.cudnn.benchmark (auto: on for graphed and compiled, off otherwise)")
    p.add_argument("--eval-batch", type=int, default=500)
    p.add_argument("--tf32", choices=["on", "off", "default"], default="default",
                   help="TF32 in float32 convolutions and matmuls (default: PyTorch's, on in cuDNN, off in matmul)")
    p.add_argument("--save-streams", type=Path, default=None, metavar="DIR",
                   help="write each seed's initial weights and per-epoch orders (what its resident or graphed run "
                        "draws) for `frost bench resnet-cifar10 --streams DIR`, then exit")
    p.add_argument("--log-every", type=int, default=None)
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--quiet", action="store_true")
    common.add_data_parallel_argument(p)
    argv = sys.argv[1:] if argv is None else list(argv)
    args = p.parse_args(argv)
    args.command_line = argv   # --nproc-per-node: the same command in each process
    if args.device is None:
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.mode == "graphed" and args.device != "cuda":
        p.error("--mode graphed needs --device cuda (CUDA graphs)")
    if args.nproc_per_node is not None and args.mode == "eager":
        p.error("--nproc-per-node trains from resident data: --mode resident-eager, graphed or compiled")
    if args.nproc_per_node is not None and args.mode == "graphed" and args.steps <= DDP_GRAPH_WARMUP:
        p.error(f"--mode graphed with --nproc-per-node warms up {DDP_GRAPH_WARMUP} steps before the capture: "
                f"--steps must be more, got {args.steps}")
    if args.precision == "bf16" and args.mode != "graphed":
        print(f"note: bf16 (autocast + channels_last) is the graphed mode's variant; running it in {args.mode}")
    return args


def save_streams(folder: Path, seeds: list[int], n_train: int, steps: int, device: str) -> None:
    """Each seed's initial weights and the permutations its resident or graphed run draws, as NumPy files."""
    from frost.bench.resnet_cifar10 import epochs_of, write_streams
    for seed in seeds:
        torch.manual_seed(seed)  # as train_one_seed: the model first, then the order's own generator
        weights = {k: v.detach().cpu().numpy() for k, v in make_model(10).state_dict().items()}
        gen = torch.Generator(device=device).manual_seed(seed)
        orders = [torch.randperm(n_train, device=device, generator=gen).cpu().numpy()
                  for _ in range(epochs_of(steps, n_train))]
        write_streams(folder, seed, weights, np.stack(orders))


def main(argv=None) -> dict:
    args = parse_args(argv)
    if args.nproc_per_node is not None and args.mode == "graphed":   # all-reduces inside a graph (PyTorch's notes)
        os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "0")   # the ranks inherit it
    return torch_ddp.run(args, __file__, run_here)


def run_here(args: argparse.Namespace) -> dict:
    """The benchmark in this process (one rank of several with --nproc-per-node)."""
    device = args.device
    rank, world = torch_ddp.place()
    if args.tf32 != "default":
        torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = args.tf32 == "on"
    benchmark = {"on": True, "off": False}.get(args.cudnn_benchmark, args.mode in ("graphed", "compiled"))
    torch.backends.cudnn.benchmark = benchmark
    name = torch.cuda.get_device_name() if device == "cuda" else common.cpu_name()
    result = common.new_result("pytorch", args.mode, args.precision, device, name, args.steps, args.seeds,
                               {"torch": torch.__version__})
    result.update({"pipeline": "loader" if args.mode == "eager" else "resident",
                   "workers": args.workers if args.mode == "eager" else None, "eval_batch": args.eval_batch,
                   "cudnn_benchmark": benchmark, "torch_threads": torch.get_num_threads(),
                   "model": "tests/nn/torch_resnet.py",
                   "compile_mode": args.compile_mode if args.mode == "compiled" else None,
                   "tf32": {"cudnn": torch.backends.cudnn.allow_tf32,
                            "matmul": torch.backends.cuda.matmul.allow_tf32},
                   "world_size": world, "global_batch": world * common.PROTOCOL["batch_size"]})

    t0 = time.perf_counter()
    root = args.data if args.data is not None else common.default_data_dir()
    download = args.data is None
    if rank:
        dist.barrier()   # rank 0 has found (or downloaded) the data: no two processes download it at once
    x_train, y_train = common.load_cifar10_arrays(root, train=True, download=download)
    x_test, y_test = common.load_cifar10_arrays(root, train=False, download=download)
    if dist.is_initialized() and not rank:
        dist.barrier()
    if args.save_streams:
        save_streams(args.save_streams, args.seeds, len(x_train), args.steps, device)
        return result
    data = {"x_test": torch.from_numpy(x_test).permute(0, 3, 1, 2).contiguous().to(device),
            "y_test": torch.from_numpy(y_test).to(device)}
    if args.mode == "eager":
        data["png_root"] = common.png_folder_for(root, x_train, y_train, x_test, y_test)
    else:
        data["x_train"] = torch.from_numpy(x_train).permute(0, 3, 1, 2).contiguous().to(device)
        data["y_train"] = torch.from_numpy(y_train).to(device)
    if device == "cuda":
        torch.cuda.synchronize()
    data_load_s = time.perf_counter() - t0
    result.update({"data": str(args.data) if args.data else "default cache", "data_load_s": data_load_s,
                   "n_train": len(x_train), "n_test": len(x_test)})

    for seed in args.seeds:
        result["runs"].append(train_one_seed(args, seed, data, device, data_load_s, rank, world))
        result["summary"] = common.summarize(result["runs"])
        if args.out:
            common.write_json(args.out, result)
    print(common.results_table(result))
    if args.out:
        print(f"results written to {args.out}")
    return result


if __name__ == "__main__":
    main()
