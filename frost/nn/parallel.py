"""DistributedDataParallel: every process holds the whole model and a slice of the batch; gradients are averaged
over the processes during backward, so each step's update equals one process's on the concatenated batch."""
from __future__ import annotations

import contextlib
import weakref
from typing import Callable, Iterator

import numpy as np

from frost import distributed as dist
from frost.autograd import complete_deferred_gradients, queue_callback, register_post_accumulate_grad_hook
from frost.layout import data_ptr
from frost.nn.module import Module, Parameter
from frost.tensor import Tensor

FIRST_BUCKET_MB = 1.0  # small, as PyTorch's: the last layers' gradients start travelling early in backward


def _span(arrays: list):
    """A 1-D view of the buffer that `arrays` tile exactly, end to end (the flat gradient buffer of frost's fused
    optimizers): a bucket then reduces in place, without a copy. None when they do not tile one buffer."""
    base = arrays[0].base
    if base is None or not base.flags.c_contiguous or any(a.base is not base or not a.flags.c_contiguous
                                                          for a in arrays):
        return None  # (a strided base's reshape(-1) would be a copy: the average would never reach the grads)
    flat = base.reshape(-1)
    start = min(data_ptr(a) for a in arrays)
    size = sum(a.size for a in arrays)
    end = max(data_ptr(a) + a.nbytes for a in arrays)
    if end - start != size * flat.itemsize:
        return None
    offset = (start - data_ptr(flat)) // flat.itemsize
    return flat[offset:offset + size]


def _broadcast_in_place(t: Tensor) -> None:
    """Rank 0's values into t, whatever its memory layout (a channels-last weight is not C-contiguous)."""
    if t.data.flags.c_contiguous:
        dist.broadcast(t, src=0)
        return
    dense = Tensor(t.xp.ascontiguousarray(t.data))
    dist.broadcast(dense, src=0)
    t.data[...] = dense.data


def _weak_ready_hook(ddp: "DistributedDataParallel") -> Callable[[Parameter], None]:
    """The post-accumulate hook of ddp's parameters, holding ddp weakly: a wrapper the user dropped (the module
    wrapped again) must stop launching collectives, and the parameters must not keep it alive."""
    owner = weakref.ref(ddp)

    def ready(p: Parameter) -> None:
        ddp_now = owner()
        if ddp_now is not None:
            ddp_now._grad_ready(p)
    return ready


class _Bucket:
    """Parameters whose gradients are averaged in one collective, launched when the last of them is in."""

    def __init__(self, params: list[Parameter]) -> None:
        self.params = params
        self.ready: set[int] = set()
        self.work = None
        self.buffer = None
        self.flat_view = None

    def launch(self) -> None:
        complete_deferred_gradients()  # a GPU kernel may still owe the last part of a gradient it wrote (autograd)
        grads = [p.grad.data for p in self.params]
        xp = self.params[0].xp
        span = _span(grads)
        if span is not None:
            self.buffer, self.flat_view = span, True
        else:
            self.buffer = xp.concatenate([g.reshape(-1) for g in grads])
            self.flat_view = False
        self.work = dist.all_reduce(Tensor(self.buffer), dist.ReduceOp.AVG, async_op=True)

    def finish(self) -> None:
        if self.work is not None:
            self.work.wait()
        if not self.flat_view:
            offset = 0
            for p in self.params:
                g = p.grad.data
                g[...] = self.buffer[offset:offset + g.size].reshape(g.shape)
                offset += g.size
        self.ready.clear()
        self.work = self.buffer = None


