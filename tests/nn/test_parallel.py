"""The parts of DistributedDataParallel and SyncBatchNorm that need no second process (the multi-process runs
are in tests/distributed)."""
import numpy as np
import pytest

import frost
from frost import nn
from frost.autograd import queue_callback, register_post_accumulate_grad_hook
from frost.nn.parallel import DistributedDataParallel, _span
from frost.nn.sync_batch_norm import SyncBatchNorm


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
