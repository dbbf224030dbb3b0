"""The parts of DistributedDataParallel and SyncBatchNorm that need no second process (the multi-process runs
are in tests/distributed)."""
import gc

import numpy as np
import pytest

import frost
from frost import nn
from frost.autograd import queue_callback, register_post_accumulate_grad_hook
from frost.distributed import process_group
from frost.nn.parallel import DistributedDataParallel, _span
from frost.nn.sync_batch_norm import SyncBatchNorm
from frost.utils.checkpoint import checkpoint


class AlikeWorld:
    """Stands in for two processes that hold the same values (an average or a min leaves them as they are), in
    one process; the all-reduces are logged."""

    name = "mpi"

    def __init__(self) -> None:
        self.reduced = []

    def all_reduce(self, a, op: str, async_op: bool):
        self.reduced.append((op, a.size))
        return process_group.Completed() if async_op else None

    def broadcast(self, a, src: int) -> None:
        pass


@pytest.fixture
def alike_pair(monkeypatch):
    world = AlikeWorld()
    monkeypatch.setattr(process_group, "_group", process_group._Group(world, 0, 2, 0, None))
    return world


def test_ddp_needs_a_process_group():
    with pytest.raises(RuntimeError, match="init_process_group"):
        DistributedDataParallel(nn.Linear(2, 2))


def test_a_bucket_of_views_that_tile_one_buffer_reduces_in_place():
    flat = np.zeros(10)
    views = [flat[6:10].reshape(2, 2), flat[0:6].reshape(3, 2)]  # reverse order, as buckets are
    span = _span(views)
    assert span is not None and np.shares_memory(span, flat) and span.size == 10
    assert _span([flat[0:4], flat[6:10]]) is None  # a gap
    assert _span([np.zeros(3), np.zeros(3)]) is None  # separate arrays


def test_post_accumulate_hooks_run_once_per_leaf_and_callbacks_after_every_gradient():
    a, b = frost.ones(3, requires_grad=True), frost.ones(2, requires_grad=True)
    events = []

    def ready(t):
        events.append(("ready", t.shape[0], t.grad.tolist()))
        if len(events) == 1:
            queue_callback(lambda: events.append(("end", a.grad is not None and b.grad is not None)))
    register_post_accumulate_grad_hook(a, ready)
    register_post_accumulate_grad_hook(b, ready)
    ((a * a).sum() + (a * 2).sum() + b.sum()).backward()  # a is used twice: one hook call with the sum
    assert sorted(events[:2]) == [("ready", 2, [1.0, 1.0]), ("ready", 3, [4.0, 4.0, 4.0])]
    assert events[2:] == [("end", True)]


def test_queue_callback_outside_backward_is_refused():
    with pytest.raises(RuntimeError, match="inside backward"):
        queue_callback(lambda: None)


def test_convert_sync_batchnorm_keeps_parameters_and_buffers():
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU())
    model[1].running_mean.data[...] = 0.5
    weight = model[1].weight
    converted = SyncBatchNorm.convert_sync_batchnorm(model)
    assert isinstance(converted[1], SyncBatchNorm)
    assert converted[1].weight is weight and float(converted[1].running_mean.data[0]) == 0.5
    x = frost.randn(2, 4, 6, 6)
    # without a process group it is batch norm: the same output as the module it replaced
    reference = nn.BatchNorm2d(4)
    reference.load_state_dict(converted[1].state_dict())
    np.testing.assert_allclose(converted[1](x).detach().numpy(), reference(x).detach().numpy(), rtol=1e-6)


def test_end_callbacks_wait_for_the_backward_that_queued_them_not_one_inside_it():
    """checkpoint's backward runs grad() inside the outer backward: the callback queued before it is the outer's."""
    frost.manual_seed(0)
    block, lead = nn.Linear(3, 3), frost.ones(2, requires_grad=True)
    events = []

    def ready(t):
        events.append(tuple(t.shape))
        if len(events) == 1:
            queue_callback(lambda: events.append(("end", block.weight.grad is not None)))
    for p in (lead, *block.parameters()):
        register_post_accumulate_grad_hook(p, ready)
    ((lead * 2).sum() + checkpoint(block, frost.randn(2, 3)).sum()).backward()  # lead's gradient comes first
    assert events == [(2,), (3, 3), (3,), ("end", True)]


class TwoBranches(nn.Module):
    """A head whose gradient comes before the checkpointed block's, and a part that forward may leave out."""

    def __init__(self) -> None:
        super().__init__()
        self.head, self.block, self.spare = nn.Linear(3, 1), nn.Linear(3, 3), nn.Linear(3, 1)

    def forward(self, x, use_spare: bool = False):
        y = self.head(x).sum() + checkpoint(self.block, x).sum()
        return y + self.spare(x).sum() if use_spare else y


def gradients(model) -> dict:
    return {name: None if p.grad is None else p.grad.numpy().copy() for name, p in model.named_parameters()}


def test_ddp_averages_each_bucket_once_around_checkpointed_blocks(alike_pair):
    frost.manual_seed(0)
    model, x = TwoBranches(), frost.randn(4, 3)
    model(x, use_spare=True).backward()
    expected = gradients(model)
    model.zero_grad()
    ddp = DistributedDataParallel(model, bucket_cap_mb=1e-6)  # a bucket per parameter
    ddp(x, use_spare=True).backward()
    assert sorted(alike_pair.reduced) == sorted(("avg", p.data.size) for p in model.parameters())
    for name, g in gradients(model).items():
        np.testing.assert_array_equal(g, expected[name], err_msg=name)


@pytest.mark.parametrize("find_unused", [False, True])
def test_a_parameter_no_process_used_keeps_no_gradient_with_find_unused_parameters(alike_pair, find_unused):
    """As PyTorch's: an optimizer then skips it (AdamW's weight decay would move it), as one process would."""
    frost.manual_seed(0)
    model = TwoBranches()
    ddp = DistributedDataParallel(model, bucket_cap_mb=1e-6, find_unused_parameters=find_unused)
    ddp(frost.randn(4, 3)).backward()
    spare = [model.spare.weight.grad, model.spare.bias.grad]
    if find_unused:
        assert spare == [None, None]
        assert alike_pair.reduced[-1] == ("min", len(list(model.parameters())))  # the mask, after the buckets
    else:  # counted as zeros
        assert [g.tolist() for g in spare] == [[[0.0, 0.0, 0.0]], [0.0]]
    assert model.block.weight.grad is not None


def test_a_dropped_wrapper_stops_averaging(alike_pair):
    """Wrapping a module again: the first wrapper's hooks must not launch collectives of their own."""
    model = nn.Linear(3, 2)
    DistributedDataParallel(model)
    gc.collect()
    ddp = DistributedDataParallel(model)
    ddp(frost.randn(4, 3)).sum().backward()
    assert alike_pair.reduced == [("avg", 8)]  # one bucket, reduced once
