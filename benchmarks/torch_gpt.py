"""`frost bench gpt` in PyTorch: the same GPT, initial weights, batches, schedule, evaluation, table and JSON.

The model is tests/models/torch_gpt.py's nanoGPT twin (the oracle frost.models.gpt is tested against), loaded with
the weights Frost's run of the same seed starts from; the loop (batches, lr schedule, evaluation, timing) is
frost.bench.gpt's, so only the framework differs. AdamW is fused on the GPU. Modes:
  eager    the model as written
  compile  torch.compile(model) (the first steps compile: they count as start-up when --warmup covers them)
--precision bf16 adds torch.autocast(bfloat16) around the forward (the loss included, as nanoGPT).
--nproc-per-node N trains with torch's DistributedDataParallel in N processes started by `frost run` (NCCL on GPUs,
one a process; gloo on CPUs), each on its batch of the global batch Frost's data-parallel run draws, micro-batches
but the last under no_sync, the compiled model wrapped as nanoGPT wraps it; rank 0 reports and writes --out.

    python benchmarks/torch_gpt.py --preset shakespeare-char --data input.txt --mode compile --precision bf16
    python benchmarks/torch_gpt.py --preset gpt2-124m --mode compile --out gpt2_torch.json
    python benchmarks/torch_gpt.py --device cpu --steps 5 --batch-size 2 --block-size 32   # a CPU smoke run
    python benchmarks/torch_gpt.py --preset gpt2-124m --mode compile --nproc-per-node 2 --out gpt2_torch_ddp.json
"""
from __future__ import annotations

import argparse
import contextlib
import importlib.util
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
REFERENCE_MODEL = REPO / "tests" / "models" / "torch_gpt.py"
for folder in (REPO, HERE):   # frost, and torch_ddp beside this script (also when a test loads it by path)
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))

import torch_ddp  # noqa: E402
from frost.bench import common  # noqa: E402
from frost.bench import gpt  # noqa: E402  (the presets, data, loop and results are shared with Frost's run)

MODES = ("eager", "compile")


