"""The PyTorch twins' data parallelism (benchmarks/torch_gpt.py, benchmarks/torch_resnet_cifar10.py): the command in
N processes started by `frost run` (torchrun's variables; the others stopped when one fails), and one process's
place in the world: NCCL on its GPU (LOCAL_RANK), gloo on the CPU, rank 0 the one that reports."""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Callable

import torch
import torch.distributed as dist

from frost.bench import common

RANK_VARIABLE = "FROST_TORCH_TWIN_RANK"   # set in the processes relaunch starts


def in_rank() -> bool:
    """Whether this process is one that relaunch started."""
    return bool(os.environ.get(RANK_VARIABLE))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def relaunch(script: str | Path, argv: list[str], nproc: int) -> None:
    """`script argv` in nproc processes under frost run's native launcher; a failure stops them all and this one."""
    command = [sys.executable, "-m", "frost.distributed.run", "--launcher", "native", "--master-port",
               str(free_port()), "--nproc-per-node", str(nproc), str(Path(script).resolve()), *argv]
    done = subprocess.run(command, env=dict(os.environ, **{RANK_VARIABLE: "1"}))
    if done.returncode != 0:
        raise SystemExit(f"{Path(script).name}: the {nproc} data-parallel processes failed (status "
                         f"{done.returncode}; their output is above)")


@contextlib.contextmanager
def process_group(device: str):
    """This process in the world (NCCL on GPU LOCAL_RANK, else gloo) for the duration: yields (rank, world size),
    the output of ranks other than 0 swallowed."""
    if device == "cuda":
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("nccl" if device == "cuda" else "gloo")
    rank = dist.get_rank()
    with contextlib.redirect_stdout(io.StringIO()) if rank else contextlib.nullcontext():
        yield rank, dist.get_world_size()
    # only after a clean run: destroying a communicator with work outstanding (a rank that raised) can block, and
    # frost run stops the other ranks once this one exits with the error
    dist.barrier()
    dist.destroy_process_group()


def leave_rank() -> None:
    """End a rank's process after a clean run (its results written) without the interpreter's teardown: there, under
    load, torch's gloo backend has aborted a rank now and then ("terminate called without an active exception", no
    Python frame left), failing a run whose every step and result were already done."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def place() -> tuple[int, int]:
    """(rank, world size) of this process: (0, 1) outside a --nproc-per-node run."""
    return (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)


def run(args: argparse.Namespace, script: str | Path, run_here: Callable[[argparse.Namespace], dict]) -> dict:
    """A twin's benchmark: run_here(args) in this process, or with --nproc-per-node N in N processes (each a rank of
    the world, ranks but 0 without --out and quiet), returning rank 0's result with --scaling-baseline's scaling
    added, as frost bench's common.run_data_parallel does for Frost."""
    common.check_data_parallel_arguments(args)
    if args.nproc_per_node is None:
        return run_here(args)
    if in_rank():
        with process_group(args.device) as (rank, _):
            if rank:
                args.quiet, args.out = True, None
            run_here(args)
        leave_rank()
    baseline = common.read_baseline(args)
    relaunch(script, args.command_line, args.nproc_per_node)
    if baseline is not None:
        return common.add_scaling(args, baseline)
    return json.loads(Path(args.out).read_text()) if args.out else {}
