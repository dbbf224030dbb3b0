"""What Frost's own convolution kernels share (conv_wgrad, conv_wgrad_mma, conv_fprop_mma): the split-K launch plan
and its fixed-order sum of partials, the capture check, and `faster_than_cudnn`, which times a kernel against cuDNN's
plan once per shape and remembers the answer. It sits below those modules so that their imports go one way."""

import threading
import time
from dataclasses import dataclass, field
from typing import Callable

from frost.backend import cuda
from frost.backend.remembered import RememberedTable
from frost.jit import register_pending_choices
from frost.kernel import Const, device, lane, static_range, syncthreads, warp

__all__ = ["FINAL_WARPS", "SplitPlan", "sum_splits", "capturing", "faster_than_cudnn", "pending_choices"]

FINAL_WARPS = 8         # warps of a finalize block; each block sums 32 outputs (one per lane)


@device
def sum_splits(part, out, sums, n_out, splits, block, WARPS: Const[int]):
    """out[o] = sum over s of part[s * n_out + o] for the 32 outputs o = 32 * block + lane, by a block of WARPS warps
    (1 to 8) with sums: shared (8, 32) floats. The order is fixed whatever WARPS is (deterministic, no float
    atomics): residue j = 0 .. 7 sums splits j, j + 8, ... in turn (warp j % WARPS does it), then lane by lane the
    8 residues' sums in order."""
    o = block * 32 + lane
    for j in static_range(FINAL_WARPS):
        if j % WARPS == warp:
            acc = 0.0
            if o < n_out:
                for s in range(j, splits, FINAL_WARPS):
                    acc += part[s * n_out + o]
            sums[j, lane] = acc
    syncthreads()
    if warp == 0 and o < n_out:
        total = 0.0
        for j in static_range(FINAL_WARPS):
            total += sums[j, lane]
        out[o] = total


@dataclass(frozen=True)
class SplitPlan:
    """What every weight-gradient launch plan has: Const values, splits over K (each written as a partial that the
    finalize kernel sums), chunks, threads and shared memory per block."""
    consts: dict = field(hash=False)
    splits: int
    chunks_per_block: int
    total_chunks: int
    threads: int
    smem: int

    carries = False   # whether its kernel can carry another convolution's finalize (launch_args)

    @property
    def n_out(self) -> int:
        c = self.consts
        return c["COUT"] * c["CIN"] * c["KH"] * c["KW"]

    def launch_args(self, part, carried) -> tuple[tuple, tuple]:
        """(grid, the partial kernel's arguments after total_chunks): none here."""
        return self.grid, ()


def capturing() -> bool:
    """True while the current stream is being captured into a CUDA graph."""
    cp = cuda.cupy()
    stream = cp.cuda.get_current_stream()
    try:
        return bool(stream.is_capturing())
    except Exception:
        # the legacy default stream cannot be captured; a capture elsewhere in the process makes this raise
        return True


_lock = threading.Lock()


def faster_than_cudnn(table: RememberedTable, key: str, time_ours: Callable[[], tuple], cudnn_fn,
                      counters: dict, prefetch: Callable[[], None] | None = None) -> bool:
    """Whether our kernel beats cuDNN's plan at the shape named by `key`: decided once (time_ours() times our
    candidates and returns (the best one's us, its tiles); cudnn_fn() runs cuDNN's plan), remembered in memory and
    on disk in `table`; during a CUDA-graph capture only a remembered answer is used (unknown: cuDNN). counters:
    "choices" and "choose_seconds" grow with each decision.

    prefetch (queues our candidates' compiles on the background threads): given, the first ask of an unknown shape
    queues them and answers cuDNN, and a later ask decides, so that a step's shapes compile side by side rather
    than one after another (a cold start-up waited 3.2 s for the forward convolutions' candidates, shape after
    shape). `pending_choices()` names the shapes still undecided (frost.jit runs one more eager call before it
    captures a step that asked one of them)."""
    choices = table.load()
    if key in choices:
        return bool(choices[key]["ours"])
    if capturing():
        return False
    if prefetch is not None and (table.name, key) not in _asked_once:
        _asked_once.add((table.name, key))
        _undecided.add((table.name, key))
        prefetch()
        return False
    with _lock:
        if key not in choices:
            start = time.perf_counter()
            ours_us, tiles = time_ours()
            cudnn_us = cuda.graph_time_us(cudnn_fn)
            choices[key] = {"ours": ours_us < cudnn_us, "tiles": tiles, "ours_us": round(ours_us, 3),
                            "cudnn_us": round(cudnn_us, 3)}
            table.save()
            counters["choices"] += 1
            counters["choose_seconds"] += time.perf_counter() - start
    _undecided.discard((table.name, key))
    return bool(choices[key]["ours"])


_asked_once: set = set()  # (table, key) of shapes asked once with a prefetch: the next ask decides
_undecided: set = set()   # those not decided yet


@register_pending_choices
def pending_choices() -> frozenset:
    """The shapes asked once (their candidates compiling) that wait for the ask that decides them (frost.jit asks)."""
    return frozenset(_undecided)
