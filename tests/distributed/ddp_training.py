"""What the data-parallel tests train, for both sides: the worker processes (run as a script under `frost run`)
and the single-process reference in the test. Each step's global batch is the same everywhere; process r of W
trains on its r-th slice."""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

import frost
import frost.distributed as dist
from frost import nn
from frost.distributed.optim import ZeroRedundancyOptimizer
from frost.models.gpt import GPT, GPTConfig
from frost.models.resnet import CifarResNet
from frost.nn.parallel import DistributedDataParallel
from frost.nn.sync_batch_norm import SyncBatchNorm

STEPS = 20
PER_PROCESS = 2
OPTIONS = {"lr": 1e-2, "weight_decay": 0.1}


def build(model: str):
    frost.manual_seed(0)
    if model == "resnet":
        return CifarResNet(blocks_per_stage=(1, 1, 1), widths=(4, 8, 8)).double()
    return GPT(GPTConfig(block_size=8, vocab_size=16, n_layer=2, n_head=2, n_embd=8)).double()


def batch(model: str, step: int, size: int):
    rng = np.random.default_rng(1000 + step)
    if model == "resnet":
        return (frost.tensor(rng.standard_normal((size, 3, 8, 8))), frost.tensor(rng.integers(0, 10, size)))
    tokens = rng.integers(0, 16, (size, 9))
    return frost.tensor(tokens[:, :-1]), frost.tensor(tokens[:, 1:])


def loss_of(model: str, net, x, y):
    if model == "resnet":
        return nn.functional.cross_entropy(net(x), y)
    return net(x, y)[1]


def train(model: str, net, opt, world: int, rank: int | None, accumulate: int = 1, steps=range(STEPS)) -> None:
    """AdamW steps; each is `accumulate` micro-batches (the gradients summed, divided by accumulate); process
    `rank` of `world` trains on its slice of each global batch, rank None on the whole of it."""
    for step in steps:
        opt.zero_grad()
        for micro in range(accumulate):
            x, y = batch(model, step * accumulate + micro, PER_PROCESS * world)
            if rank is not None:
                part = slice(rank * PER_PROCESS, (rank + 1) * PER_PROCESS)
                x, y = x[part], y[part]
            last = micro == accumulate - 1
            context = net.no_sync() if (not last and isinstance(net, DistributedDataParallel)) else _nothing()
            with context:
                (loss_of(model, net, x, y) / accumulate).backward()
        opt.step()


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def state_of(net) -> dict:
    return {k: v.numpy() for k, v in net.state_dict().items()}


def reference(model: str, world: int, accumulate: int = 1) -> dict:
    """One process on the concatenated batches."""
    net = build(model)
    train(model, net, frost.optim.AdamW(net.parameters(), **OPTIONS), world, None, accumulate)
    return state_of(net)


def worker(args) -> None:
    """Train steps [start, stop) with DDP or ZeRO-1 (resuming from --load, saving to --save on rank 0), and write
    each rank's final weights."""
    dist.init_process_group("mpi")
    rank, world = dist.get_rank(), dist.get_world_size()
    net = build(args.model)
    if args.model == "resnet":
        net = SyncBatchNorm.convert_sync_batchnorm(net)
    if args.load:
        saved = frost.load(args.load)
        net.load_state_dict(saved["model"])
    if args.zero:
        trained, opt = net, ZeroRedundancyOptimizer(net.parameters(), frost.optim.AdamW, **OPTIONS)
    else:  # tiny buckets: several collectives in flight
        trained = DistributedDataParallel(net, bucket_cap_mb=0.001)
        opt = frost.optim.AdamW(net.parameters(), **OPTIONS)
    if args.load:
        opt.load_state_dict(saved["optimizer"])
    train(args.model, trained, opt, world, rank, args.accumulate, range(args.start, args.stop))
    state = opt.state_dict()  # collective under ZeRO: every rank takes part, rank 0 writes
    if args.save and rank == 0:
        frost.save({"model": net.state_dict(), "optimizer": state}, args.save)
    np.savez(Path(args.out) / f"rank{rank}.npz", **state_of(net))
    dist.destroy_process_group()


def parse(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("model", choices=("resnet", "gpt"))
    p.add_argument("out")
    p.add_argument("--accumulate", type=int, default=1)
    p.add_argument("--zero", action="store_true")
    p.add_argument("--start", type=int, default=0)
    p.add_argument("--stop", type=int, default=STEPS)
    p.add_argument("--load")
    p.add_argument("--save")
    return p.parse_args(argv)


if __name__ == "__main__":
    worker(parse())
