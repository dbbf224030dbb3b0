"""ZeRO stage 1: the optimizer state sharded over the processes (each keeps 1/N of it).

The parameters are seen as one flat vector split into N equal shards. A step reduce-scatters the gradients (each
process receives the average of its shard), runs the wrapped optimizer on its shard alone, and all-gathers the
updated shards into every process's parameters. Only element-wise optimizers can run on a shard of a flattened
vector: their update of an element reads only that element's state (SGD, Adam, AdamW, Lion, RMSprop, Adagrad);
those that look at a whole tensor (LAMB's trust ratio, Muon's orthogonalization, Adafactor's factored moments) are
refused."""
from __future__ import annotations

from typing import Any, Callable

from frost import distributed as dist
from frost.nn.module import Parameter
from frost.optim import SGD, Adagrad, Adam, AdamW, Lion, RMSprop
from frost.optim.optimizer import Optimizer
from frost.tensor import Tensor

ELEMENTWISE = (SGD, Adam, AdamW, Lion, RMSprop, Adagrad)


class ZeroRedundancyOptimizer:
    """`optimizer_class(shard, **defaults)` over this process's shard of `params`; use it instead of wrapping the
    model in DistributedDataParallel (the step averages the gradients itself), after init_process_group. Rank 0's
    parameter values are broadcast at construction. state_dict() is the whole state, gathered (the same on every
    process, so rank 0 can save it); load_state_dict takes one saved at any world size."""

    def __init__(self, params, optimizer_class: type[Optimizer], **defaults: Any) -> None:
        if not issubclass(optimizer_class, ELEMENTWISE):
            raise TypeError(f"ZeroRedundancyOptimizer: {optimizer_class.__name__} updates whole tensors, so it cannot "
                            f"run on a shard of the flattened parameters; element-wise optimizers only: "
                            f"{', '.join(c.__name__ for c in ELEMENTWISE)}")
        self.params = [p for p in params if p.requires_grad]
        if not self.params:
            raise ValueError("ZeroRedundancyOptimizer: got no parameters that require grad")
        dtypes = {p.dtype for p in self.params}
        if len(dtypes) != 1:
            raise TypeError(f"ZeroRedundancyOptimizer: one flat vector needs one dtype; got {sorted(map(str, dtypes))}")
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.xp = self.params[0].xp
        self.numel = sum(p.data.size for p in self.params)
        self.shard_size = -(-self.numel // self.world)
        for p in self.params:
            dense = Tensor(self.xp.ascontiguousarray(p.data))
            dist.broadcast(dense, src=0)
            p.data[...] = dense.data
        self.shard = Parameter(Tensor(self._my_part(self._flat(lambda p: p.data)).copy()))
        self.optimizer = optimizer_class([self.shard], **defaults)

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        """The wrapped optimizer's, looked up each time: its load_state_dict replaces the list, and a learning-rate
        schedule must keep reaching the groups that step() uses."""
        return self.optimizer.param_groups

    def _flat(self, part: Callable) -> Any:
        """The parameters' `part` (data or grad) as one vector, zero-padded to world * shard_size."""
        xp = self.xp
        pieces = [part(p).reshape(-1) for p in self.params]
        pad = self.world * self.shard_size - self.numel
        if pad:
            pieces.append(xp.zeros(pad, dtype=pieces[0].dtype))
        return xp.concatenate(pieces)

    def _my_part(self, flat):
        return flat[self.rank * self.shard_size:(self.rank + 1) * self.shard_size]

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            if set_to_none:
                p.grad = None
            elif p.grad is not None:
                p.grad.data[...] = 0

    def step(self, closure: Callable | None = None):
        loss = closure() if closure is not None else None
        xp = self.xp
        grads = Tensor(self._flat(lambda p: p.grad.data if p.grad is not None else xp.zeros_like(p.data)))
        shard_grad = Tensor(xp.empty(self.shard_size, dtype=grads.data.dtype))
        dist.reduce_scatter_tensor(shard_grad, grads, dist.ReduceOp.AVG)
        self.shard.grad = shard_grad
        self.optimizer.step()
        whole = Tensor(xp.empty(self.world * self.shard_size, dtype=self.shard.data.dtype))
        dist.all_gather_into_tensor(whole, Tensor(xp.ascontiguousarray(self.shard.data)))
        offset = 0
        for p in self.params:
            p.data[...] = whole.data[offset:offset + p.data.size].reshape(p.shape)
            offset += p.data.size
        return loss

    def state_dict(self) -> dict[str, Any]:
        """The wrapped optimizer's state dict with every shard-sized state tensor gathered into the whole
        (unpadded) vector."""
        inner = self.optimizer.state_dict()
        state = {key: self._gathered(value) for key, value in inner["state"].get(0, {}).items()}
        return {"state": state, "param_groups": inner["param_groups"], "numel": self.numel}

    def _gathered(self, value):
        if not (isinstance(value, Tensor) and value.data.shape == (self.shard_size,)):
            return value
        whole = Tensor(self.xp.empty(self.world * self.shard_size, dtype=value.data.dtype))
        dist.all_gather_into_tensor(whole, Tensor(self.xp.ascontiguousarray(value.data)))
        return Tensor(whole.data[:self.numel].copy())

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if state_dict.get("numel") != self.numel:
            raise ValueError(f"ZeroRedundancyOptimizer.load_state_dict: the saved state is for "
                             f"{state_dict.get('numel')} parameter elements, these parameters have {self.numel}")
        state = {key: self._my_slice(value) for key, value in state_dict["state"].items()}
        self.optimizer.load_state_dict({"state": {0: state} if state else {},
                                        "param_groups": state_dict["param_groups"]})

    def _my_slice(self, value):
        if not (isinstance(value, Tensor) and value.data.shape == (self.numel,)):
            return value
        xp = self.xp
        padded = xp.concatenate([value.data, xp.zeros(self.world * self.shard_size - self.numel, value.data.dtype)])
        return Tensor(self._my_part(padded).copy())