class DistributedDataParallel(Module):
    """Wrap `module` for data-parallel training over the default process group (init_process_group first).

    At construction rank 0's parameters and buffers are broadcast to every process. During backward the
    gradients are averaged in buckets of about bucket_cap_mb MB (the first one smaller), in the reverse order of
    module.parameters() (about the order backward produces them), each launched as soon as its last gradient is
    in, so communication overlaps the rest of backward; backward() returns with every gradient averaged.
    Parameters that got no gradient in a step count as zero; with find_unused_parameters=True (one more small
    all-reduce per backward) one that got none on any process keeps .grad None, as PyTorch's (so the optimizer
    skips it, as one process would). Inside `no_sync()` gradients accumulate locally;
    the first backward outside it averages the accumulated sums. broadcast_buffers: rank 0's buffers (batch norm's
    running statistics) are copied to every process before each forward in training, as PyTorch does; batch
    statistics stay per process (convert with nn.SyncBatchNorm.convert_sync_batchnorm for global ones).
    device_ids, output_device, gradient_as_bucket_view and static_graph are accepted for PyTorch's call form."""

    def __init__(self, module: Module, device_ids=None, output_device=None, broadcast_buffers: bool = True,
                 bucket_cap_mb: float = 25.0, find_unused_parameters: bool = False,
                 gradient_as_bucket_view: bool = False, static_graph: bool = False, process_group=None) -> None:
        super().__init__()
        if not dist.is_initialized():
            raise RuntimeError("DistributedDataParallel: the default process group is not initialized; call "
                               "frost.distributed.init_process_group() first")
        self.module = module
        object.__setattr__(self, "broadcast_buffers", broadcast_buffers)
        object.__setattr__(self, "find_unused_parameters", find_unused_parameters)
        object.__setattr__(self, "_sync", True)
        object.__setattr__(self, "_pending", False)
        object.__setattr__(self, "_next_launch", 0)  # buckets launch in order: collectives match across processes
        params = [p for p in module.parameters() if p.requires_grad]
        object.__setattr__(self, "_buckets", self._make_buckets(params, bucket_cap_mb))
        object.__setattr__(self, "_bucket_of", {id(p): b for b in self._buckets for p in b.params})
        object.__setattr__(self, "_params", params)
        self._broadcast_state()
        ready = _weak_ready_hook(self)
        for p in params:
            register_post_accumulate_grad_hook(p, ready)

    @staticmethod
    def _make_buckets(params: list[Parameter], cap_mb: float) -> list[_Bucket]:
        # a cap below the first bucket's size caps it too (PyTorch's first bucket is 1 MB only by default)
        buckets, current, size, cap = [], [], 0, min(FIRST_BUCKET_MB, cap_mb) * 2 ** 20
        for p in reversed(params):
            grouped = current and (p.dtype != current[0].dtype or str(p.device) != str(current[0].device))
            if current and (size + p.data.nbytes > cap or grouped):
                buckets.append(_Bucket(current))
                current, size, cap = [], 0, cap_mb * 2 ** 20
            current.append(p)
            size += p.data.nbytes
        if current:
            buckets.append(_Bucket(current))
        return buckets

    def _broadcast_state(self) -> None:
        for t in list(self.module.parameters()) + [b for b in self.module.buffers() if b is not None]:
            _broadcast_in_place(t)

    def forward(self, *args, **kwargs):
        if self.training and self.broadcast_buffers and dist.get_world_size() > 1:
            for b in self.module.buffers():
                if b is not None:
                    _broadcast_in_place(b)
        return self.module(*args, **kwargs)

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Backward passes inside accumulate gradients locally; the first one after averages the sums."""
        previous = self._sync
        object.__setattr__(self, "_sync", False)
        try:
            yield
        finally:
            object.__setattr__(self, "_sync", previous)

    def _grad_ready(self, p: Parameter) -> None:
        if not self._sync or dist.get_world_size() == 1:  # one process: nothing to average (skipped, no copy)
            return
        if not self._pending:
            object.__setattr__(self, "_pending", True)
            queue_callback(self._finish_backward)
        self._bucket_of[id(p)].ready.add(id(p))
        while self._next_launch < len(self._buckets):
            bucket = self._buckets[self._next_launch]
            if len(bucket.ready) < len(bucket.params):
                break
            bucket.launch()
            object.__setattr__(self, "_next_launch", self._next_launch + 1)

    def _finish_backward(self) -> None:
        """At the end of backward: launch buckets with gradients that never came (as zeros), then wait for all."""
        object.__setattr__(self, "_pending", False)
        filled = []  # only a bucket not launched yet can hold a parameter that got no gradient
        for bucket in self._buckets[self._next_launch:]:
            for p in bucket.params:
                if p.grad is None:
                    p.grad = Tensor(p.xp.zeros_like(p.data))
                    filled.append(p)
            bucket.launch()
        object.__setattr__(self, "_next_launch", 0)
        for bucket in self._buckets:
            bucket.finish()
        if self.find_unused_parameters:
            self._drop_globally_unused(filled)

    def _drop_globally_unused(self, filled: list[Parameter]) -> None:
        """Back to None, the gradients that every process zero-filled (one MIN all-reduce of a 0/1 mask, run by
        every process after every synchronized backward, so that the collectives match)."""
        position = {id(p): i for i, p in enumerate(self._params)}
        mask = np.zeros(len(self._params), dtype=np.float32)
        mask[[position[id(p)] for p in filled]] = 1
        everywhere = Tensor(self._params[0].xp.asarray(mask))
        dist.all_reduce(everywhere, dist.ReduceOp.MIN)
        on_every_process = everywhere.tolist()
        for p in filled:
            if on_every_process[position[id(p)]] == 1:
                p.grad = None