def load_twin_class() -> type:
    """nanoGPT's model in PyTorch: tests/models/torch_gpt.py's TorchGPT."""
    spec = importlib.util.spec_from_file_location("frost_torch_gpt_reference", REFERENCE_MODEL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.TorchGPT


class TorchTrainer:
    """gpt.Trainer in PyTorch: the twin with Frost's initial weights, its AdamW, the step and the evaluation."""

    def __init__(self, corpus: gpt.Corpus, settings: gpt.Settings, seed: int, device: str, mode: str,
                 rank: int = 0) -> None:
        self.settings, self.device, self.rank = settings, device, rank
        self.reference = gpt.build_model(settings.config, seed)  # Frost's weights; its estimate_mfu counts FLOPs
        torch.manual_seed(seed)  # dropout's stream
        model = load_twin_class()(settings.config)
        model.load_state_dict({k: torch.from_numpy(v.numpy().copy()) for k, v in self.reference.state_dict().items()})
        self.model = model.to(device)
        self.net = torch.compile(self.model) if mode == "compile" else self.model
        if dist.is_initialized():   # nanoGPT's order: compiled, then wrapped
            self.net = DistributedDataParallel(self.net, device_ids=[torch.cuda.current_device()]
                                               if device == "cuda" else None)
        params = [p for p in self.model.parameters() if p.requires_grad]
        groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": settings.weight_decay},
                  {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
        self.opt = torch.optim.AdamW(groups, lr=settings.lr, betas=settings.betas,
                                     fused=True if device == "cuda" else None)
        self.tokens = {"train": torch.from_numpy(corpus.train).to(device),
                       "val": torch.from_numpy(corpus.val).to(device)}
        self.offsets = torch.arange(settings.config.block_size + 1, device=device)

    def autocast(self):
        if self.settings.precision == "bf16":
            return torch.autocast(device_type=self.device, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def batch(self, split: str, starts: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        windows = self.tokens[split][torch.from_numpy(starts).to(self.device)[:, None] + self.offsets]
        return windows[:, :-1].contiguous(), windows[:, 1:].contiguous()

    def set_lr(self, lr: float) -> None:
        for group in self.opt.param_groups:
            group["lr"] = lr

    def step(self, starts: np.ndarray) -> torch.Tensor:
        """One update from the step's micro-batches (gpt.my_micro_batches); the mean loss."""
        self.opt.zero_grad(set_to_none=True)
        n = self.settings.grad_accum
        losses = []
        for m, micro in enumerate(gpt.my_micro_batches(starts, self.settings, self.rank)):
            x, y = self.batch("train", micro)
            # DDP averages the gradients over processes once, after the last micro-batch
            with self.net.no_sync() if m < n - 1 and isinstance(self.net, DistributedDataParallel) \
                    else contextlib.nullcontext():
                with self.autocast():
                    _, loss = self.net(x, y)
                (loss / n if n > 1 else loss).backward()
            losses.append(loss.detach())
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.settings.grad_clip)
        self.opt.step()
        return losses[0] if n == 1 else torch.stack(losses).mean()

    def eval_loss(self, split: str, starts: list[np.ndarray]) -> float:
        self.net.eval()
        total = 0.0
        with torch.no_grad(), self.autocast():
            for s in starts:
                total += float(self.net(*self.batch(split, s))[1].item())
        self.net.train()
        return total / len(starts)

    def estimate_mfu(self, batch_size: int, seconds: float) -> float:
        return self.reference.estimate_mfu(batch_size, seconds)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    gpt.add_arguments(p)
    p.add_argument("--mode", choices=MODES, default="eager", help="eager, or torch.compile of the model")
    argv = sys.argv[1:] if argv is None else list(argv)
    args = p.parse_args(argv)
    args.command_line = argv   # --nproc-per-node: the same command in each process
    if args.jit:
        p.error("--jit is Frost's capture; PyTorch's counterpart here is --mode compile")
    if args.device is None:
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda, but PyTorch sees no GPU")
    return args


def run(args: argparse.Namespace) -> dict:
    """Train every seed in PyTorch (args as parse_args makes them); print the table; write JSON with --out. With
    --nproc-per-node N: the same in N processes (rank 0's result)."""
    return torch_ddp.run(args, __file__, run_here)


def run_here(args: argparse.Namespace) -> dict:
    """The benchmark in this process (one rank of several with --nproc-per-node)."""
    device = args.device
    rank, _ = torch_ddp.place()
    gpt.check_arguments(args, device)
    t0 = time.perf_counter()
    corpus = gpt.load_corpus(args.preset, args.data, args.tokenizer)
    data_load_s = time.perf_counter() - t0
    settings = gpt.settle(args, device, corpus.vocab_size)
    gpt.check_corpus(corpus, settings.config.block_size)
    name = torch.cuda.get_device_name() if device == "cuda" else common.cpu_name()
    result = gpt.new_gpt_result("pytorch", args.mode, settings, device, name, args.seeds, corpus,
                                {"torch": torch.__version__})
    result.update({"data_load_s": data_load_s, "model": "tests/models/torch_gpt.py",
                   "torch_threads": torch.get_num_threads(), "fused_adamw": device == "cuda"})
    sync = torch.cuda.synchronize if device == "cuda" else None
    for seed in args.seeds:
        t_start = time.perf_counter()
        trainer = TorchTrainer(corpus, settings, seed, device, args.mode, rank)
        result["params"] = trainer.reference.num_params()
        result["runs"].append(gpt.train_run(trainer, corpus, settings, seed, sync, t_start, args.quiet,
                                            with_mfu=device == "cuda"))
        result["summary"] = gpt.summarize(result["runs"])
        if args.out:
            common.write_json(args.out, result)
    print(gpt.results_table(result))   # (a rank but 0 prints into torch_ddp.process_group's sink)
    if args.out:
        print(f"results written to {args.out}")
    return result


def main(argv=None) -> dict:
    return run(parse_args(argv))


if __name__ == "__main__":
    main()
